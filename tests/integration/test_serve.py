"""`atrium serve` as a real process: token and URL files, the login link, signals, the CLI, and
configuration errors (one line each on stderr, exit status 2, nothing written)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_DIR
from tests.integration.conftest import SseReader, serving, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, str]]:
    with serving(tmp_path / "home") as shell:
        yield shell.proc, shell.home, f"{shell.url}/login?token={shell.token}"


def test_serve_writes_a_private_token_and_prints_a_working_login_url(
    served: tuple[subprocess.Popen[str], Path, str],
) -> None:
    _, home, login = served
    token_file = home / "run" / "token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert login.endswith(f"/login?token={token}")
    url = (home / "run" / "url").read_text().strip()
    assert login.startswith(url)
    with httpx.Client(timeout=10, follow_redirects=True) as client:
        wait_for(lambda: client.get(f"{url}/api/version").status_code == 200, "the shell")
        response = client.get(login)
        assert response.status_code == 200
        assert "<title>Atrium</title>" in response.text
        assert client.get(f"{url}/api/apps").status_code == 200


def test_the_cli_finds_the_shell_through_its_home(
    served: tuple[subprocess.Popen[str], Path, str],
) -> None:
    _, home, _ = served
    env = {**os.environ, "ATRIUM_HOME": str(home), "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "atrium", "apps"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "com.atrium.notes" in result.stdout


def test_sigterm_stops_the_shell_promptly_with_streams_open(
    served: tuple[subprocess.Popen[str], Path, str],
) -> None:
    proc, home, _ = served
    url = (home / "run" / "url").read_text().strip()
    token = (home / "run" / "token").read_text().strip()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as api:
        streams = [SseReader(api) for _ in range(3)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert all(s.ended.wait(5) for s in streams)
    assert not (home / "run" / "url").exists()


def serve_refused(home: Path, *args: str, **env: str) -> list[str]:
    """Run `atrium serve` expecting a configuration error: its stderr lines, after the checks
    every such error shares (status 2, no traceback, nothing on stdout, nothing else said)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")}
    result = subprocess.run(
        [sys.executable, "-m", "atrium", "serve", *args],
        env={**clean, "ATRIUM_HOME": str(home), "ATRIUM_PORT": "0", **env},
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines
    assert all(line.startswith("atrium serve: ") for line in lines), lines
    return lines


def test_a_short_token_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    [line] = serve_refused(home, ATRIUM_TOKEN="fifteen-chars!!")
    assert "ATRIUM_TOKEN" in line
    assert "at least 16 characters" in line
    assert "fifteen" not in line  # the secret is never repeated
    assert not home.exists()


def test_a_port_in_use_names_the_address_and_the_way_out(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        [line] = serve_refused(home, ATRIUM_HOST="127.0.0.1", ATRIUM_PORT=str(port))
    assert f"cannot listen on 127.0.0.1:{port}: the address is already in use" in line
    assert "ATRIUM_PORT / --port (0 for any free port)" in line
    assert not home.exists()


def test_an_unresolvable_host_is_a_configuration_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    [line] = serve_refused(home, ATRIUM_HOST="no-such-host.invalid")
    assert "cannot listen on no-such-host.invalid:0" in line
    assert "ATRIUM_HOST / --host" in line
    assert not home.exists()


@pytest.mark.parametrize("under", ["home", "home/run"], ids=["home-is-a-file", "run-is-a-file"])
def test_a_home_that_cannot_hold_a_directory_is_named(tmp_path: Path, under: str) -> None:
    # a regular file where a directory must be: fails as root too, unlike permission bits
    home = tmp_path / "home"
    blocker = tmp_path / under
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory\n")
    [line] = serve_refused(home)
    assert f"ATRIUM_HOME / --home '{home}'" in line
    assert f"cannot create {home / 'run'}: {blocker} is not a directory" in line
    assert blocker.read_text() == "not a directory\n"


def test_a_home_under_a_regular_file_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    home = blocker / "home"
    [line] = serve_refused(home)
    assert f"ATRIUM_HOME / --home '{home}'" in line
    assert f"{blocker} is not a directory" in line


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("ATRIUM_PORT", "abc", "ATRIUM_PORT / --port 'abc': input should be a valid integer"),
        ("ATRIUM_PORT", "70000", "ATRIUM_PORT / --port '70000': input should be less than"),
        ("ATRIUM_USER", "Bad!", "ATRIUM_USER / --user 'Bad!': not a user id"),
        ("ATRIUM_RUNNER", "nope", "ATRIUM_RUNNER / --runner 'nope': input should be 'auto'"),
        (
            "ATRIUM_HEARTBEAT_SECONDS",
            "0",
            "ATRIUM_HEARTBEAT_SECONDS / --heartbeat-seconds '0': input should be greater than 0",
        ),
        ("ATRIUM_LOG_LEVEL", "loud", "ATRIUM_LOG_LEVEL / --log-level 'loud': not a log level"),
        ("ATRIUM_VIEW_GRACE_SECONDS", "-1", "ATRIUM_VIEW_GRACE_SECONDS '-1': input should be"),
    ],
)
def test_a_refused_setting_is_one_line_naming_it_and_what_is_accepted(
    tmp_path: Path, variable: str, value: str, said: str
) -> None:
    home = tmp_path / "home"
    [line] = serve_refused(home, **{variable: value})
    assert line.startswith(f"atrium serve: {said}")
    assert "; accepted: " in line
    assert not home.exists()


def test_every_refused_setting_gets_its_own_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    lines = serve_refused(home, "--port", "70000", ATRIUM_USER="Bad!", ATRIUM_RUNNER="nope")
    assert [line.split(" '")[0] for line in lines] == [
        "atrium serve: ATRIUM_PORT / --port",
        "atrium serve: ATRIUM_USER / --user",
        "atrium serve: ATRIUM_RUNNER / --runner",
    ]
    assert "accepted: an integer 0-65535, 0 for any free port" in lines[0]
    assert not home.exists()
