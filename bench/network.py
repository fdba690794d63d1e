"""An instance's own network: plumbing one namespace on the shell's bridge
(`atrium.lifecycle.network.Network.plumb`: ``ip netns add``, the veth into the bridge with its
fixed MAC and neighbour entry, address and route inside, the sysctls, the nft table) and removing
it again (``ip netns delete``). Goal: plumbing ≤ 40 ms (median). Root only; the bridge lives on a
range of its own for the run and is removed after it.

A second row is one request from the host to a busybox httpd inside such a namespace against one
on the host's loopback: what the bridge costs a request.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp

from atrium.lifecycle.network import NetworkUnavailable, open_network
from bench.report import table

RUNS = 30
REQUESTS = 200
GOAL_MS = 40.0
RANGE = "10.215.0.0/16"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def requests(session: aiohttp.ClientSession, url: str) -> list[float]:
    deadline = time.monotonic() + 5
    while True:  # until the server answers
        try:
            async with session.get(url) as response:
                await response.read()
                break
        except aiohttp.ClientError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.01)
    samples = []
    for _ in range(REQUESTS):
        began = time.perf_counter()
        async with session.get(url) as response:
            await response.read()
        samples.append(time.perf_counter() - began)
    return samples


async def main() -> None:
    busybox = shutil.which("busybox")
    if os.geteuid() != 0 or busybox is None or shutil.which("nft") is None:
        print("\nnetwork: skipped (needs root, busybox and nftables)")
        return
    try:
        network = open_network(RANGE, free_port())
    except NetworkUnavailable as err:
        print(f"\nnetwork: skipped ({err})")
        return
    plumbing: list[float] = []
    removing: list[float] = []
    try:
        for _ in range(RUNS):
            began = time.perf_counter()
            lease = await network.plumb()
            plumbing.append(time.perf_counter() - began)
            began = time.perf_counter()
            await network.release(lease)
            removing.append(time.perf_counter() - began)
        lease = await network.plumb()
        web = Path(tempfile.mkdtemp(prefix="atrium-bench-network-"))
        web.chmod(0o755)
        (web / "index.html").write_text("hello\n")
        port = free_port()
        inside = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                lease.netns,
                busybox,
                "httpd",
                "-f",
                "-p",
                "8080",
                "-h",
                str(web),
            ]
        )
        outside = subprocess.Popen(
            [busybox, "httpd", "-f", "-p", f"127.0.0.1:{port}", "-h", str(web)]
        )
        try:
            async with aiohttp.ClientSession() as session:
                bridged = await requests(session, f"http://{lease.address}:8080/")
                loopback = await requests(session, f"http://127.0.0.1:{port}/")
        finally:
            for process in (inside, outside):
                process.kill()
                process.wait()
            await network.release(lease)
            shutil.rmtree(web)
    finally:
        network.close()
    table(
        f"An instance's own network: {RUNS} namespaces plumbed and removed",
        [("plumb (namespace, veth, address, nft)", plumbing), ("remove (netns delete)", removing)],
        baseline="plumb (namespace, veth, address, nft)",
        target_ms=GOAL_MS,
    )
    table(
        f"One GET / to busybox httpd ({REQUESTS} requests, a new connection each)",
        [("host loopback", loopback), ("instance namespace over the bridge", bridged)],
        baseline="host loopback",
    )
