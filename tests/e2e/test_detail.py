"""The app detail in a real browser, on a desktop and a phone: the storage the app's data takes,
Back up now / Restore / Export / Import through the page, a pinned install's newer tags and
"Update to v2" through the permission review, who signed it, the uninstall confirmation's words
about the data, Revoke of what an app may reach, and an API error as a styled alert with its code
in small print."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.conftest import REPO_DIR
from tests.e2e.conftest import ARTIFACTS, Served, axe_serious, e2e_app
from tests.e2e.test_host_page import api

pytestmark = pytest.mark.e2e
#: the detail's words for an instance's ``network``
NETWORK_WORDS = {
    "own": "Own network: reaches only Atrium",
    "host": "Shared network: the computer's own",
}
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def plain_app(source: Path, app_id: str, version: str, **extra: object) -> None:
    """A stdlib app (no SDK) in ``source``, at ``version``."""
    source.mkdir(exist_ok=True)
    shutil.copy(REPO_DIR / "tests" / "apps" / "test.plain.stdlib" / "server.py", source)
    manifest = {"id": app_id, "name": "Kept", "version": version,
                "entrypoint": ["python3", "server.py"], **extra}  # fmt: skip
    (source / "app.manifest.json").write_text(json.dumps(manifest))


def go_home(page: Page) -> None:
    """The apps' list in view: an open app covers the home (its Home button brings it back)."""
    home = page.locator("#go-home")
    if home.count() and home.is_visible() and not page.locator("#apps").is_visible():
        home.click()
    page.locator("#apps").wait_for(state="visible")


def open_detail(page: Page, name: str) -> None:
    go_home(page)
    page.get_by_role("button", name=f"Details of {name}").click()
    page.locator("#detail").wait_for(state="visible")


def result(page: Page, text: str) -> None:
    page.locator("#detail-result", has_text=text).wait_for(timeout=30_000)


def confirm(page: Page, *, yes: bool) -> str:
    """Answer the confirmation dialog; its words."""
    page.locator("#confirm").wait_for(state="visible")
    words = page.locator("#confirm").inner_text()
    page.click(f'#confirm button[value="{"yes" if yes else "no"}"]')
    page.locator("#confirm").wait_for(state="hidden")
    return words


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"detail-{name}.png"), full_page=False)


def test_the_detail_backs_up_restores_exports_and_imports_an_apps_data(
    page: Page, served: Served, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    size = request.node.callspec.params["page"]
    app_id = f"test.kept.{size}"
    plain_app(tmp_path / app_id, app_id, "1.0.0")
    data = served.home / "scopes/global/apps" / app_id / f"{app_id}-1"
    notes = data / "notes.txt"
    try:
        with api(served) as client:
            body = {"ref": f"local:{tmp_path / app_id}", "autoApprove": True}
            client.post("/api/dist/install", json=body).raise_for_status()
        data.mkdir()
        notes.write_text("a" * 1500)
        open_detail(page, "Kept")
        page.locator("#detail-facts tr", has_text="Network").filter(has_text="—").wait_for()
        with api(served) as client:
            running = client.post("/api/instances", json={"appId": app_id}).json()
        # the network its instance has, in words (its own as root with bubblewrap), as soon as
        # it runs: the open detail follows its instances
        words = NETWORK_WORDS[running["network"]]
        page.locator("#detail-facts tr", has_text="Network").filter(has_text=words).wait_for()
        with api(served) as client:
            client.post(f"/api/instances/{running['instanceId']}/stop").raise_for_status()
        facts = page.locator("#detail-facts").inner_text()
        assert "1.5 kB of data" in facts  # the storage its data takes
        assert "No trusted signature recorded" in facts  # who signed it: nobody it trusts
        page.locator("#detail-backups li.status").wait_for()  # none yet, in words
        shot(page, f"{size}-open")
        assert axe_serious(page) == [], "the detail"

        page.click("#detail-backup")
        result(page, "Backed up 1 file")
        manual = page.locator("#detail-backups li", has_text="manual").first
        manual.wait_for()
        assert "1.5 kB" in manual.inner_text()

        notes.write_text("changed after the backup")
        manual.get_by_role("button", name="Restore").click()
        words = confirm(page, yes=False)  # asked first; cancelling changes nothing
        assert "today's data is backed up first" in words
        assert notes.read_text() == "changed after the backup"
        manual.get_by_role("button", name="Restore").click()
        confirm(page, yes=True)
        result(page, "Restored the data")
        assert notes.read_text() == "a" * 1500

        with page.expect_download() as download:
            page.click("#detail-export")
        archive = tmp_path / "export.tar.zst"
        download.value.save_as(archive)
        assert download.value.suggested_filename == f"{app_id}.tar.zst"
        assert archive.read_bytes()[:4] == ZSTD_MAGIC

        notes.write_text("lost unless the import brings it back")
        page.set_input_files("#detail-import-file", str(archive))
        assert "backed up first" in confirm(page, yes=True)
        result(page, "Imported Kept 1.0.0")
        assert notes.read_text() == "a" * 1500
        shot(page, f"{size}-kept")
        assert axe_serious(page) == [], "the detail after importing"

        page.click("#detail-uninstall")
        words = confirm(page, yes=False)
        assert "The data of your instances is deleted with it (1.5 kB today)" in words
        assert "Its backups are kept" in words
        with api(served) as client:
            assert client.get(f"/api/apps/{app_id}").status_code == 200  # cancelled: still there
    finally:
        with api(served) as client:
            client.delete(f"/api/dist/uninstall/{app_id}")


def tagged_repository(root: Path, app_id: str) -> Path:
    """A bare git repository of the app: v1 (1.0.0), then v2 (2.0.0, asking for a permission)."""
    work = root / "work" / app_id
    e2e_app(work.parent, app_id, name="Pinned", version="1.0.0")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]

    def run(*args: str) -> None:
        subprocess.run([*git, *args], cwd=work, check=True, timeout=60, capture_output=True)

    run("init", "-q")
    run("add", "-A")
    run("commit", "-qm", "v1")
    run("tag", "v1")
    manifest = json.loads((work / "app.manifest.json").read_text())
    manifest.update({"version": "2.0.0", "permissions": ["com.atrium.notes.read"]})
    (work / "app.manifest.json").write_text(json.dumps(manifest))
    run("commit", "-qam", "v2")
    run("tag", "v2")
    bare = root / f"{app_id}.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, timeout=60)
    return bare


