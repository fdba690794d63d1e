"""Instances as real sandboxed child processes walking the 14-state machine (real hooks, real
crashes, the fixture apps of tests/apps named by behaviour)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, SseReader, StartShell, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def lifecycle_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    for app in (TESTS_DIR / "apps").iterdir():
        if app.is_dir():
            shutil.copytree(app, system_apps / app.name)
    return start_shell()


@pytest.fixture
def api(lifecycle_shell: RunningShell) -> Iterator[httpx.Client]:
    with lifecycle_shell.client(timeout=30) as client:
        yield client


def launch(api: httpx.Client, app_id: str, **extra: Any) -> dict[str, Any]:
    response = api.post("/api/instances", json={"appId": app_id, **extra})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def act(api: httpx.Client, instance_id: str, action: str) -> httpx.Response:
    return api.post(f"/api/instances/{instance_id}/{action}")


def state(api: httpx.Client, instance_id: str) -> str:
    response = api.get(f"/api/instances/{instance_id}")
    if response.status_code == 404:
        return "installed"
    value: str = response.json()["state"]
    return value


def raw_event_stream(shell: RunningShell, client: str) -> socket.socket:
    """An event stream on a plain socket, so the test decides exactly when it goes away."""
    sock = socket.create_connection(("127.0.0.1", shell.settings.port), timeout=10)
    sock.sendall(
        f"GET /api/events?client={client} HTTP/1.1\r\nHost: localhost\r\n"
        f"Authorization: Bearer {shell.token}\r\n\r\n".encode()
    )
    received = b""
    while b": connected" not in received:
        received += sock.recv(4096)
    return sock


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_launch_walks_to_started_and_destroy_walks_back(
    lifecycle_shell: RunningShell, api: httpx.Client
) -> None:
    events = SseReader(api, {"topics": "app:state"})
    instance = launch(api, "test.sdk.echo", new=True)
    assert instance["state"] == "started"
    assert instance["instanceId"].startswith("test.sdk.echo-")
    assert instance["port"]
    assert instance["pid"]
    pid = instance["pid"]
    iid = instance["instanceId"]
    assert act(api, iid, "resume").json()["state"] == "resuming"
    assert act(api, iid, "resumed").json()["state"] == "resumed"
    assert act(api, iid, "pause").json()["state"] == "paused"
    assert act(api, iid, "stop").json()["state"] == "stopped"
    assert pid_alive(pid)  # stopping keeps the runner and port up
    assert act(api, iid, "start").json()["state"] == "started"
    assert act(api, iid, "stop").json()["state"] == "stopped"
    destroyed = act(api, iid, "destroy")
    assert destroyed.json()["state"] == "installed"
    assert api.get(f"/api/instances/{iid}").status_code == 404
    wait_for(lambda: not pid_alive(pid), "the child to be gone")
    wait_for(
        lambda: (
            ("destroyed", "installed") in [(e.data["from"], e.data["to"]) for e in events.events]
        ),
        "the last move",
    )
    moves = [(e.data["from"], e.data["to"]) for e in events.events if e.data["instanceId"] == iid]
    assert moves[:4] == [
        ("installed", "creating"),
        ("creating", "created"),
        ("created", "starting"),
        ("starting", "started"),
    ]
    assert moves[-3:] == [
        ("stopped", "destroying"),
        ("destroying", "destroyed"),
        ("destroyed", "installed"),
    ]


def test_an_illegal_action_is_409_and_emits_lifecycle_error(api: httpx.Client) -> None:
    iid = launch(api, "test.sdk.echo", new=True)["instanceId"]
    events = SseReader(api, {"topics": "app:lifecycle.error"})
    response = act(api, iid, "pause")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "illegal_transition"
    assert (error["from"], error["to"]) == ("started", "pausing")
    events.wait(1)
    assert events.events[0].data == {
        "type": "app:lifecycle.error",
        "instanceId": iid,
        "appId": "test.sdk.echo",
        "from": "started",
        "to": "pausing",
        "message": error["message"],
    }
    assert state(api, iid) == "started"


def test_an_unknown_action_is_400(api: httpx.Client) -> None:
    iid = launch(api, "test.sdk.echo", new=True)["instanceId"]
    assert act(api, iid, "explode").status_code == 400


def test_create_reuses_the_live_instance_unless_new(api: httpx.Client) -> None:
    first = launch(api, "test.plain.stdlib")
    again = launch(api, "test.plain.stdlib")
    fresh = launch(api, "test.plain.stdlib", new=True)
    assert again["instanceId"] == first["instanceId"]
    assert fresh["instanceId"] != first["instanceId"]
    assert {first["instanceId"], fresh["instanceId"]} == {
        "test.plain.stdlib-1",
        "test.plain.stdlib-2",
    }


@pytest.mark.parametrize(
    ("app_id", "cause"),
    [
        ("test.fault.wrongidentity", "identity"),
        ("test.fault.exitsearly", "exited"),
        ("test.fault.neverhealthy", "timeout"),
        ("test.fault.wrongport", "port"),
    ],
)
def test_a_failed_spawn_goes_to_error_with_its_reason(
    api: httpx.Client, app_id: str, cause: str
) -> None:
    response = api.post("/api/instances", json={"appId": app_id})
    assert response.status_code == 502
    error = response.json()["error"]
    assert (error["code"], error["cause"]) == ("spawn_failed", cause)
    (instance,) = [i for i in api.get("/api/instances").json() if i["appId"] == app_id]
    assert instance["state"] == "error"
    assert instance["error"].startswith(f"spawn failed ({cause})")
    assert instance["port"] is None
    assert act(api, instance["instanceId"], "reset").json()["state"] == "installed"


def test_a_bind_mount_failure_goes_to_error_with_cause_mount(
    lifecycle_shell: RunningShell, api: httpx.Client
) -> None:
    runtime = lifecycle_shell.settings.home / "scopes/system/apps/test.sdk.datawriter"
    runtime.mkdir(parents=True)
    (runtime / "test.sdk.datawriter-1").write_text("a file where the data directory must be")
    response = api.post("/api/instances", json={"appId": "test.sdk.datawriter"})
    assert response.status_code == 502
    assert response.json()["error"]["cause"] == "mount"
    assert state(api, "test.sdk.datawriter-1") == "error"


def test_a_slow_start_within_its_deadline_succeeds(api: httpx.Client) -> None:
    assert launch(api, "test.fault.slowstart")["state"] == "started"


def test_a_crash_goes_to_error_and_emits_app_crashed(api: httpx.Client) -> None:
    iid = launch(api, "test.fault.crashes")["instanceId"]
    act(api, iid, "resumed")
    events = SseReader(api, {"topics": "app:crashed"})
    api.post(f"/api/proxy/{iid}/crash")
    events.wait(1)
    assert events.events[0].data == {
        "type": "app:crashed",
        "instanceId": iid,
        "appId": "test.fault.crashes",
        "exitCode": 7,
        "state": "resumed",
        "reason": "exited",
    }
    instance = api.get(f"/api/instances/{iid}").json()
    assert instance["state"] == "error"
    assert instance["port"] is None
    assert act(api, iid, "retry").json()["state"] == "started"


def test_a_failed_hook_leaves_the_state_and_answers_502(
    lifecycle_shell: RunningShell, api: httpx.Client
) -> None:
    iid = launch(api, "test.fault.hookfails")["instanceId"]
    data = lifecycle_shell.settings.home / "scopes/system/apps/test.fault.hookfails" / iid
    (data / "fail-onResume").write_text("")
    response = act(api, iid, "resume")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "hook_failed"
    assert state(api, iid) == "started"
    (data / "fail-onResume").unlink()
    assert act(api, iid, "resume").json()["state"] == "resuming"


def test_a_failed_oncreate_goes_to_error(lifecycle_shell: RunningShell, api: httpx.Client) -> None:
    data = lifecycle_shell.settings.home / "scopes/system/apps/test.fault.hookfails"
    (data / "test.fault.hookfails-1").mkdir(parents=True)
    (data / "test.fault.hookfails-1" / "fail-onCreate").write_text("")
    response = api.post("/api/instances", json={"appId": "test.fault.hookfails"})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "hook_failed"
    assert state(api, "test.fault.hookfails-1") == "error"


def test_a_blocked_hook_holds_the_transient_state(
    lifecycle_shell: RunningShell, api: httpx.Client
) -> None:
    iid = launch(api, "test.fault.hookblocks")["instanceId"]
    data = lifecycle_shell.settings.home / "scopes/system/apps/test.fault.hookblocks" / iid
    act(api, iid, "resumed")
    (data / "block-onPause").write_text("")
    with lifecycle_shell.client(timeout=30) as other:
        result: list[httpx.Response] = []
        pausing = threading.Thread(target=lambda: result.append(act(other, iid, "pause")))
        pausing.start()
        wait_for(lambda: state(api, iid) == "pausing", "the pausing state")
        (data / "block-onPause").unlink()
        pausing.join(30)
    assert result[0].json()["state"] == "paused"


def test_the_data_dir_is_mounted_at_data(lifecycle_shell: RunningShell, api: httpx.Client) -> None:
    iid = launch(api, "test.sdk.datawriter")["instanceId"]
    assert api.post(f"/api/proxy/{iid}/write?name=hello").status_code == 200
    data = lifecycle_shell.settings.home / "scopes/system/apps/test.sdk.datawriter" / iid
    assert (data / "hello").exists()


def test_tools_are_confined_to_what_the_manifest_declares(api: httpx.Client) -> None:
    assert api.put("/api/tools/git", json={"path": shutil.which("git")}).status_code == 200
    with_git = launch(api, "test.sdk.tools")["instanceId"]
    without = launch(api, "test.sdk.notools")["instanceId"]
    allowed = api.get(f"/api/proxy/{with_git}/run?cmd=git").json()
    refused = api.get(f"/api/proxy/{without}/run?cmd=git").json()
    assert allowed["git"] == 0
    assert allowed["/usr/bin/git"] == 0
    assert refused["git"] != 0
    assert refused["/usr/bin/git"] != 0


#: a GET of ``http://HOST:PORT/health`` from the network of the process PID: its status
DIRECT_GET: Final = (
    "import sys, urllib.error, urllib.request\n"
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=10).status)\n"
    "except urllib.error.HTTPError as err:\n"
    "    print(err.code)\n"
)


def test_the_app_refuses_requests_without_the_shell_secret(
    api: httpx.Client, lifecycle_shell: RunningShell
) -> None:
    instance = launch(api, "test.sdk.echo")
    # a request not from the shell: from inside the instance's own network (the host's, or the
    # namespace of its own, where only the shell's connections come from outside)
    address = lifecycle_shell.shell.lifecycle.get(instance["instanceId"]).address
    direct = subprocess.run(
        ["nsenter", f"--net=/proc/{instance['pid']}/ns/net", "/usr/bin/python3", "-c", DIRECT_GET,
         f"http://{address.host}:{address.port}/health"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert direct.stdout.strip() == "403", direct
    via_shell = api.get(f"/api/proxy/{instance['instanceId']}/health")
    assert via_shell.status_code == 200


def test_destroy_kills_the_whole_process_group(api: httpx.Client) -> None:
    instance = launch(api, "test.sdk.echo", new=True)
    pgid = os.getpgid(instance["pid"])
    assert api.delete(f"/api/instances/{instance['instanceId']}").status_code == 200

    def group_gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(group_gone, "the process group to be gone")


def test_force_delete_kills_without_hooks_from_any_state(
    lifecycle_shell: RunningShell, api: httpx.Client
) -> None:
    instance = launch(api, "test.fault.hookfails")
    data = (
        lifecycle_shell.settings.home
        / "scopes/system/apps/test.fault.hookfails"
        / instance["instanceId"]
    )
    for hook in ("onStop", "onDestroy", "onPause"):
        (data / f"fail-{hook}").write_text("")
    response = api.delete(f"/api/instances/{instance['instanceId']}", params={"force": "1"})
    assert response.status_code == 200
    wait_for(lambda: not pid_alive(instance["pid"]), "the child to be killed")
    assert state(api, instance["instanceId"]) == "installed"


def test_activities_walk_the_instance_to_resumed_and_never_change_its_state(
    api: httpx.Client,
) -> None:
    iid = launch(api, "com.atrium.viewer")["instanceId"]
    events = SseReader(api, {"topics": "activity:opened"})
    created = api.post(f"/api/instances/{iid}/activities", json={"extras": {"text": "hi"}})
    assert created.status_code == 200, created.text
    activity = created.json()
    assert activity["path"].startswith("/activity/")
    assert state(api, iid) == "resumed"
    events.wait(1)
    assert events.events[0].data["activityId"] == activity["activityId"]
    act(api, iid, "pause")
    deleted = api.delete(f"/api/instances/{iid}/activities/{activity['activityId']}")
    assert deleted.status_code == 200
    assert state(api, iid) == "paused"
    assert api.delete(f"/api/instances/{iid}/activities/nope").status_code == 404


def test_dropping_the_last_view_stops_the_instance_unless_background(api: httpx.Client) -> None:
    plain = launch(api, "test.sdk.echo", new=True)["instanceId"]
    background = launch(api, "test.bg.service")["instanceId"]
    for iid in (plain, background):
        view = api.post(f"/api/instances/{iid}/views", json={}).json()
        act(api, iid, "resumed")
        assert api.delete(f"/api/instances/{iid}/views/{view['viewId']}").status_code == 200
    assert state(api, plain) == "stopped"
    assert state(api, background) == "resumed"


def test_a_warm_pool_instance_is_handed_out_resumed_and_refilled(api: httpx.Client) -> None:
    def pooled() -> list[dict[str, Any]]:
        return [
            i
            for i in api.get("/api/instances").json()
            if i["appId"] == "test.sdk.echo" and i["pooled"]
        ]

    first = wait_for(lambda: [i for i in pooled() if i["state"] == "resumed"], "the warm pool")[0]
    claimed = launch(api, "test.sdk.echo")
    assert claimed["instanceId"] == first["instanceId"]
    assert claimed["state"] == "resumed"
    assert claimed["pooled"] is False
    refill = wait_for(lambda: [i for i in pooled() if i["state"] == "resumed"], "the refill")
    assert refill[0]["instanceId"] != first["instanceId"]


def test_logs_tail_the_instance_output(api: httpx.Client) -> None:
    iid = launch(api, "test.sdk.echo", new=True)["instanceId"]
    response = api.get(f"/api/instances/{iid}/logs", params={"lines": "50"})
    assert response.status_code == 200
    assert api.get(f"/api/instances/{iid}/logs", params={"lines": "x"}).status_code == 400
    # digits Python's isdigit() takes but int() does not: still a bad request, never a 500
    for bad in ({"lines": "²"}, {"after": "²"}, {"after": "-1"}, {"after": "1" * 19}):
        assert api.get(f"/api/instances/{iid}/logs", params=bad).status_code == 400, bad
    # following: what was written after an offset, and the offset to ask after next
    first = api.get(f"/api/instances/{iid}/logs", params={"after": "0"})
    end = int(first.headers["X-Log-End"])
    again = api.get(f"/api/instances/{iid}/logs", params={"after": str(end)})
    assert (again.status_code, again.text) == (200, "")
    past = api.get(f"/api/instances/{iid}/logs", params={"after": str(end + 10**9)})
    assert past.text == first.text  # a replaced log reads from its start


def test_shutdown_destroys_every_instance(start_shell: StartShell, system_apps: Path) -> None:
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", system_apps / "test.sdk.echo")
    shell = start_shell()
    with shell.client(timeout=30) as api:
        pids = [launch(api, "test.sdk.echo", new=True)["pid"] for _ in range(2)]
        pids += [i["pid"] for i in api.get("/api/instances").json() if i["pooled"]]
    shell.stop()
    for pid in pids:

        def gone(pid: int = pid) -> bool:
            return not pid_alive(pid)

        wait_for(gone, f"pid {pid} to be gone")


def test_views_of_a_host_page_whose_stream_is_gone_are_released(
    start_shell: StartShell, system_apps: Path
) -> None:
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", system_apps / "test.sdk.echo")
    shell = start_shell(view_grace_seconds=0.3)
    with shell.client(timeout=30) as api:
        iid = launch(api, "test.sdk.echo", new=True)["instanceId"]
        kept = api.post(f"/api/instances/{iid}/views", json={"client": "tab-kept-1"}).json()
        gone = api.post(f"/api/instances/{iid}/views", json={"client": "tab-gone-1"}).json()
        with shell.client(timeout=30) as tab:
            stream = SseReader(tab, {"client": "tab-kept-1"})
            closing_tab = raw_event_stream(shell, "tab-gone-1")
            closing_tab.close()
            wait_for(
                lambda: api.get(f"/api/instances/{iid}").json()["views"] == 1,
                "the gone tab's view to be released",
            )
            assert api.delete(f"/api/instances/{iid}/views/{gone['viewId']}").status_code == 404
            assert api.delete(f"/api/instances/{iid}/views/{kept['viewId']}").status_code == 200
            assert not stream.ended.is_set()


def _gone(api: httpx.Client, iid: str) -> bool:
    return all(i["instanceId"] != iid for i in api.get("/api/instances").json())


def test_delete_ends_an_instance_whose_onstart_failed(
    lifecycle_shell: RunningShell, api: httpx.Client
) -> None:
    """Issue 14 row 5: a failed `onStart` leaves `created`, from which no move reaches
    `stopping`; DELETE still ends the instance and says what it skipped."""
    data = lifecycle_shell.settings.home / "scopes/system/apps/test.fault.hookfails"
    (data / "test.fault.hookfails-1").mkdir(parents=True)
    (data / "test.fault.hookfails-1" / "fail-onStart").write_text("")
    response = api.post("/api/instances", json={"appId": "test.fault.hookfails"})
    assert response.status_code == 502
    iid = "test.fault.hookfails-1"
    assert state(api, iid) == "created"
    pid = lifecycle_shell.shell.lifecycle.get(iid).child.pid  # type: ignore[union-attr]
    deleted = api.delete(f"/api/instances/{iid}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["state"] == "installed"
    assert "created" in deleted.json()["problem"]
    assert _gone(api, iid)
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), "the child to be gone")


def test_delete_ends_an_instance_whose_stop_hook_fails(
    lifecycle_shell: RunningShell, api: httpx.Client
) -> None:
    iid = launch(api, "test.fault.hookfails")["instanceId"]
    data = lifecycle_shell.settings.home / "scopes/system/apps/test.fault.hookfails" / iid
    (data / "fail-onStop").write_text("")
    deleted = api.delete(f"/api/instances/{iid}")
    assert deleted.status_code == 200, deleted.text
    assert "onStop" in deleted.json()["problem"]
    assert _gone(api, iid)


def test_a_view_or_activity_of_a_stopped_instance_is_not_serving_and_moves_nothing(
    api: httpx.Client,
) -> None:
    """Issue 19: nothing moves, so `409 not_serving` naming the state, and no
    `app:lifecycle.error` (which announces a refused move)."""
    iid = launch(api, "test.sdk.echo", new=True)["instanceId"]
    assert act(api, iid, "stop").json()["state"] == "stopped"
    events = SseReader(api, {"topics": "app:lifecycle.error"})
    view = api.post(f"/api/instances/{iid}/views", json={"path": "/"})
    assert view.status_code == 409, view.text
    assert view.json()["error"]["code"] == "not_serving"
    assert view.json()["error"]["state"] == "stopped"
    activity = api.delete(f"/api/instances/{iid}/activities/nope")
    assert activity.status_code == 404  # an unknown activity is named first
    assert state(api, iid) == "stopped"
    act(api, iid, "pause")  # a refused move: its event is the marker that the stream is live
    events.wait(1)
    assert [e.data["to"] for e in events.events] == ["pausing"]


def test_a_spawn_whose_log_cannot_be_opened_goes_to_error_and_retries(
    lifecycle_shell: RunningShell, api: httpx.Client
) -> None:
    """Issue 14 row 2: an OSError before the child starts (here: `run/logs` is a file, which
    stops root too) is `spawn_failed` with cause `setup` and the instance in `error`, never 500
    and never stuck in `creating`; retry works once the cause is gone."""
    logs = lifecycle_shell.settings.home / "run" / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.write_text("not a folder")
    response = api.post("/api/instances", json={"appId": "test.plain.stdlib", "new": True})
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "spawn_failed"
    assert error["cause"] == "setup"
    assert "run/logs" in error["message"]
    iid = next(
        i["instanceId"]
        for i in api.get("/api/instances").json()
        if i["appId"] == "test.plain.stdlib"
    )
    assert state(api, iid) == "error"
    logs.unlink()
    assert act(api, iid, "retry").json()["state"] == "started"
    assert api.delete(f"/api/instances/{iid}").status_code == 200


def test_nothing_boots_once_the_lifecycle_has_shut_down(
    lifecycle_shell: RunningShell, api: httpx.Client
) -> None:
    """An operation whose copy outlives the shutdown grace restarts the instances it stopped when
    it ends (same ids); after the lifecycle's shutdown that spawned a child nothing would stop."""
    import asyncio

    from atrium.errors import ShuttingDown

    first = launch(api, "test.sdk.echo")["instanceId"]
    lifecycle = lifecycle_shell.shell.lifecycle
    loop = lifecycle_shell.server._loop
    assert loop is not None

    async def shut_then_bring_back() -> BaseException | None:
        await lifecycle.shutdown()
        try:
            await lifecycle.create("test.sdk.echo", new=True, instance_id=first)
        except ShuttingDown as err:
            return err
        return None

    refused = asyncio.run_coroutine_threadsafe(shut_then_bring_back(), loop).result(30)
    assert isinstance(refused, ShuttingDown)
    assert lifecycle.all() == []
