"""The warm pool starts nothing of an app while an operation holds it (docs/api.md "Waking a
provider" says the same of a wake): an update's registry event (`app:installed` for the new
version) and its own restart of the app's instances ask the pool to refill, while the update
still holds the app (it is bringing its instances back, then pruning its backups). The refill
waits for the operation's end. Real shell, real processes; the app's `onStart` hook waits on a
file, which holds the update inside its restart of `<appId>-1`."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import pytest

from atrium.errors import SpawnFailed
from atrium.lifecycle.instance import Instance
from atrium.lifecycle.runners import RunningApp, SpawnSpec
from tests.integration.conftest import RunningShell, wait_for
from tests.integration.distribution.conftest import MakeApp, installed_ok, write_manifest
from tests.integration.distribution.test_wake_during_operations import BLOCKING, in_background

pytestmark = pytest.mark.integration
APP = "com.example.pooled"


def pooled(shell: RunningShell) -> list[Instance]:
    lifecycle = shell.shell.lifecycle
    return [i for i in lifecycle.of_app(APP) if lifecycle.is_pooled(i)]


def pooled_resumed(shell: RunningShell) -> list[Instance]:
    return [i for i in pooled(shell) if i.state.value == "resumed"]


def test_the_pool_refills_only_after_an_update_ends(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    source = make_app(APP, entrypoint=["python3", "blocking.py"], warmPool=1)
    (source / "blocking.py").write_text(BLOCKING)
    installed_ok(api, f"local:{source}")
    wait_for(lambda: pooled_resumed(dist_shell), "the warm pool to fill")
    launched = api.post("/api/instances", json={"appId": APP}).json()
    data = home / "scopes/global/apps" / APP / launched["instanceId"]
    [refilled] = wait_for(lambda: pooled_resumed(dist_shell), "the pool to refill behind it")
    assert refilled.id != launched["instanceId"]

    write_manifest(source, version="2.0.0", entrypoint=["python3", "blocking.py"], warmPool=1)
    (data / "block-onStart").write_text("")
    locks = dist_shell.shell.dist.locks
    with dist_shell.client(timeout=60) as client:
        update, answers = in_background(lambda: client.post(f"/api/dist/update/{APP}", json={}))
        wait_for(
            lambda: (data / "in-onStart").exists() or answers, "the update to restart the instance"
        )
        # nothing pooled meanwhile: a refill here took the id (and the data) of the instance the
        # update was about to bring back, whose restart then failed
        assert [i.id for i in pooled(dist_shell)] == []
        assert (answers, locks.operation(APP)) == ([], "update")
        # the new version is visible (app:installed) and the restart asked for a refill: the
        # pool waits for the update's end
        wait_for(lambda: APP in dist_shell.shell.lifecycle.pool.held, "the refill to wait")
        assert [i.id for i in pooled(dist_shell)] == []
        (data / "block-onStart").unlink()
        update.join(60)
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["record"]["version"] == "2.0.0"
    back = dist_shell.shell.lifecycle.find(launched["instanceId"])
    assert back is not None
    assert not dist_shell.shell.lifecycle.is_pooled(back)
    assert back.state.value == "started"
    assert back.manifest.version == "2.0.0"
    [again] = wait_for(lambda: pooled_resumed(dist_shell), "the pool to refill after the update")
    assert again.manifest.version == "2.0.0"
    assert APP not in dist_shell.shell.lifecycle.pool.held


def test_an_operation_waits_for_a_pooled_instance_still_spawning_before_it_copies(
    api: httpx.Client, make_app: MakeApp, dist_shell: RunningShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operation's stop drains the pool. A pooled instance whose boot is inside the runner's
    spawn has no child yet: ended then without its lock, its child was started after its end,
    outside the index, and ran on its data folder through the operation and after it (the next
    refill started another on the same folder). The drain now waits for the boot under the
    instance's lock. The spawn is held by wrapping the shell's runner (it is over in tens of ms,
    too short to meet by chance); the child, the processes and the data are real."""
    installed_ok(api, f"local:{make_app(APP, warmPool=1)}")
    wait_for(lambda: pooled_resumed(dist_shell), "the warm pool to fill")
    runner = dist_shell.shell.lifecycle._booter.runner
    spawn = runner.spawn
    held, go = threading.Event(), threading.Event()
    children: list[RunningApp] = []

    async def holding(spec: SpawnSpec) -> RunningApp:
        if not held.is_set():
            held.set()
            await asyncio.to_thread(go.wait, 60)
            children.append(await spawn(spec))
            return children[-1]
        return await spawn(spec)

    monkeypatch.setattr(runner, "spawn", holding)
    api.post("/api/instances", json={"appId": APP})  # takes the pooled one: a refill boots
    wait_for(held.is_set, "the refill's spawn")
    [spawning] = pooled(dist_shell)
    with dist_shell.client(timeout=60) as client:
        backup, answers = in_background(lambda: client.post(f"/api/dist/backups/{APP}"))
        wait_for(lambda: dist_shell.shell.dist.locks.operation(APP) == "backup", "the backup")
        go.set()
        backup.join(60)
    [answer] = answers
    assert answer.status_code == 200, answer.text
    [child] = children
    # ended with its instance, which left the index (the refill after the backup may take its
    # id again, with a child of its own): nothing of the app runs outside the index
    wait_for(lambda: child.status is not None, "the drained instance's child to end")
    assert dist_shell.shell.lifecycle.find(spawning.id) is not spawning


def test_a_pool_spawn_that_failed_is_tried_again(
    api: httpx.Client, make_app: MakeApp, dist_shell: RunningShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refill whose spawn failed once (a start deadline met on a busy machine) left the pool
    empty until the next launch or install: the first try here fails, the pool is full a
    moment later, and the failed instance is not left listed in `error`. The failure is made
    by wrapping the shell's runner; the retried spawn, its child and the shell are real."""
    installed_ok(api, f"local:{make_app(APP, warmPool=1)}")
    wait_for(lambda: pooled_resumed(dist_shell), "the warm pool to fill")
    runner = dist_shell.shell.lifecycle._booter.runner
    spawn = runner.spawn
    failed = threading.Event()

    async def failing_once(spec: SpawnSpec) -> RunningApp:
        if not failed.is_set():
            failed.set()
            raise SpawnFailed("a start deadline met on a busy machine", app_id=APP, cause="port")
        return await spawn(spec)

    monkeypatch.setattr(runner, "spawn", failing_once)
    launched = api.post("/api/instances", json={"appId": APP})  # takes the pooled one
    assert launched.status_code == 200, launched.text
    wait_for(failed.is_set, "the refill's first spawn")
    [refilled] = wait_for(lambda: pooled_resumed(dist_shell), "the pool to refill on a retry")
    assert refilled.id != launched.json()["instanceId"]
    states = {i.id: i.state.value for i in dist_shell.shell.lifecycle.of_app(APP)}
    assert "error" not in states.values(), states
