"""The store: the catalogue as cards (search, categories, states), the add-a-catalogue step of a
shell without one, and the install review in plain words with the scope chosen on the review.
Each flow runs on a desktop and on a phone; screenshots go to ``test-artifacts/``."""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
import threading
import zlib
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page

from atrium.theme.catalogue import ThemeCatalogue
from tests.conftest import REPO_DIR
from tests.e2e.conftest import (
    ARTIFACTS,
    CATALOGUED,
    VIEWPORTS,
    Served,
    axe_serious,
    catalogue,
    fits,
    serve_on,
)
from tests.integration.test_image_apps import CONFIG as HTTPD_CONFIG
from tests.integration.test_image_apps import httpd_layers
from tests.integration.test_image_layouts import write_layout

pytestmark = pytest.mark.e2e


def png(width: int = 160, height: int = 100) -> bytes:
    """A blue PNG (the screenshot a catalogue entry names over http)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    rows = b"".join(b"\x00" + bytes([40, 90, 160]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def entry(
    app_id: str, name: str, description: str, categories: list[str], **more: object
) -> dict[str, object]:
    return {
        "id": app_id,
        "name": name,
        "description": description,
        "publisher": {"name": "Somebody Else"},
        "categories": categories,
        "sources": {"git": {"ref": f"git+file:///nowhere/{app_id}.git"}},
        "channels": {"stable": {"git-tag": "v2.3.0"}},
        **more,
    }


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An http server for the screenshots (a browser shows http(s) images, never file://)."""
    folder = tmp_path_factory.mktemp("pictures")
    (folder / "shot.png").write_bytes(png())
    handler = partial(SimpleHTTPRequestHandler, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def rich_catalogue(root: Path, pictures: str) -> str:
    """The conftest's installable entry (with categories, size and screenshots added) and three
    entries to search and filter among (their sources do not exist: they are only shown)."""
    url = catalogue(root)
    index_file = root / "catalogue" / "index.json"
    index = json.loads(index_file.read_text())
    index["apps"][0].update(
        categories=["productivity"],
        size=123_456,
        screenshots=[f"{pictures}/shot.png", "local-shot.png"],
    )
    index["apps"] += [
        entry(
            "org.example.photos", "Photo Wall", "Your pictures on a wall", ["media"], size=4_200_000
        ),
        entry(
            "org.example.ledger",
            "Ledger",
            "Money in and out, by month",
            ["productivity", "finance"],
            homepage="https://ledger.example/",
            publisher={"name": "Somebody Else", "url": "https://somebody.example/"},
        ),
        entry("org.example.radio", "Radio", "Listen to stations from anywhere", ["media"]),
        # an image app described by its entry, with its icon as a data: URL (only shown here)
        {
            "id": "org.example.clock",
            "name": "Clock",
            "description": "The time, from a container image",
            "categories": ["tools"],
            "version": "1.2.0",
            "icon": "data:image/png;base64," + base64.b64encode(png(32, 32)).decode(),
            "runtime": {"image": "registry.invalid/clock:1", "health": {"path": "/"}},
        },
    ]
    index_file.write_text(json.dumps(index))
    return url


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, pictures: str) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("store")
    with serve_on(root, ATRIUM_INDEX_URL=rich_catalogue(root, pictures)) as served:
        yield served


def client(served: Served) -> httpx.Client:
    return httpx.Client(
        base_url=served.url.replace("localhost", "127.0.0.1"),
        timeout=30,
        headers={"Authorization": f"Bearer {served.token}"},
    )


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"store-{name}.png"))


def card(page: Page, app_id: str) -> Locator:
    return page.locator(f'#catalogue-rows li[data-app-id="{app_id}"]')


def visible_cards(page: Page) -> list[str]:
    ids: list[str] = page.eval_on_selector_all(
        "#catalogue-rows li:not([hidden])", "(cards) => cards.map((c) => c.dataset.appId)"
    )
    return sorted(ids)


