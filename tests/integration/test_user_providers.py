"""Providers and intents resolve among the apps the caller's user sees, through the real shell."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from atrium.scopes import Scope
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell

pytestmark = pytest.mark.integration

ACTION = "test.users.OWN"
APP_ID = "test.users.own"


def put_in_user_scope(shell: RunningShell, home: Path, user: str) -> None:
    """A provider (authority `own`) with an intent filter, in ``user``'s own scope, then the
    rescan an install makes (local refs are an admin's: a member cannot install a folder)."""
    registry = shell.shell.registry
    shell.on_loop(registry.ensure_user(user))
    target = home / "scopes/users" / user / "apps" / APP_ID
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", target)
    manifest = json.loads((target / "app.manifest.json").read_text())
    manifest.update({"id": APP_ID, "intentFilters": [{"action": ACTION}], "warmPool": False})
    manifest["dataProvider"] = {"authority": "own", "providers": [{"path": "/open"}]}
    (target / "app.manifest.json").write_text(json.dumps(manifest))
    shell.on_loop(registry.rescan([Scope.USER], user=user))


def test_a_users_own_provider_and_handler_serve_that_user_only(
    start_shell: StartShell, home: Path
) -> None:
    shell = start_shell()
    bob = shell.add_user("bob")
    with shell.client() as alice, shell.client(bob, timeout=60) as b:
        # warm the tables of both users before the app arrives: the change must reach them
        assert b.get("/api/data/own/open/x").json()["error"]["code"] == "no_provider"
        assert alice.get("/api/data/own/open/x").json()["error"]["code"] == "no_provider"
        assert b.post("/api/intents/resolve", json={"action": ACTION}).json() == []

        put_in_user_scope(shell, home, "bob")

        resolved = b.post("/api/intents/resolve", json={"action": ACTION}).json()
        assert [m["appId"] for m in resolved] == [APP_ID]
        assert alice.post("/api/intents/resolve", json={"action": ACTION}).json() == []

        instance = b.post("/api/instances", json={"appId": APP_ID}).json()
        assert b.post(f"/api/instances/{instance['instanceId']}/resumed").status_code == 200
        answer = b.get("/api/data/own/open/x")
        assert answer.status_code == 200, answer.text
        assert answer.json()["subpath"] == "x"

        # B's own app reaches it with its token (a provider calls its own authority)
        app_token = shell.shell.app_tokens.issue(APP_ID, instance["instanceId"], "bob")
        with shell.client(app_token) as bobs_app:
            assert bobs_app.get("/api/data/own/open/y").status_code == 200

        refused = alice.get("/api/data/own/open/x")
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "no_provider"

        # B removes it: B's table forgets it
        shutil.rmtree(home / "scopes/users/bob/apps" / APP_ID)
        shell.on_loop(shell.shell.registry.rescan([Scope.USER], user="bob"))
        assert b.get("/api/data/own/open/x").json()["error"]["code"] == "no_provider"
        assert b.post("/api/intents/resolve", json={"action": ACTION}).json() == []


def test_the_admins_own_provider_does_not_serve_a_member(
    start_shell: StartShell, home: Path
) -> None:
    shell = start_shell()
    bob = shell.add_user("bob")
    put_in_user_scope(shell, home, shell.shell.settings.user)
    with shell.client() as alice, shell.client(bob) as b:
        resolved = alice.post("/api/intents/resolve", json={"action": ACTION}).json()
        assert [m["appId"] for m in resolved] == [APP_ID]
        assert b.post("/api/intents/resolve", json={"action": ACTION}).json() == []
        assert alice.get("/api/data/own/open/x").json()["error"]["code"] != "no_provider"
        refused = b.get("/api/data/own/open/x")
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "no_provider"


def test_a_member_is_not_told_of_a_clash_with_the_admins_own_app(
    start_shell: StartShell, system_apps: Path, home: Path
) -> None:
    rival = system_apps / "test.users.zz"
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", rival)
    manifest = json.loads((rival / "app.manifest.json").read_text())
    manifest.update({"id": rival.name, "warmPool": False})
    manifest["dataProvider"] = {"authority": "own", "providers": [{"path": "/open"}]}
    (rival / "app.manifest.json").write_text(json.dumps(manifest))
    shell = start_shell()
    bob = shell.add_user("bob")
    put_in_user_scope(shell, home, shell.shell.settings.user)
    with shell.client() as alice, shell.client(bob) as b:
        assert alice.get(f"/api/apps/{rival.name}").json()["conflicts"] == [
            {"authority": "own", "servedBy": APP_ID}
        ]
        # bob sees no app of the admin's own scope: the global rival serves `own` for bob
        assert b.get(f"/api/apps/{rival.name}").json()["conflicts"] == []
        assert APP_ID not in b.get("/api/apps").text


def test_a_removed_users_tables_go_with_them(start_shell: StartShell, home: Path) -> None:
    """A removed account's provider table and intent index are dropped with its scope: a new
    account under the same id sees none of the old one's apps (their folder is in lost+found)."""
    shell = start_shell()
    bob = shell.add_user("bob")
    put_in_user_scope(shell, home, "bob")
    with shell.client(bob) as b:
        # the old bob's tables are built and hold his provider and handler
        assert b.get("/api/data/own/open/x").json()["error"]["code"] != "no_provider"
        assert b.post("/api/intents/resolve", json={"action": ACTION}).json() != []
    with shell.client() as admin:
        assert admin.delete("/api/users/bob").status_code in (200, 204)
    new_bob = shell.add_user("bob")
    with shell.client(new_bob) as b:
        answer = b.get("/api/data/own/open/x")
        assert answer.json()["error"]["code"] == "no_provider", answer.text
        assert b.post("/api/intents/resolve", json={"action": ACTION}).json() == []
