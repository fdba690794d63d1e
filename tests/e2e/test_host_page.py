"""The host page in a real browser: launch, live theming inside app iframes, strategies, the
chooser, the process manager, and isolation of app pages from the host page."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Frame, Page, Route
from playwright.sync_api import Error as PlaywrightError

from atrium.authoring.scaffold import create
from tests.conftest import REPO_DIR
from tests.e2e.conftest import CATALOGUED, Served, axe_serious, go_home, tap

pytestmark = pytest.mark.e2e

BG = "getComputedStyle(document.documentElement).getPropertyValue('--os-color-bg').trim()"


def api(served: Served) -> httpx.Client:
    return httpx.Client(
        base_url=served.url.replace("localhost", "127.0.0.1"),
        timeout=30,
        headers={"Authorization": f"Bearer {served.token}"},
    )


def select_theme(served: Served, **change: str) -> None:
    with api(served) as client:
        client.post("/api/os/themes/select", json=change).raise_for_status()


def app_frame(page: Page, app_id: str) -> Frame:
    """The frame of the first iframe showing ``app_id``, once its page has loaded."""
    page.wait_for_selector(f'iframe[data-app-id="{app_id}"]', state="attached")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for frame in page.frames:
            element = frame.frame_element() if frame.parent_frame else None
            if element and element.get_attribute("data-app-id") == app_id:
                try:
                    if (
                        frame.evaluate("document.readyState") == "complete"
                        and frame.url.startswith("http")
                        and "/_os/enter" not in frame.url
                    ):
                        return frame
                except PlaywrightError:  # the frame is navigating: look again
                    continue
        time.sleep(0.05)
    raise AssertionError(f"no loaded frame for {app_id}")


def page_stream_held(context: BrowserContext) -> list[Route]:
    """Every host page's own event stream in ``context`` held (its routes gathered, to be let
    through by the test); the notices' streams go on."""
    held: list[Route] = []

    def hold(route: Route) -> None:
        if "client=" in route.request.url:
            held.append(route)
        else:
            route.continue_()

    context.route("**/api/events?**", hold)
    return held


def launch(page: Page, app_id: str) -> Frame:
    go_home(page)  # an open app covers the home
    page.click(f'button.app[data-app-id="{app_id}"]')
    return app_frame(page, app_id)


def test_the_host_page_lists_the_apps(page: Page) -> None:
    names = page.locator("button.app").all_inner_texts()
    assert any("Notes" in n for n in names)
    assert any("OWN PALETTE" in n for n in names)


def test_a_theme_change_reaches_the_app_iframe_without_a_reload(page: Page, served: Served) -> None:
    select_theme(served, themeIdLight="atrium-light", themeIdDark="atrium-dark", colorMode="light")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    frame = launch(page, "com.atrium.notes")
    page.wait_for_function("() => document.getElementById('os-theme').textContent.length > 0")
    assert frame.evaluate(BG) == "#f6f7fb"
    frame.evaluate("window.__marker = 'still the same document'")
    tap(page, "#open-theme")
    page.select_option("#theme-light", "paper")
    frame.wait_for_function(f"() => {BG} === '#f5efe3'")
    assert frame.evaluate("window.__marker") == "still the same document"
    host_bg = page.evaluate(BG)
    assert host_bg == "#f5efe3"
    page.check('input[name="mode"][value="dark"]')
    frame.wait_for_function(f"() => {BG} === '#0f1117'")


def test_auto_mode_follows_the_browsers_color_scheme(page: Page, served: Served) -> None:
    select_theme(served, themeIdLight="glacier", themeIdDark="fjord", colorMode="auto")
    page.emulate_media(color_scheme="dark")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    frame = launch(page, "com.atrium.notes")
    assert page.evaluate(BG) == "#2e3440"
    assert frame.evaluate(BG) == "#2e3440"
    page.emulate_media(color_scheme="light")
    frame.wait_for_function(f"() => {BG} === '#eef4fa'")
    assert page.evaluate(BG) == "#eef4fa"