def tap(page: Page, selector: str) -> None:
    """A header action; on a phone it may sit behind the Menu button."""
    target = page.locator(selector)
    menu = page.locator("#open-menu")
    if not target.is_visible() and menu.count() and menu.is_visible():
        menu.click()
    target.click()


def open_store(page: Page) -> None:
    tap(page, "#open-catalogue")
    page.locator("#catalogue").wait_for(state="visible")
    card(page, CATALOGUED).wait_for()


def test_cards_show_what_each_app_is_and_search_and_categories_filter_them(
    page: Page, request: pytest.FixtureRequest
) -> None:
    size = request.node.callspec.params["page"]
    assert page.locator("#open-catalogue").inner_text() == "Store"
    open_store(page)
    text = card(page, CATALOGUED).inner_text()
    for words in (
        "Catalogued",
        "An app from the catalogue",
        "productivity",
        "by Tests",
        "123\xa0KB",
        "version 1.0.0",
    ):
        assert words in text, (words, text)
    photos = card(page, "org.example.photos").inner_text()
    assert "4.2\xa0MB" in photos
    assert "by Somebody Else" in photos
    assert "version 2.3.0" in photos
    assert card(page, CATALOGUED).get_by_role("button", name="Install Catalogued").is_visible()
    # the app's and its publisher's pages are links, opened apart from the shell
    links = card(page, "org.example.ledger").locator(".links a")
    assert [links.nth(n).get_attribute("href") for n in range(links.count())] == [
        "https://ledger.example/",
        "https://somebody.example/",
    ]
    assert links.first.get_attribute("rel") == "noopener noreferrer"
    assert card(page, "org.example.radio").locator(".links a").count() == 0
    # an image entry shows its own icon and version
    assert "version 1.2.0" in card(page, "org.example.clock").inner_text()
    page.wait_for_function(
        'document.querySelector(\'#catalogue-rows li[data-app-id="org.example.clock"] '
        "img.icon')?.naturalWidth === 32"
    )
    # the http screenshot shows; the file:// one is left out (a browser cannot show it)
    shots = card(page, CATALOGUED).locator(".shot img")
    assert shots.count() == 1
    page.wait_for_function("document.querySelector('#catalogue-rows .shot img').naturalWidth > 0")
    assert page.locator("#catalogue img[src^='file:']").count() == 0
    fits(page, "store")
    assert axe_serious(page) == [], "store"
    shot(page, f"{size}-cards")
    # search as you type: name, description, category
    page.fill("#store-search", "stations")
    assert visible_cards(page) == ["org.example.radio"]
    page.fill("#store-search", "media")
    assert visible_cards(page) == ["org.example.photos", "org.example.radio"]
    page.fill("#store-search", "nothing like this")
    page.locator("#store-none", has_text="No app").wait_for()
    page.fill("#store-search", "")
    # a category chip narrows the cards, All brings them back
    page.locator("#store-categories button", has_text="finance").click()
    assert visible_cards(page) == ["org.example.ledger"]
    assert page.locator("#store-categories button[aria-pressed=true]").inner_text() == "finance"
    page.locator("#store-categories button", has_text="productivity").click()
    assert visible_cards(page) == ["org.example.ledger", CATALOGUED]
    page.fill("#store-search", "money")
    assert visible_cards(page) == ["org.example.ledger"]
    shot(page, f"{size}-filtered")
    page.fill("#store-search", "")
    page.locator("#store-categories button", has_text="All").click()
    assert len(visible_cards(page)) == 5
    # a screenshot enlarges
    card(page, CATALOGUED).locator(".shot").click()
    page.locator("#shot").wait_for(state="visible")
    assert axe_serious(page) == [], "screenshot"
    page.click("#shot-close")
    page.keyboard.press("Escape")
    page.locator("#catalogue").wait_for(state="hidden")


