"""The host page tells the user when the shell goes away and comes back, and when the session
has ended (issue 17): a shell of its own, stopped and started again on the same port and token."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from playwright.sync_api import Browser

from tests.conftest import REPO_DIR

TOKEN = "reconnect-test-token-0123456789abcdef"


def serve(home: Path, port: str) -> tuple[subprocess.Popen[bytes], str]:
    (home / "run" / "url").unlink(missing_ok=True)
    env = {**os.environ, "ATRIUM_HOME": str(home), "ATRIUM_PORT": port, "ATRIUM_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "atrium", "serve"],
        env=env,
        cwd=REPO_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url_file = home / "run" / "url"
    deadline = time.monotonic() + 30
    while not url_file.exists() or not url_file.read_text().strip():
        assert proc.poll() is None, "serve exited"
        assert time.monotonic() < deadline, "serve did not start"
        time.sleep(0.05)
    return proc, url_file.read_text().strip()


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(15)


def test_a_restart_shows_and_clears_the_banner_and_an_ended_session_says_so(
    browser: Browser, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    proc, url = serve(home, "0")
    port = url.rsplit(":", 1)[1].rstrip("/")
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    try:
        page.goto(f"{url}/login?token={TOKEN}")
        page.wait_for_selector("body[data-ready=true]")
        banner = page.locator("#banner")
        assert banner.is_hidden()
        stop(proc)
        banner.wait_for(state="visible", timeout=15_000)
        assert "Lost the connection" in banner.inner_text()
        proc, _ = serve(home, port)
        banner.wait_for(state="hidden", timeout=30_000)
        context.clear_cookies()
        page.get_by_role("button", name="Details of Notes").click()
        banner.wait_for(state="visible")
        assert "session has ended" in banner.inner_text()
    finally:
        context.close()
        if proc.poll() is None:
            stop(proc)
