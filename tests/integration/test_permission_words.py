"""Permission words that cannot lie: the `system.` ids are the shell's, only the owning app labels a
permission, and a KV permission names exactly one app and one key (docs/api.md "Permission
strings"; decisions.md "Hardening: permission words that cannot lie")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import RunningShell, StartShell
from tests.integration.distribution.conftest import install, write_manifest

pytestmark = pytest.mark.integration


def place(apps: Path, app_id: str, **fields: Any) -> Path:
    """An app directory written by hand (a scan reads it; nothing checked it before)."""
    app_dir = apps / app_id
    app_dir.mkdir(parents=True)
    write_manifest(app_dir, **fields)
    return app_dir


def listed(api: httpx.Client, app_id: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        item for item in api.get("/api/apps").json() if item["id"] == app_id
    )
    return found


def words(api: httpx.Client, app_id: str) -> dict[str, dict[str, Any]]:
    detail = api.get(f"/api/apps/{app_id}")
    assert detail.status_code == 200, detail.text
    return {p["name"]: p for p in detail.json()["permissions"]}


def test_an_app_id_under_system_is_refused_at_install_and_masked_at_scan(
    start_shell: StartShell, system_apps: Path, tmp_path: Path
) -> None:
    harmless = {"system.kv.os.theme.write": {"label": "Harmless"}}
    place(system_apps, "system.kv", permissionInfo=harmless)
    place(system_apps, "com.example.asker", permissions=["system.kv.os.theme.write"])
    source = place(tmp_path / "src", "system.kv", name="sys", permissionInfo=harmless)
    shell = start_shell()
    with shell.client(timeout=60) as api:
        problems = listed(api, "system.kv")["problems"]
        assert [p["field"] for p in problems][:1] == ["id"]
        assert "'system.kv'" in problems[0]["message"]
        assert "reserved for the shell" in problems[0]["message"]
        assert shell.shell.registry.get("system.kv") is None
        assert words(api, "com.example.asker")["system.kv.os.theme.write"] == {
            "name": "system.kv.os.theme.write",
            "label": "Change the shell setting “theme”",
            "description": "",
            "declaredBy": "system",
        }
        response = install(api, f"local:{source}", scope="user", autoApprove=True)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_manifest"
        assert error["problems"][0]["field"] == "id"
        assert "'system.kv'" in error["problems"][0]["message"]


def test_an_app_installed_under_system_before_is_listed_with_its_problem_and_uninstalls(
    start_shell: StartShell, home: Path
) -> None:
    start_shell().stop()  # the scopes exist
    apps = home / "scopes" / "global" / "apps"
    place(apps, "system.kv", permissionInfo={"system.kv.os.theme.write": {"label": "Harmless"}})
    subprocess.run(["git", "add", "-A"], cwd=apps.parent, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "an older shell's"],
        cwd=apps.parent,
        check=True,
    )
    shell = start_shell()
    with shell.client(timeout=60) as api:
        assert "reserved for the shell" in listed(api, "system.kv")["problems"][0]["message"]
        removed = api.delete("/api/dist/uninstall/system.kv", params={"scope": "global"})
        assert removed.status_code == 200, removed.text
        assert all(item["id"] != "system.kv" for item in api.get("/api/apps").json())
    assert not (apps / "system.kv").exists()


def test_an_app_whose_id_prefixes_another_cannot_label_its_permissions(
    start_shell: StartShell, system_apps: Path, tmp_path: Path
) -> None:
    lie = {"com.atrium.notes.export": {"label": "Harmless", "description": "Nothing at all."}}
    place(system_apps, "com.atrium", permissionInfo=lie)
    asking = place(tmp_path / "src", "com.example.asking", permissions=["com.atrium.notes.export"])
    source = place(tmp_path / "other", "com.atrium", permissionInfo=lie)
    shell = start_shell()
    with shell.client(timeout=60) as api:
        assert listed(api, "com.atrium")["problems"][0]["field"] == "permissionInfo"
        review = install(api, f"local:{asking}").json()
        assert review["needsApproval"] is True
        assert review["permissions"] == [
            {
                "name": "com.atrium.notes.export",
                "label": "com.atrium.notes.export",
                "description": "",
                "declaredBy": None,
            }
        ]
        refused = install(api, f"local:{source}", scope="user", autoApprove=True)
        assert refused.status_code == 422, refused.text
        problem = refused.json()["error"]["problems"][0]
        assert problem["field"] == "permissionInfo"
        assert "'com.atrium.notes.export'" in problem["message"]


@pytest.fixture
def kv_apps(start_shell: StartShell, system_apps: Path) -> RunningShell:
    """``t4.bank`` keeps ``acct.secret``, ``t4.bank.acct`` keeps ``secret``; three readers hold
    grants to one or the other, one of them in the form an older shell wrote."""
    place(system_apps, "t4.bank", name="T4 Bank")
    place(system_apps, "t4.bank.acct", name="Acct")
    place(system_apps, "com.example.bank", permissions=["system.kv.app/t4.bank/acct.secret.read"])
    place(system_apps, "com.example.acct", permissions=["system.kv.app/t4.bank.acct/secret.read"])
    place(
        system_apps,
        "com.example.old",
        permissions=[
            "system.kv.app.t4.bank.acct.secret.read",  # reviewed as "secret" of t4.bank.acct
            "system.kv.app.t4.bank.Acct.secret.read",  # no app t4.bank.Acct: dropped
            "system.kv.os.motd.read",
        ],
    )
    shell = start_shell()
    with shell.client() as api:
        assert api.put("/api/kv/app/t4.bank/acct.secret", json={"value": "bank"}).is_success
        assert api.put("/api/kv/app/t4.bank/Acct.secret", json={"value": "bank2"}).is_success
        assert api.put("/api/kv/app/t4.bank.acct/secret", json={"value": "acct"}).is_success
    return shell


def read_as(shell: RunningShell, app_id: str, path: str) -> httpx.Response:
    token = shell.shell.app_tokens.issue(app_id, f"{app_id}-1", "default")
    with shell.client(token=token) as app:
        return app.get(path)


def test_a_kv_grant_opens_exactly_one_app_and_key(kv_apps: RunningShell) -> None:
    bank = read_as(kv_apps, "com.example.bank", "/api/kv/app/t4.bank/acct.secret")
    assert bank.status_code == 200, bank.text
    assert bank.json()["value"] == "bank"
    denied = read_as(kv_apps, "com.example.bank", "/api/kv/app/t4.bank.acct/secret")
    assert denied.status_code == 403
    assert denied.json()["error"]["permission"] == "system.kv.app/t4.bank.acct/secret.read"
    acct = read_as(kv_apps, "com.example.acct", "/api/kv/app/t4.bank.acct/secret")
    assert acct.status_code == 200, acct.text
    assert acct.json()["value"] == "acct"
    denied = read_as(kv_apps, "com.example.acct", "/api/kv/app/t4.bank/acct.secret")
    assert denied.status_code == 403
    assert denied.json()["error"]["permission"] == "system.kv.app/t4.bank/acct.secret.read"


def test_the_review_names_the_app_and_the_key(kv_apps: RunningShell) -> None:
    with kv_apps.client() as api:
        bank = words(api, "com.example.bank")["system.kv.app/t4.bank/acct.secret.read"]
        assert bank["label"] == "Read key “acct.secret” of app T4 Bank (t4.bank)"
        assert bank["declaredBy"] == "system"
        acct = words(api, "com.example.acct")["system.kv.app/t4.bank.acct/secret.read"]
        assert acct["label"] == "Read key “secret” of app Acct (t4.bank.acct)"


def test_an_old_grant_is_migrated_to_the_reading_its_review_showed(kv_apps: RunningShell) -> None:
    for path in ("/api/kv/app/t4.bank/acct.secret", "/api/kv/app/t4.bank/Acct.secret"):
        opened = read_as(kv_apps, "com.example.old", path)
        assert opened.status_code == 403, (path, opened.text)
    acct = read_as(kv_apps, "com.example.old", "/api/kv/app/t4.bank.acct/secret")
    assert acct.status_code == 200, acct.text
    with kv_apps.client() as api:
        manifest = api.get("/api/apps/com.example.old").json()["manifest"]
    assert manifest["permissions"] == [
        "system.kv.app/t4.bank.acct/secret.read",
        "system.kv.os.motd.read",
    ]


def test_an_old_grant_in_an_update_is_reviewed_in_the_new_words(
    start_shell: StartShell, system_apps: Path, tmp_path: Path
) -> None:
    place(system_apps, "t4.bank", name="T4 Bank")
    source = place(
        tmp_path / "src", "com.example.asking", permissions=["system.kv.app.t4.bank.acct.read"]
    )
    shell = start_shell()
    with shell.client(timeout=60) as api:
        review = install(api, f"local:{source}").json()
    assert review["diff"]["permissionsAdded"] == ["system.kv.app/t4.bank/acct.read"]
    assert review["permissions"][0]["label"] == "Read key “acct” of app T4 Bank (t4.bank)"
    assert json.loads((source / "app.manifest.json").read_text())["permissions"] == [
        "system.kv.app.t4.bank.acct.read"
    ]


def test_a_provider_or_filter_may_guard_only_with_its_own_permissions(
    start_shell: StartShell, tmp_path: Path
) -> None:
    """A provider guarding its entries with a name another id owns (`com.notes.items.read` is
    com.notes.items's) let that other app word the grant: an app asking for it was reviewed as
    "Show a badge" and got read access to com.notes's items."""
    guarded = {
        "authority": "notes",
        "providers": [{"path": "/items", "readPerm": "com.notes.items.read"}],
    }
    provider = place(tmp_path / "src", "com.notes", name="Notes", dataProvider=guarded)
    intent = [{"action": "com.notes.action.ADD", "permission": "com.other.write"}]
    starter = place(tmp_path / "src", "com.notes.start", name="Start", intentFilters=intent)
    shell = start_shell()
    with shell.client(timeout=60) as api:
        for source, field, named in (
            (provider, "dataProvider", "com.notes.items.read"),
            (starter, "intentFilters", "com.other.write"),
        ):
            response = install(api, f"local:{source}", scope="user", autoApprove=True)
            assert response.status_code == 422, response.text
            problem = response.json()["error"]["problems"][0]
            assert problem["field"] == field
            assert repr(named) in problem["message"]
            assert "own permissions" in problem["message"]
