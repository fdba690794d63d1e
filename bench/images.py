"""An image app's spawn → first HTTP 200: Debian's busybox-static httpd as an unpacked image (the
store's layout: files 0444/0555, folders 0755, the mount points), started by the image runner
(`atrium.lifecycle.runners.image`: the relay, setpriv, bwrap with its user namespace mapped by
the shell, its own network and the forwarder) and polled through the forwarder's port until it
answers 200. Goal: ≤ 300 ms (median), the image already pulled. Root only.

A second row is the same busybox started by plain bwrap on the host network (no user namespace
of the shell's, no forwarder) as the baseline: what the image runner's own steps cost; a third
the image runner with the instance in a network of its own on the shell's bridge
(`atrium.lifecycle.network`, polled at its address). Then one request through the forwarder of a
running instance, and one at an instance's address on the bridge.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from atrium.httppool import marked_socket
from atrium.images.config import Launch
from atrium.lifecycle.network import SHELL_MARK, Network, NetworkUnavailable, open_network
from atrium.lifecycle.runners import SpawnSpec
from atrium.lifecycle.runners.image import ImageRun, ImageRunner, image_ids
from bench.report import table

RUNS = 15
GOAL_MS = 300.0
#: how long one spawn may take to answer before the bench stops, saying so (it never hangs)
PATIENCE = 30.0
#: the own-network rows' range (another shell on this machine may hold the default one)
RANGE = "10.217.0.0/16"
BUSYBOX = Path("/bin/busybox")


def rootfs(folder: Path) -> Path:
    root = folder / "rootfs"
    for name in ("bin", "www", "etc", "proc", "dev", "sys", "tmp", "run"):
        (root / name).mkdir(parents=True, mode=0o755)
    shutil.copyfile(BUSYBOX, root / "bin" / "busybox")
    (root / "bin" / "busybox").chmod(0o555)
    (root / "www" / "index.html").write_text("hello from the image\n")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    return root


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def first_200(
    session: aiohttp.ClientSession, port: int, started: float, host: str = "127.0.0.1"
) -> float:
    while True:
        try:
            async with session.get(f"http://{host}:{port}/") as response:
                if response.status == 200:
                    return time.perf_counter() - started
        except aiohttp.ClientError:
            pass
        if time.perf_counter() - started > PATIENCE:
            raise RuntimeError(f"no 200 from http://{host}:{port}/ within {PATIENCE:.0f} s")
        await asyncio.sleep(0.002)


def shells_socket(info: tuple[Any, ...]) -> socket.socket:
    """A socket marked as the shell marks its own: the host's table refuses any other
    connection to an instance's address on the bridge."""
    return marked_socket(info[0], SHELL_MARK)


async def image_runs(
    folder: Path, root: Path, network: Network | None = None
) -> tuple[list[float], list[float]]:
    runner = ImageRunner(network=network)
    launch = Launch(
        argv=("/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/www"),
        env={"PATH": "/bin"},
        cwd="/www",
        port=80,
    )
    run = ImageRun(root, launch, image_ids("bench.image"), ())
    spawns: list[float] = []
    requests: list[float] = []
    connector = aiohttp.TCPConnector(socket_factory=shells_socket if network else None)
    async with aiohttp.ClientSession(connector=connector) as session:
        for number in range(RUNS):
            port = free_port()
            spec = SpawnSpec(
                app_id="bench.image",
                instance_id=f"bench.image-{number}",
                app_dir=folder,
                argv=launch.argv,
                env={},
                data_dir=folder / "data" / str(number),
                host="127.0.0.1",
                port=port,
                log_path=folder / "logs" / f"{number}.log",
            )
            started = time.perf_counter()
            child = await runner.spawn(spec, run)
            spawns.append(await first_200(session, child.port, started, child.host))
            for _ in range(20):
                began = time.perf_counter()
                async with session.get(f"http://{child.host}:{child.port}/") as response:
                    await response.read()
                requests.append(time.perf_counter() - began)
            await child.stop(1.0)
    return spawns, requests


async def bwrap_runs(root: Path) -> list[float]:
    samples: list[float] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(RUNS):
            port = free_port()
            started = time.perf_counter()
            process = await asyncio.create_subprocess_exec(
                "bwrap", "--ro-bind", str(root), "/", "--proc", "/proc", "--dev", "/dev",
                "--unshare-pid", "--die-with-parent", "--",
                "/bin/busybox", "httpd", "-f", "-p", str(port), "-h", "/www",
            )  # fmt: skip
            samples.append(await first_200(session, port, started))
            process.kill()
            await process.wait()
    return samples


async def main() -> None:
    if os.geteuid() != 0 or not BUSYBOX.is_file():
        print("\nimages: skipped (needs root and Debian's busybox-static at /bin/busybox)")
        return
    with tempfile.TemporaryDirectory(prefix="atrium-bench-images-") as name:
        folder = Path(name)
        folder.chmod(0o755)
        root = rootfs(folder)
        spawns, requests = await image_runs(folder, root)
        plain = await bwrap_runs(root)
        try:
            network: Network | None = open_network(RANGE, free_port())
        except NetworkUnavailable as err:
            print(f"\nimages: no own network here ({err})")
            network = None
        own: list[float] = []
        own_requests: list[float] = []
        if network is not None:
            try:
                own, own_requests = await image_runs(folder, root, network)
            finally:
                network.close()
    table(
        f"Image app: spawn → first HTTP 200 (busybox httpd, image pulled), {RUNS} spawns",
        [
            ("plain bwrap, host network (baseline)", plain),
            ("image runner (own ids, network, forwarder)", spawns),
            *([("image runner, own network on the bridge", own)] if own else []),
        ],
        baseline="plain bwrap, host network (baseline)",
        target_ms=GOAL_MS,
    )
    table(
        "One GET / through the forwarder and on the bridge (busybox closes each connection)",
        [
            ("image runner forwarder", requests),
            *([("instance address on the bridge", own_requests)] if own_requests else []),
        ],
        baseline="image runner forwarder",
    )
