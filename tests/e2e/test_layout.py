"""The host page on a desktop and a phone (issue 17): nothing off-screen, overlays close on Esc,
one tab per instance, named controls, and no serious or critical axe-core violation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from tests.e2e.conftest import ARTIFACTS, OFF_SCREEN, VIEWPORTS, Served, axe_serious

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


def fits(page: Page, where: str) -> None:
    found: dict[str, Any] = page.evaluate(OFF_SCREEN)
    assert found["scroll"] <= found["width"], f"{where}: the page scrolls sideways ({found})"
    assert found["out"] == [], f"{where}: controls outside the viewport: {found['out']}"


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
        page.click(button)
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
    page.click("#open-install")
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
    card.click()
    page.wait_for_timeout(300)
    assert page.locator('iframe[data-app-id="com.atrium.viewer"]').count() == 1
    assert tab.get_attribute("aria-selected") == "true"
    fits(page, f"{size} with a tab open")
    assert serious(page) == [], "with a tab open"
    shot(page, f"{size}-tab")
    page.get_by_role("button", name="Close Viewer").click()
    page.wait_for_selector('iframe[data-app-id="com.atrium.viewer"]', state="detached")