def test_a_themed_app_gets_the_metas_and_no_stylesheet(page: Page) -> None:
    frame = launch(page, "test.theme.themed")
    metas = frame.evaluate(
        "Object.fromEntries([...document.querySelectorAll('meta[name^=os-]')]"
        ".map(m => [m.name, m.content]))"
    )
    assert set(metas) == {"os-theme-id", "os-color-mode", "os-design-framework"}
    assert frame.evaluate("document.querySelectorAll('link[rel=stylesheet]').length") == 0


def test_an_override_app_gets_only_the_color_mode_meta(page: Page) -> None:
    frame = launch(page, "test.theme.override")
    names = frame.evaluate("[...document.querySelectorAll('meta[name^=os-]')].map(m => m.name)")
    assert names == ["os-color-mode"]
    assert frame.evaluate("document.querySelectorAll('link[rel=stylesheet]').length") == 0


def test_a_tied_intent_opens_the_chooser(page: Page) -> None:
    page.evaluate("() => { window.atrium.startIntent({action: 'test.intent.TIE'}); }")
    dialog = page.locator("#chooser")
    dialog.wait_for(state="visible")
    choices = dialog.locator("button[data-app-id]")
    assert choices.evaluate_all("bs => bs.map(b => b.dataset.appId)") == [
        "test.tie.app1",
        "test.tie.app2",
    ]
    choices.nth(1).click()
    app_frame(page, "test.tie.app2")


def test_the_process_manager_shows_a_crashed_instance(page: Page, served: Served) -> None:
    launch(page, "test.fault.crashes")
    tap(page, "#open-procs")
    with api(served) as client:
        crashing = next(
            i for i in client.get("/api/instances").json() if i["appId"] == "test.fault.crashes"
        )
        client.post(f"/api/proxy/{crashing['instanceId']}/crash")
    row = page.locator(f'tr[data-instance-id="{crashing["instanceId"]}"] td.state')
    row.filter(has_text="crashed").wait_for()  # the state in words, the reason as its title
    page.wait_for_function(
        """(id) => (document.querySelector(`tr[data-instance-id="${id}"] td.state`)?.title || '')
                   .includes('crashed')""",
        arg=crashing["instanceId"],
    )


def test_an_app_page_cannot_read_the_host_page_or_act_as_the_user(
    page: Page, served: Served
) -> None:
    frame = launch(page, "com.atrium.notes")
    read = frame.evaluate("""() => { try { return window.parent.document.title; }
                                     catch (e) { return 'blocked: ' + e.name; } }""")
    assert read.startswith("blocked")
    host = served.url
    result = frame.evaluate(
        """async (host) => {
             try {
               const r = await fetch(host + '/api/dist/install', {method: 'POST',
                 credentials: 'include', headers: {'Content-Type': 'application/json'},
                 body: JSON.stringify({ref: 'local:/tmp/x', autoApprove: true})});
               return 'status ' + r.status;
             } catch (e) { return 'blocked: ' + e.name; }
           }""",
        host,
    )
    assert result.startswith("blocked") or result in {"status 401", "status 403"}
    with api(served) as client:
        assert client.get("/api/dist/installed").json() == []
    cookie_less = frame.evaluate(
        """async (host) => {
             try {
               const r = await fetch(host + '/api/kv/os/pwned', {method: 'PUT',
                 headers: {'Content-Type': 'application/json'}, body: '{"value": 1}'});
               return 'status ' + r.status;
             } catch (e) { return 'blocked: ' + e.name; }
           }""",
        host,
    )
    assert cookie_less.startswith("blocked") or cookie_less in {"status 401", "status 403"}
    with api(served) as client:
        assert client.get("/api/kv/os/pwned").status_code == 404


def test_the_iframe_gets_the_theme_message_payload(page: Page, served: Served) -> None:
    frame = launch(page, "com.atrium.notes")
    frame.evaluate("""window.__msgs = [];
                      window.addEventListener('message', e => window.__msgs.push(e.data));""")
    select_theme(served, themeIdLight="meadow")
    frame.wait_for_function("() => window.__msgs.some(m => m.type === 'os.theme.changed')")
    message = frame.evaluate("window.__msgs.find(m => m.type === 'os.theme.changed')")
    assert message["themeIdLight"] == "meadow"
    assert json.dumps(message)


