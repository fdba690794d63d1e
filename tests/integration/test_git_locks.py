"""A scope repository's git lock files are cleared at start only once no git works there any more
(issue 14 row 8): a git still running in the repository (a killed shell's, or one an operator
started) keeps its ``index.lock`` and is waited for; one that outlives the git deadline stops
start-up with an error naming it. Real git, a real editor holding the lock, a real shell."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from atrium.git import TIMEOUT_ENV
from tests.integration.conftest import StartShell, wait_for
from tests.integration.distribution.test_crash import Served

pytestmark = pytest.mark.integration


def slow_commit(repo: Path, seconds: float) -> subprocess.Popen[bytes]:
    """`git commit -a` whose editor takes ``seconds``: git holds ``.git/index.lock`` meanwhile."""
    (repo / "notes.txt").write_text("by hand\n")
    subprocess.run(["git", "add", "notes.txt"], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=Op", "-c", "user.email=op@localhost", "commit", "-qm", "add"],
        cwd=repo,
        check=True,
    )
    (repo / "notes.txt").write_text("changed by hand\n")
    editor = f'f() {{ sleep {seconds}; echo "by hand" > "$1"; }}; f'
    proc = subprocess.Popen(
        ["git", "-c", "user.name=Op", "-c", "user.email=op@localhost", "commit", "-qa"],
        cwd=repo,
        env={**os.environ, "GIT_EDITOR": editor},
        stderr=subprocess.PIPE,
        start_new_session=True,  # git and its editor stop together (see the tests' kill)
    )
    lock = repo / ".git" / "index.lock"
    for _ in range(200):
        if lock.exists():
            return proc
        proc.poll()
        assert proc.returncode is None, "git ended before taking its lock"
        subprocess.run(["sleep", "0.02"], check=True)
    raise AssertionError("git never took index.lock")


@pytest.fixture
def repo(start_shell: StartShell, home: Path) -> Path:
    start_shell().stop()
    return home / "scopes" / "global"


def test_a_running_git_keeps_its_lock_and_is_waited_for(
    start_shell: StartShell, repo: Path
) -> None:
    git = slow_commit(repo, 2.0)
    shell = start_shell()
    # the shell started only after git was done with the repository, so git's commit went through
    _, err = git.communicate(timeout=30)
    assert git.returncode == 0, err.decode()
    log = subprocess.run(
        ["git", "log", "--format=%s", "-1"], cwd=repo, capture_output=True, text=True, check=True
    )
    assert log.stdout.strip() == "by hand"
    assert not (repo / ".git" / "index.lock").exists()
    with shell.client() as api:
        assert api.get("/api/scopes").status_code == 200


def test_a_git_outliving_the_deadline_stops_start_up_naming_it(
    start_shell: StartShell, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    git = slow_commit(repo, 30.0)
    monkeypatch.setenv(TIMEOUT_ENV, "1")
    try:
        with pytest.raises(RuntimeError) as failed:
            start_shell()
        said = str(failed.value)
        assert f"pid {git.pid}" in said
        assert str(repo) in said
        assert (repo / ".git" / "index.lock").exists()  # still git's, untouched
    finally:
        os.killpg(git.pid, signal.SIGKILL)
        git.communicate()


def test_a_lock_left_by_a_dead_git_is_cleared(start_shell: StartShell, repo: Path) -> None:
    for name in ("index.lock", "HEAD.lock", "refs/heads/main.lock"):
        (repo / ".git" / name).write_text("")
    shell = start_shell()
    with shell.client() as api:
        assert api.get("/api/scopes").status_code == 200
    assert not list((repo / ".git").rglob("*.lock"))


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def git_pids_talking_to(port: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f":{port}/" in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_killed_shells_git_dies_with_it(home: Path, system_apps: Path) -> None:
    """A git fetch hung on a remote that accepts and never answers outlives neither a kill -9
    of the shell: it would otherwise run on, unsupervised, until the shell's own deadline that no
    longer exists."""
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    served = Served(home, system_apps, "")
    try:

        def install() -> None:
            with served.client() as api, contextlib.suppress(httpx.TransportError):
                api.post("/api/dist/install", json={"ref": f"git://127.0.0.1:{port}/a.git"})

        threading.Thread(target=install, daemon=True).start()
        running = wait_for(lambda: git_pids_talking_to(port), "git to reach the remote")
        served.proc.send_signal(signal.SIGKILL)
        served.proc.wait(timeout=30)
        wait_for(lambda: not any(alive(pid) for pid in running), "the killed shell's git to die")
    finally:
        served.close()
        silent.close()
