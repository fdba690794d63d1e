"""Waking a provider (docs/api.md "Waking a provider"): real shell, real child processes.

The provider is the stdlib fixture under another id with `dataProvider.wake`; the slow variant
sleeps before it serves, so requests pile up while it boots.
"""

from __future__ import annotations

import json
import shutil
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.lifecycle.headless import RETRY_AFTER
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, SseReader, StartShell, wait_for

pytestmark = pytest.mark.integration

APP = "test.wake.plain"
SLOW = "test.wake.slow"
BROKEN = "test.wake.broken"
READER = "test.wake.reader"
SLOW_START = """import runpy, sys, time
time.sleep(float(sys.argv[1]))
runpy.run_path("server.py", run_name="__main__")
"""


def provider(
    system_apps: Path,
    app_id: str,
    authority: str,
    *,
    source: str = "test.plain.stdlib",
    delay: float | None = None,
    **wake: Any,
) -> None:
    target = system_apps / app_id
    shutil.copytree(TESTS_DIR / "apps" / source, target)
    manifest = json.loads((target / "app.manifest.json").read_text())
    manifest["id"] = app_id
    manifest["dataProvider"] = {
        "authority": authority,
        "providers": [{"path": "/items", "writePerm": f"{app_id}.write"}],
        "wake": True,
        **wake,
    }
    if delay is not None:
        (target / "slow.py").write_text(SLOW_START)
        manifest["entrypoint"] = ["python3", "slow.py", str(delay)]
    (target / "app.manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def wake_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    provider(system_apps, APP, "wakeplain", idleTimeoutMs=1000)
    provider(system_apps, SLOW, "wakeslow", delay=1.0, wakeTimeoutMs=10_000, idleTimeoutMs=60_000)
    provider(system_apps, BROKEN, "wakebroken", source="test.fault.exitsearly")
    reader = system_apps / READER
    reader.mkdir()
    (reader / "entrypoint.sh").write_text("#!/bin/sh\n")
    (reader / "app.manifest.json").write_text(
        json.dumps({"id": READER, "name": "Reader", "version": "1.0.0", "permissions": []})
    )
    return start_shell()


def instances(api: httpx.Client, app_id: str) -> list[dict[str, Any]]:
    return [i for i in api.get("/api/instances").json() if i["appId"] == app_id]


def test_a_data_request_wakes_a_headless_instance_and_idle_stops_it(
    wake_shell: RunningShell,
) -> None:
    with wake_shell.client() as api:
        events = SseReader(api, {"topics": "app:state"})
        assert instances(api, APP) == []
        response = api.get("/api/data/wakeplain/items/x")
        assert response.status_code == 200, response.text
        assert response.json()["path"] == "/api/data/items/x"
        [woken] = instances(api, APP)
        assert woken["instanceId"] == f"{APP}-provider"
        assert woken["state"] == "resumed"
        assert woken["headless"] is True
        assert woken["views"] == 0
        assert woken["wake"]["wakeMs"] > 0
        assert woken["wake"]["requests"] == 1
        assert woken["wake"]["idleTimeoutMs"] == 1000
        assert woken["wake"]["wakes"] == 1
        # a second request goes to the same instance, no second wake
        assert api.get("/api/data/wakeplain/items").status_code == 200
        assert instances(api, APP)[0]["wake"]["requests"] == 2
        assert wake_shell.shell.lifecycle.headless.wakes == {APP: 1}
        # idle for 1 s: stopped and destroyed through the normal moves
        wait_for(lambda: instances(api, APP) == [], "the idle headless instance to go")

        def moves_heard() -> list[tuple[str, str]]:
            return [
                (e.data["from"], e.data["to"])
                for e in events.events
                if e.data["instanceId"] == f"{APP}-provider"
            ]

        # its last moves reach the stream shortly after (each row is written first)
        wait_for(lambda: moves_heard()[-1:] == [("destroyed", "installed")], "the last move")
        moves = moves_heard()
        assert moves[:6] == [
            ("installed", "creating"),
            ("creating", "created"),
            ("created", "starting"),
            ("starting", "started"),
            ("started", "resuming"),
            ("resuming", "resumed"),
        ]
        assert ("resumed", "pausing") in moves
        assert moves[-2:] == [("destroying", "destroyed"), ("destroyed", "installed")]
        # and the next request wakes it again
        assert api.get("/api/data/wakeplain/items").status_code == 200
        assert wake_shell.shell.lifecycle.headless.wakes == {APP: 2}


def test_requests_during_a_wake_share_one_spawn_and_all_succeed(
    wake_shell: RunningShell,
) -> None:
    with wake_shell.client(timeout=30) as api:

        def ask(n: int) -> tuple[int, str]:
            response = api.get(f"/api/data/wakeslow/items/{n}")
            return response.status_code, response.json().get("path", "")

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(8)))
        assert answers == [(200, f"/api/data/items/{n}") for n in range(8)]
        assert wake_shell.shell.lifecycle.headless.wakes == {SLOW: 1}
        [woken] = instances(api, SLOW)
        assert woken["wake"]["requests"] == 8
        assert woken["wake"]["wakeMs"] >= 1000  # the fixture sleeps 1 s before it serves


