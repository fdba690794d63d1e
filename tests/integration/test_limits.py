"""Resource limits through the real shell and the real bwrap runner: each instance in its own
cgroup, a memory overrun kills that instance alone (reason ``oom``), a fork past ``pids`` fails
inside the app, and destroy leaves no cgroup behind; where no cgroup is used, rlimits set in the
child before it executes; a fork bomb or a 10 GiB allocation leaves the shell and other apps
answering either way."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
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
    shell_key,
)
from atrium.lifecycle.runners import SpawnSpec
from atrium.lifecycle.runners.process import ProcessRunner, descendants
from tests.conftest import REPO_DIR
from tests.integration.conftest import RunningShell, SseReader, StartShell, add_test_apps


def usable_here() -> bool:
    """Whether a shell here can make its cgroups (tried, not guessed: a cgroup v2 whose
    controllers cannot be handed down, such as a root cgroup holding processes, is detected as
    v2 and only fails when the shell makes its folder)."""
    with tempfile.TemporaryDirectory() as home:
        made = Cgroups(detect_cgroups(), Path(home), Limits(None, None, None))
        made.close()
        return made.enforced


CGROUPS_HERE = usable_here()
pytestmark = pytest.mark.integration
needs_cgroups = pytest.mark.skipif(
    not CGROUPS_HERE, reason="no usable cgroup here: limits are not enforced with cgroups"
)

HOG = "test.load.hog"
MEMORY = "test.load.memory"
BOMB = "test.load.bomb"


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


@needs_cgroups
def test_the_instance_object_shows_the_limits_applied(api: httpx.Client) -> None:
    hog = launch(api, HOG)
    assert hog["limits"] == {
        "memoryMiB": 64,
        "cpuMilli": 500,
        "pids": 16,
        "enforcement": "cgroup",
    }
    plain = launch(api, "test.plain.stdlib")
    assert plain["limits"] == {
        "memoryMiB": 1024,
        "cpuMilli": None,
        "pids": 1024,
        "enforcement": "cgroup",
    }
    assert api.get(f"/api/instances/{hog['instanceId']}").json()["limits"]["pids"] == 16


@needs_cgroups
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


@needs_cgroups
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


@needs_cgroups
def test_a_fork_past_the_pids_limit_fails_inside_the_app(api: httpx.Client) -> None:
    hog = launch(api, HOG)["instanceId"]
    answer = api.post(f"/api/proxy/{hog}/fork", params={"n": "40"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["failed"] > 0
    assert body["forked"] < 16
    assert api.get(f"/api/instances/{hog}").json()["state"] == "started"
    assert api.get(f"/api/proxy/{hog}/health").status_code == 200


@needs_cgroups
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


@needs_cgroups
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


@needs_cgroups
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


def test_where_no_cgroup_is_usable_rlimits_hold_and_the_instance_says_so(
    start_shell: StartShell, system_apps: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No usable cgroup: the limits rlimits can hold are set in the child before it executes
    (memory as RLIMIT_DATA, processes as RLIMIT_NPROC of the app's own uid) and said (the log,
    once; ``enforcement: "rlimit"``, ``cpuMilli: null``), never silently dropped."""
    add_test_apps(system_apps, HOG)
    not_a_cgroup = tmp_path / "plain-folder"
    not_a_cgroup.mkdir()
    shell = start_shell(runner="bwrap", cgroup_parent=not_a_cgroup)
    with shell.client(timeout=30) as client:
        instance = client.post("/api/instances", json={"appId": HOG}).json()
    assert instance["state"] == "started"
    own_uid = os.geteuid() == 0  # the app runs under a uid of its own only when the shell is root
    assert instance["limits"] == {
        "memoryMiB": 64,
        "cpuMilli": None,
        "pids": 16 if own_uid else None,
        "enforcement": "rlimit",
    }
    said = [r.getMessage() for r in caplog.records if "rlimits" in r.getMessage()]
    assert len(said) == 1
    assert str(not_a_cgroup) in said[0]
    limits = app_rlimits(instance["pid"])
    assert limits["Max data size"] == str(64 * 1024 * 1024)
    assert limits["Max processes"] == (str(16) if own_uid else "unlimited")


