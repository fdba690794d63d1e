"""Resource limits through the real shell and the real bwrap runner: each instance in its own
cgroup, a memory overrun kills that instance alone (reason ``oom``), a fork past ``pids`` fails
inside the app, and destroy leaves no cgroup behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.lifecycle.limits import (
    Cgroups,
    InstanceCgroup,
    Limits,
    detect_cgroups,
    enter_from_child,
)
from atrium.lifecycle.runners import SpawnSpec
from atrium.lifecycle.runners.process import ProcessRunner, descendants
from tests.integration.conftest import RunningShell, SseReader, StartShell, add_test_apps


def usable_here() -> bool:
    """Whether a shell here can make its cgroups (tried, not guessed: a cgroup v2 whose
    controllers cannot be handed down, such as a root cgroup holding processes, is detected as
    v2 and only fails when the shell makes its folder)."""
    with tempfile.TemporaryDirectory() as home:
        made = Cgroups(detect_cgroups(), Path(home), Limits(None, None, None))
        made.close()
        return made.enforced


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not usable_here(), reason="no usable cgroup here: limits are not enforced"),
]

HOG = "test.load.hog"
MEMORY = "test.load.memory"


@pytest.fixture
def limits_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    add_test_apps(system_apps, HOG, MEMORY, "test.plain.stdlib")
    return start_shell(runner="bwrap")


@pytest.fixture
def api(limits_shell: RunningShell) -> Iterator[httpx.Client]:
    with limits_shell.client(timeout=30) as client:
        yield client


def launch(api: httpx.Client, app_id: str) -> dict[str, Any]:
    response = api.post("/api/instances", json={"appId": app_id})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
def cgroups(tmp_path: Path) -> Iterator[Cgroups]:
    """The cgroups of a shell on ``tmp_path``, all removed at teardown whatever the test did."""
    made = Cgroups(detect_cgroups(), tmp_path, Limits(256, None, 64))
    yield made
    for base in made.bases:
        for folder in base.iterdir():
            if folder.is_dir():
                InstanceCgroup([folder], made.version or 1).try_remove()
    made.close()


def memory_cgroup(pid: int) -> Path:
    """The memory cgroup folder of a running process (v1 memory line, else the v2 line)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    fields = [line.split(":", 2) for line in lines]
    v1 = [path for _, names, path in fields if "memory" in names.split(",")]
    if v1 and Path("/sys/fs/cgroup/memory").is_dir():
        return Path("/sys/fs/cgroup/memory" + v1[0])
    return Path("/sys/fs/cgroup" + next(path for hid, _, path in fields if hid == "0"))


def test_the_instance_object_shows_the_limits_applied(api: httpx.Client) -> None:
    hog = launch(api, HOG)
    assert hog["limits"] == {"memoryMiB": 64, "cpuMilli": 500, "pids": 16}
    plain = launch(api, "test.plain.stdlib")
    assert plain["limits"] == {"memoryMiB": 1024, "cpuMilli": None, "pids": 1024}
    assert api.get(f"/api/instances/{hog['instanceId']}").json()["limits"]["pids"] == 16


def test_an_app_past_its_memory_limit_dies_alone_with_reason_oom(api: httpx.Client) -> None:
    hog = launch(api, HOG)["instanceId"]
    other = launch(api, MEMORY)["instanceId"]
    events = SseReader(api, {"topics": "app:crashed"})
    with contextlib.suppress(httpx.TransportError):  # it dies mid-answer: the point
        api.post(f"/api/proxy/{hog}/alloc", params={"mib": "200"})
    events.wait(1)
    time.sleep(0.5)  # a second event would come now
    assert [e.data for e in events.events] == [
        {
            "type": "app:crashed",
            "instanceId": hog,
            "appId": HOG,
            "exitCode": events.events[0].data["exitCode"],
            "state": "started",
            "reason": "oom",
        }
    ]
    dead = api.get(f"/api/instances/{hog}").json()
    assert dead["state"] == "error"
    assert "out of memory" in dead["error"]
    assert api.get(f"/api/instances/{other}").json()["state"] == "started"
    assert api.get(f"/api/proxy/{other}/health").status_code == 200
    assert api.get("/api/instances").status_code == 200


def test_an_app_past_its_memory_limit_while_starting_fails_with_cause_oom(
    start_shell: StartShell, system_apps: Path
) -> None:
    add_test_apps(system_apps, MEMORY)  # holds 48 MiB as it starts
    manifest = system_apps / MEMORY / "app.manifest.json"
    manifest.write_text(
        json.dumps({**json.loads(manifest.read_text()), "resources": {"memoryMiB": 32}})
    )
    shell = start_shell(runner="bwrap")
    with shell.client(timeout=30) as client:
        answer = client.post("/api/instances", json={"appId": MEMORY})
    assert answer.status_code == 502, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["cause"]) == ("spawn_failed", "oom")
    assert "out of memory (its limit is 32 MiB)" in error["message"]


