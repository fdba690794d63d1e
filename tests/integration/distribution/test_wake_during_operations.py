"""Nothing wakes during an operation (docs/api.md "Waking a provider"): a backup, restore, export,
update or rollback stops the app's instances so that what it copies is one state; a data request
meanwhile is held until the operation ends (or answered 503 once the app's `wakeTimeoutMs` has
passed), and never starts `<appId>-provider` on the data being copied. Real shell, real
processes; the app's `onStop` hook waits on a file, which holds the backup inside its stop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import RunningShell, SseReader, wait_for
from tests.integration.distribution.conftest import MakeApp, installed_ok

pytestmark = pytest.mark.integration
APP = "com.example.wakeheld"
PROVIDER = f"{APP}-provider"
#: the stdlib fixture server, with lifecycle hooks that wait while `$OS_DATA_DIR/block-<hook>`
#: exists (writing `in-<hook>` first, so the test knows it is there), and a start that sleeps
#: 1.5 s while `$OS_DATA_DIR/slow-start` exists
BLOCKING = """import os, pathlib, time
from http.server import ThreadingHTTPServer

import server

data = pathlib.Path(os.environ["OS_DATA_DIR"])
route = server.Handler.route


def blocking(self):
    if self.path.startswith("/api/lifecycle/"):
        hook = self.path.rsplit("/", 1)[-1]
        gate = data / f"block-{hook}"
        if gate.exists():
            (data / f"in-{hook}").write_text(os.environ["OS_INSTANCE_ID"])
        deadline = time.monotonic() + 60
        while gate.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    route(self)


for verb in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
    setattr(server.Handler, f"do_{verb}", blocking)
if (data / "slow-start").exists():
    time.sleep(1.5)