def app_rlimits(pid: int) -> dict[str, str]:
    """The soft limits of the app's own process below ``pid`` (bwrap or the keeper): the
    deepest descendant running ``server.py``."""
    tree = [s.pid for s in descendants(pid)]
    app = next(p for p in reversed(tree) if b"server.py" in Path(f"/proc/{p}/cmdline").read_bytes())
    found: dict[str, str] = {}
    for line in Path(f"/proc/{app}/limits").read_text().splitlines()[1:]:
        name, soft = line[:26].strip(), line[26:].split()[0]
        found[name] = soft
    return found


@pytest.mark.parametrize("enforcement", [pytest.param("cgroup", marks=needs_cgroups), "rlimit"])
def test_a_fork_bomb_and_a_10_gib_allocation_leave_the_shell_and_other_apps_answering(
    start_shell: StartShell, system_apps: Path, enforcement: str
) -> None:
    """One app allocates 10 GiB, then forks without end (limits 64 MiB, 32 processes): the
    allocation ends that app (``oom``, with a cgroup) or is refused inside it (rlimit), the bomb
    stays within 32 processes, and the shell's API and another app answer all along."""
    if enforcement == "rlimit" and os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC holds only where the app runs under its own uid (a root shell)")
    add_test_apps(system_apps, BOMB, "test.plain.stdlib")
    shell = start_shell(runner="bwrap", app_limits="auto" if enforcement == "cgroup" else "rlimit")
    with shell.client(timeout=30) as api:
        other = launch(api, "test.plain.stdlib")["instanceId"]
        bomb = launch(api, BOMB)
        assert bomb["limits"]["enforcement"] == enforcement
        assert bomb["limits"]["memoryMiB"] == 64
        assert bomb["limits"]["pids"] == 32

        events = SseReader(api, {"topics": "app:crashed"})
        try:
            answer = api.post(f"/api/proxy/{bomb['instanceId']}/alloc", params={"gib": "10"})
        except httpx.TransportError:
            answer = None
        if enforcement == "cgroup":
            events.wait(1)
            assert events.events[0].data["reason"] == "oom"
            assert api.get(f"/api/instances/{bomb['instanceId']}").json()["state"] == "error"
            bomb = launch(api, BOMB)
        else:  # RLIMIT_DATA: malloc is refused, the app says so and keeps running
            assert answer is not None
            assert answer.status_code == 507, answer.text
            assert answer.json()["heldMiB"] < 64
        still_answering(api, other)

        assert api.post(f"/api/proxy/{bomb['instanceId']}/bomb").status_code == 200
        counts = []
        for _ in range(10):
            time.sleep(0.2)
            counts.append(len(descendants(bomb["pid"])))
            still_answering(api, other)
        # bwrap's own processes and the keeper are not the app's uid: at most 2 more than 32
        assert 16 <= max(counts) <= 32 + 2, counts
        assert api.delete(f"/api/instances/{bomb['instanceId']}").status_code == 200
        assert descendants(bomb["pid"]) == []


def still_answering(api: httpx.Client, other: str) -> None:
    """The shell's API and another app's /health answer, each within 3 s (a starved shell or
    machine would not)."""
    for path in ("/api/instances", f"/api/proxy/{other}/health"):
        began = time.monotonic()
        assert api.get(path, timeout=10).status_code == 200
        assert time.monotonic() - began < 3.0, path