def test_the_review_says_what_the_app_is_and_installs_into_the_scope_chosen_on_it(
    page: Page, served: Served, request: pytest.FixtureRequest
) -> None:
    size = request.node.callspec.params["page"]
    with client(served) as api:
        # global warns about unsigned apps; the user scope checks nothing (policy off)
        answer = api.put("/api/scopes/global/trust", json={"policy": "warn", "keys": []})
        assert answer.status_code == 200, answer.text
    try:
        open_store(page)
        card(page, CATALOGUED).get_by_role("button", name="Install Catalogued").click()
        review = page.locator("#install-diff")
        review.wait_for(state="visible")
        assert page.locator("#install-app").inner_text() == "Catalogued"
        assert page.locator('#install .steps li[aria-current="step"]').inner_text() == "Review"
        assert "Published by Tests" in review.inner_text()
        assert "Not signed" in page.locator("#install-trust").inner_text()
        facts = page.locator("#install-facts").inner_text()
        assert "a git repository" in facts
        assert "the catalogue" in facts
        assert "123\xa0KB" in facts
        # what it may use, in words: it names no resources, so the administrator's default
        assert (
            "It may use up to 1024 MiB of memory and 1024 processes (the administrator's "
            "default)." in facts
        )
        assert "Nothing: it asks for no permissions." in page.locator("#install-asks").inner_text()
        assert "Nothing to other apps." in page.locator("#install-offers").inner_text()
        assert page.locator('input[name="install-scope"][value="global"]').is_checked()
        assert page.locator("#install menu button.primary:visible").count() == 1
        fits(page, "review")
        assert axe_serious(page) == [], "install review"
        shot(page, f"{size}-review")
        # the scope is chosen here: the review is made again for it (its trust policy is off)
        page.get_by_label("Only me").check()
        page.locator("#install-trust", has_text="not checked").wait_for()
        page.click("#install-approve")
        page.locator("#install-open").wait_for(state="visible", timeout=30_000)
        assert "for you" in page.locator("#install-result").inner_text()
        with client(served) as api:
            records = api.get("/api/dist/installed").json()
            assert [(r["id"], r["scope"]) for r in records] == [(CATALOGUED, "user")]
        page.click("#install-close")
        open_store(page)
        installed = card(page, CATALOGUED)
        installed.locator(".chip.ok", has_text="INSTALLED").wait_for()
        assert installed.get_attribute("data-state") == "installed"
        assert axe_serious(page) == [], "installed card"
        shot(page, f"{size}-installed")
    finally:
        with client(served) as api:
            api.delete(f"/api/dist/uninstall/{CATALOGUED}?scope=user")
            api.put("/api/scopes/global/trust", json={"policy": "off", "keys": []})


def test_a_scope_that_requires_signatures_refuses_in_words_and_another_scope_can_be_chosen(
    page: Page, served: Served
) -> None:
    with client(served) as api:
        answer = api.put("/api/scopes/global/trust", json={"policy": "require", "keys": []})
        assert answer.status_code == 200, answer.text
    try:
        open_store(page)
        card(page, CATALOGUED).get_by_role("button", name="Install Catalogued").click()
        alert = page.locator("#install-result .alert")
        alert.wait_for()
        text = alert.inner_text()
        assert "only apps signed by a key it trusts" in text
        assert "untrusted_artifact" in text
        assert axe_serious(page) == [], "refused"
        page.get_by_label("Only me").check()
        page.locator("#install-diff").wait_for(state="visible")
        assert page.locator("#install-app").inner_text() == "Catalogued"
    finally:
        with client(served) as api:
            api.put("/api/scopes/global/trust", json={"policy": "off", "keys": []})


