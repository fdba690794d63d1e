"""The host page on a desktop and a phone (issue 17): nothing off-screen, overlays close on Esc,
one tab per instance, named controls, and no serious or critical axe-core violation."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests.conftest import REPO_DIR
from tests.e2e.conftest import ARTIFACTS, VIEWPORTS, Served, axe_serious, fits, go_home, tap

#: the screens are also checked at the narrowest width the page supports
SIZES = {**VIEWPORTS, "narrow": (360, 740)}


@pytest.fixture(params=list(SIZES))
def sized(
    browser: Browser, served: Served, request: pytest.FixtureRequest
) -> Iterator[tuple[Page, str]]:
    width, height = SIZES[request.param]
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{served.url}/login?token={served.token}")
    page.wait_for_selector("body[data-ready=true]")
    yield page, request.param
    context.close()


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"layout-{name}.png"))


def serious(page: Page) -> list[str]:
    return axe_serious(page)


def test_every_screen_fits_and_passes_axe(sized: tuple[Page, str]) -> None:
    page, size = sized
    fits(page, f"{size} launcher")
    assert serious(page) == [], "launcher"
    shot(page, f"{size}-launcher")
    for button, panel in [
        ("#open-procs", "#procs"),
        ("#open-theme", "#theme"),
        ("#open-defaults", "#defaults"),
        ("#open-versions", "#versions"),
        ("#open-catalogue", "#catalogue"),
    ]:
        tap(page, button)
        page.locator(panel).wait_for(state="visible")
        page.wait_for_timeout(200)  # its content loads
        fits(page, f"{size} {panel}")
        assert serious(page) == [], panel
        shot(page, f"{size}-{panel[1:]}")
        page.keyboard.press("Escape")  # every overlay closes on Esc
        page.locator(panel).wait_for(state="hidden")
    page.get_by_role("button", name="Details of Notes").click()
    page.locator("#detail").wait_for(state="visible")
    fits(page, f"{size} app detail")
    assert serious(page) == [], "app detail"
    shot(page, f"{size}-detail")
    page.keyboard.press("Escape")
    page.locator("#detail").wait_for(state="hidden")
    tap(page, "#open-install")
    page.locator("#install").wait_for(state="visible")
    fits(page, f"{size} install dialog")
    assert serious(page) == [], "install dialog"
    shot(page, f"{size}-install")
    page.keyboard.press("Escape")
    page.locator("#install").wait_for(state="hidden")


def test_a_second_click_on_an_app_focuses_its_tab(sized: tuple[Page, str]) -> None:
    page, size = sized
    card = page.locator('button.app[data-app-id="com.atrium.viewer"]')
    card.click()
    page.wait_for_selector('iframe[data-app-id="com.atrium.viewer"]', state="attached")
    tab = page.get_by_role("tab", name="Viewer")
    tab.wait_for()
    go_home(page)  # the home is behind the open app: its Home button brings it back
    card.click()
    page.wait_for_timeout(300)
    assert page.locator('iframe[data-app-id="com.atrium.viewer"]').count() == 1
    assert tab.get_attribute("aria-selected") == "true"
    fits(page, f"{size} with a tab open")
    assert serious(page) == [], "with a tab open"
    shot(page, f"{size}-tab")
    page.get_by_role("button", name="Close Viewer").click()
    page.wait_for_selector('iframe[data-app-id="com.atrium.viewer"]', state="detached")


def test_the_versions_panel_fits_a_phone_with_a_long_app_id(
    browser: Browser, served: Served, tmp_path: Path
) -> None:
    """An installed app with a 32-character id: the Versions panel's app select (as wide as its
    longest option unless told otherwise) stays within a 390 px screen."""
    app_id = "com.example.long-app-id-for-phon"
    assert len(app_id) == 32
    source = tmp_path / app_id
    source.mkdir()
    shutil.copy(REPO_DIR / "tests" / "apps" / "test.plain.stdlib" / "server.py", source)
    manifest = {"id": app_id, "name": "Long Id", "version": "1.0.0",
                "entrypoint": ["python3", "server.py"]}  # fmt: skip
    (source / "app.manifest.json").write_text(json.dumps(manifest))
    headers = {"Authorization": f"Bearer {served.token}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=60) as client:
        body = {"ref": f"local:{source}", "autoApprove": True}
        client.post("/api/dist/install", json=body).raise_for_status()
        context = browser.new_context(viewport={"width": 390, "height": 844})
        try:
            page = context.new_page()
            page.set_default_timeout(15_000)
            page.goto(f"{served.url}/login?token={served.token}")
            page.wait_for_selector("body[data-ready=true]")
            tap(page, "#open-versions")
            page.locator(f'#versions-app option[data-app-id="{app_id}"]').wait_for(state="attached")
            page.select_option("#versions-app", label=f"{app_id} (global, 1.0.0)")
            box = page.locator("#versions-app").bounding_box()
            shot(page, "phone-versions-long-id")
            assert box is not None
            assert box["x"] >= 0
            assert box["x"] + box["width"] <= 390, f"the select reaches {box}"
            fits(page, "phone versions with a long id")
        finally:
            context.close()
            client.delete(f"/api/dist/uninstall/{app_id}")