async def test_the_process_runner_sets_the_rlimits_before_the_app_executes(tmp_path: Path) -> None:
    """Limits held with rlimits: the keeper and the app below it run with the memory limit set;
    no process limit where the app shares the shell's uid (``user`` None: RLIMIT_NPROC would
    count the shell's own processes)."""
    (tmp_path / "app").mkdir()
    limits = Limits(48, None, 32, "rlimit")
    spec = SpawnSpec(
        app_id="probe",
        instance_id="probe-1",
        app_dir=tmp_path / "app",
        argv=[sys.executable, "-c", "import time\ntime.sleep(60)"],
        env={},
        data_dir=tmp_path / "data",
        host="127.0.0.1",
        port=1,
        log_path=tmp_path / "log",
        limits=limits,
    )
    child = await ProcessRunner().spawn(spec)
    try:
        for _ in range(500):
            if descendants(child.pid):
                break
            await asyncio.sleep(0.01)
        for pid in [child.pid, *(s.pid for s in descendants(child.pid))]:
            text = Path(f"/proc/{pid}/limits").read_text()
            data = next(line for line in text.splitlines() if line.startswith("Max data size"))
            nproc = next(line for line in text.splitlines() if line.startswith("Max processes"))
            assert data.split()[3:5] == [str(48 << 20)] * 2, data
            assert "unlimited" not in data
            assert (
                nproc.split()[2]
                == Path("/proc/self/limits").read_text().split("Max processes")[1].split()[0]
            )
    finally:
        await child.stop(0.5)


def run_doctor(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")}
    return subprocess.run(
        [sys.executable, "-m", "atrium", "doctor", *args],
        env={**clean, "ATRIUM_HOME": str(home), **env},
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("mode", ["auto", "rlimit"])
def test_doctor_says_how_a_shell_here_would_hold_the_limits(tmp_path: Path, mode: str) -> None:
    """`atrium doctor` names the way (cgroup v2, v1 or rlimits), why, and the ceilings, without
    making any cgroup."""
    env = {"ATRIUM_APP_LIMITS": mode, "ATRIUM_APP_MEMORY_MIB": "512", "ATRIUM_APP_PIDS": "64"}
    said = run_doctor(tmp_path / "home", **env)
    assert said.returncode == 0, said.stderr
    line = next(x for x in said.stdout.splitlines() if x.startswith("limits: "))
    answer = run_doctor(tmp_path / "home", "--json", **env)
    limits = json.loads(answer.stdout)["limits"]
    assert limits["ceilings"] == {"memoryMiB": 512, "cpuMilli": None, "pids": 64}
    if mode == "auto" and CGROUPS_HERE:
        assert limits["enforcement"] == "cgroup"
        assert limits["cgroup"] in (1, 2)
        assert f"cgroup v{limits['cgroup']}" in line
    else:
        assert limits["enforcement"] == "rlimit"
        assert limits["cgroup"] is None
        assert "rlimits" in line
        assert "ATRIUM_APP_LIMITS" in limits["why"] or mode == "auto"
    assert "512 MiB of memory, 64 processes, no CPU quota" in line
    assert limits["why"] in line
    assert not list(Path("/sys/fs/cgroup/memory").glob(f"atrium-{shell_key(tmp_path / 'home')}"))


def test_ps_shows_each_instances_memory_and_cpu_beside_its_limit(
    start_shell: StartShell, system_apps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`atrium ps`: current memory of the limit (``12.3 MiB of 64 MiB``) and CPU per instance."""
    from typer.testing import CliRunner

    from atrium.cli.main import app

    add_test_apps(system_apps, HOG)
    shell = start_shell(runner="bwrap", app_limits="rlimit", usage_seconds=0.2)
    with shell.client(timeout=30) as api:
        hog = launch(api, HOG)["instanceId"]
        for _ in range(100):  # the shell's first figures come after one sampling period
            if api.get("/api/system/usage").json()["instances"]:
                break
            time.sleep(0.1)
    monkeypatch.setenv("ATRIUM_URL", shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", shell.token)
    monkeypatch.setenv("COLUMNS", "240")
    listed = CliRunner().invoke(app, ["ps"])
    assert listed.exit_code == 0, listed.output
    header = next(line for line in listed.output.splitlines() if "instance" in line)
    assert "memory" in header
    assert "cpu" in header
    row = next(line for line in listed.output.splitlines() if hog in line)
    assert re.search(r"\d+(\.\d)? MiB of 64 MiB", row), row
    assert re.search(r"\d+\.\d %", row), row