def test_an_app_asks_the_host_to_start_an_intent_and_the_user_allows_it(page: Page) -> None:
    frame = launch(page, "com.atrium.notes")
    frame.evaluate(
        "window.parent.postMessage({type: 'os.intent.start', "
        "intent: {action: 'test.intent.TIE'}}, '*')"
    )
    confirm = page.locator("#confirm")
    confirm.wait_for(state="visible")
    assert 'Notes wants to start "test.intent.TIE" with something' in confirm.inner_text()
    confirm.locator("button[value=yes]").click()
    page.locator("#chooser").wait_for(state="visible")
    page.locator('#chooser button[data-app-id="test.tie.app1"]').click()
    app_frame(page, "test.tie.app1")


def test_a_message_from_a_foreign_window_is_ignored(page: Page) -> None:
    page.evaluate(
        "window.postMessage({type: 'os.intent.start', intent: {action: 'test.intent.TIE'}}, '*')"
    )
    page.wait_for_timeout(500)
    assert not page.locator("#confirm").is_visible()


def test_an_app_opens_another_view_of_itself(page: Page) -> None:
    frame = launch(page, "test.theme.override")
    frame.evaluate(
        "window.parent.postMessage({type: 'os.activity.open', path: '/index.html', "
        "title: 'Second view'}, '*')"
    )
    page.locator(".tab", has_text="Second view").wait_for()
    assert page.locator('iframe[data-app-id="test.theme.override"]').count() == 2


def test_the_install_dialog_shows_the_diff_and_installs_on_approval(
    page: Page, served: Served, tmp_path: Path
) -> None:
    app_dir = tmp_path / "test.installed.viaui"
    shutil.copytree(REPO_DIR / "tests" / "apps" / "test.sdk.echo", app_dir)
    manifest = json.loads((app_dir / "app.manifest.json").read_text())
    manifest.update(
        {"id": "test.installed.viaui", "permissions": ["test.sdk.echo.read"], "warmPool": False}
    )
    manifest.pop("dataProvider")
    (app_dir / "app.manifest.json").write_text(json.dumps(manifest))
    tap(page, "#open-install")
    page.fill("#install-ref", f"local:{app_dir}")
    page.click("#install-go")
    page.locator("#install-diff").wait_for(state="visible")
    assert "test.sdk.echo.read" in page.locator("#install-diff").inner_text()
    page.click("#install-approve")
    page.locator("#install-result", has_text="installed").wait_for()
    page.click("#install-close")
    page.locator('button.app[data-app-id="test.installed.viaui"]').wait_for()
    with api(served) as client:
        records = client.get("/api/dist/installed").json()
        assert [r["id"] for r in records] == ["test.installed.viaui"]
        # the next viewport's run starts from nothing again
        client.delete("/api/dist/uninstall/test.installed.viaui").raise_for_status()


def test_the_install_dialog_reports_a_denial(page: Page, tmp_path: Path) -> None:
    app_dir = tmp_path / "test.denied.viaui"
    shutil.copytree(REPO_DIR / "tests" / "apps" / "test.sdk.echo", app_dir)
    manifest = json.loads((app_dir / "app.manifest.json").read_text())
    manifest.update({"id": "test.denied.viaui", "permissions": ["x.y.read"], "warmPool": False})
    manifest.pop("dataProvider")
    (app_dir / "app.manifest.json").write_text(json.dumps(manifest))
    tap(page, "#open-install")
    page.fill("#install-ref", f"local:{app_dir}")
    page.click("#install-go")
    page.locator("#install-deny").wait_for(state="visible")
    page.click("#install-deny")
    page.locator("#install-result", has_text="approval_denied").wait_for()


def _ran(page: Page | Frame) -> str | None:
    """The hostile page's report in its title, or None when its script never ran (a script that
    may run has run by the load event: a second of grace is plenty)."""
    try:
        page.wait_for_function("document.title.startsWith('ran')", timeout=1000)
    except PlaywrightError:
        return None
    return str(page.evaluate("() => document.title"))


