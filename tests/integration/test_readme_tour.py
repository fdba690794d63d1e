"""The README's tour runs as written: its commands, in order, against a real `atrium serve`.

The commands are read from README.md (the code blocks of "A 60-second tour"), not copied here, so
the README cannot drift from what works. Three substitutions, and only these: `.venv/bin/atrium`
is this checkout's CLI, the shell listens on a free port instead of 7070, and `/tmp/` is a fresh
folder (so a second run does not find the first run's repository), made in one pass so that a
checkout under /tmp keeps its own paths. `atrium events` follows the bus forever: it must still
be running after 3 s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_DIR

pytestmark = pytest.mark.integration
FOLLOWS = (" events ",)


def tour_commands() -> list[str]:
    text = (REPO_DIR / "README.md").read_text()
    tour = text.split("## A 60-second tour", 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", tour, re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment
            if line:
                commands.append(line)
    return commands


SUBSTITUTED = re.compile(r"\.venv/bin/atrium|localhost:7070|/tmp/")


def run_here(command: str, cli: str, port: str, scratch: Path) -> str:
    """The README's ``command`` with its three substitutions made in one pass over the README's
    own text: what one puts in is never rewritten by the next (the CLI's path holds `/tmp/` in a
    checkout cloned there, and the scratch folder always does)."""
    by_word = {
        ".venv/bin/atrium": cli,
        "localhost:7070": f"localhost:{port}",
        "/tmp/": f"{scratch}/",  # noqa: S108 - the README's path, replaced
    }
    return SUBSTITUTED.sub(lambda found: by_word[found.group()], command)


def test_the_substitutions_touch_only_the_readmes_own_words() -> None:
    """A checkout cloned under /tmp: its CLI's path holds `/tmp/` too, and stays as it is."""
    cli = "/tmp/xyz/.venv/bin/atrium"  # noqa: S108 - a checkout's path, not a file used
    scratch = Path("/tmp/pytest-of-x/test0/scratch")  # noqa: S108 - likewise
    command = (
        ".venv/bin/atrium publish apps/com.atrium.notes --to /tmp/com.atrium.notes.git "
        "--tag v1 && curl http://localhost:7070/x"
    )
    assert run_here(command, cli, "4711", scratch) == (
        f"{cli} publish apps/com.atrium.notes --to {scratch}/com.atrium.notes.git --tag v1 "
        "&& curl http://localhost:4711/x"
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    home = tmp_path / "home"
    env = {**os.environ, "ATRIUM_HOME": str(home), "ATRIUM_PORT": "0"}
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "atrium", "serve"],
        env=env,
        cwd=REPO_DIR,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url_file = home / "run" / "url"
    deadline = time.monotonic() + 30
    while not url_file.exists() or not url_file.read_text().strip():
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        assert time.monotonic() < deadline, "serve did not start"
        time.sleep(0.05)
    yield home, url_file.read_text().strip()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def test_the_readme_tour_runs_as_written(served: tuple[Path, str], tmp_path: Path) -> None:
    home, url = served
    commands = tour_commands()
    assert len(commands) >= 15, commands
    cli = str(Path(sys.executable).with_name("atrium"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    port = url.rsplit(":", 1)[1].rstrip("/")
    env = {**os.environ, "ATRIUM_HOME": str(home)}
    outputs: dict[str, str] = {}
    for command in commands:
        line = run_here(command, cli, port, scratch)
        if any(word in f"{line} " for word in FOLLOWS):
            follower = subprocess.Popen(
                ["bash", "-c", line], cwd=REPO_DIR, env=env, stdout=subprocess.DEVNULL
            )
            time.sleep(3)
            assert follower.poll() is None, f"{command!r} ended instead of following the bus"
            follower.terminate()
            follower.wait(10)
            continue
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=REPO_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{command!r} failed:\n{done.stdout}\n{done.stderr}"
        outputs[command] = done.stdout
    curl = next(c for c in outputs if c.startswith("curl"))
    # Notes answers (a list, not a 503 error object) although the tour destroyed it: it wakes
    assert isinstance(json.loads(outputs[curl]), list), outputs[curl]
    shutil.rmtree(scratch)
