"""Browser tests: `atrium serve` as a subprocess and Debian's Chromium driven by Playwright.

- ``served``: one shell per test module (system apps: the repository's, the fixture apps, and the
  e2e apps made here), with its URL and token.
- ``browser``: one Chromium per module (`/usr/bin/chromium`; never a downloaded browser).
- ``page``: a fresh context per test, logged in to the host page, its screenshot saved under
  ``test-artifacts/`` at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, Page, sync_playwright

from tests.conftest import REPO_DIR, TESTS_DIR

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = REPO_DIR / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-quic",
    "--disable-sync",
]


#: an app icon file: a red square (the host page must show it as an image)
SVG_ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="32" height="32">'
    '<rect width="32" height="32" fill="#c00"/></svg>'
)


@dataclass
class Served:
    """A running `atrium serve`."""

    url: str
    token: str
    home: Path
    proc: subprocess.Popen[bytes]


def e2e_app(apps_dir: Path, app_id: str, **manifest: object) -> None:
    """A copy of the SDK echo app with its manifest changed (theme strategy, intent filters)."""
    target = apps_dir / app_id
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", target)
    data = json.loads((target / "app.manifest.json").read_text())
    data.update({"id": app_id, "warmPool": False, **manifest})
    data.pop("dataProvider")
    (target / "app.manifest.json").write_text(json.dumps(data))
    (target / "index.html").write_text(
        "<!doctype html><html><head><title>e2e</title></head><body><h1>e2e page</h1></body></html>"
    )


CATALOGUED = "test.catalogue.app"


def catalogue(root: Path) -> str:
    """A file:// index listing one app, tagged v1.0.0 in a bare git repository."""
    work = root / "catalogue" / CATALOGUED
    e2e_app(work.parent, CATALOGUED, name="Catalogued")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "v1"], ["tag", "v1.0.0"]):
        subprocess.run([*git, *args], cwd=work, check=True, timeout=60)
    bare = root / "catalogue" / f"{CATALOGUED}.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, timeout=60)
    entry = {
        "id": CATALOGUED,
        "name": "Catalogued",
        "description": "An app from the catalogue",
        "publisher": "Tests",
        "sources": {"git": {"ref": f"git+{bare.as_uri()}", "default-branch": "main"}},
        "channels": {"stable": {"git-tag": "v1.0.0"}},
    }
    index = root / "catalogue" / "index.json"
    index.write_text(json.dumps({"schema": 1, "apps": [entry]}))
    return index.as_uri()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("e2e")
    system = root / "system-apps"
    shutil.copytree(REPO_DIR / "apps", system)
    for name in ("test.fault.crashes", "test.sdk.echo"):
        shutil.copytree(TESTS_DIR / "apps" / name, system / name)
    e2e_app(system, "test.theme.themed", themeStrategy="themed")
    e2e_app(system, "test.theme.override", themeStrategy="override")
    for n in (1, 2):
        e2e_app(system, f"test.tie.app{n}", intentFilters=[{"action": "test.intent.TIE"}])
    e2e_app(system, "test.icon.svg", name="Drawn Icon", icon="icon.svg")
    (system / "test.icon.svg" / "icon.svg").write_text(SVG_ICON)
    e2e_app(system, "test.icon.nofont", name="Private Glyph", icon="\ue000")
    with serve_on(
        root,
        ATRIUM_SYSTEM_APPS=str(system),
        ATRIUM_INDEX_URL=catalogue(root),
    ) as served:
        yield served


@contextmanager
def serve_on(root: Path, *, clean_log: bool = False, **env: str) -> Iterator[Served]:
    """`atrium serve` on the home ``root/home`` with ``env`` added to this process's environment
    (its own ``ATRIUM_*`` left out), its stderr in ``root/shell.log``; stopped when the block
    ends (SIGTERM, SIGKILL after 15 s). ``clean_log``: a traceback in the log fails the test."""
    home = root / "home"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")}
    log_path = root / "shell.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "atrium", "serve"],
        env={**clean, "ATRIUM_HOME": str(home), "ATRIUM_PORT": "0", **env},
        cwd=REPO_DIR,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        url_file = home / "run" / "url"
        deadline = time.monotonic() + 30
        while not url_file.exists():
            assert proc.poll() is None, f"the shell exited at start: {log_path.read_text()}"
            assert time.monotonic() < deadline, "the shell did not start"
            time.sleep(0.05)
        token = (home / "run" / "token").read_text().strip()
        yield Served(url_file.read_text().strip(), token, home, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    if clean_log:
        assert "Traceback" not in log_path.read_text()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Playwright's sync API runs an event loop in this thread while it is open: module scope
    keeps it from outliving the browser tests (the e2e tier also runs last)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


#: every flow runs on a desktop and on a phone
VIEWPORTS: Final = {"desktop": (1280, 800), "phone": (390, 844)}
#: what lies outside the viewport: the page's scroll width and the controls off the sides
OFF_SCREEN: Final = """() => {
  const width = window.innerWidth;
  const out = [...document.querySelectorAll("button, select, input")]
    .filter((b) => b.offsetParent !== null && b.getClientRects().length)
    .filter((b) => { const r = b.getBoundingClientRect(); return r.left < -1 || r.right > width + 1; })
    .map((b) => b.getAttribute("aria-label") || b.textContent.trim() || b.id);
  return {scroll: document.documentElement.scrollWidth, width, out};
}"""


def fits(page: Page, where: str) -> None:
    """Nothing on ``page`` scrolls sideways or sits outside the viewport (`OFF_SCREEN`)."""
    found = page.evaluate(OFF_SCREEN)
    assert found["scroll"] <= found["width"], f"{where}: the page scrolls sideways ({found})"
    assert found["out"] == [], f"{where}: controls outside the viewport: {found['out']}"


@pytest.fixture(params=list(VIEWPORTS))
def page(browser: Browser, served: Served, request: pytest.FixtureRequest) -> Iterator[Page]:
    width, height = VIEWPORTS[request.param]
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{served.url}/login?token={served.token}")
    page.wait_for_selector("body[data-ready=true]")
    yield page
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"))
    found = page.evaluate(OFF_SCREEN)
    context.close()
    # whatever the flow left on screen fits it: no sideways scroll, no control off the edge
    assert found["scroll"] <= found["width"], f"the page scrolls sideways: {found}"
    assert found["out"] == [], f"controls outside the viewport: {found['out']}"


def tap(page: Page, selector: str) -> None:
    """Click a header action. On a phone the actions other than Home sit in the Menu sheet of the
    bottom bar: the Menu button opens it first, as a person would."""
    target = page.locator(selector)
    if not target.is_visible() and page.locator("#open-menu").is_visible():
        page.click("#open-menu")
    target.click()


def go_home(page: Page) -> None:
    """Back to the home (the open tabs stay), as the Home button does."""
    if not page.locator("#home").is_visible():
        page.click("#go-home")
    page.locator("#home").wait_for(state="visible")


def axe_serious(page: Page) -> list[str]:
    """axe-core's serious and critical violations on what the page shows now."""
    results = Axe().run(page)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:3]}"
        for v in results.response["violations"]
        if v["impact"] in {"serious", "critical"}
    ]