@pytest.mark.parametrize("size", list(VIEWPORTS))
def test_a_shell_without_a_catalogue_offers_to_add_one(
    browser: Browser, tmp_path: Path, size: str
) -> None:
    good = catalogue(tmp_path)
    refusing = tmp_path / "refusing.json"
    refusing.write_text(json.dumps({"schema": 1, "apps": [{"id": "no.sources", "name": "None"}]}))
    (tmp_path / "bare").mkdir()
    with serve_on(tmp_path / "bare") as served:
        width, height = VIEWPORTS[size]
        context = browser.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{served.url}/login?token={served.token}")
        page.wait_for_selector("body[data-ready=true]")
        tap(page, "#open-catalogue")
        setup = page.locator("#store-setup")
        setup.wait_for(state="visible")
        assert "Add a catalogue" in setup.inner_text()
        fits(page, "add a catalogue")
        assert axe_serious(page) == [], "add a catalogue"
        shot(page, f"{size}-add-catalogue")
        # a member is told who adds one, and gets no form
        with client(served) as api:
            body = {"id": "mia", "role": "member", "password": "correct horse battery"}
            assert api.post("/api/users", json=body).status_code == 201
        member = browser.new_context(viewport={"width": width, "height": height}).new_page()
        member.goto(f"{served.url}/")
        member.wait_for_selector("body[data-signin=true]")
        member.fill("#signin-user", "mia")
        member.fill("#signin-password", "correct horse battery")
        member.click("#signin-go")
        member.wait_for_selector("body[data-ready=true]")
        tap(member, "#open-catalogue")
        member.locator("#store-setup", has_text="Ask an admin").wait_for()
        assert member.locator("#store-setup-form").is_hidden()
        assert axe_serious(member) == [], "a member's store without a catalogue"
        member.context.close()
        # a bad address: the reason in words, nothing stored
        page.fill("#store-url", (tmp_path / "missing.json").as_uri())
        page.click("#store-add")
        alert = page.locator("#store-setup-result .alert")
        alert.wait_for()
        assert "could not be read" in alert.inner_text()
        assert "fetch_failed" in alert.inner_text()
        page.fill("#store-url", "ftp://example.org/index.json")
        page.click("#store-add")
        page.locator("#store-setup-result .alert", has_text="bad_request").wait_for()
        shot(page, f"{size}-add-catalogue-error")
        with client(served) as api:
            assert api.get("/api/dist/index").json()["configured"] is False
        # a catalogue whose every entry is refused says why
        page.fill("#store-url", refusing.as_uri())
        page.click("#store-add")
        status = page.locator("#catalogue-status")
        status.locator(".refused").wait_for()
        assert "every one was refused" in status.inner_text()
        assert "no.sources" in status.inner_text()
        # why, per entry
        assert "sources: an entry needs sources (git or oci) or a runtime" in status.inner_text()
        assert axe_serious(page) == [], "all refused"
        shot(page, f"{size}-all-refused")
        # the admin changes it to a good one: its cards show, and it is remembered
        page.click("#store-change")
        page.fill("#store-url", good)
        page.click("#store-add")
        card(page, CATALOGUED).wait_for()
        with client(served) as api:
            snapshot = api.get("/api/dist/index").json()
            assert (snapshot["url"], snapshot["urlFrom"]) == (good, "stored")
        context.close()


def publish_next(root: Path) -> str:
    """A new version of the catalogued app: committed, tagged and pushed to its bare repository,
    and the index's stable channel moved to it. Answers the new version."""
    work = root / "catalogue" / CATALOGUED
    manifest_file = work / "app.manifest.json"
    manifest = json.loads(manifest_file.read_text())
    major = int(manifest["version"].split(".")[0]) + 1
    manifest["version"] = version = f"{major}.0.0"
    manifest_file.write_text(json.dumps(manifest))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    bare = root / "catalogue" / f"{CATALOGUED}.git"
    for args in (
        ["commit", "-qam", f"v{version}"],
        ["tag", f"v{version}"],
        ["push", "-q", str(bare), "HEAD:main", f"v{version}"],
    ):
        subprocess.run([*git, *args], cwd=work, check=True, timeout=60)
    index_file = root / "catalogue" / "index.json"
    index = json.loads(index_file.read_text())
    index["apps"][0]["channels"] = {"stable": {"git-tag": f"v{version}"}}
    index_file.write_text(json.dumps(index))
    return version