def test_a_provider_answer_opened_as_the_user_runs_no_script(page: Page, served: Served) -> None:
    """Issue 13 row 2: an open provider entry answering HTML, opened on the host origin where the
    user's session cookie lives (a link, the address bar) or in a popup from an app's iframe, must
    not act as the user."""
    with api(served) as client:
        before = client.get("/api/os/theme").json()
    hostile = f"{served.url}/api/data/echo/open/hostile.html"
    response = page.goto(hostile)
    assert response is not None
    assert response.status == 200
    assert "sandbox" in response.headers["content-security-policy"]
    assert _ran(page) is None
    page.goto(served.url)
    page.wait_for_selector("body[data-ready=true]")
    frame = launch(page, "com.atrium.notes")
    with page.context.expect_page() as opened:
        frame.evaluate("(url) => { window.open(url); }", hostile)
    popup = opened.value
    popup.wait_for_load_state()
    assert _ran(popup) is None
    popup.close()
    # the same answer in an app's iframe, through that app's origin where its view cookie lives
    origin = "/".join(frame.url.split("/", 3)[:3])
    reply = frame.goto(f"{origin}/_os/api/data/echo/open/hostile.html")
    assert reply is not None
    assert reply.status == 200
    assert _ran(frame) is None
    with api(served) as client:
        assert client.get("/api/os/theme").json() == before


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_a_sibling_app_page_cannot_reach_another_apps_data_or_hooks(
    page: Page, served: Served
) -> None:
    """Issue 13 row 3: app B's page sends `no-cors` requests to app A's origin, where A's view
    cookie rides along (`*.localhost` origins are same-site): none may store a note in A."""
    marker = "written by a sibling page"
    notes = launch(page, "com.atrium.notes")  # A's view, and its view cookie, in this page
    notes_origin = "/".join(notes.url.split("/", 3)[:3])
    sibling = launch(page, "test.theme.override")
    sent = sibling.evaluate(
        """async ([origin, text]) => {
             const out = [];
             for (const path of ['/api/data/notes', '//api/data/notes', '/api/./data/notes',
                                 '/%61pi/data/notes', '/API/data/notes', '/x/../api/data/notes',
                                 '/api/lifecycle/onPause', '/']) {
               try {
                 await fetch(origin + path, {method: 'POST', mode: 'no-cors',
                   credentials: 'include', headers: {'Content-Type': 'text/plain'},
                   body: JSON.stringify({text})});
                 out.push(path);
               } catch (e) { out.push(path + ': ' + e.name); }
             }
             return out;
           }""",
        [notes_origin, marker],
    )
    assert "/api/data/notes" in sent  # sent; a no-cors answer is opaque to the sibling
    # a form posted by the sibling's page navigates to A's origin as a top-level request
    sibling.evaluate(
        """([origin, text]) => {
             const form = document.createElement('form');
             form.method = 'POST'; form.action = origin + '/api/data/notes';
             form.enctype = 'text/plain'; form.target = '_blank';
             const field = document.createElement('input');
             field.name = '{"text": "' + text + '", "x": "'; field.value = '"}';
             form.appendChild(field); document.body.appendChild(form); form.submit();
           }""",
        [notes_origin, marker],
    )
    time.sleep(1.5)
    assert _files_holding(served.home / "scopes", marker.encode()) == []


def test_notes_shows_a_note_another_caller_wrote_without_a_reload(
    page: Page, served: Served
) -> None:
    """`data:changed` reaches the Notes page (its EventSource on `/_os/api/events`)."""
    frame = launch(page, "com.atrium.notes")
    frame.wait_for_function("changes.readyState === EventSource.OPEN")  # listening
    loads = frame.evaluate("performance.getEntriesByType('navigation').length")
    text = f"written elsewhere {time.time_ns()}"
    with api(served) as client:
        client.post("/api/data/notes/notes", json={"text": text}).raise_for_status()
    frame.wait_for_selector(f"#list li:has-text('{text}')", timeout=10_000)
    assert frame.evaluate("performance.getEntriesByType('navigation').length") == loads


