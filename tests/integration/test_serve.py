"""`atrium serve` as a real process: token and URL files, the login link, signals, the CLI."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_DIR
from tests.integration.conftest import SseReader, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, str]]:
    home = tmp_path / "home"
    env = {**os.environ, "ATRIUM_HOME": str(home), "ATRIUM_PORT": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "atrium", "serve"],
        env=env,
        cwd=REPO_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 20
    while not any("login?token=" in line for line in lines):
        assert time.monotonic() < deadline, "serve printed no login URL"
        lines.append(proc.stdout.readline())
    login = next(
        re.search(r"http://\S+", line).group(0)  # type: ignore[union-attr]
        for line in lines
        if "login?token=" in line
    )
    yield proc, home, login
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    proc.stdout.close()


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
