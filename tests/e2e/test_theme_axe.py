"""Every bundled theme, in the mode of its tone, on the main screens of the host page: no
serious or critical axe-core violation (contrast above all: a chip, a state word or a button
coloured from the palette must read in each theme, not only in the default one).

The default theme's screens are checked at every size by test_layout.py; here each theme once,
on a desktop, and the first light and dark ones on a phone too.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page

from atrium.theme.catalogue import ThemeCatalogue
from tests.e2e.conftest import VIEWPORTS, Served, axe_serious, go_home, tap

pytestmark = pytest.mark.e2e

#: (the control that opens it, the screen): the overlays of the host page
PANELS = [
    ("#open-procs", "#procs"),
    ("#open-theme", "#theme"),
    ("#open-catalogue", "#catalogue"),
]


@pytest.fixture
def api(served: Served) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {served.token}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=60) as client:
        before = client.get("/api/os/theme").json()
        yield client
        client.post(
            "/api/os/themes/select",
            json={
                k: before[k] for k in ("themeIdLight", "themeIdDark", "colorMode") if k in before
            },
        )


def select(api: httpx.Client, theme: str, tone: str) -> None:
    slot = "themeIdLight" if tone == "light" else "themeIdDark"
    chosen = api.post("/api/os/themes/select", json={slot: theme, "colorMode": tone})
    assert chosen.status_code == 200, chosen.text


def screens(page: Page) -> Iterator[str]:
    """Open each main screen in turn; yield its name while it is shown."""
    go_home(page)
    yield "home"
    for button, panel in PANELS:
        tap(page, button)
        page.locator(panel).wait_for(state="visible")
        page.wait_for_timeout(300)  # its content loads
        yield panel
        page.keyboard.press("Escape")
        page.locator(panel).wait_for(state="hidden")
    page.get_by_role("button", name="Details of Notes").click()
    page.locator("#detail").wait_for(state="visible")
    page.wait_for_timeout(300)
    yield "app detail"
    page.keyboard.press("Escape")
    page.locator("#detail").wait_for(state="hidden")
    tap(page, "#open-install")
    page.locator("#install").wait_for(state="visible")
    yield "install dialog"
    page.keyboard.press("Escape")
    page.locator("#install").wait_for(state="hidden")


#: the bundled themes, as `GET /api/os/themes` lists them (checked below): one test each
BUNDLED = [(t.id, t.tone.value) for t in ThemeCatalogue.load(None).themes()]


def test_the_bundled_themes_are_the_listed_ones(api: httpx.Client) -> None:
    listed = api.get("/api/os/themes").json()
    assert [(t["id"], t["tone"]) for t in listed] == BUNDLED


def check(
    browser: Browser, served: Served, api: httpx.Client, size: str, theme: str, tone: str
) -> None:
    select(api, theme, tone)
    width, height = VIEWPORTS[size]
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=tone)  # type: ignore[arg-type]
    found: list[str] = []
    try:
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{served.url}/login?token={served.token}")
        page.wait_for_selector("body[data-ready=true]")
        for screen in screens(page):
            found += [f"{theme} ({size}) {screen}: {v}" for v in axe_serious(page)]
    finally:
        context.close()
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(("theme", "tone"), BUNDLED, ids=[t for t, _ in BUNDLED])
def test_every_theme_passes_axe_on_the_main_screens(
    browser: Browser, served: Served, api: httpx.Client, theme: str, tone: str
) -> None:
    check(browser, served, api, "desktop", theme, tone)


@pytest.mark.parametrize("tone", ["light", "dark"])
def test_the_first_light_and_dark_themes_pass_axe_on_a_phone(
    browser: Browser, served: Served, api: httpx.Client, tone: str
) -> None:
    theme = next(t for t, of in BUNDLED if of == tone)
    check(browser, served, api, "phone", theme, tone)
