"""Instances belong to the user who started them, through the real shell: another user's instance
answers every route as a missing one, `?all=1` is an admin's, each user's launch makes and
reuses their own instance on their own data, and the data proxy reaches (or wakes) the calling
user's provider instance. Under bwrap, an instance of a global app run by user B cannot list or
read the data of user A's instances of the same app, tried from inside the sandbox."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.lifecycle.runners.bwrap import bwrap_works
from tests.integration.conftest import ECHO, RunningShell, StartShell, add_test_apps
from tests.integration.instances import as_missing, launch

pytestmark = pytest.mark.integration

WRITER = "test.sdk.datawriter"
NOTES = "com.atrium.notes"


@pytest.fixture
def apps_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    add_test_apps(system_apps, ECHO, WRITER)
    return start_shell()


@pytest.fixture
def alice(apps_shell: RunningShell) -> Iterator[httpx.Client]:
    with apps_shell.client(timeout=30) as client:
        yield client


@pytest.fixture
def bob(apps_shell: RunningShell) -> Iterator[httpx.Client]:
    with apps_shell.client(apps_shell.add_user("bob"), timeout=30) as client:
        yield client


def test_another_users_instance_answers_every_route_as_a_missing_one(
    apps_shell: RunningShell, alice: httpx.Client, bob: httpx.Client
) -> None:
    mine = launch(alice, ECHO)
    assert mine["owner"] == apps_shell.shell.settings.user
    iid = mine["instanceId"]
    missing = f"{ECHO}-99"
    routes: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", "/api/instances/{}", None),
        ("GET", "/api/instances/{}/logs", None),
        ("POST", "/api/instances/{}/stop", None),
        ("POST", "/api/instances/{}/views", {}),
        ("POST", "/api/instances/{}/activities", {}),
        ("DELETE", "/api/instances/{}/activities/a1", None),
        ("DELETE", "/api/instances/{}/views/v1", None),
        ("GET", "/api/proxy/{}/", None),
        ("DELETE", "/api/instances/{}", None),
    ]
    for method, path, body in routes:
        as_missing(bob.request(method, path.format(iid), json=body), iid)
        none = bob.request(method, path.format(missing), json=body)
        as_missing(none, missing)
    # nothing moved, and B's list holds nothing of A's
    assert alice.get(f"/api/instances/{iid}").json()["state"] == mine["state"]
    assert bob.get("/api/instances").json() == []
    # ?all=1 is an admin's: a member gets 403, the admin sees every user's
    denied = bob.get("/api/instances", params={"all": "1"})
    assert (denied.status_code, denied.json()["error"]["code"]) == (403, "permission_denied")
    theirs = launch(bob, ECHO)
    assert theirs["owner"] == "bob"
    assert theirs["instanceId"] != iid  # B's launch never reuses A's live instance
    # (the echo app keeps a warm pool: the bootstrap admin's, never handed to anyone else)
    mine_now = [i["instanceId"] for i in alice.get("/api/instances").json() if not i["pooled"]]
    assert mine_now == [iid]
    assert [i["instanceId"] for i in bob.get("/api/instances").json()] == [theirs["instanceId"]]
    everyone = alice.get("/api/instances", params={"all": "1"}).json()
    assert sorted((i["instanceId"], i["owner"]) for i in everyone if not i["pooled"]) == sorted(
        [(iid, apps_shell.shell.settings.user), (theirs["instanceId"], "bob")]
    )
    assert {i["owner"] for i in everyone if i["pooled"]} <= {apps_shell.shell.settings.user}
    # and A acts on B's no more than B on A's
    as_missing(alice.post(f"/api/instances/{theirs['instanceId']}/stop"), theirs["instanceId"])
    # B's own app origin: a view ticket of B's instance, never A's
    view = bob.post(f"/api/instances/{theirs['instanceId']}/views", json={})
    assert view.status_code == 200, view.text


def test_each_user_relaunching_gets_their_own_data_back(
    apps_shell: RunningShell, alice: httpx.Client, bob: httpx.Client
) -> None:
    first = launch(alice, WRITER)["instanceId"]
    wrote = alice.post(f"/api/proxy/{first}/write", params={"name": "a.txt"}, content=b"alice's")
    assert wrote.status_code == 200, wrote.text
    assert alice.delete(f"/api/instances/{first}").status_code == 200
    # A's instance is gone: B's launch gets a new instance on B's own (empty) data folder
    theirs = launch(bob, WRITER)["instanceId"]
    read = bob.get(f"/api/proxy/{theirs}/read", params={"name": "a.txt"})
    assert read.status_code == 404, read.text
    assert bob.post(
        f"/api/proxy/{theirs}/write", params={"name": "b.txt"}, content=b"bob's"
    ).is_success
    lifecycle = apps_shell.shell.lifecycle
    bob_data = lifecycle.get(theirs).data_dir
    assert bob_data.is_relative_to(apps_shell.shell.settings.home / "scopes/users/bob")
    assert bob.delete(f"/api/instances/{theirs}").status_code == 200
    # each relaunch finds its own user's data, whoever launched in between
    again = launch(alice, WRITER)["instanceId"]
    assert again == first
    assert alice.get(f"/api/proxy/{again}/read", params={"name": "a.txt"}).text == "alice's"
    assert alice.get(f"/api/proxy/{again}/read", params={"name": "b.txt"}).status_code == 404
    back = launch(bob, WRITER)["instanceId"]
    assert back == theirs
    assert bob.get(f"/api/proxy/{back}/read", params={"name": "b.txt"}).text == "bob's"
    assert bob.get(f"/api/proxy/{back}/read", params={"name": "a.txt"}).status_code == 404


def test_the_data_proxy_wakes_and_reaches_the_callers_own_provider_instance(
    shell: RunningShell,
) -> None:
    with shell.client() as alice, shell.client(shell.add_user("bob")) as bob:
        assert alice.post("/api/data/notes/notes", json={"text": "alice's"}).status_code == 201
        # B's request wakes B's own provider instance, on B's data: A's note is not there
        listed = bob.get("/api/data/notes/notes")
        assert listed.status_code == 200, listed.text
        assert listed.json() == []
        assert bob.post("/api/data/notes/notes", json={"text": "bob's"}).status_code == 201
        assert [n["text"] for n in alice.get("/api/data/notes/notes").json()] == ["alice's"]
        [woken] = bob.get("/api/instances").json()
        assert (woken["owner"], woken["headless"]) == ("bob", True)
        assert woken["wake"]["wakes"] == 1  # B's own wakes: A's are none of B's business
        # B's launch of Notes shows B's notes (the data the provider wrote), never A's
        mine = launch(bob, NOTES)
        assert mine["instanceId"] != woken["instanceId"]
        data = shell.shell.lifecycle.get(mine["instanceId"]).data_dir
        saved = json.loads((data / "notes.json").read_text())
        assert [n["text"] for n in saved.values()] == ["bob's"]
        # with B's Notes resumed, B's requests go there; A's still reach A's instance
        assert bob.post(f"/api/instances/{mine['instanceId']}/resumed").is_success
        assert [n["text"] for n in bob.get("/api/data/notes/notes").json()] == ["bob's"]
        assert [n["text"] for n in alice.get("/api/data/notes/notes").json()] == ["alice's"]


PEEK_SERVER = """
from pathlib import Path

