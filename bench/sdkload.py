"""An SDK app under 200 clients: through the shell's data proxy, and straight to the app.

bench/apps/bench.sdk (the SDK's own threaded `http.server`, a JSON body of about 230 bytes) is
served by `atrium serve` (process runner) and, as the baseline, by a second copy of the same app
started by the bench with a shell secret it knows, so the same requests reach it with no shell in
between. Two loads of 200 clients, each for BENCH_LOAD_SECONDS (60 s), against both:

- steady: wrk, 200 keep-alive connections asking back to back;
- bursts: every 5 s, all 200 clients ask at once (as many views do when one change notice
  reaches them all); the 5 s gap outlasts the pool's idle close (4 s), so each burst makes the
  shell open new connections to the app.

First, the app alone at 8 to 200 connections (5 s each): how many it serves best. Printed per
load and target: requests, p50, p99 and max latency, timeouts (no answer within 10 s), other
errors (refused, reset, a status other than 200), and p50 and p99 as a multiple of the direct
baseline's. Goal: through the shell, p99 < 1 s and no timeouts in both loads.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.shell import APPS, ROOT, free_port, launch, serve, stop, wait_port
from bench.wrk import SOCKET_ERRORS, command, parse

CLIENTS = 200
SECONDS = int(os.environ.get("BENCH_LOAD_SECONDS", "60"))
GAP = 5.0
TIMEOUT = 10.0
APP_ID = "bench.sdk"
GOAL_P99_MS = 1000.0
#: the app alone at these many connections: how many it serves best (what the shell's
#: per-instance cap, atrium.httppool.MAX_PER_UPSTREAM, rests on)
SWEEP = (8, 16, 32, 64, 128, 200)
SWEEP_SECONDS = int(os.environ.get("BENCH_SWEEP_SECONDS", "5"))
DIRECT = "direct to the app"


@dataclass(frozen=True)
class Target:
    """Where the load goes: the full URL of the data path and the headers that open it."""

    url: str
    headers: tuple[str, ...]


@dataclass(frozen=True)
class Result:
    requests: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    timeouts: int
    errors: int
    #: what the errors were (empty when none)
    kinds: str = ""
    rps: float = 0.0


def start_direct(app_dir: Path, data_dir: Path) -> tuple[subprocess.Popen[bytes], Target]:
    """The same app as its own process, with a secret the bench knows (the baseline)."""
    port, secret = free_port(), secrets.token_urlsafe(32)
    data_dir.mkdir()
    env = {
        **os.environ,
        "OS_APP_ID": APP_ID,
        "OS_INSTANCE_ID": f"{APP_ID}-direct",
        "OS_HOST": "127.0.0.1",
        "OS_PORT": str(port),
        "OS_SHELL_SECRET": secret,
        "OS_DATA_DIR": str(data_dir),
        "PYTHONPATH": str(ROOT),  # atrium/sdk.py imports nothing else of the package
    }
    proc = subprocess.Popen(["/usr/bin/python3", "sdkapp.py"], cwd=app_dir, env=env)
    wait_port(port, proc=proc)
    url = f"http://127.0.0.1:{port}/api/data/items"
    return proc, Target(url, (f"X-Os-Shell-Secret: {secret}",))


def check(name: str, target: Target) -> None:
    headers = dict(h.split(": ", 1) for h in target.headers)
    answer = httpx.get(target.url, headers=headers, timeout=30)
    if answer.status_code != 200 or b'"items"' not in answer.content:
        raise RuntimeError(f"{name}: GET answered {answer.status_code} {answer.text[:200]}")


def steady(target: Target, connections: int = CLIENTS, seconds: int = SECONDS) -> Result:
    """wrk: ``connections`` asking back to back for ``seconds``."""
    cmd = command(
        target.url, connections, seconds, headers=target.headers, timeout_seconds=TIMEOUT, threads=2
    )
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    run = parse(out)
    found = SOCKET_ERRORS.search(out)
    counts = dict(zip(("connect", "read", "write"), found.groups(), strict=False)) if found else {}
    counts["status ≥ 400"] = str(run.bad_status)
    return Result(
        requests=run.requests,
        p50_ms=run.p50_ms,
        p99_ms=run.p99_ms,
        max_ms=run.max_ms,
        timeouts=run.timeouts,
        errors=run.socket_errors - run.timeouts + run.bad_status,
        kinds=", ".join(f"{kind} {n}" for kind, n in counts.items() if n != "0"),
        rps=run.rps,
    )


class Client:
    """One client: a keep-alive connection, opened again after a failure."""

    def __init__(self, host: str, port: int, request: bytes) -> None:
        self._address = (host, port)
        self._request = request
        self._stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def ask(self) -> tuple[float, str]:
        """(seconds, outcome): ``ok``, ``timeout``, or what went wrong."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(TIMEOUT):
                outcome = await self._exchange()
        except TimeoutError:
            outcome = "timeout"
        except (OSError, asyncio.IncompleteReadError, ValueError) as err:
            outcome = type(err).__name__
        if outcome != "ok":
            self.close()
        return time.perf_counter() - started, outcome

    async def _exchange(self) -> str:
        if self._stream is not None:
            try:
                return await self._send()
            except (OSError, asyncio.IncompleteReadError) as err:
                if getattr(err, "partial", b""):
                    raise
                # the server closed the idle connection as it was reused (the shell closes
                # keep-alive connections idle for 5 s): once more on a new one, as browsers do
                self.close()
        self._stream = await asyncio.open_connection(*self._address)
        return await self._send()

    async def _send(self) -> str:
        assert self._stream is not None
        reader, writer = self._stream
        writer.write(self._request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        closing = False
        for line in head.lower().split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip() == b"close":
                closing = True
        await reader.readexactly(length)
        if closing:
            self.close()
        return "ok" if status == 200 else f"status {status}"

    def close(self) -> None:
        if self._stream is not None:
            self._stream[1].close()
            self._stream = None


async def bursts(target: Target) -> Result:
    """Every GAP seconds for SECONDS, all CLIENTS ask at once."""
    url = httpx.URL(target.url)
    host, port = url.host, url.port or 80
    head = [f"GET {url.raw_path.decode()} HTTP/1.1", f"Host: {host}:{port}", *target.headers]
    request = ("\r\n".join(head) + "\r\n\r\n").encode()
    clients = [Client(host, port, request) for _ in range(CLIENTS)]
    latencies: list[float] = []
    timeouts = 0
    errors: Counter[str] = Counter()
    deadline = time.monotonic() + SECONDS
    try:
        while time.monotonic() < deadline:
            began = time.monotonic()
            for took, outcome in await asyncio.gather(*(c.ask() for c in clients)):
                if outcome == "ok":
                    latencies.append(took * 1000)
                elif outcome == "timeout":
                    timeouts += 1
                else:
                    errors[outcome] += 1
            await asyncio.sleep(max(0.0, began + GAP - time.monotonic()))
    finally:
        for client in clients:
            client.close()
    ordered = sorted(latencies) or [0.0]
    return Result(
        requests=len(latencies) + timeouts + errors.total(),
        p50_ms=ordered[len(ordered) // 2],
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        max_ms=ordered[-1],
        timeouts=timeouts,
        errors=errors.total(),
        kinds=", ".join(f"{kind} {n}" for kind, n in errors.most_common()),
    )


def sweep(target: Target) -> None:
    print(f"\nThe SDK app alone, by connections (wrk, {SWEEP_SECONDS} s each)")
    print(f"{'connections':>11} {'req/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for connections in SWEEP:
        r = steady(target, connections, SWEEP_SECONDS)
        print(f"{connections:>11} {r.rps:>8.0f} {r.p50_ms:>9.1f} {r.p99_ms:>9.1f} {r.max_ms:>9.1f}")


def report(title: str, rows: Sequence[tuple[str, Result]], baseline: str) -> None:
    base = dict(rows)[baseline]
    print(f"\n{title}")
    print(
        f"{'target':<20} {'requests':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} "
        f"{'timeouts':>9} {'errors':>7} {'p50 x direct':>13} {'p99 x direct':>13}"
    )
    for name, r in rows:
        print(
            f"{name:<20} {r.requests:>9} {r.p50_ms:>9.1f} {r.p99_ms:>9.1f} {r.max_ms:>9.1f} "
            f"{r.timeouts:>9} {r.errors:>7} {r.p50_ms / max(base.p50_ms, 1e-9):>12.2f}x "
            f"{r.p99_ms / max(base.p99_ms, 1e-9):>12.2f}x"
        )
    for name, r in rows:
        if r.kinds:
            print(f"  {name}: errors: {r.kinds}")


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o755)  # the process runner's apps run under their own uid
        system = tmp / "system-apps"
        shutil.copytree(APPS / APP_ID, system / APP_ID)
        shutil.copytree(APPS / APP_ID, tmp / "direct-app")
        proc, url, token = serve(tmp / "home", system)
        procs = [proc]
        try:
            direct_proc, direct = start_direct(tmp / "direct-app", tmp / "direct-data")
            procs.append(direct_proc)
            launch(url, token, APP_ID)
            shell = Target(f"{url}/api/data/sdkb/items", (f"Authorization: Bearer {token}",))
            targets = {"direct to the app": direct, "through the shell": shell}
            for name, target in targets.items():
                check(name, target)
            sweep(direct)
            rows = [(name, steady(target)) for name, target in targets.items()]
            title = f"{CLIENTS} clients back to back (wrk)"
            report(f"SDK app, {title}, {SECONDS} s, {TIMEOUT:g} s timeout", rows, DIRECT)
            rows = [(name, await bursts(target)) for name, target in targets.items()]
            title = f"{CLIENTS} clients at once every {GAP:g} s"
            report(f"SDK app, {title}, {SECONDS} s, {TIMEOUT:g} s timeout", rows, DIRECT)
            print(f"goal: through the shell, p99 < {GOAL_P99_MS:.0f} ms and no timeouts")
        finally:
            stop(procs)