def test_a_newer_version_in_the_catalogue_shows_update_and_installs_through_the_review(
    page: Page, served: Served
) -> None:
    root = served.home.parent
    with client(served) as api:
        answer = api.post("/api/dist/install", json={"ref": CATALOGUED, "autoApprove": True})
        assert answer.status_code == 200, answer.text
        before = answer.json()["record"]["version"]
        version = publish_next(root)
        assert api.get("/api/dist/index", params={"refresh": "1"}).status_code == 200
    try:
        open_store(page)
        update = card(page, CATALOGUED).get_by_role("button", name="Update Catalogued")
        update.wait_for()
        assert card(page, CATALOGUED).get_attribute("data-state") == "update"
        assert axe_serious(page) == [], "update card"
        update.click()
        page.locator("#install-diff").wait_for(state="visible", timeout=30_000)
        assert (
            f"Version {version}, replacing {before}"
            in page.locator("#install-version").inner_text()
        )
        assert page.locator("#install-approve").inner_text() == "Update"
        page.click("#install-approve")
        page.locator("#install-open").wait_for(state="visible", timeout=30_000)
        with client(served) as api:
            records = api.get("/api/dist/installed").json()
            assert [(r["id"], r["version"]) for r in records] == [(CATALOGUED, version)]
    finally:
        with client(served) as api:
            api.delete(f"/api/dist/uninstall/{CATALOGUED}")


def test_a_pinned_install_updates_from_its_card_to_its_newest_tag_and_stays_pinned(
    page: Page, served: Served
) -> None:
    """The card's Update of an install pinned to a tag takes the source's newest tag (through
    the updates panel), as `atrium update --to` does: reinstalling by the catalogue's id would
    quietly have switched it to following the catalogue's channel."""
    root = served.home.parent
    bare = (root / "catalogue" / f"{CATALOGUED}.git").as_uri()
    with client(served) as api:
        answer = api.post(
            "/api/dist/install", json={"ref": f"git+{bare}#v1.0.0", "autoApprove": True}
        )
        assert answer.status_code == 200, answer.text
        version = publish_next(root)
        assert api.get("/api/dist/updates", params={"refresh": "1"}).status_code == 200
    try:
        open_store(page)
        update = card(page, CATALOGUED).get_by_role("button", name="Update Catalogued")
        update.wait_for()
        update.click()
        page.locator("#catalogue").wait_for(state="hidden")
        row = page.locator(f"#update-rows li[data-app-id='{CATALOGUED}']")
        row.get_by_role("button", name="Update Catalogued").click()
        page.locator("#updates-status", has_text=f"Updated Catalogued to {version}").wait_for(
            timeout=30_000
        )
        with client(served) as api:
            [record] = api.get("/api/dist/installed").json()
            assert (record["version"], record["ref"]) == (version, f"git+{bare}#v{version}")
            assert record["pinned"]
    finally:
        with client(served) as api:
            api.delete(f"/api/dist/uninstall/{CATALOGUED}")


#: the bundled themes: the store's chips, states, alerts and review read in each
THEMES = [(t.id, t.tone.value) for t in ThemeCatalogue.load(None).themes()]