def test_a_pinned_install_shows_its_newer_tags_and_updates_to_one_after_review(
    page: Page, served: Served, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    size = request.node.callspec.params["page"]
    app_id = f"test.pinned.{size}"
    bare = tagged_repository(tmp_path, app_id)
    try:
        with api(served) as client:
            body = {"ref": f"git+{bare.as_uri()}#v1", "autoApprove": True}
            client.post("/api/dist/install", json=body).raise_for_status()
        open_detail(page, "Pinned")
        assert "Pinned to v1" in page.locator("#detail-pin").inner_text()
        page.get_by_role("button", name="Check for newer versions").click()
        result(page, "newer version v2 is out")
        page.get_by_role("button", name="Update to v2").click()
        # v2 asks for more: the review waits for the user, nothing is installed before
        page.locator("#detail-review").wait_for(state="visible", timeout=30_000)
        assert "Read your notes" in page.locator("#detail-asks").inner_text()
        # and what it may use, in words (it names no resources: the administrator's default)
        assert "It may use up to 1024 MiB of memory and 1024 processes (the administrator's " in (
            page.locator("#detail-asks").inner_text()
        )
        with api(served) as client:
            assert client.get(f"/api/apps/{app_id}").json()["version"] == "1.0.0"
        shot(page, f"{size}-review")
        assert axe_serious(page) == [], "the update review"
        page.click("#detail-approve")
        result(page, "Updated to 2.0.0 (pinned to v2)")
        assert "Pinned to v2" in page.locator("#detail-pin").inner_text()
        with api(served) as client:
            assert client.get(f"/api/apps/{app_id}").json()["version"] == "2.0.0"
    finally:
        with api(served) as client:
            client.delete(f"/api/dist/uninstall/{app_id}")


def test_an_api_error_is_a_styled_alert_with_its_code_in_small_print(
    page: Page, served: Served, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    size = request.node.callspec.params["page"]
    app_id = f"test.nodata.{size}"
    plain_app(tmp_path / app_id, app_id, "1.0.0", network={"egress": True})
    try:
        with api(served) as client:
            body = {"ref": f"local:{tmp_path / app_id}", "autoApprove": True}
            client.post("/api/dist/install", json=body).raise_for_status()
        open_detail(page, "Kept")
        # what it may reach, granted at install: Revoke takes it back (an admin's, a shared copy)
        granted = page.locator('#detail-permissions li[data-egress="granted"]')
        assert "Can reach the internet" in granted.inner_text()
        granted.get_by_role("button", name="Revoke").click()
        revoked = page.locator('#detail-permissions li[data-egress="revoked"]')
        revoked.get_by_role("button", name="Allow again").wait_for()
        with api(served) as client:
            egress = client.get(f"/api/apps/{app_id}").json()["network"]["egress"]
            assert (egress["granted"], egress["revoked"]) == (False, True), egress
        page.click("#detail-backup")  # no instance ever ran: no data to back up
        alert = page.locator("#detail-result .alert[role=alert]")
        alert.wait_for()
        assert alert.locator(".alert-title").inner_text() == "Not found"
        assert "has no runtime data" in alert.locator(".alert-reason").inner_text()
        code = alert.locator(".alert-code")
        assert code.inner_text() == "not_found · HTTP 404"
        # small print: smaller than the reason
        smaller = code.evaluate(
            "(c) => parseFloat(getComputedStyle(c).fontSize)"
            " < parseFloat(getComputedStyle(c.previousElementSibling).fontSize)"
        )
        assert smaller
        shot(page, f"{size}-alert")
        assert axe_serious(page) == [], "an alert in the detail"
        page.keyboard.press("Escape")
        # an action's failure elsewhere: the corner alert (an app that does not exist)
        page.evaluate("location.hash = 'app=no.such.app'")
        toast = page.locator("#toasts .alert[role=alert]")
        toast.wait_for()
        assert "not_found · HTTP 404" in toast.locator(".alert-code").inner_text()
        shot(page, f"{size}-toast")
        assert axe_serious(page) == [], "an alert in the corner"
        toast.get_by_role("button", name="Dismiss").click()
        toast.wait_for(state="detached")
    finally:
        with api(served) as client:
            client.delete(f"/api/dist/uninstall/{app_id}")
