"""One fake Kubernetes cluster: the fake API server and the fake kubelet, on their own thread.

They run on a loop of their own so that a test may block (a synchronous HTTP call, a shell
started as a subprocess that talks to the API) without stalling the cluster. Everything the
cluster makes on the host is named after the session (``atk<pid>``): the bridge ``atk<pid>b``,
namespaces ``atk<pid>-<n>``, veths ``atk<pid>h<n>``, the memory cgroup
``/sys/fs/cgroup/memory/atk<pid>`` and the folder ``/tmp/atrium-kube-<pid>``; `sweep` removes
what a session that died without cleaning left (its pid no longer runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web

from tests.kube.fake_api import FakeApi
from tests.kube.kubelet import MEMORY_CGROUP, PIDS_CGROUP, Kubelet

T = TypeVar("T")
PREFIX = "atk"
TMP = Path("/tmp")  # noqa: S108


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _dead_owner(name: str) -> bool:
    match = re.match(rf"{PREFIX}(\d+)", name)
    return (
        match is not None and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1)))
    )


def sweep() -> list[str]:
    """Remove the links, namespaces, cgroups and folders of earlier sessions that died."""
    removed: list[str] = []
    links = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=False
    ).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if _dead_owner(name):
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
            removed.append(name)
    spaces = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=False
    ).stdout
    for line in spaces.splitlines():
        name = line.split()[0] if line.split() else ""
        if _dead_owner(name):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
            removed.append(name)
    for hierarchy in (MEMORY_CGROUP, PIDS_CGROUP):
        for parent in hierarchy.glob(f"{PREFIX}*") if hierarchy.is_dir() else []:
            if _dead_owner(parent.name):
                for child in [p for p in parent.iterdir() if p.is_dir()]:
                    with contextlib.suppress(OSError):
                        for pid in (child / "cgroup.procs").read_text().split():
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(int(pid), signal.SIGKILL)
                    with contextlib.suppress(OSError):
                        child.rmdir()
                with contextlib.suppress(OSError):
                    parent.rmdir()
                removed.append(str(parent))
    for folder in TMP.glob("atrium-kube-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.213.0.0/16 that no route or address of this host uses."""
    used = subprocess.run(
        ["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True, check=False
    )
    taken = used.stdout
    start = os.getpid() % 200
    for step in range(256):
        third = (start + step) % 256
        if f"10.213.{third}." not in taken:
            return ipaddress.IPv4Network(f"10.213.{third}.0/24")
    raise RuntimeError("no free /24 in 10.213.0.0/16")


class FakeCluster:
    """A started fake cluster. `url` (the API, on `host`), `kubeconfig` (a file naming it),
    `host_address` (where pods reach the host: the bridge's address in the root namespace),
    `api` (the `FakeApi`: state and faults) and `kubelet` (the `Kubelet`: images, ceilings,
    claim folders). Call into either from a test with `call` (a function run on the cluster's
    loop) or `run` (a coroutine); the fault helpers below are safe from any thread."""

    def __init__(
        self, name: str = "", host: str = "127.0.0.1", setup: Callable[[], None] | None = None
    ) -> None:
        """``name``: told apart from the session's cluster (its links, namespaces, cgroups and
        folder carry it too); ``host``: where the API listens; ``setup``: run first on the
        cluster's thread (the failover test moves it into a network namespace: the bridge, the
        pods' links and the API's socket are then made there)."""
        self.prefix = f"{PREFIX}{os.getpid()}{name}"
        self.root = TMP / f"atrium-kube-{name}{'-' if name else ''}{os.getpid()}"
        self.host = host
        self.api = FakeApi()
        self.kubelet = Kubelet(self.api, self.prefix, self.root, free_subnet())
        self.loop = asyncio.new_event_loop()
        self._setup = setup
        self.thread = threading.Thread(target=self._serve, name="fake-cluster", daemon=True)
        self.port = 0
        self._runner: aiohttp.web.ServerRunner | None = None
        self._site: aiohttp.web.TCPSite | None = None
        self._reopen: asyncio.Task[None] | None = None

    def _serve(self) -> None:
        if self._setup is not None:
            self._setup()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def host_address(self) -> str:
        return self.kubelet.gateway

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def start(self) -> FakeCluster:
        sweep()
        self.root.mkdir(parents=True, exist_ok=True)
        self.thread.start()
        self.run(self._start())
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": "atrium"},
                }
            ],
            "current-context": "fake",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))  # JSON is YAML
        return self

    async def _start(self) -> None:
        await self.api.__aenter__()
        # at the end, open watches are cut at once: aiohttp's default waits 60 s for them
        self._runner = aiohttp.web.ServerRunner(
            aiohttp.web.Server(self.api), handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        self._site = aiohttp.web.TCPSite(self._runner, self.host, self.port)
        await self._site.start()
        server = self._site._server
        assert server is not None
        assert hasattr(server, "sockets")
        self.port = server.sockets[0].getsockname()[1]
        await self.kubelet.start()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self._stop(), timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()
        shutil.rmtree(self.root, ignore_errors=True)

    async def _stop(self) -> None:
        try:
            await self.kubelet.stop()
        finally:
            if self._runner is not None:
                await self._runner.cleanup()
            await self.api.__aexit__(None, None, None)
            # what is left on the loop (kmock's stream feeders, cut handlers) ends here, not
            # as "Task was destroyed" noise when the loop closes
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the cluster's loop, its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a function on the cluster's loop (the state is the loop's), its result."""

        async def wrapped() -> T:
            return fn(*args)

        return self.run(wrapped())

    async def acall(self, fn: Callable[..., T], *args: Any) -> T:
        """`call` for async tests: awaits without blocking the test's loop."""

        async def wrapped() -> T:
            return fn(*args)

        future = asyncio.run_coroutine_threadsafe(wrapped(), self.loop)
        return await asyncio.wrap_future(future)

    # --- faults ----------------------------------------------------------------------------------

    def fail_next(self, method: str, path: str, status: int, count: int = 1) -> None:
        """The next ``count`` requests with ``method`` (``*``: any) whose path matches the regular
        expression ``path`` get ``status`` (403, 409, 410, 422, ...) and change nothing."""
        self.api.fail_next(method, path, status, count)

    def outage(self, seconds: float, refuse: bool = False) -> None:
        """The API is down for ``seconds``: open watches end and every request answers 503, or
        with ``refuse`` the port is closed (connections refused, every open connection cut) and
        opened again after."""
        if not refuse:
            self.api.outage(seconds)
            self.call(self.api.cut_watches)
            return
        self.run(self._refuse(seconds))

    async def _refuse(self, seconds: float) -> None:
        assert self._site is not None
        assert self._runner is not None
        await self._site.stop()
        server = self._runner.server
        if server is not None:
            await server.shutdown(
                0.05
            )  # (0 would mean no timeout) the open connections (watches, keep-alive) are cut too

        async def reopen() -> None:
            await asyncio.sleep(seconds)
            assert self._runner is not None
            self._site = aiohttp.web.TCPSite(self._runner, self.host, self.port)
            await self._site.start()

        self._reopen = asyncio.get_running_loop().create_task(reopen())

    def expire_watches(self) -> None:
        """Every open watch ends with a 410 Gone ERROR event; resuming from before now is refused."""
        self.call(self.api.expire_watches)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored pod (a copy), None if there is none."""
        obj = self.call(self.api.get, "v1/pods", namespace, name)
        return json.loads(json.dumps(obj)) if obj is not None else None


async def wait_for(
    check: Callable[[], Awaitable[T | None]], timeout: float = 20, step: float = 0.05
) -> T:
    """Poll ``check`` until it returns something other than None (or time out)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result is not None:
            return result
        if loop.time() > deadline:
            raise TimeoutError("the fake cluster did not get there in time")
        await asyncio.sleep(step)


__all__ = ["FakeCluster", "sweep", "wait_for"]
