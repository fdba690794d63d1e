"""The author loop in the browser: `atrium dev` running, the app open in a tab; a save reloads
that tab's frame in place with a "reloaded" note, a broken save shows the problem over the last
good page, and the tab stays the same one throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from atrium.authoring.scaffold import create
from tests.e2e.conftest import ARTIFACTS, Served
from tests.e2e.test_host_page import app_frame

pytestmark = pytest.mark.e2e
APP = "com.example.reloads"


def heading(page: Page) -> str:
    return str(app_frame(page, APP).evaluate("document.querySelector('h1').textContent"))


@pytest.fixture
def dev_page(browser: Browser, served: Served, tmp_path: Path) -> Iterator[tuple[Page, Path]]:
    """`atrium dev` on a fresh app folder (a real process) and a signed-in desktop page."""
    folder = create(tmp_path, APP, "stdlib")
    env = {**os.environ, "ATRIUM_URL": served.url, "ATRIUM_TOKEN": served.token, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "atrium", "dev", str(folder)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = ""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        while "Watching" not in seen:
            line = proc.stdout.readline()
            assert line, seen
            seen += line
        # the command says where to look at the app
        url = f"{served.url}/#app={APP}"
        assert url in seen, seen
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{served.url}/login?token={served.token}")
        page.wait_for_selector("body[data-ready=true]")
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]")
        yield page, folder
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dev_reload.png"))
    finally:
        context.close()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)


def test_a_save_reloads_the_open_tab_in_place_and_a_broken_one_shows_why(
    dev_page: tuple[Page, Path],
) -> None:
    page, folder = dev_page
    assert heading(page) == "Reloads"
    tab = page.locator("#tabs .tab")
    assert tab.count() == 1
    tab.first.evaluate("t => { t.dataset.marker = 'the same tab' }")

    index = folder / "index.html"
    index.write_text(index.read_text().replace("<h1>Reloads</h1>", "<h1>Saved</h1>"))
    page.locator(".toast", has_text="reloaded").wait_for()
    app_frame(page, APP).wait_for_function("document.querySelector('h1').textContent === 'Saved'")
    assert tab.count() == 1
    assert tab.first.get_attribute("data-marker") == "the same tab"
    assert not page.locator(f'iframe[data-app-id="{APP}"]').first.is_hidden()

    # a broken manifest: the problem is shown over the page, which stays the last good one
    manifest = folder / "app.manifest.json"
    good = manifest.read_text()
    manifest.write_text(good.replace('"version": "0.1.0"', '"version": "zero"'))
    problem = page.locator(".dev-problem")
    problem.wait_for()
    assert "not a semver" in problem.inner_text()
    assert problem.get_attribute("role") == "alert"
    assert heading(page) == "Saved"
    assert tab.count() == 1

    # a save that does not start: said so, over the last good page
    manifest.write_text(good)
    server = folder / "server.py"
    working = server.read_text()
    server.write_text(working + "\ndef broken(:\n")
    page.locator(".dev-problem", has_text="did not start").wait_for()
    assert heading(page) == "Saved"
    assert tab.first.get_attribute("data-marker") == "the same tab"

    # fixed: reloaded again, the problem gone
    server.write_text(working)
    index.write_text(index.read_text().replace("<h1>Saved</h1>", "<h1>Fixed</h1>"))
    problem.wait_for(state="detached")
    app_frame(page, APP).wait_for_function("document.querySelector('h1').textContent === 'Fixed'")
    assert tab.first.get_attribute("data-marker") == "the same tab"