def test_a_caller_without_permission_never_wakes_the_provider(wake_shell: RunningShell) -> None:
    token = wake_shell.shell.app_tokens.issue(READER, f"{READER}-1", "default")
    with wake_shell.client(token=token) as reader, wake_shell.anonymous() as anonymous:
        refused = reader.post("/api/data/wakeplain/items", content=b"x")
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"
        assert anonymous.post("/api/data/wakeplain/items").status_code == 401
        assert reader.get("/api/data/wakeplain/nothing-here").status_code == 404
    assert wake_shell.shell.lifecycle.of_app(APP) == []
    assert wake_shell.shell.lifecycle.headless.wakes == {}


def test_a_held_request_gives_up_after_the_wake_timeout_and_the_boot_goes_on(
    start_shell: StartShell, system_apps: Path
) -> None:
    provider(system_apps, SLOW, "wakeslow", delay=1.5, wakeTimeoutMs=200)
    shell = start_shell()
    with shell.client() as api:
        held = api.get("/api/data/wakeslow/items")
        assert held.status_code == 503
        assert held.headers["retry-after"] == "1"
        error = held.json()["error"]
        assert error["code"] == "provider_unavailable"
        assert "did not wake within 200 ms" in error["message"]
        wait_for(
            lambda: [i["state"] for i in instances(api, SLOW)] == ["resumed"], "the boot to end"
        )
        assert api.get("/api/data/wakeslow/items").status_code == 200
        assert shell.shell.lifecycle.headless.wakes == {SLOW: 1}


