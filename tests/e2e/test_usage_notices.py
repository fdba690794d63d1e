"""The home's widgets and the notifications centre, on a desktop and a phone: the machine's
figures and the running apps by name, kept current by `system:usage`; a crash becomes a notice
with an unread count that opening the panel clears, kept across a reload, and one that happened
while no page was open is there when the page comes back; no serious or critical axe finding."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from atrium.theme.catalogue import ThemeCatalogue
from tests.e2e.conftest import ARTIFACTS, VIEWPORTS, Served, axe_serious, go_home, tap

pytestmark = pytest.mark.e2e

CRASHES = "test.fault.crashes"
#: the bundled themes and their tones
BUNDLED = [(t.id, t.tone.value) for t in ThemeCatalogue.load(None).themes()]


#: the last event id the notifications centre stored (localStorage, per user)
LAST_ID = """(() => {
  const key = Object.keys(localStorage).find((k) => k.startsWith("atrium.notices."));
  return key ? JSON.parse(localStorage.getItem(key) || "null")?.lastId ?? null : null;
})()"""


def client(served: Served) -> httpx.Client:
    return httpx.Client(
        base_url=served.url.replace("localhost", "127.0.0.1"),
        timeout=30,
        headers={"Authorization": f"Bearer {served.token}"},
    )


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    size = page.viewport_size or {"width": 0}
    page.screenshot(path=str(ARTIFACTS / f"usage-{name}-{size['width']}.png"))


def start(served: Served, app_id: str) -> str:
    with client(served) as api:
        answer = api.post("/api/instances", json={"appId": app_id, "new": True})
        assert answer.status_code == 200, answer.text
        instance_id: str = answer.json()["instanceId"]
        assert api.post(f"/api/instances/{instance_id}/resumed").status_code == 200
        return instance_id


def crash(served: Served) -> str:
    instance_id = start(served, CRASHES)
    with client(served) as api:
        assert api.post(f"/api/proxy/{instance_id}/crash").status_code == 200
    return instance_id


def destroy(served: Served, instance_id: str) -> None:
    with client(served) as api:
        api.post(f"/api/instances/{instance_id}/stop")
        api.post(f"/api/instances/{instance_id}/destroy")


def test_the_widgets_show_the_figures_and_follow_the_event(page: Page, served: Served) -> None:
    go_home(page)
    widgets = page.locator("#usage")
    expect(widgets).to_be_visible()
    expect(page.locator("#widget-cpu .widget-value")).to_have_text(
        re.compile(r"^\d+(\.\d)?% busy$")
    )
    expect(page.locator("#widget-memory .widget-value")).to_have_text(
        re.compile(r"^\d+(\.\d)? [KMGT]?B of \d+(\.\d)? [KMGT]?B$")
    )
    expect(page.locator("#widget-disk .widget-note")).to_have_text(re.compile(r" free$"))
    first = widgets.get_attribute("data-at")
    # an app started elsewhere appears by its name with the next figures from the stream
    instance_id = start(served, "test.sdk.echo")
    try:
        row = page.locator(f'#widget-apps li[data-instance-id="{instance_id}"]')
        expect(row).to_be_visible(timeout=20_000)
        assert widgets.get_attribute("data-at") != first
        with client(served) as api:
            name = next(
                a["name"] for a in api.get("/api/apps").json() if a["id"] == "test.sdk.echo"
            )
        expect(row.locator(".widget-app-name")).to_have_text(re.compile(re.escape(name)))
        expect(row.locator(".widget-app-figures")).to_have_text(
            re.compile(r"^\d+(\.\d)? [KMGT]?B · \d+(\.\d)?% CPU$")
        )
        assert axe_serious(page) == []
        shot(page, "widgets")
    finally:
        destroy(served, instance_id)


def test_a_crash_is_a_notice_with_an_unread_count_cleared_by_opening(
    page: Page, served: Served
) -> None:
    bell = page.locator("#open-notices")
    expect(bell).to_be_visible()
    expect(page.locator("#notices-count")).to_be_hidden()
    crashed = crash(served)
    expect(page.locator("#notices-count")).to_have_text("1", timeout=20_000)
    expect(bell).to_have_attribute("aria-label", "Notifications: 1 unread")
    assert axe_serious(page) == []
    shot(page, "badge")
    tap(page, "#open-notices")
    panel = page.locator("#notices")
    expect(panel).to_be_visible()
    row = panel.locator("li.notice").first
    expect(row).to_contain_text("Crashes stopped unexpectedly")
    expect(row).to_contain_text("exit code 7")
    expect(row.locator("time")).to_have_text(re.compile(r"\d"))
    expect(page.locator("#notices-count")).to_be_hidden()
    expect(bell).to_have_attribute("aria-label", "Notifications")
    assert axe_serious(page) == []
    shot(page, "panel")
    page.keyboard.press("Escape")
    expect(panel).to_be_hidden()
    expect(bell).to_have_attribute("aria-expanded", "false")
    destroy(served, crashed)

    # kept across a reload, read
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator("#notices-count")).to_be_hidden()
    tap(page, "#open-notices")
    expect(page.locator("#notices li.notice")).to_have_count(1)
    page.keyboard.press("Escape")

    # a crash while no page is open is there when the page comes back
    url = page.url
    # the page stored the id of the last event it heard (the crash's or a later system:usage's):
    # the replay starts there, so the first crash is not told again. Nothing is waited for: a
    # system:usage carries the newest stored id, which may be the one already heard.
    heard = page.evaluate(f"() => {LAST_ID}")
    assert heard is not None, "the page stored no event id"
    page.goto("about:blank")
    crashed = crash(served)
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator("#notices-count")).to_have_text("1", timeout=20_000)
    destroy(served, crashed)


#: each theme on a desktop; the first light and dark ones on a phone too
THEMED = [("desktop", theme, tone) for theme, tone in BUNDLED] + [
    ("phone", next(t for t, of in BUNDLED if of == tone), tone) for tone in ("light", "dark")
]


@pytest.mark.parametrize(("size", "theme", "tone"), THEMED, ids=[f"{s}-{t}" for s, t, _ in THEMED])
def test_the_widgets_and_a_notice_pass_axe_in_every_theme(
    browser: Browser, served: Served, size: str, theme: str, tone: str
) -> None:
    """The theme in the mode of its tone: the widgets with their figures, the bell and the open
    panel with a crash notice (axe reads the whole page, the widgets beside the panel too)."""
    width, height = VIEWPORTS[size]
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=tone)  # type: ignore[arg-type]
    with client(served) as api:
        before = api.get("/api/os/theme").json()
        slot = "themeIdLight" if tone == "light" else "themeIdDark"
        chosen = api.post("/api/os/themes/select", json={slot: theme, "colorMode": tone})
        assert chosen.status_code == 200, chosen.text
        try:
            page = context.new_page()
            page.set_default_timeout(15_000)
            page.goto(f"{served.url}/login?token={served.token}")
            page.wait_for_selector("body[data-ready=true]")
            crashed = crash(served)
            expect(page.locator("#notices-count")).to_have_text("1", timeout=20_000)
            expect(page.locator("#usage")).to_be_visible()
            tap(page, "#open-notices")
            page.locator("#notices li.notice").first.wait_for()
            found = axe_serious(page)
            shot(page, f"{size}-{theme}")
            destroy(served, crashed)
        finally:
            context.close()
            api.post(
                "/api/os/themes/select",
                json={k: before[k] for k in ("themeIdLight", "themeIdDark", "colorMode")},
            )
    assert found == [], "\n".join(found)