def test_always_use_this_remembers_and_the_defaults_panel_forgets(
    page: Page, served: Served
) -> None:
    tie = "test.intent.TIE"
    try:
        page.evaluate(f"() => {{ window.atrium.startIntent({{action: '{tie}'}}); }}")
        dialog = page.locator("#chooser")
        dialog.wait_for(state="visible")
        page.check("#chooser-remember")
        dialog.locator('button[data-app-id="test.tie.app1"]').click()
        app_frame(page, "test.tie.app1")
        with api(served) as client:
            remembered = [d["appId"] for d in client.get("/api/intents/defaults").json()]
            assert remembered == ["test.tie.app1"]
        # the next tie goes straight to it: no chooser
        page.evaluate(f"() => {{ window.atrium.startIntent({{action: '{tie}'}}); }}")
        page.wait_for_function("window.atrium.tabs.size >= 2")
        assert not dialog.is_visible()
        tap(page, "#open-defaults")
        row = page.locator('#default-rows li[data-app-id="test.tie.app1"]')
        row.wait_for(state="visible")
        assert tie in row.inner_text()
        row.get_by_role("button", name="Forget").click()
        page.locator("#default-rows li.status").wait_for(state="visible")
        page.evaluate(f"() => {{ window.atrium.startIntent({{action: '{tie}'}}); }}")
        dialog.wait_for(state="visible")
        assert not page.is_checked("#chooser-remember")  # never pre-ticked
        page.keyboard.press("Escape")
    finally:
        with api(served) as client:
            client.delete("/api/intents/defaults", params={"action": tie})


def test_the_versions_panel_rolls_back_and_restores_a_backup(
    page: Page, served: Served, tmp_path: Path
) -> None:
    app_id = "test.versions.viaui"
    source = tmp_path / app_id
    source.mkdir()
    shutil.copy(REPO_DIR / "tests" / "apps" / "test.plain.stdlib" / "server.py", source)

    def version(number: str) -> None:
        manifest = {"id": app_id, "name": "Versioned", "version": number,
                    "entrypoint": ["python3", "server.py"]}  # fmt: skip
        (source / "app.manifest.json").write_text(json.dumps(manifest))

    version("1.0.0")
    data = served.home / "scopes/global/apps" / app_id / f"{app_id}-1"
    try:
        with api(served) as client:
            body = {"ref": f"local:{source}", "autoApprove": True}
            client.post("/api/dist/install", json=body).raise_for_status()
            data.mkdir()
            (data / "notes.txt").write_text("written under 1.0.0")
            version("2.0.0")
            client.post(f"/api/dist/update/{app_id}", json={}).raise_for_status()
        (data / "notes.txt").write_text("migrated by 2.0.0")
        tap(page, "#open-versions")
        page.locator(f'#versions-app option[data-app-id="{app_id}"]').wait_for(state="attached")
        page.select_option("#versions-app", label=f"{app_id} (global, 2.0.0)")
        # newest first: the install of this run (an earlier run's history stays in the repository)
        row = page.locator('#history-rows tr[data-version="1.0.0"]').first
        row.get_by_role("button", name="Roll back").click()
        page.locator("#confirm").wait_for(state="visible")
        page.click('#confirm button[value="yes"]')
        page.locator("#versions-result", has_text="Rolled back to 1.0.0 with its data").wait_for()
        assert (data / "notes.txt").read_text() == "written under 1.0.0"
        # the list follows: 1.0.0 is current now, so only 2.0.0 offers a rollback
        page.wait_for_function(
            "document.querySelector('#history-rows tr')?.textContent.includes('rollback from')"
        )
        offered = page.locator("#history-rows tr", has=page.get_by_role("button", name="Roll back"))
        versions = offered.evaluate_all("rows => rows.map(r => r.dataset.version)")
        assert versions
        assert set(versions) == {"2.0.0"}
        # today's data went into a backup first: restore it from the list
        backup = page.locator("#backup-rows li", has_text="2.0.0 · rollback").first  # newest
        backup.get_by_role("button", name="Restore").click()
        page.click('#confirm button[value="yes"]')
        page.locator("#versions-result", has_text="Restored the data").wait_for()
        assert (data / "notes.txt").read_text() == "migrated by 2.0.0"
    finally:
        with api(served) as client:
            client.delete(f"/api/dist/uninstall/{app_id}")