def test_an_upload_waiting_for_its_go_ahead_during_a_wake_is_not_a_stalled_body(
    start_shell: StartShell, system_apps: Path
) -> None:
    """An `Expect: 100-continue` client sends nothing until the shell says go, which it does
    when the request is routed, here after a wake of over a second: that silence is the shell's,
    not a body stall (0.3 s here), and the upload goes through."""
    provider(system_apps, SLOW, "wakeslow", delay=1.0, wakeTimeoutMs=10_000)
    shell = start_shell(stall_seconds=0.3)
    body = b'{"note": "sent after the go-ahead"}'
    with socket.create_connection(("127.0.0.1", shell.settings.port), timeout=30) as sock:
        sock.sendall(
            (
                f"POST /api/data/wakeslow/items HTTP/1.1\r\nHost: 127.0.0.1:{shell.settings.port}"
                f"\r\nAuthorization: Bearer {shell.token}\r\nExpect: 100-continue\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        go_ahead = sock.recv(65536)
        assert go_ahead.startswith(b"HTTP/1.1 100 "), go_ahead[:200]
        sock.sendall(body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["body"] == body.decode()


def test_a_provider_that_cannot_start_is_503_with_the_reason(wake_shell: RunningShell) -> None:
    with wake_shell.client() as api:
        response = api.get("/api/data/wakebroken/items")
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "provider_unavailable"
        assert "waking it failed" in error["message"]
        assert error["state"] == "error"
        # requests right after get the same answer without a spawn each (anyone who may read an
        # open entry can ask)...
        for _ in range(5):
            again = api.get("/api/data/wakebroken/items")
            assert again.status_code == 503
            assert "waking it failed" in again.json()["error"]["message"]
        assert wake_shell.shell.lifecycle.headless.wakes == {BROKEN: 1}
        # ...and once the 5 s have passed, the next request tries again: it does not stick
        headless = wake_shell.shell.lifecycle.headless
        key = (BROKEN, wake_shell.shell.settings.user)  # the bootstrap admin's wake
        failed_at, error = headless._failed[key]
        headless._failed[key] = (failed_at - RETRY_AFTER, error)
        assert api.get("/api/data/wakebroken/items").status_code == 503
        assert headless.wakes == {BROKEN: 2}
        assert [i["instanceId"] for i in instances(api, BROKEN)] == [f"{BROKEN}-provider"]


def test_notes_wakes_after_destroy_and_a_user_launch_gets_its_own_instance_on_the_same_data(
    shell: RunningShell,
) -> None:
    notes = "com.atrium.notes"
    with shell.client() as api:
        launched = api.post("/api/instances", json={"appId": notes}).json()
        assert api.delete(f"/api/instances/{launched['instanceId']}").status_code == 200
        # the README tour: the data is there although Notes is not running
        created = api.post("/api/data/notes/notes", json={"text": "woken"})
        assert created.status_code == 201, created.text
        [woken] = instances(api, notes)
        assert woken["headless"] is True
        # the user's launch is a view instance of its own, never the headless one...
        answer = api.post("/api/instances", json={"appId": notes})
        mine = answer.json()
        assert answer.status_code in {200, 201}, answer.text
        assert mine["instanceId"] == f"{notes}-1"
        assert mine["headless"] is False
        # ...on the data the provider wrote
        lifecycle = shell.shell.lifecycle
        data_dir = lifecycle.get(f"{notes}-1").data_dir
        assert lifecycle.get(f"{notes}-provider").data_dir == data_dir
        saved = json.loads((data_dir / "notes.json").read_text())
        assert [n["text"] for n in saved.values()] == ["woken"]


def test_notes_in_a_background_tab_still_answers_with_the_notes_the_user_wrote(
    shell: RunningShell,
) -> None:
    """The issue's Reader: Notes open but paused (not the visible tab) used to mean 503."""
    notes = "com.atrium.notes"
    with shell.client() as api:
        mine = api.post("/api/instances", json={"appId": notes}).json()["instanceId"]
        assert api.post(f"/api/instances/{mine}/resumed").json()["state"] == "resumed"
        written = api.post("/api/data/notes/notes", json={"text": "from the visible tab"})
        assert written.status_code == 201
        assert api.post(f"/api/instances/{mine}/pause").json()["state"] == "paused"
        listed = api.get("/api/data/notes/notes")
        assert listed.status_code == 200, listed.text
        assert [n["text"] for n in listed.json()] == ["from the visible tab"]
        states = {i["instanceId"]: (i["state"], i["headless"]) for i in instances(api, notes)}
        assert states == {mine: ("paused", False), f"{notes}-provider": ("resumed", True)}
        # both write while both run: neither loses the other's note
        assert api.post("/api/data/notes/notes", json={"text": "while paused"}).status_code == 201
        assert api.post(f"/api/instances/{mine}/resumed").status_code == 200
        texts = sorted(n["text"] for n in api.get("/api/data/notes/notes").json())
        assert texts == ["from the visible tab", "while paused"]


def test_an_update_stops_the_headless_instance_and_the_next_request_wakes_the_new_version(
    start_shell: StartShell, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    provider(source, "test.wake.installed", "wakeinst")
    shell = start_shell()
    with shell.client(timeout=60) as api:
        ref = f"local:{source / 'test.wake.installed'}"
        installed = api.post("/api/dist/install", json={"ref": ref, "autoApprove": True})
        assert installed.status_code == 200, installed.text
        assert api.get("/api/data/wakeinst/items").status_code == 200
        assert [i["headless"] for i in instances(api, "test.wake.installed")] == [True]
        manifest_file = source / "test.wake.installed" / "app.manifest.json"
        manifest = json.loads(manifest_file.read_text())
        manifest_file.write_text(json.dumps({**manifest, "version": "2.0.0"}))
        updated = api.post("/api/dist/update/test.wake.installed", json={"autoApprove": True})
        assert updated.status_code == 200, updated.text
        assert instances(api, "test.wake.installed") == []  # stopped, not brought back
        assert api.get("/api/data/wakeinst/items").status_code == 200
        [woken] = instances(api, "test.wake.installed")
        assert woken["headless"] is True
        assert shell.shell.lifecycle.get(woken["instanceId"]).manifest.version == "2.0.0"
