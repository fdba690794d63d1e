"""Kubernetes runner cost: spawn → started through the fake cluster, and the shell's own CPU per
spawn, beside the local runners' cold start measured in the same run.

Each runner serves the same SDK app (the runner contract's probe, tests/apps/) from a real shell
(uvicorn in a thread, as the integration tests run it): `lifecycle.create` → `started` is timed
on the shell's own loop, then the instance is destroyed (not timed). On Kubernetes that is the
whole path: the Secret, the claim and the Pod through the API (kubernetes-asyncio against the
fake API server), the fake kubelet running the init container (which fetches the app from the
shell by digest) and the app under bubblewrap in a network namespace of its own, the watch
seeing it run, then `/health` at ``podIP:8080``.

"Shell CPU" is the CPU time of the shell's event-loop thread over one spawn (`time.thread_time`
read on that thread): what the shell itself spends per instance, not the time it waits on the
API, the kubelet or the app. The fake cluster runs in this process too (a thread of its own), so
the wall times share one interpreter's lock with it: a real cluster's API is elsewhere.

Targets: none in the issue beyond "pods start in seconds, not the 85 ms of a local spawn"; the
baseline is the process runner, same run.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.lifecycle import use_reachable_python
from bench.report import table
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, launch_shell
from tests.kube.cluster import FakeCluster

ROUNDS = 10
WARMUP = 2
APP = "test.contract.probe"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))  # noqa: S104 - pods reach the shell on the bridge
        port: int = probe.getsockname()[1]
        return port


def system_apps(root: Path) -> Path:
    target = root / "system"
    shutil.copytree(TESTS_DIR / "apps" / APP, target / APP)
    use_reachable_python(target / APP)  # as root, the process runner's app uid needs it
    return target


def spawns(shell: RunningShell, rounds: int) -> tuple[list[float], list[float]]:
    """Wall time and shell-thread CPU time of ``rounds`` spawns to `started`."""

    async def one() -> tuple[float, float]:
        lifecycle = shell.shell.lifecycle
        wall, cpu = time.perf_counter(), time.thread_time()
        instance = await lifecycle.create(APP, new=True)
        took = time.perf_counter() - wall, time.thread_time() - cpu
        assert instance.state.value == "started", instance.state
        await lifecycle.remove(instance.id)
        return took

    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(rounds):
        wall, cpu = shell.on_loop(one())
        walls.append(wall)
        cpus.append(cpu)
    return walls, cpus


def measure(start: Callable[[], RunningShell]) -> tuple[list[float], list[float]]:
    shell = start()
    try:
        spawns(shell, WARMUP)  # page cache, bytecode, the image's first pull
        return spawns(shell, ROUNDS)
    finally:
        shell.stop()


def local(runner: str, root: Path) -> tuple[list[float], list[float]]:
    apps = system_apps(root / runner)
    return measure(lambda: launch_shell(root / f"home-{runner}", apps, runner=runner))


def kubernetes(root: Path) -> tuple[list[float], list[float]]:
    cluster = FakeCluster()
    cluster.start()
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    cluster.call(cluster.api.create, "v1/namespaces", "", {"metadata": {"name": namespace}})
    apps = system_apps(root / "kubernetes")
    port = free_port()
    options: dict[str, Any] = {
        "host": "0.0.0.0",  # noqa: S104 - pods reach the shell on the bridge
        "port": port,
        "runner": "kubernetes",
        "kube_config": cluster.kubeconfig,
        "kube_namespace": namespace,
        "kube_shell_url": f"http://{cluster.host_address}:{port}",
        "kube_start_timeout_seconds": 60.0,
    }
    try:
        return measure(lambda: launch_shell(root / "home-kubernetes", apps, **options))
    finally:
        cluster.stop()


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # the process runner's apps run under their own uid
        process = local("process", root)
        bwrap = local("bwrap", root)
        kube = kubernetes(root)
    title = f"{ROUNDS} rounds after {WARMUP} unmeasured, one app ({APP}, SDK)"
    table(
        f"Spawn → started: local cold start and a pod through the fake kubelet; {title}",
        [
            ("process runner (baseline)", process[0]),
            ("bwrap runner", bwrap[0]),
            ("kubernetes runner (fake API + kubelet)", kube[0]),
        ],
        baseline="process runner (baseline)",
    )
    table(
        "The shell's own CPU per spawn (its event-loop thread)",
        [
            ("process runner (baseline)", process[1]),
            ("bwrap runner", bwrap[1]),
            ("kubernetes runner", kube[1]),
        ],
        baseline="process runner (baseline)",
    )