def test_notes_shares_a_note_through_the_chooser(page: Page, served: Served) -> None:
    """The bundled apps reach the chooser: Notes and Viewer both take shared text."""
    text = f"shared {time.time_ns()}"
    with api(served) as client:
        client.post("/api/data/notes/notes", json={"text": text}).raise_for_status()
    frame = launch(page, "com.atrium.notes")
    share = frame.locator("#list li", has_text=text).get_by_role("button", name="Share")
    share.click()
    confirm = page.locator("#confirm")
    confirm.wait_for(state="visible")
    assert "Notes wants to share some text" in confirm.inner_text()
    assert text in confirm.inner_text()
    assert axe_serious(page) == [], "the confirmation"
    confirm.locator("button[value=yes]").click()
    chooser = page.locator("#chooser")
    chooser.wait_for(state="visible")
    assert axe_serious(page) == [], "the chooser"
    offered = chooser.locator("button[data-app-id]").evaluate_all(
        "bs => bs.map(b => b.dataset.appId)"
    )
    assert offered == ["com.atrium.notes", "com.atrium.viewer"]
    chooser.locator('button[data-app-id="com.atrium.viewer"]').click()
    viewer = app_frame(page, "com.atrium.viewer")
    viewer.wait_for_selector(f"text={text}")


def test_app_icons_are_images_glyphs_or_drawn_monograms(page: Page) -> None:
    svg = page.locator('button.app[data-app-id="test.icon.svg"] img.icon')
    svg.wait_for()
    page.wait_for_function(
        "document.querySelector('button.app[data-app-id=\\'test.icon.svg\\'] img').naturalWidth > 0"
    )
    # a private-use code point no font draws: a monogram of the name, never an empty box
    private = page.locator('button.app[data-app-id="test.icon.nofont"] .icon')
    assert private.get_attribute("class") == "icon monogram"
    assert private.inner_text() == "PG"
    # every card shows an image, a monogram, or a glyph the page's fonts can draw
    kinds = page.locator("button.app .icon").evaluate_all(
        "icons => icons.map(i => i.tagName === 'IMG' || i.classList.contains('monogram') || "
        "i.textContent.length > 0)"
    )
    assert kinds
    assert all(kinds)


def test_a_destroyed_instance_loses_its_tab_and_the_welcome_comes_back(
    page: Page, served: Served
) -> None:
    assert page.locator("#welcome").is_visible()
    launch(page, "com.atrium.viewer")
    assert page.locator("#welcome").is_hidden()
    instance = page.locator('iframe[data-app-id="com.atrium.viewer"]').get_attribute(
        "data-instance-id"
    )
    with api(served) as client:
        client.delete(f"/api/instances/{instance}").raise_for_status()
    page.wait_for_selector('iframe[data-app-id="com.atrium.viewer"]', state="detached")
    assert page.get_by_role("tab").count() == 0
    page.locator("#welcome").wait_for(state="visible")


def _first_event_id(served: Served, act: Callable[[], None]) -> int:
    """The id of the first ``app:state`` event after ``act`` ran, from a stream of the shell's
    own, opened before it."""
    with api(served) as client, client.stream("GET", "/api/events?topics=app:state") as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith(": connected")
        act()
        for line in lines:
            if line.startswith("id: "):
                return int(line[4:])
    raise AssertionError("the stream ended")