httpd = ThreadingHTTPServer((os.environ["OS_HOST"], int(os.environ["OS_PORT"])), server.Handler)
httpd.daemon_threads = True
httpd.serve_forever()
"""


def provider_app(api: httpx.Client, make_app: MakeApp, home: Path, **wake: Any) -> Path:
    """APP installed (a provider with `wake`) and launched once: `<APP>-1`, `started`, whose
    data folder the headless provider would share; returns that folder."""
    source = make_app(
        APP,
        entrypoint=["python3", "blocking.py"],
        dataProvider={
            "authority": "wakeheld",
            "providers": [{"path": "/items"}],
            "wake": True,
            "idleTimeoutMs": 60_000,
            **wake,
        },
    )
    (source / "blocking.py").write_text(BLOCKING)
    installed_ok(api, f"local:{source}")
    launched = api.post("/api/instances", json={"appId": APP}).json()
    assert (launched["instanceId"], launched["state"]) == (f"{APP}-1", "started")
    return home / "scopes/global/apps" / APP / f"{APP}-1"


def in_background(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    thread.start()
    return thread, answers


def backup_held_in_its_stop(
    shell: RunningShell, data: Path
) -> tuple[threading.Thread, list[Any], httpx.Client]:
    """A backup of APP started and held inside its stop of `<APP>-1` (its `onStop` waits on
    `block-onStop`, which the caller removes to let the backup go on)."""
    (data / "block-onStop").write_text("")
    client = shell.client(timeout=60)
    thread, answers = in_background(lambda: client.post(f"/api/dist/backups/{APP}"))
    wait_for(lambda: (data / "in-onStop").exists(), "the backup to stop the app's instance")
    return thread, answers, client


def started_meanwhile(shell: RunningShell) -> bool:
    """Whether the held data request reached the shell: it woke a provider (the defect) or is
    waiting for the operation to end."""
    headless = shell.shell.lifecycle.headless
    return shell.shell.lifecycle.find(PROVIDER) is not None or bool(
        getattr(headless, "held", {}).get(APP)
    )


def moves_of(events: SseReader, instance_id: str) -> list[tuple[int, str]]:
    """(position in the stream, target state) of every move of ``instance_id``."""
    return [
        (n, e.data["to"])
        for n, e in enumerate(events.of("app:state"))
        if e.data["instanceId"] == instance_id
    ]


def test_a_data_request_during_a_backup_is_held_and_wakes_the_provider_only_after_it(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    data = provider_app(api, make_app, home, wakeTimeoutMs=60_000)
    events = SseReader(api, {"topics": "app:state"})
    backup, backed_up, backup_client = backup_held_in_its_stop(dist_shell, data)
    with dist_shell.client(timeout=60) as caller:
        request, answered = in_background(lambda: caller.get("/api/data/wakeheld/items/x"))
        wait_for(lambda: started_meanwhile(dist_shell), "the data request to reach the shell")
        # the backup has the app stopped (or is stopping it): nothing of it may start now
        assert dist_shell.shell.lifecycle.find(PROVIDER) is None, "woken during the backup"
        assert answered == []  # held, not refused
        (data / "block-onStop").unlink()
        backup.join(60)
        request.join(60)
    backup_client.close()
    [taken] = backed_up
    assert taken.status_code == 200, taken.text
    [answer] = answered
    assert answer.status_code == 200, answer.text
    assert answer.json()["path"] == "/api/data/items/x"
    # the order the shell moved things in: `<APP>-1` stopped and started again by the backup,
    # and only then the provider created
    wait_for(lambda: moves_of(events, PROVIDER), "the provider's moves")
    restarted = [n for n, to in moves_of(events, f"{APP}-1") if to == "started"][-1]
    woke = next(n for n, to in moves_of(events, PROVIDER) if to == "creating")
    assert woke > restarted
    assert dist_shell.shell.lifecycle.headless.wakes == {APP: 1}
    # the copy was taken after the stop (the hook's mark is in it)
    folder = home / "backups/global" / APP / taken.json()["id"] / "data" / f"{APP}-1"
    assert (folder / "in-onStop").read_text() == f"{APP}-1"


def test_a_request_held_past_its_wake_timeout_is_503_and_wakes_nothing(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    data = provider_app(api, make_app, home, wakeTimeoutMs=300)
    backup, backed_up, backup_client = backup_held_in_its_stop(dist_shell, data)
    refused = api.get("/api/data/wakeheld/items/x")
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "provider_unavailable"
    assert "a backup of the app holds it" in error["message"]
    assert "300 ms" in error["message"]
    assert dist_shell.shell.lifecycle.find(PROVIDER) is None
    (data / "block-onStop").unlink()
    backup.join(60)
    backup_client.close()
    assert backed_up[0].status_code == 200
    # the caller gave up before anything started: nothing wakes for nobody afterwards
    assert dist_shell.shell.lifecycle.headless.wakes == {}
    assert [i["instanceId"] for i in api.get("/api/instances").json()] == [f"{APP}-1"]


def test_a_request_held_through_an_uninstall_finds_no_provider(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    data = provider_app(api, make_app, home, wakeTimeoutMs=60_000)
    (data / "block-onStop").write_text("")
    removing, removed = in_background(lambda: api.delete(f"/api/dist/uninstall/{APP}"))
    wait_for(lambda: (data / "in-onStop").exists(), "the uninstall to stop the app's instance")
    with dist_shell.client(timeout=60) as caller:
        request, answered = in_background(lambda: caller.get("/api/data/wakeheld/items/x"))
        wait_for(lambda: started_meanwhile(dist_shell), "the data request to reach the shell")
        (data / "block-onStop").unlink()
        removing.join(60)
        request.join(60)
    assert removed[0].status_code == 200, removed[0].text
    [answer] = answered
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "no_provider"
    assert dist_shell.shell.lifecycle.headless.wakes == {}


def test_a_launch_during_a_backup_starts_nothing_and_says_why(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    """A launch (the user's, or an intent an app sends) is the other way to start the app on its
    data meanwhile: it is refused while the operation holds the app, never queued."""
    data = provider_app(api, make_app, home, wakeTimeoutMs=60_000)
    backup, backed_up, backup_client = backup_held_in_its_stop(dist_shell, data)
    launched = api.post("/api/instances", json={"appId": APP, "new": True})
    assert launched.status_code == 409, launched.text
    error = launched.json()["error"]
    assert (error["code"], error["appId"], error["operation"]) == ("busy", APP, "backup")
    assert [i.id for i in dist_shell.shell.lifecycle.of_app(APP)] == [f"{APP}-1"]
    (data / "block-onStop").unlink()
    backup.join(60)
    backup_client.close()
    assert backed_up[0].status_code == 200
    # once it has ended, the launch goes through
    again = api.post("/api/instances", json={"appId": APP, "new": True})
    assert again.status_code in {200, 201}, again.text


def test_a_backup_stops_a_woken_provider_and_does_not_bring_it_back(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    provider_app(api, make_app, home, wakeTimeoutMs=60_000)
    assert api.get("/api/data/wakeheld/items/x").status_code == 200
    woken = api.get(f"/api/instances/{PROVIDER}").json()
    assert (woken["state"], woken["headless"]) == ("resumed", True)
    taken = api.post(f"/api/dist/backups/{APP}")
    assert taken.status_code == 200, taken.text
    # stopped for the copy like the app's other instance; only that one is started again
    assert [i["instanceId"] for i in api.get("/api/instances").json()] == [f"{APP}-1"]
    assert api.get("/api/data/wakeheld/items/y").status_code == 200
    assert dist_shell.shell.lifecycle.headless.wakes == {APP: 2}


def test_a_wake_booting_when_a_backup_begins_is_stopped_and_woken_again_after_it(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    data = provider_app(api, make_app, home, wakeTimeoutMs=60_000)
    (data / "slow-start").write_text("")  # the provider (on this folder) boots for 1.5 s
    events = SseReader(api, {"topics": "app:state"})
    with dist_shell.client(timeout=60) as caller:
        request, answered = in_background(lambda: caller.get("/api/data/wakeheld/items/x"))
        wait_for(lambda: moves_of(events, PROVIDER), "the wake to begin")
        (data / "slow-start").unlink()
        taken = api.post(f"/api/dist/backups/{APP}")
        request.join(60)
    assert taken.status_code == 200, taken.text
    [answer] = answered
    assert answer.status_code == 200, answer.text
    # the first boot was stopped by the backup; the request waited for the backup's end and
    # was answered by a second one, created after the backup had started `<APP>-1` again
    moves = moves_of(events, PROVIDER)
    creations = [n for n, to in moves if to == "creating"]
    assert len(creations) == 2
    assert any(to == "destroyed" for n, to in moves if n < creations[1])
    restarted = [n for n, to in moves_of(events, f"{APP}-1") if to == "started"][-1]
    assert creations[1] > restarted
    assert dist_shell.shell.lifecycle.headless.wakes == {APP: 2}