@pytest.mark.parametrize(("theme", "tone"), THEMES, ids=[t for t, _ in THEMES])
def test_the_store_and_its_review_pass_axe_in_every_theme(
    browser: Browser, served: Served, theme: str, tone: str
) -> None:
    slot = "themeIdLight" if tone == "light" else "themeIdDark"
    with client(served) as api:
        before = api.get("/api/os/theme").json()
        assert api.post("/api/os/themes/select", json={slot: theme, "colorMode": tone}).is_success
        body = {"ref": CATALOGUED, "autoApprove": True}
        assert api.post("/api/dist/install", json=body).status_code == 200
        # the review's warning about an unsigned app shows in every theme too
        assert api.put("/api/scopes/global/trust", json={"policy": "warn", "keys": []}).is_success
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=tone)  # type: ignore[arg-type]
    found: list[str] = []
    try:
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{served.url}/login?token={served.token}")
        page.wait_for_selector("body[data-ready=true]")
        open_store(page)
        card(page, CATALOGUED).locator(".chip.ok", has_text="INSTALLED").wait_for()
        page.locator("#store-categories button", has_text="media").click()
        found += [f"store: {v}" for v in axe_serious(page)]
        # an entry whose source does not exist: the error as an alert
        card(page, "org.example.radio").get_by_role("button", name="Install Radio").click()
        page.locator("#install-result .alert").wait_for(timeout=30_000)
        found += [f"install error: {v}" for v in axe_serious(page)]
        page.fill("#install-ref", CATALOGUED)
        page.click("#install-go")
        page.locator("#install-diff").wait_for(state="visible", timeout=30_000)
        page.locator("#install-trust[data-tone=warn]").wait_for()
        found += [f"review: {v}" for v in axe_serious(page)]
    finally:
        context.close()
        with client(served) as api:
            api.delete(f"/api/dist/uninstall/{CATALOGUED}")
            api.put("/api/scopes/global/trust", json={"policy": "off", "keys": []})
            keep = {
                k: before[k] for k in ("themeIdLight", "themeIdDark", "colorMode") if k in before
            }
            api.post("/api/os/themes/select", json=keep)
    assert found == [], f"{theme}:\n" + "\n".join(found)


def test_the_review_says_in_words_what_an_app_offers(page: Page, tmp_path: Path) -> None:
    app_dir = tmp_path / "test.offers.viaui"
    shutil.copytree(REPO_DIR / "tests" / "apps" / "test.sdk.echo", app_dir)
    manifest = json.loads((app_dir / "app.manifest.json").read_text())
    manifest.update(
        id="test.offers.viaui",
        name="Offers",
        warmPool=False,
        intentFilters=[{"action": "os.intent.action.SEND"}],
    )
    manifest["dataProvider"] = {"authority": "offered", "providers": [{"path": "/open"}]}
    (app_dir / "app.manifest.json").write_text(json.dumps(manifest))
    tap(page, "#open-install")
    page.fill("#install-ref", f"local:{app_dir}")
    page.click("#install-go")
    offers = page.locator("#install-offers")
    offers.wait_for(state="visible", timeout=30_000)
    text = offers.inner_text()
    assert "as “offered” (a data provider)" in text
    assert "To share things for other apps" in text
    assert "Where from" not in page.locator("#install-diff").inner_text()
    page.click("#install-close")


@pytest.mark.skipif(not Path("/bin/busybox").is_file(), reason="Debian's busybox-static builds it")
def test_the_review_of_an_image_app_says_it_is_a_container_image_and_what_it_keeps(
    page: Page, tmp_path: Path
) -> None:
    """An app that carries its image (busybox httpd as an OCI image layout in its folder): the
    review says whose container image it is, its unpacked size, its data and its network."""
    app_dir = tmp_path / "test.image.reviewed"
    app_dir.mkdir()
    manifest = {
        "id": app_dir.name,
        "version": "1.0.0",
        "name": "Carried httpd",
        "runtime": {"image": "oci:image", "health": {"path": "/"}, "data": ["/www/data"]},
    }
    (app_dir / "app.manifest.json").write_text(json.dumps(manifest))
    write_layout(app_dir / "image", httpd_layers(), HTTPD_CONFIG)
    tap(page, "#open-install")
    page.fill("#install-ref", f"local:{app_dir}")
    page.click("#install-go")
    facts = page.locator("#install-facts")
    facts.wait_for(state="visible", timeout=60_000)
    text = facts.inner_text()
    assert f"A container image carried in the app from local:{app_dir}, not an Atrium app." in text
    assert "MiB unpacked" in text
    assert "Keeps /www/data in its data folder." in text
    assert "Cannot reach the network; only the shell reaches its page." in text
    page.click("#install-close")