def test_an_earlier_instances_end_heard_late_leaves_the_tab_of_its_successor_open(
    browser: Browser, served: Served
) -> None:
    """An instance id is used again once it is gone (`<app>-1`). A stream behind the page's own
    answers (a shell under load, or a resume from an older id) brings the earlier instance's end
    after the page opened a tab of the new one: that tab stays, and an end of its own closes
    it."""
    with api(served) as client:
        for instance in client.get("/api/instances").json():
            if instance["appId"] == "com.atrium.viewer":
                client.delete(f"/api/instances/{instance['instanceId']}").raise_for_status()
        made: list[str] = []

        def make() -> None:
            made.append(
                client.post("/api/instances", json={"appId": "com.atrium.viewer"}).json()[
                    "instanceId"
                ]
            )

        before = _first_event_id(served, make) - 1
        client.delete(f"/api/instances/{made[0]}").raise_for_status()
    context = browser.new_context()
    try:
        held = page_stream_held(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        asked: list[str] = []
        page.on("requestfinished", lambda request: asked.append(request.url))
        page.goto(f"{served.url}/login?token={served.token}")
        page.wait_for_selector("body[data-ready=true]")
        launch(page, "com.atrium.viewer")
        frame = page.locator('iframe[data-app-id="com.atrium.viewer"]')
        assert frame.get_attribute("data-instance-id") == made[0], "the id is used again"
        assert len(held) == 1
        route = held[0]
        route.continue_(headers={**route.request.headers, "last-event-id": str(before)})
        # it hears the earlier instance's end, asks the shell and keeps the tab
        gone = f"/api/instances/{made[0]}"
        deadline = time.monotonic() + 15
        while not any(url.endswith(gone) for url in asked) and time.monotonic() < deadline:
            if page.get_by_role("tab").count() == 0:
                break
            page.wait_for_timeout(50)
        assert page.get_by_role("tab").count() == 1, "the new instance's tab was closed"
        assert any(url.endswith(gone) for url in asked)
        assert frame.is_visible()
        with api(served) as client:  # its own end closes it
            client.delete(gone).raise_for_status()
        frame.wait_for(state="detached")
        assert page.get_by_role("tab").count() == 0
    finally:
        context.close()


def test_install_walks_its_steps_in_plain_words_and_ends_with_open(
    page: Page, served: Served, tmp_path: Path
) -> None:
    app_id = "test.reader.viaui"
    app_dir = tmp_path / app_id
    shutil.copytree(REPO_DIR / "tests" / "apps" / "test.sdk.echo", app_dir)
    manifest = json.loads((app_dir / "app.manifest.json").read_text())
    manifest.update({"id": app_id, "name": "Reader", "permissions": ["com.atrium.notes.read"]})
    manifest.pop("dataProvider")
    manifest["warmPool"] = False
    (app_dir / "app.manifest.json").write_text(json.dumps(manifest))
    (app_dir / "index.html").write_text("<!doctype html><title>r</title><h1>Reader</h1>")
    try:
        tap(page, "#open-install")
        assert page.locator('#install .steps li[aria-current="step"]').inner_text() == "Source"
        page.fill("#install-ref", f"local:{app_dir}")
        page.click("#install-go")
        asks = page.locator('#install-asks li[data-permission="com.atrium.notes.read"]')
        asks.wait_for()
        assert "Read your notes" in asks.inner_text()  # Notes' own words for its permission
        assert "See the text of every note" in asks.inner_text()
        assert page.locator('#install .steps li[aria-current="step"]').inner_text() == "Review"
        primaries = page.locator("#install menu button.primary:visible")
        assert primaries.count() == 1  # one primary action per step
        assert axe_serious(page) == [], "install review"
        page.click("#install-approve")
        page.locator("#install-open").wait_for(state="visible")
        assert "Installed" in page.locator("#install-result").inner_text()
        assert page.locator("#install menu button.primary:visible").count() == 1
        assert axe_serious(page) == [], "install done"
        page.click("#install-open")
        app_frame(page, app_id)
    finally:
        with api(served) as client:
            client.delete(f"/api/dist/uninstall/{app_id}")


def test_app_detail_shows_what_an_app_is_and_may_do_and_uninstalls_it(
    page: Page, served: Served, tmp_path: Path
) -> None:
    app_id = "test.detail.viaui"
    app_dir = tmp_path / app_id
    shutil.copytree(REPO_DIR / "tests" / "apps" / "test.sdk.echo", app_dir)
    manifest = json.loads((app_dir / "app.manifest.json").read_text())
    manifest.update({"id": app_id, "name": "Detailed", "permissions": ["com.atrium.notes.write"]})
    manifest.pop("dataProvider")
    manifest["warmPool"] = False
    (app_dir / "app.manifest.json").write_text(json.dumps(manifest))
    with api(served) as client:
        body = {"ref": f"local:{app_dir}", "autoApprove": True}
        client.post("/api/dist/install", json=body).raise_for_status()
    page.get_by_role("button", name="Details of Detailed").click()
    detail = page.locator("#detail")
    detail.wait_for(state="visible")
    text = detail.inner_text()
    assert "Detailed 1.0.0" in text
    assert f"local:{app_dir}" in text
    assert "Change your notes" in text  # its permission, in Notes' words
    assert "com.atrium.notes.write" in text  # and the name it grants, under the words
    page.click("#detail-uninstall")
    page.click('#confirm button[value="yes"]')
    detail.wait_for(state="hidden")
    page.locator(f'button.app[data-app-id="{app_id}"]').wait_for(state="detached")
    # a bundled app shows no update or uninstall
    page.get_by_role("button", name="Details of Notes").click()
    detail.wait_for(state="visible")
    assert page.locator("#detail-uninstall").is_hidden()
    assert "bundled with Atrium" in detail.inner_text()
    page.keyboard.press("Escape")


def test_the_catalogue_installs_from_the_index_and_opens(page: Page, served: Served) -> None:
    try:
        tap(page, "#open-catalogue")
        row = page.locator(f'#catalogue-rows li[data-app-id="{CATALOGUED}"]')
        row.wait_for()
        assert "An app from the catalogue" in row.inner_text()
        row.get_by_role("button", name="Install Catalogued").click()
        page.locator("#install").wait_for(state="visible")
        # the review comes first, for any app: what it is, asks and offers, and the scope
        page.locator("#install-diff").wait_for(state="visible", timeout=30_000)
        assert page.locator("#install-app").inner_text() == "Catalogued"
        page.click("#install-approve")
        page.locator("#install-open").wait_for(state="visible", timeout=30_000)
        page.click("#install-open")
        app_frame(page, CATALOGUED)
        tap(page, "#open-catalogue")
        page.locator(f'#catalogue-rows li[data-app-id="{CATALOGUED}"] .chip.ok').wait_for()
    finally:
        with api(served) as client:
            client.delete(f"/api/dist/uninstall/{CATALOGUED}")


def test_an_app_installed_before_the_pages_stream_opened_is_on_the_launcher(
    browser: Browser, served: Served, tmp_path: Path
) -> None:
    """The page lists the apps, then opens its event stream: an app installed between the two
    was in neither (its `app:installed` went out before the stream's subscription), and stayed
    off the launcher until a reload. The stream is held here until the install is done."""
    folder = create(tmp_path, "com.example.meanwhile", "python")
    launcher = 'button.app[data-app-id="com.example.meanwhile"]'
    context = browser.new_context()
    try:
        held = page_stream_held(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{served.url}/login?token={served.token}")
        page.wait_for_selector("body[data-ready=true]")
        assert page.locator(launcher).count() == 0
        with api(served) as client:
            body = {"ref": f"local:{folder}", "autoApprove": True}
            client.post("/api/dist/install", json=body).raise_for_status()
        assert len(held) == 1
        held[0].continue_()
        page.locator(launcher).wait_for()
    finally:
        context.close()
        with api(served) as client:
            client.delete("/api/dist/uninstall/com.example.meanwhile")


def test_a_dev_copy_is_marked_in_the_launcher(page: Page, served: Served, tmp_path: Path) -> None:
    folder = create(tmp_path, "com.example.devmark", "python")
    body = {"ref": f"local:{folder}", "scope": "user", "autoApprove": True, "dev": True}
    with api(served) as client:
        client.post("/api/dist/install", json=body).raise_for_status()
    launcher = page.locator('button.app[data-app-id="com.example.devmark"]')
    chip = launcher.locator(".chip.dev")
    chip.wait_for()
    assert chip.inner_text() == "DEV"
    assert "atrium dev" in (chip.get_attribute("title") or "")
    with api(served) as client:
        client.delete("/api/dist/uninstall/com.example.devmark", params={"scope": "user"})
    launcher.wait_for(state="detached")
