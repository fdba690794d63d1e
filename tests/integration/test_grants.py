"""Sharing by grant through the real shell: the owner grants, lists and revokes; a grantee finds
the instance in `?shared=1` and may open views on it, nothing else; a viewer's changes stop at
the shell unless the app enforces roles; revoking closes the grantee's views at once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import (
    ECHO,
    RunningShell,
    SseReader,
    StartShell,
    add_test_apps,
    wait_for,
)
from tests.integration.instances import as_missing, new_instance, view_client
from tests.integration.test_origins import on_origin

pytestmark = pytest.mark.integration


@pytest.fixture
def api(echo_shell: RunningShell) -> Iterator[httpx.Client]:
    with echo_shell.client(timeout=30) as client:
        yield client


@pytest.fixture
def bob(echo_shell: RunningShell) -> Iterator[httpx.Client]:
    with echo_shell.client(echo_shell.add_user("bob", name="Bob"), timeout=30) as client:
        yield client


@pytest.fixture
def carol(echo_shell: RunningShell) -> Iterator[httpx.Client]:
    with echo_shell.client(echo_shell.add_user("carol"), timeout=30) as client:
        yield client


def grant(api: httpx.Client, instance_id: str, user: str, role: str) -> dict[str, Any]:
    answer = api.post(f"/api/instances/{instance_id}/grants", json={"user": user, "role": role})
    assert answer.status_code in (200, 201), answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_the_owner_grants_lists_and_the_grantee_finds_it_shared(
    echo_shell: RunningShell, api: httpx.Client, bob: httpx.Client, carol: httpx.Client
) -> None:
    instance_id = new_instance(api)
    made = api.post(f"/api/instances/{instance_id}/grants", json={"user": "bob", "role": "viewer"})
    assert made.status_code == 201, made.text
    grant_id = made.json()["grantId"]
    assert made.json() | {"createdAt": None} == {
        "grantId": grant_id,
        "instanceId": instance_id,
        "appId": ECHO,
        "owner": echo_shell.settings.user,
        "user": "bob",
        "userName": "Bob",
        "role": "viewer",
        "createdAt": None,
    }
    # granting again changes the role of the same grant
    again = grant(api, instance_id, "bob", "editor")
    assert (again["grantId"], again["role"]) == (grant_id, "editor")
    listed = api.get(f"/api/instances/{instance_id}/grants")
    assert [(g["grantId"], g["user"], g["role"]) for g in listed.json()] == [
        (grant_id, "bob", "editor")
    ]
    shared = bob.get("/api/instances", params={"shared": "1"})
    assert shared.status_code == 200, shared.text
    assert [(i["instanceId"], i["access"], i["owner"]) for i in shared.json()] == [
        (instance_id, "editor", echo_shell.settings.user)
    ]
    # a user nothing was shared with sees nothing, and cannot open a view
    assert carol.get("/api/instances", params={"shared": "1"}).json() == []
    as_missing(carol.post(f"/api/instances/{instance_id}/views", json={}), instance_id)
    # the owner's own instances are not "shared with" them
    assert api.get("/api/instances", params={"shared": "1"}).json() == []


def test_granting_refuses_what_it_cannot_do(
    echo_shell: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    instance_id = new_instance(api)
    base = f"/api/instances/{instance_id}/grants"
    nobody = api.post(base, json={"user": "nobody", "role": "viewer"})
    assert nobody.status_code == 404, nobody.text
    assert nobody.json()["error"] == {
        "code": "not_found",
        "message": "no user 'nobody'",
        "kind": "user",
        "id": "nobody",
    }
    for body, field in (
        ({"user": "bob", "role": "owner"}, "role"),
        ({"user": "Bob!", "role": "viewer"}, "user"),
        ({"user": echo_shell.settings.user, "role": "viewer"}, "user"),
        ({"user": "bob"}, "role"),
    ):
        answer = api.post(base, json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["error"]["code"] == "bad_request"
        assert field in json.dumps(answer.json()["error"].get("problems")), answer.text
    assert api.get(base).json() == []
    # only the owner shares: anyone else finds no instance, grantee or not
    as_missing(bob.post(base, json={"user": "bob", "role": "editor"}), instance_id)
    as_missing(bob.get(base), instance_id)
    made = grant(api, instance_id, "bob", "viewer")
    as_missing(bob.get(base), instance_id)
    as_missing(bob.delete(f"{base}/{made['grantId']}"), instance_id)
    assert bob.post(base, json={"user": "bob", "role": "editor"}).status_code == 404
    gone = api.delete(f"{base}/grt_0000000000000000")
    assert gone.status_code == 404
    assert gone.json()["error"]["kind"] == "grant"


def test_a_grantee_may_open_views_and_nothing_else(
    echo_shell: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    instance_id = new_instance(api)
    grant(api, instance_id, "bob", "editor")
    page = view_client(echo_shell, bob, instance_id)
    with closing(page):
        seen = page.get("/whoami").json()
    assert seen["user"] == {"id": "bob", "name": "Bob", "role": "editor"}
    for method, path in (
        ("POST", f"/api/instances/{instance_id}/stop"),
        ("POST", f"/api/instances/{instance_id}/pause"),
        ("GET", f"/api/instances/{instance_id}/logs"),
        ("DELETE", f"/api/instances/{instance_id}"),
        ("POST", f"/api/instances/{instance_id}/activities"),
        ("GET", f"/api/proxy/{instance_id}/whoami"),
    ):
        as_missing(bob.request(method, path), instance_id)
    assert api.get(f"/api/instances/{instance_id}").json()["state"] != "installed"
    # a grantee closes the views they opened, and no one else's
    owners = api.post(f"/api/instances/{instance_id}/views", json={}).json()["viewId"]
    theirs = bob.post(f"/api/instances/{instance_id}/views", json={}).json()["viewId"]
    refused = bob.delete(f"/api/instances/{instance_id}/views/{owners}")
    assert refused.status_code == 404
    assert refused.json()["error"]["kind"] == "view"
    assert bob.delete(f"/api/instances/{instance_id}/views/{theirs}").status_code == 200


def test_a_viewer_looks_an_editor_changes(
    echo_shell: RunningShell, api: httpx.Client, bob: httpx.Client, carol: httpx.Client
) -> None:
    instance_id = new_instance(api)
    grant(api, instance_id, "bob", "viewer")
    grant(api, instance_id, "carol", "editor")
    viewer = view_client(echo_shell, bob, instance_id)
    editor = view_client(echo_shell, carol, instance_id)
    with closing(viewer), closing(editor):
        assert viewer.get("/whoami").json()["user"]["role"] == "viewer"
        assert viewer.head("/whoami").status_code == 200
        for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
            refused = viewer.request(method, "/whoami")
            assert refused.status_code == 403, (method, refused.text)
            assert refused.json()["error"]["code"] == "permission_denied"
        # the app's API on its origin acts for the owner: a viewer only reads through it
        assert viewer.get("/_os/api/instances").status_code == 200
        wrote = viewer.put("/_os/api/kv/app/test.sdk.echo/x", json={"value": 1})
        assert wrote.status_code == 403, wrote.text
        changed = editor.post("/whoami")
        assert changed.status_code == 200, changed.text
        assert changed.json()["user"] == {"id": "carol", "name": "carol", "role": "editor"}


def test_an_app_that_enforces_roles_decides_itself(
    start_shell: StartShell, system_apps: Path
) -> None:
    add_test_apps(system_apps, ECHO)
    target = system_apps / ECHO
    manifest = json.loads((target / "app.manifest.json").read_text())
    manifest["sharing"] = {"enforcesRoles": True}
    (target / "app.manifest.json").write_text(json.dumps(manifest))
    shell = start_shell()
    with shell.client(timeout=30) as api, shell.client(shell.add_user("bob"), timeout=30) as bob:
        assert api.get(f"/api/apps/{ECHO}").json()["manifest"]["sharing"] == {"enforcesRoles": True}
        instance_id = new_instance(api)
        grant(api, instance_id, "bob", "viewer")
        with closing(view_client(shell, bob, instance_id)) as viewer:
            answer = viewer.post("/whoami")
            assert answer.status_code == 200, answer.text
            assert answer.json()["user"]["role"] == "viewer"  # the app's to refuse


def test_revoking_closes_the_grantees_views_at_once(
    echo_shell: RunningShell, api: httpx.Client, bob: httpx.Client, carol: httpx.Client
) -> None:
    instance_id = new_instance(api)
    others = SseReader(carol, {"topics": "grant:*"})
    made = grant(api, instance_id, "bob", "viewer")
    page = view_client(echo_shell, bob, instance_id)
    unused = bob.post(f"/api/instances/{instance_id}/views", json={}).json()["url"]
    owners = view_client(echo_shell, api, instance_id)
    events = SseReader(bob, {"topics": "grant:*"})
    with closing(page), closing(owners):
        assert page.get("/whoami").status_code == 200
        revoked = api.delete(f"/api/instances/{instance_id}/grants/{made['grantId']}")
        assert revoked.status_code == 200, revoked.text
        assert revoked.json() == {"ok": True, "grantId": made["grantId"], "closedViews": 2}
        started = time.monotonic()
        after = page.get("/whoami")
        took = time.monotonic() - started
        assert after.status_code == 401, after.text
        assert took < 1.0
        assert page.get("/_os/client.js").status_code == 401
        ticket, target = on_origin(echo_shell, unused)
        with closing(ticket):
            assert ticket.get(target, follow_redirects=False).status_code == 401
        # the owner's own view is untouched, and the instance still runs for them
        assert owners.get("/whoami").json()["user"]["role"] == "owner"
        gone = wait_for(lambda: events.of("grant:revoked"), "grant:revoked")
        assert gone[0].data["grantId"] == made["grantId"]
        assert gone[0].data["instanceId"] == instance_id
        assert len(gone[0].data["viewIds"]) == 2
        assert gone[0].data["user"] == "bob"
        # addressed: a user the grant is not about hears nothing of it
        assert others.events == []
    assert bob.get("/api/instances", params={"shared": "1"}).json() == []
    as_missing(bob.post(f"/api/instances/{instance_id}/views", json={}), instance_id)


def test_a_grantee_opens_an_instance_its_owner_stopped(
    echo_shell: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    instance_id = new_instance(api)
    grant(api, instance_id, "bob", "viewer")
    assert api.post(f"/api/instances/{instance_id}/stop").json()["state"] == "stopped"
    with closing(view_client(echo_shell, bob, instance_id)) as page:
        assert page.get("/whoami").json()["user"]["id"] == "bob"


def test_grants_are_kept_across_a_restart_and_go_with_their_user(
    start_shell: StartShell, system_apps: Path
) -> None:
    add_test_apps(system_apps, ECHO)
    first = start_shell()
    first.add_user("bob")
    first.add_user("carol")
    with first.client(timeout=30) as api:
        instance_id = new_instance(api)
        grant(api, instance_id, "bob", "viewer")
        grant(api, instance_id, "carol", "editor")
    owner = first.settings.user
    first.stop()
    second = start_shell()
    grants = second.shell.grants
    kept = grants.of_instance(owner, instance_id)
    assert [(g.user_id, g.role.value) for g in kept] == [("bob", "viewer"), ("carol", "editor")]
    second.on_loop(second.shell.users.remove("carol"))
    assert [g.user_id for g in grants.of_instance(owner, instance_id)] == ["bob"]
    second.stop()
    third = start_shell()
    assert [g.user_id for g in third.shell.grants.of_instance(owner, instance_id)] == ["bob"]


def test_a_disabled_grantees_views_close_at_their_next_request(
    echo_shell: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    instance_id = new_instance(api)
    grant(api, instance_id, "bob", "editor")
    with closing(view_client(echo_shell, bob, instance_id)) as page:
        assert page.get("/whoami").status_code == 200
        echo_shell.on_loop(echo_shell.shell.users.update("bob", disabled=True))
        assert page.get("/whoami").status_code == 401
        assert page.get("/_os/api/instances").status_code == 401