def test_a_fork_past_the_pids_limit_fails_inside_the_app(api: httpx.Client) -> None:
    hog = launch(api, HOG)["instanceId"]
    answer = api.post(f"/api/proxy/{hog}/fork", params={"n": "40"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["failed"] > 0
    assert body["forked"] < 16
    assert api.get(f"/api/instances/{hog}").json()["state"] == "started"
    assert api.get(f"/api/proxy/{hog}/health").status_code == 200


def test_destroy_removes_the_instances_cgroup(api: httpx.Client) -> None:
    instance = launch(api, HOG)
    folder = memory_cgroup(instance["pid"])
    assert folder.name == instance["instanceId"]
    assert folder.is_dir()
    assert api.delete(f"/api/instances/{instance['instanceId']}").status_code == 200
    assert not folder.exists()


def test_a_bad_resources_value_is_a_manifest_problem(
    start_shell: StartShell, system_apps: Path
) -> None:
    add_test_apps(system_apps, HOG)
    manifest = system_apps / HOG / "app.manifest.json"
    data = json.loads(manifest.read_text())
    data["resources"] = {"memoryMiB": 0, "pids": "many"}
    manifest.write_text(json.dumps(data))
    shell = start_shell(runner="bwrap")
    with shell.client() as client:
        app = next(a for a in client.get("/api/apps").json() if a["id"] == HOG)
    fields = {p["field"] for p in app["problems"]}
    assert fields == {"resources.memoryMiB", "resources.pids"}, app["problems"]


async def test_the_process_runner_puts_the_whole_tree_in_the_cgroup(
    tmp_path: Path, cgroups: Cgroups
) -> None:
    """The process runner (keeper, app, a forked child) under the same cgroup, removed after."""
    cgroup = cgroups.make("probe-1", Limits(256, None, 64))
    assert cgroup is not None
    (tmp_path / "app").mkdir()
    spec = SpawnSpec(
        app_id="probe",
        instance_id="probe-1",
        app_dir=tmp_path / "app",
        argv=[sys.executable, "-c", "import os, time\nos.fork()\ntime.sleep(60)"],
        env={},
        data_dir=tmp_path / "data",
        host="127.0.0.1",
        port=1,
        log_path=tmp_path / "log",
        limits=Limits(256, None, 64),
        cgroup=cgroup,
    )
    child = await ProcessRunner().spawn(spec)
    try:
        for _ in range(500):
            if len(descendants(child.pid)) >= 2:
                break
            await asyncio.sleep(0.01)
        tree = [child.pid, *(s.pid for s in descendants(child.pid))]
        assert len(tree) >= 3
        assert sorted(tree) == cgroup.pids()
    finally:
        await child.stop(0.5)
    assert child.status is not None
    assert child.status.reason == "exited"  # stopped by the shell, not killed
    assert not any(folder.exists() for folder in cgroup.folders)


def test_a_cgroup_still_in_use_under_the_same_id_is_never_joined_nor_killed(
    cgroups: Cgroups,
) -> None:
    """Two runs under one id (two owners' trials of one app, `<appId>-check`): the second gets a
    folder of its own, so its end kills nothing of the first; a stale empty folder is replaced."""
    first = cgroups.make("probe-check", Limits(256, None, 64))
    assert first is not None
    fds = first.open_procs()
    try:
        sleeper = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            preexec_fn=lambda: enter_from_child(fds),
        )
    finally:
        for fd in fds:
            os.close(fd)
    try:
        second = cgroups.make("probe-check", Limits(128, None, 32))
        assert second is not None
        assert [f.name for f in second.folders] == ["probe-check~2"] * len(second.folders)
        assert second.try_remove()
        assert sleeper.poll() is None
        assert first.pids() == [sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
    for _ in range(500):
        if first.try_remove():
            break
        time.sleep(0.01)
    stale = [folder.parent / "probe-stale" for folder in first.folders]
    for folder in stale:
        folder.mkdir()
    again = cgroups.make("probe-stale", Limits(256, None, 64))
    assert again is not None
    assert list(again.folders) == stale
    assert again.try_remove()


def test_where_no_cgroup_is_usable_instances_say_limits_null(
    start_shell: StartShell, system_apps: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Limits not enforced are said (the log, once; `limits: null`), never silently dropped."""
    add_test_apps(system_apps, HOG)
    not_a_cgroup = tmp_path / "plain-folder"
    not_a_cgroup.mkdir()
    shell = start_shell(runner="bwrap", cgroup_parent=not_a_cgroup)
    with shell.client(timeout=30) as client:
        instance = client.post("/api/instances", json={"appId": HOG}).json()
    assert instance["state"] == "started"
    assert instance["limits"] is None
    said = [r.getMessage() for r in caplog.records if "NOT enforced" in r.getMessage()]
    assert len(said) == 1
    assert str(not_a_cgroup) in said[0]
