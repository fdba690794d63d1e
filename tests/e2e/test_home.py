"""The home on a desktop and a phone: a grid of app names (an id only to tell two apps of one
name apart), search as you type, running apps marked, "Updates available (N)" with an update
that asks before it widens an app's permissions, and the phone's bottom bar."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests.conftest import REPO_DIR, TESTS_DIR
from tests.e2e.conftest import (
    ARTIFACTS,
    VIEWPORTS,
    Served,
    axe_serious,
    e2e_app,
    fits,
    go_home,
    serve_on,
    tap,
)

pytestmark = pytest.mark.e2e

UPDATABLE = "test.home.updatable"
PERMISSION = "com.atrium.notes.read"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def updatable_source(root: Path) -> str:
    """A bare git repository of UPDATABLE: v1.0.0, then v1.1.0 asking for one permission more."""
    work = root / "src" / UPDATABLE
    e2e_app(work.parent, UPDATABLE, name="Updatable", version="1.0.0", permissions=[])
    subprocess.run([*GIT, "init", "-q"], cwd=work, check=True, timeout=60)
    for version, permissions in (("1.0.0", []), ("1.1.0", [PERMISSION])):
        manifest = json.loads((work / "app.manifest.json").read_text())
        manifest.update({"version": version, "permissions": permissions})
        (work / "app.manifest.json").write_text(json.dumps(manifest))
        for args in (["add", "-A"], ["commit", "-qm", version], ["tag", f"v{version}"]):
            subprocess.run([*GIT, *args], cwd=work, check=True, timeout=60)
    bare = root / "src" / f"{UPDATABLE}.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, timeout=60)
    return f"git+{bare.as_uri()}#v1.0.0"


@pytest.fixture(scope="module")
def home_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    root = tmp_path_factory.mktemp("home")
    system = root / "system-apps"
    shutil.copytree(REPO_DIR / "apps", system)
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", system / "test.sdk.echo")
    e2e_app(system, "test.twin.books", name="Twin", description="Counts your receipts")
    e2e_app(system, "test.twin.games", name="Twin", description="A card game for two")
    # the catalogue knows a category of one of them (a manifest has none)
    entry = {
        "id": "test.twin.books",
        "name": "Twin",
        "categories": ["bookkeeping"],
        "sources": {"git": {"ref": "git+file:///nowhere/x.git"}},
    }
    index = root / "index.json"
    index.write_text(json.dumps({"schema": 1, "apps": [entry]}))
    ref = updatable_source(root)
    with serve_on(root, ATRIUM_SYSTEM_APPS=str(system), ATRIUM_INDEX_URL=index.as_uri()) as served:
        yield served, ref


def client(served: Served) -> httpx.Client:
    headers = {"Authorization": f"Bearer {served.token}"}
    return httpx.Client(base_url=served.url, headers=headers, timeout=120)


@pytest.fixture(params=list(VIEWPORTS))
def home(
    browser: Browser, home_served: tuple[Served, str], request: pytest.FixtureRequest
) -> Iterator[tuple[Page, str]]:
    served, _ = home_served
    width, height = VIEWPORTS[request.param]
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{served.url}/login?token={served.token}")
    page.wait_for_selector("body[data-ready=true]")
    yield page, request.param
    context.close()


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"home-{name}.png"))


def visible_cards(page: Page) -> list[str]:
    found: list[str] = page.locator("#apps .card:visible").evaluate_all(
        "cs => cs.map(c => c.dataset.appId)"
    )
    return found


def test_the_grid_shows_names_and_tells_two_of_one_name_apart(home: tuple[Page, str]) -> None:
    page, size = home
    notes = page.locator('button.app[data-app-id="com.atrium.notes"]')
    assert notes.locator(".name").inner_text() == "Notes"  # the name, no id, no scope word
    assert notes.locator(".tell").count() == 0
    grid = page.locator("#apps").inner_text()
    assert "com.atrium" not in grid
    assert " · " not in grid
    twins = {
        app_id: page.locator(f'button.app[data-app-id="{app_id}"] .tell').inner_text()
        for app_id in ("test.twin.books", "test.twin.games")
    }
    assert twins == {"test.twin.books": "test.twin.books", "test.twin.games": "test.twin.games"}
    details = page.locator('.card[data-app-id="test.twin.books"] .more').get_attribute("aria-label")
    assert details == "Details of Twin (test.twin.books)"
    # large icons: the grid's icons are far bigger than the old list's 32 px
    box = notes.locator(".icon").bounding_box()
    assert box is not None
    assert box["width"] >= 48
    fits(page, f"{size} home")
    assert axe_serious(page) == [], "home"
    shot(page, f"{size}-grid")


def test_search_filters_by_name_description_and_category(home: tuple[Page, str]) -> None:
    page, size = home
    page.locator("body").click(position={"x": 5, "y": 300})  # focus on nothing in particular
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "home-search"
    page.keyboard.type("receipts")  # a description
    page.wait_for_function("document.querySelectorAll('#apps .card:not([hidden])').length === 1")
    assert visible_cards(page) == ["test.twin.books"]
    page.fill("#home-search", "bookkeeping")  # a category, from the catalogue
    page.wait_for_function("document.querySelectorAll('#apps .card:not([hidden])').length === 1")
    assert visible_cards(page) == ["test.twin.books"]
    page.fill("#home-search", "view")  # a name
    page.wait_for_function("document.querySelectorAll('#apps .card:not([hidden])').length === 1")
    assert visible_cards(page) == ["com.atrium.viewer"]
    assert "1 of" in page.inner_text("#status")
    shot(page, f"{size}-search")
    page.fill("#home-search", "nothing like this")
    page.locator("#status", has_text="No app matches").wait_for()
    page.keyboard.press("Escape")
    assert page.input_value("#home-search") == ""
    assert "com.atrium.notes" in visible_cards(page)
    # in a field, / is typed, not taken
    page.keyboard.press("/")
    assert page.input_value("#home-search") == "/"


def test_a_running_app_is_marked_and_home_keeps_its_tab(
    home: tuple[Page, str], home_served: tuple[Served, str]
) -> None:
    page, size = home
    card = page.locator('.card[data-app-id="com.atrium.viewer"]')
    with client(home_served[0]) as api:  # no Viewer alive (an earlier run's closed tab left one)
        for instance in api.get("/api/instances").json():
            if instance["appId"] == "com.atrium.viewer":
                api.delete(f"/api/instances/{instance['instanceId']}").raise_for_status()
    card.locator(".running").wait_for(state="hidden")  # the mark goes with the instance
    card.locator("button.app").click()
    frame = page.locator('iframe[data-app-id="com.atrium.viewer"]')
    frame.wait_for()
    assert page.locator("#home").is_hidden()
    go_home(page)
    assert page.get_by_role("tab").count() == 1  # the tab stays open behind the home
    card.locator(".running").wait_for(state="visible")
    assert card.locator(".running").inner_text() == "Running"
    shot(page, f"{size}-running")
    page.get_by_role("tab", name="Viewer").click()
    frame.wait_for(state="visible")
    # the brand (desktop) or the Home button brings the home back too
    page.click("#brand" if size == "desktop" else "#go-home")
    page.locator("#home").wait_for(state="visible")
    page.get_by_role("tab", name="Viewer").click()
    page.get_by_role("button", name="Close Viewer").click()
    frame.wait_for(state="detached")
    page.locator("#home").wait_for(state="visible")


def test_the_phone_has_a_bottom_bar_and_an_app_takes_the_screen(home: tuple[Page, str]) -> None:
    page, size = home
    bar = page.locator("header.bar").bounding_box()
    assert bar is not None
    width, height = VIEWPORTS[size]
    if size == "desktop":
        assert bar["y"] == 0, "a top bar on a desktop"
        assert bar["height"] < 60, "one row on a desktop"
        for button in ("#open-catalogue", "#open-install", "#open-theme", "#open-procs"):
            assert page.locator(button).is_visible()
        return
    assert bar["height"] < 70, f"one row, not a wrapped header: {bar}"
    assert bar["y"] + bar["height"] == pytest.approx(height, abs=1), "at the bottom"
    # every header action is reachable from the Menu sheet, which fits the screen
    page.click("#open-menu")
    for button in ("#open-catalogue", "#open-install", "#open-theme", "#open-procs",
                   "#open-defaults", "#open-versions", "#open-users", "#open-account"):  # fmt: skip
        assert page.locator(button).is_visible(), button
    fits(page, "phone menu")
    assert axe_serious(page) == [], "phone menu"
    shot(page, "phone-menu")
    page.keyboard.press("Escape")
    page.locator("#open-theme").wait_for(state="hidden")
    tap(page, "#open-theme")
    page.locator("#theme").wait_for(state="visible")
    # an action closes the sheet, just after its own click handler opened the dialog
    page.locator("#open-theme").wait_for(state="hidden")
    page.keyboard.press("Escape")
    # an open app: all of the screen above the bar
    page.locator('button.app[data-app-id="com.atrium.notes"]').click()
    frame = page.locator('iframe[data-app-id="com.atrium.notes"]')
    frame.wait_for()
    box = frame.bounding_box()
    bar = page.locator("header.bar").bounding_box()
    assert box is not None
    assert bar is not None
    assert (box["x"], box["y"], box["width"]) == (0, 0, width)
    assert box["y"] + box["height"] == pytest.approx(bar["y"], abs=1)
    assert box["height"] >= height - 80
    fits(page, "phone app")
    shot(page, "phone-app")
    page.click("#go-home")
    page.locator("#home").wait_for(state="visible")
    assert page.get_by_role("tab").count() == 1
    page.get_by_role("tab", name="Notes").click()
    page.get_by_role("button", name="Close Notes").click()
    frame.wait_for(state="detached")


def test_updates_available_lists_a_newer_version_and_asks_before_widening(
    home: tuple[Page, str], home_served: tuple[Served, str]
) -> None:
    page, size = home
    served, ref = home_served
    with client(served) as api:
        api.post("/api/dist/install", json={"ref": ref, "autoApprove": True}).raise_for_status()
    try:
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        entry = page.locator("#home-updates")
        entry.wait_for(state="visible", timeout=30_000)
        assert entry.inner_text() == "Updates available (1)"
        fits(page, f"{size} home with updates")
        assert axe_serious(page) == [], "home with updates"
        shot(page, f"{size}-updates-entry")
        entry.click()
        row = page.locator(f'#update-rows li[data-app-id="{UPDATABLE}"]')
        row.wait_for()
        assert "Updatable" in row.inner_text()
        assert "1.0.0 → v1.1.0" in row.inner_text()
        row.get_by_role("button", name="Update Updatable").click()
        # the new version asks for more: its review, and nothing updated yet
        review = page.locator("#update-review")
        review.wait_for(state="visible", timeout=30_000)
        assert "Read your notes" in review.inner_text()
        with client(served) as api:
            record = next(r for r in api.get("/api/dist/installed").json() if r["id"] == UPDATABLE)
            assert record["version"] == "1.0.0"
        fits(page, f"{size} update review")
        assert axe_serious(page) == [], "update review"
        shot(page, f"{size}-update-review")
        page.click("#update-approve")
        page.locator("#updates-status", has_text="Updated Updatable to 1.1.0").wait_for(
            timeout=30_000
        )
        entry.wait_for(state="hidden")
        with client(served) as api:
            record = next(r for r in api.get("/api/dist/installed").json() if r["id"] == UPDATABLE)
            assert (record["version"], record["pinned"]) == ("1.1.0", "v1.1.0")
    finally:
        with client(served) as api:
            api.delete(f"/api/dist/uninstall/{UPDATABLE}")
