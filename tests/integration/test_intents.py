"""Intents over HTTP with real handler apps: resolve, start, chooser, target, index refresh."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from atrium.cli.main import app
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell, wait_for

pytestmark = pytest.mark.integration
SHARE = "os.intent.action.SHARE"


def handler(apps_dir: Path, app_id: str, filters: list[dict[str, Any]]) -> Path:
    """A copy of the SDK echo app answering intents with ``filters``."""
    target = apps_dir / app_id
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", target)
    manifest = json.loads((target / "app.manifest.json").read_text())
    manifest.update({"id": app_id, "intentFilters": filters, "warmPool": False})
    manifest.pop("dataProvider")
    (target / "app.manifest.json").write_text(json.dumps(manifest))
    return target


@pytest.fixture
def intent_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    handler(system_apps, "test.share.text", [{"action": SHARE, "dataMime": ["text/*"]}])
    handler(
        system_apps,
        "test.share.exact",
        [{"action": SHARE, "dataMime": ["text/plain"]}, {"action": SHARE}],
    )
    handler(system_apps, "test.share.tie1", [{"action": "os.intent.action.TIE"}])
    handler(system_apps, "test.share.tie2", [{"action": "os.intent.action.TIE"}])
    return start_shell()


@pytest.fixture
def api(intent_shell: RunningShell) -> Iterator[httpx.Client]:
    with intent_shell.client(timeout=60) as client:
        yield client


def test_resolve_ranks_one_match_per_app_with_its_breakdown(api: httpx.Client) -> None:
    response = api.post("/api/intents/resolve", json={"action": SHARE, "type": "text/plain"})
    assert response.status_code == 200
    assert response.json() == [
        {
            "appId": "test.share.exact",
            "scope": "system",
            "filterIndex": 0,
            "score": 100,
            "breakdown": {"mime": 100, "scheme": 0, "categories": 0, "priority": 0},
            "default": False,
        },
        {
            "appId": "test.share.text",
            "scope": "system",
            "filterIndex": 0,
            "score": 50,
            "breakdown": {"mime": 50, "scheme": 0, "categories": 0, "priority": 0},
            "default": False,
        },
    ]


def test_resolve_without_a_match_is_an_empty_list(api: httpx.Client) -> None:
    assert api.post("/api/intents/resolve", json={"action": "nothing.handles.this"}).json() == []


def test_start_launches_the_winner_and_hands_it_the_extras(api: httpx.Client) -> None:
    started = api.post(
        "/api/intents/start",
        json={
            "action": SHARE,
            "type": "text/plain",
            "extras": {"text": "hello"},
        },
    )
    assert started.status_code == 200, started.text
    body = started.json()
    assert body["status"] == "started"
    assert body["appId"] == "test.share.exact"
    assert body["url"].startswith("http://")
    assert ".localhost:" in body["url"]
    activities = api.get(f"/api/proxy/{body['instanceId']}/activities").json()
    handed = activities[body["activityId"]]
    assert handed["extras"] == {"text": "hello"}
    assert handed["intent"] == {
        "action": SHARE,
        "type": "text/plain",
        "extras": {"text": "hello"},
        "callerAppId": None,  # the user started it
    }
    instance = api.get(f"/api/instances/{body['instanceId']}").json()
    assert instance["state"] == "resumed"


def caller(apps_dir: Path, app_id: str, permissions: list[str]) -> None:
    """An app that starts intents (the test holds its token): a manifest, never run."""
    (apps_dir / app_id).mkdir()
    (apps_dir / app_id / "entrypoint.sh").write_text("#!/bin/sh\n")
    manifest = {"id": app_id, "name": app_id, "version": "1.0.0", "permissions": permissions}
    (apps_dir / app_id / "app.manifest.json").write_text(json.dumps(manifest))


def test_a_filter_naming_a_permission_starts_only_for_apps_holding_it(
    start_shell: StartShell, system_apps: Path
) -> None:
    """An app's server may start intents: a filter whose activity acts (adds, sends, deletes)
    names the permission that act needs, and the shell refuses an app without it before
    anything starts; the handler learns who asked (`callerAppId`)."""
    add = "test.guarded.action.ADD"
    handler(system_apps, "test.guarded", [{"action": add, "permission": "test.guarded.write"}])
    caller(system_apps, "test.caller.nobody", [])
    caller(system_apps, "test.caller.writer", ["test.guarded.write"])
    shell = start_shell()
    with shell.client(timeout=60) as user:
        resolved = user.post("/api/intents/resolve", json={"action": add}).json()
        assert [(m["appId"], m["permission"]) for m in resolved] == [
            ("test.guarded", "test.guarded.write")
        ]
        nobody = shell.shell.app_tokens.issue(
            "test.caller.nobody", "test.caller.nobody-1", "default"
        )
        with shell.client(token=nobody, timeout=60) as app_client:
            for body in ({"action": add}, {"action": add, "target": "test.guarded"}):
                refused = app_client.post("/api/intents/start", json=body)
                assert refused.status_code == 403, refused.text
                error = refused.json()["error"]
                assert error["code"] == "permission_denied"
                assert error["permission"] == "test.guarded.write"
                assert "test.caller.nobody" in error["message"]
        assert user.get("/api/instances").json() == []  # refused before anything started
        writer = shell.shell.app_tokens.issue(
            "test.caller.writer", "test.caller.writer-1", "default"
        )
        with shell.client(token=writer, timeout=60) as app_client:
            started = app_client.post(
                "/api/intents/start", json={"action": add, "extras": {"n": 1}}
            )
        assert started.json()["status"] == "started", started.text
        iid = started.json()["instanceId"]
        handed = user.get(f"/api/proxy/{iid}/activities").json()[started.json()["activityId"]]
        assert handed["intent"]["callerAppId"] == "test.caller.writer"
        own = shell.shell.app_tokens.issue("test.guarded", iid, "default")
        with shell.client(token=own, timeout=60) as app_client:  # a handler may start its own
            assert app_client.post("/api/intents/start", json={"action": add}).status_code == 200
        assert user.post("/api/intents/start", json={"action": add}).status_code == 200


def test_a_tie_opens_a_chooser_and_starts_nothing(api: httpx.Client) -> None:
    answer = api.post("/api/intents/start", json={"action": "os.intent.action.TIE"}).json()
    assert answer["status"] == "chooser"
    assert [c["appId"] for c in answer["candidates"]] == ["test.share.tie1", "test.share.tie2"]
    assert api.get("/api/instances").json() == []


def test_target_starts_the_chosen_candidate(api: httpx.Client) -> None:
    answer = api.post(
        "/api/intents/start", json={"action": "os.intent.action.TIE", "target": "test.share.tie2"}
    ).json()
    assert (answer["status"], answer["appId"]) == ("started", "test.share.tie2")
    missing = api.post(
        "/api/intents/start", json={"action": "os.intent.action.TIE", "target": "test.share.text"}
    )
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_no_match_is_404_no_handler(api: httpx.Client) -> None:
    response = api.post("/api/intents/start", json={"action": "nothing.handles.this"})
    assert response.status_code == 404
    assert response.json()["error"] == {
        "code": "no_handler",
        "message": "no app has an intent filter matching action 'nothing.handles.this'",
        "action": "nothing.handles.this",
    }


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"action": ""},
        {"action": 5},
        {"action": "a", "type": "nomime"},
        {"action": "a", "extras": []},
        {"action": "a", "category": [1]},
    ],
)
def test_bad_intents_are_400(api: httpx.Client, body: dict[str, Any]) -> None:
    response = api.post("/api/intents/resolve", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


def test_apps_may_resolve_with_their_token(intent_shell: RunningShell) -> None:
    token = intent_shell.shell.app_tokens.issue("test.share.text", "test.share.text-1", "default")
    with intent_shell.client(token=token) as app:
        assert app.post("/api/intents/resolve", json={"action": SHARE}).status_code == 200


def test_the_index_follows_installs_and_removals_without_a_restart(
    api: httpx.Client, home: Path
) -> None:
    def ranked() -> list[str]:
        reply = api.post(
            "/api/intents/resolve", json={"action": SHARE, "type": "text/plain", "category": "pick"}
        )
        return [m["appId"] for m in reply.json()]

    global_apps = home / "scopes/global/apps"
    added = handler(
        global_apps,
        "test.share.new",
        [{"action": SHARE, "dataMime": ["text/plain"], "category": ["pick"]}],
    )
    wait_for(lambda: ranked()[:1] == ["test.share.new"], "the new handler to win")
    shutil.rmtree(added)
    wait_for(lambda: "test.share.new" not in ranked(), "the handler to go")


def test_the_cli_exits_3_on_a_tie_and_starts_nothing(
    intent_shell: RunningShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATRIUM_URL", intent_shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", intent_shell.token)
    monkeypatch.setenv("COLUMNS", "60")
    before = len(intent_shell.shell.lifecycle.all())
    tie = CliRunner().invoke(app, ["intent", "start", "-a", "os.intent.action.TIE"])
    assert tie.exit_code == 3, tie.output
    assert "Nothing was started" in tie.output
    assert "test.share.tie1" in tie.output.replace("\n", "").replace("│", "").replace(" ", "")
    as_json = CliRunner().invoke(app, ["intent", "start", "-a", "os.intent.action.TIE", "--json"])
    assert as_json.exit_code == 3
    assert json.loads(as_json.output)["status"] == "chooser"
    assert len(intent_shell.shell.lifecycle.all()) == before
