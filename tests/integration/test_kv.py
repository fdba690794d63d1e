"""The KV store over HTTP on real SQLite: envelope, validation, permissions, events, restarts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningShell, SseReader, StartShell, wait_for

pytestmark = pytest.mark.integration


def test_a_value_round_trips_in_the_envelope(api: httpx.Client) -> None:
    value = {"themeIdLight": "paper", "nested": [1, 2.5, None, True, "é"]}
    put = api.put("/api/kv/os/prefs", json={"value": value})
    assert put.status_code == 200
    assert put.json()["value"] == value
    got = api.get("/api/kv/os/prefs").json()
    assert got["value"] == value
    assert got["updatedAt"].endswith("Z")
    assert api.delete("/api/kv/os/prefs").json() == {"ok": True, "namespace": "os", "key": "prefs"}
    missing = api.get("/api/kv/os/prefs")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert api.delete("/api/kv/os/prefs").status_code == 404


def test_app_namespaces_are_separate(api: httpx.Client) -> None:
    api.put("/api/kv/app/com.example.a/k", json={"value": "a"})
    api.put("/api/kv/app/com.example.b/k", json={"value": "b"})
    api.put("/api/kv/os/k", json={"value": "os"})
    assert api.get("/api/kv/app/com.example.a/k").json()["value"] == "a"
    assert api.get("/api/kv/app/com.example.b/k").json()["value"] == "b"
    assert api.get("/api/kv/os/k").json()["value"] == "os"


def test_values_survive_a_restart(start_shell: StartShell) -> None:
    first = start_shell()
    with first.client() as api:
        for n in range(20):
            assert api.put(f"/api/kv/os/k{n}", json={"value": n}).is_success
    first.stop()
    second = start_shell()
    with second.client() as api:
        assert [api.get(f"/api/kv/os/k{n}").json()["value"] for n in range(20)] == list(range(20))


@pytest.mark.parametrize(
    "key",
    ["has:colon", "has space", "x" * 129, ".hidden", "a/b", "-dash", "%00nul"],
    ids=["colon", "space", "129-chars", "leading-dot", "slash", "leading-dash", "nul"],
)
def test_bad_keys_are_400_and_store_nothing(api: httpx.Client, key: str) -> None:
    response = api.put(f"/api/kv/os/{key}", json={"value": 1})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"
    assert api.get(f"/api/kv/os/{key}").status_code == 400


def test_a_128_character_key_is_fine(api: httpx.Client) -> None:
    assert api.put(f"/api/kv/os/{'k' * 128}", json={"value": 1}).status_code == 200


@pytest.mark.parametrize(
    "body",
    [b"{", b"[1]", b'"value"', b"", b'{"val": 1}', b'{"value": 1, "other": 2}', b'{"value": NaN}'],
    ids=["truncated", "array", "string", "empty", "wrong-field", "extra-field", "nan"],
)
def test_malformed_bodies_are_400_and_keep_the_old_value(api: httpx.Client, body: bytes) -> None:
    api.put("/api/kv/os/keep", json={"value": "old"})
    response = api.put(
        "/api/kv/os/keep", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"
    assert api.get("/api/kv/os/keep").json()["value"] == "old"


def test_a_bad_app_id_is_400(api: httpx.Client) -> None:
    assert api.get("/api/kv/app/NotAnId/k").status_code == 400


def test_a_too_large_value_is_400(api: httpx.Client) -> None:
    response = api.put("/api/kv/os/big", json={"value": "x" * (1 << 20)})
    assert response.status_code == 400
    assert api.get("/api/kv/os/big").status_code == 404


def test_every_change_publishes_kv_changed(api: httpx.Client) -> None:
    events = SseReader(api, {"topics": "kv:*"})
    api.put("/api/kv/os/a", json={"value": 1})
    api.put("/api/kv/app/com.example.a/b", json={"value": 2})
    api.delete("/api/kv/os/a")
    events.wait(3)
    assert [e.data for e in events.events] == [
        {"type": "kv:changed", "namespace": "os", "key": "a"},
        {"type": "kv:changed", "namespace": "app/com.example.a", "key": "b"},
        {"type": "kv:changed", "namespace": "os", "key": "a"},
    ]


def _app_with_permissions(system_apps: Path, app_id: str, permissions: list[str]) -> None:
    source = system_apps / "com.atrium.notes"
    target = system_apps / app_id
    shutil.copytree(source, target)
    manifest = json.loads((target / "app.manifest.json").read_text())
    manifest.update({"id": app_id, "permissions": permissions})
    manifest.pop("dataProvider")
    manifest.pop("permissionInfo")  # Notes labels its own permissions, not this copy's
    (target / "app.manifest.json").write_text(json.dumps(manifest))


def test_apps_need_kv_permissions_except_in_their_own_namespace(
    shell: RunningShell, api: httpx.Client, system_apps: Path
) -> None:
    _app_with_permissions(
        system_apps,
        "com.example.granted",
        ["system.kv.os.motd.read", "system.kv.app.com.example.other.k.write"],
    )
    _app_with_permissions(system_apps, "com.example.plain", [])
    wait_for(lambda: shell.shell.registry.get("com.example.plain"), "the apps")
    api.put("/api/kv/os/motd", json={"value": "t"})
    granted = shell.shell.app_tokens.issue(
        "com.example.granted", "com.example.granted-1", "default"
    )
    plain = shell.shell.app_tokens.issue("com.example.plain", "com.example.plain-1", "default")
    with shell.client(token=granted) as app:
        assert app.get("/api/kv/os/motd").json()["value"] == "t"
        denied = app.put("/api/kv/os/motd", json={"value": "mine"})
        assert denied.status_code == 403
        assert denied.json()["error"]["permission"] == "system.kv.os.motd.write"
        assert app.put("/api/kv/app/com.example.other/k", json={"value": 1}).status_code == 200
        assert app.get("/api/kv/app/com.example.other/k").status_code == 403
        assert app.put("/api/kv/app/com.example.granted/own", json={"value": 2}).status_code == 200
    with shell.client(token=plain) as app:
        response = app.get("/api/kv/os/motd")
        assert response.status_code == 403
        assert response.json()["error"] == {
            "code": "permission_denied",
            "message": "app 'com.example.plain' needs permission 'system.kv.os.motd.read' in its "
            "manifest to read os/motd",
            "callerAppId": "com.example.plain",
            "permission": "system.kv.os.motd.read",
        }
        assert app.get("/api/kv/app/com.example.plain/missing").status_code == 404
    assert api.get("/api/kv/os/motd").json()["value"] == "t"