from atrium.sdk import App, Request

app = App()


@app.route("GET", "/peek")
def peek(request: Request) -> dict[str, object]:
    target = Path(request.query["path"])
    seen: dict[str, object] = {"path": str(target)}
    try:
        seen["list"] = sorted(p.name for p in target.iterdir())
    except OSError as err:
        seen["listError"] = type(err).__name__
    try:
        seen["read"] = (target / "secret.txt").read_text()
    except OSError as err:
        seen["readError"] = type(err).__name__
    return seen


@app.route("POST", "/secret")
def secret(request: Request) -> dict[str, object]:
    (app.data_dir / "secret.txt").write_bytes(request.body)
    return {"dataDir": str(app.data_dir)}


if __name__ == "__main__":
    app.run()
"""


def peek_app(folder: Path) -> Path:
    app = folder / "test.owner.peek"
    app.mkdir(parents=True)
    manifest = {
        "id": "test.owner.peek",
        "name": "Peek",
        "version": "1.0.0",
        "entrypoint": ["python3", "server.py"],
        "startTimeoutMs": 5000,
        "hookTimeoutMs": 2000,
    }
    (app / "app.manifest.json").write_text(json.dumps(manifest))
    (app / "server.py").write_text(PEEK_SERVER)
    return app


@pytest.mark.skipif(bwrap_works() is not None, reason=f"no bubblewrap: {bwrap_works()}")
def test_under_bwrap_another_users_instance_cannot_list_or_read_the_data_of_the_same_app(
    start_shell: StartShell, tmp_path: Path
) -> None:
    shell = start_shell(runner="bwrap")
    source = peek_app(tmp_path / "source")
    with shell.client(timeout=60) as alice, shell.client(shell.add_user("bob"), timeout=60) as bob:
        installed = alice.post(
            "/api/dist/install",
            json={"ref": f"local:{source}", "scope": "global", "autoApprove": True},
        )
        assert installed.status_code == 200, installed.text
        hers = launch(alice, "test.owner.peek")["instanceId"]
        assert alice.post(f"/api/proxy/{hers}/secret", content=b"alice's secret").is_success
        her_data = shell.shell.lifecycle.get(hers).data_dir
        app_dir = shell.shell.lifecycle.get(hers).app_dir
        assert her_data.parent == app_dir  # the bootstrap admin's data: where it always was
        theirs = launch(bob, "test.owner.peek")["instanceId"]

        def peek(path: Path) -> dict[str, Any]:
            answer = bob.get(f"/api/proxy/{theirs}/peek", params={"path": str(path)})
            assert answer.status_code == 200, answer.text
            seen: dict[str, Any] = answer.json()
            return seen

        # A's folder inside the app directory B's sandbox shows: nothing to list or read
        seen = peek(her_data)
        assert "alice's secret" not in json.dumps(seen)
        assert seen.get("list", []) == []
        assert "read" not in seen
        if os.geteuid() != 0:
            return  # apps run as the shell's uid: docs/security.md says what holds then
        # a folder A makes after B's sandbox was built: named, but closed to B's instance
        later = launch(alice, "test.owner.peek", new=True)["instanceId"]
        assert alice.post(f"/api/proxy/{later}/secret", content=b"alice's later").is_success
        seen = peek(shell.shell.lifecycle.get(later).data_dir)
        assert "alice's later" not in json.dumps(seen)
        assert "read" not in seen, seen
        assert "list" not in seen, seen
        # and B's own data is at /data only
        assert bob.post(f"/api/proxy/{theirs}/secret", content=b"bob's").json() == {
            "dataDir": "/data"
        }
        assert peek(Path("/data"))["read"] == "bob's"


def test_an_intent_starts_an_instance_of_the_starting_user(shell: RunningShell) -> None:
    with shell.client() as alice, shell.client(shell.add_user("bob")) as bob:
        intent = {"action": "os.intent.action.CREATE_NOTE", "type": "text/plain"}
        hers = alice.post("/api/intents/start", json={**intent, "target": NOTES})
        assert hers.status_code == 200, hers.text
        theirs = bob.post("/api/intents/start", json={**intent, "target": NOTES})
        assert theirs.status_code == 200, theirs.text
        her_id, their_id = hers.json()["instanceId"], theirs.json()["instanceId"]
        assert her_id != their_id  # B's intent never lands on A's live instance
        assert bob.get(f"/api/instances/{their_id}").json()["owner"] == "bob"
        as_missing(bob.get(f"/api/instances/{her_id}"), her_id)
        as_missing(alice.get(f"/api/instances/{their_id}"), their_id)
