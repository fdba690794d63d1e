"""The tail under load: 200 clients on one provider, with event streams and key-value writes beside.

A real `atrium serve` (process runner) with one provider app, and for ATRIUM_BENCH_LOAD_SECONDS
(60 s), all at once:

- 200 clients asking the provider back to back through the data proxy: wrk, 200 keep-alive
  connections on 2 threads, a 10 s timeout (a request not answered within it is a timeout, not a
  latency). The provider (ATRIUM_BENCH_LOAD_PROVIDER) is `sdk` (default: bench/apps/bench.sdk,
  an app on the SDK's own threaded server, what an app built with Atrium runs; `GET
  /api/data/sdkb/items`, the user's token) or `upstream` (bench/apps/bench.upstream on uvloop,
  so the shell's own cost is what is left; `GET /api/data/bench/small` with the bench.caller
  app's token, a permission checked per request);
- 50 subscribers on `GET /api/events?topics=kv:changed`, opened before and held open the whole
  time (bench/events.py's raw streams): at the end, how many are still connected and whether
  each heard every write;
- a writer doing 20 `PUT /api/kv/os/<key>` a second at a steady pace (each on its own schedule,
  so a slow answer does not slow the pace), each to a key of its own: a write fails when it is
  not answered 200 with its value within 10 s, or is lost when reading it back at the end does
  not give its value;
- the shell's RSS, after a 5 s warm-up of the same load and at the end.

Printed: p50 / p99 / max latency, timeouts, errors, subscribers alive and events heard, KV writes
ok / failed / lost, RSS growth, each against its goal (PASS or MISS); and the CPU each part used
over the run (the shell, the provider, wrk, this process) with the machine's load, so a reader
sees whether the client or other work on the machine was the limit. Last, the same 200 clients
straight to the provider for 10 s (no shell; for `sdk` a second copy of the app with a shell
secret the bench knows, as bench/sdkload.py does): the spread the machine and the app give alone.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.events import Streams, raise_fd_limit
from bench.sdkload import start_direct
from bench.shell import APPS, launch, rss_bytes, running_shell, serve, stop
from bench.wrk import WrkResult, command, parse

SECONDS = int(os.environ.get("ATRIUM_BENCH_LOAD_SECONDS", "60"))
PROVIDER = os.environ.get("ATRIUM_BENCH_LOAD_PROVIDER", "sdk")
CLIENTS = 200
THREADS = 2
SUBSCRIBERS = 50
WRITES_PER_SECOND = 20
WARMUP_SECONDS = 5
DIRECT_SECONDS = 10
TIMEOUT = 10.0
MIB = 1 << 20

GOAL_P99_MS = 250.0
GOAL_MAX_MS = 2000.0
GOAL_RSS_MIB = 20.0


@dataclass(frozen=True)
class Target:
    """The shell under load: its process, base URL, the user's token, and the data URL wrk asks
    with the token that opens it."""

    proc: subprocess.Popen[bytes]
    url: str
    user_token: str
    data_url: str
    data_token: str
    provider: str
    #: the same provider's data URL with no shell in between, and the headers that open it
    direct_url: str
    direct_headers: tuple[str, ...]


@asynccontextmanager
async def shell_with_provider(tmp: Path) -> AsyncIterator[Target]:
    """The shell in ``tmp`` with PROVIDER launched; stopped on exit."""
    if PROVIDER == "upstream":
        with running_shell(tmp) as shell:
            yield Target(
                shell.proc,
                shell.url,
                shell.user_token,
                f"{shell.data_url}/small",
                shell.caller_token,
                "bench.upstream (uvloop), /api/data/bench/small as bench.caller",
                f"{shell.direct_url}/small",
                (),
            )
        return
    if PROVIDER != "sdk":
        raise ValueError(f"ATRIUM_BENCH_LOAD_PROVIDER is sdk or upstream, not {PROVIDER!r}")
    tmp.chmod(0o755)  # the process runner's apps run under their own uid
    system = tmp / "system-apps"
    shutil.copytree(APPS / "bench.sdk", system / "bench.sdk")
    shutil.copytree(APPS / "bench.sdk", tmp / "direct-app")
    proc, url, token = serve(tmp / "home", system)
    procs = [proc]
    try:
        direct_proc, direct = start_direct(tmp / "direct-app", tmp / "direct-data")
        procs.append(direct_proc)
        launch(url, token, "bench.sdk")
        yield Target(
            proc,
            url,
            token,
            f"{url}/api/data/sdkb/items",
            token,
            "bench.sdk (the SDK's server), /api/data/sdkb/items as the user",
            direct.url,
            direct.headers,
        )
    finally:
        stop(procs)


# -- the key-value writer -------------------------------------------------------------------------


@dataclass
class Writes:
    """What the writer did: every write's outcome and how long its answer took."""

    ok: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    took_ms: list[float] = field(default_factory=list)


async def write_one(api: aiohttp.ClientSession, n: int, writes: Writes) -> None:
    key = f"bench-load-{n:06d}"
    started = time.perf_counter()
    try:
        async with asyncio.timeout(TIMEOUT):
            async with api.put(f"/api/kv/os/{key}", json={"value": {"n": n}}) as answer:
                body = await answer.json(content_type=None)
                if answer.status != 200 or body.get("value") != {"n": n}:
                    writes.failed[key] = f"status {answer.status}"
                    return
    except TimeoutError:
        writes.failed[key] = "timeout"
        return
    except (aiohttp.ClientError, ValueError) as err:
        writes.failed[key] = f"{type(err).__name__}: {err}"[:120]
        return
    writes.took_ms.append((time.perf_counter() - started) * 1000)
    writes.ok[key] = n


async def writer(api: aiohttp.ClientSession, seconds: float, writes: Writes) -> None:
    """WRITES_PER_SECOND writes, each started on its own schedule, for ``seconds``."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    tasks: list[asyncio.Task[None]] = []
    for n in range(int(seconds * WRITES_PER_SECOND)):
        await asyncio.sleep(max(0.0, began + n / WRITES_PER_SECOND - loop.time()))
        tasks.append(asyncio.create_task(write_one(api, n, writes)))
    await asyncio.gather(*tasks)


async def read_back(api: aiohttp.ClientSession, writes: Writes) -> None:
    """Every answered write must read back as written; what does not is lost."""
    gate = asyncio.Semaphore(16)

    async def one(key: str, n: int) -> None:
        async with gate, api.get(f"/api/kv/os/{key}") as answer:
            body = await answer.json(content_type=None)
            if answer.status != 200 or body.get("value") != {"n": n}:
                writes.lost.append(key)

    await asyncio.gather(*(one(key, n) for key, n in writes.ok.items()))


# -- CPU accounting ---------------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one live process (0 once it has gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (the shell's apps, and what runs them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / TICK, sum(values) / TICK


def waited_for_cpu(pid: int) -> float:
    """Seconds the process's main thread (the shell's event loop) has spent ready to run but
    waiting for a CPU (the second figure of /proc/<pid>/schedstat; 0 without schedstats)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def listen_overflows() -> int:
    """The kernel's count of connections dropped for a full accept queue (TcpExt ListenOverflows,
    this network namespace: every process's, not only the shell's and the provider's)."""
    lines = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines()]
    for names, values in itertools.pairwise(lines):
        if names[0] == "TcpExt:" and values[0] == "TcpExt:" and "ListenOverflows" in names:
            return int(values[names.index("ListenOverflows")])
    return 0


@dataclass
class Cpu:
    """CPU seconds per part, read at the start and the end of the run."""

    parts: dict[str, Sequence[int]]
    start: dict[str, float] = field(default_factory=dict)
    machine: tuple[float, float] = (0.0, 0.0)
    overflows: int = 0
    waited: float = 0.0

    def read(self) -> dict[str, float]:
        used = {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in self.parts.items()}
        times = os.times()
        used["this process (streams, writer)"] = times.user + times.system
        return used

    def begin(self) -> None:
        self.start = self.read()
        self.machine = machine_cpu()
        self.overflows = listen_overflows()
        self.waited = waited_for_cpu(self.parts["the shell"][0])

    def shell_seconds(self) -> float:
        """The shell's CPU seconds since `begin`."""
        return self.read()["the shell"] - self.start["the shell"]

    def report(self, wall: float) -> list[str]:
        end = self.read()
        busy, total = machine_cpu()
        cores = (total - self.machine[1]) / wall
        ours = sum(end[name] - self.start[name] for name in end)
        lines = [
            f"  {name:<32} {(end[name] - self.start[name]) / wall:>5.2f} cores" for name in end
        ]
        lines.append(
            f"  {'the whole machine':<32} {(busy - self.machine[0]) / wall:>5.2f} of "
            f"{cores:.0f} cores busy ({(busy - self.machine[0] - ours) / wall:.2f} by other work); "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        waited = waited_for_cpu(self.parts["the shell"][0]) - self.waited
        lines.append(
            f"  the shell's event loop waited {waited:.1f} s of {wall:.1f} s for a CPU while "
            "ready to run"
        )
        lines.append(f"  listen overflows (whole machine): {listen_overflows() - self.overflows}")
        return lines


# -- the run ----------------------------------------------------------------------------------------


async def run_wrk(target: Target, seconds: int, *, direct: bool = False) -> WrkResult:
    """wrk at CLIENTS connections for ``seconds`` through the shell (or ``direct`` to the
    provider): its summary."""
    url, token = (target.direct_url, None) if direct else (target.data_url, target.data_token)
    cmd = command(
        url,
        CLIENTS,
        seconds,
        token,
        threads=THREADS,
        headers=target.direct_headers if direct else (),
        timeout_seconds=TIMEOUT,
    )
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {err.decode()[:500]}")
    return parse(out.decode())


@dataclass(frozen=True)
class Outcome:
    result: WrkResult
    alive: int
    heard: list[int]
    writes: Writes
    rss_start: int
    rss_end: int
    rss_peak: int
    cpu: list[str]
    #: the shell's CPU seconds over the run
    shell_cpu: float
    #: the same load straight to the provider right after: the machine's own spread
    direct: WrkResult


async def sample_rss(pid: int, peak: list[int]) -> None:
    while True:
        peak[0] = max(peak[0], rss_bytes(pid))
        await asyncio.sleep(1)


async def load(target: Target) -> Outcome:
    headers = {"Authorization": f"Bearer {target.user_token}"}
    timeout = aiohttp.ClientTimeout(total=TIMEOUT * 3)
    # an idle connection is given up before the shell closes it (5 s idle), so a write is never
    # sent on a connection that is closing: a failure is then the shell's, not this client's race
    connector = aiohttp.TCPConnector(keepalive_timeout=2)
    async with aiohttp.ClientSession(
        base_url=target.url, headers=headers, timeout=timeout, connector=connector
    ) as api:
        streams = Streams(target.url, target.user_token, topic="kv:changed")
        await streams.grow(SUBSCRIBERS)
        try:
            warm = Writes()
            await asyncio.gather(run_wrk(target, WARMUP_SECONDS), writer(api, WARMUP_SECONDS, warm))
            await asyncio.sleep(0.5)  # the warm-up's last events on their way
            for stream in streams.streams:
                stream.frames = 0
            rss_start = rss_bytes(target.proc.pid)
            peak = [rss_start]
            sampler = asyncio.create_task(sample_rss(target.proc.pid, peak))
            wrk_task = asyncio.create_task(run_wrk(target, SECONDS))
            await asyncio.sleep(0.5)  # wrk has started: its pid is among the parts below
            cpu = Cpu(
                {
                    "the shell": [target.proc.pid],
                    "the provider (and its runner)": descendants(target.proc.pid),
                    "wrk": wrk_pids(),
                }
            )
            cpu.begin()
            began = time.monotonic()
            writes = Writes()
            writing = asyncio.create_task(writer(api, SECONDS - 1, writes))
            await asyncio.sleep(SECONDS - 1)  # CPU read while wrk still runs
            shell_cpu = cpu.shell_seconds()
            cpu_lines = cpu.report(time.monotonic() - began)
            result = await wrk_task
            await writing
            rss_end = rss_bytes(target.proc.pid)
            sampler.cancel()
            await asyncio.sleep(1)  # the last writes' events on their way
            alive = sum(1 for s in streams.streams if s.is_connected and not s.closed.done())
            heard = [s.frames for s in streams.streams]
            await read_back(api, writes)
        finally:
            await streams.close()
    direct = await run_wrk(target, min(SECONDS, DIRECT_SECONDS), direct=True)
    return Outcome(
        result, alive, heard, writes, rss_start, rss_end, peak[0], cpu_lines, shell_cpu, direct
    )


def wrk_pids() -> list[int]:
    """The wrk processes this bench started (children of this process named wrk)."""
    mine = os.getpid()
    found = []
    for pid in descendants(mine):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "wrk":
                found.append(pid)
        except OSError:
            continue
    return found


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(target: Target, out: Outcome) -> None:
    r, w = out.result, out.writes
    growth = (out.rss_end - out.rss_start) / MIB
    errors = r.socket_errors - r.timeouts + r.bad_status
    written = len(w.ok) + len(w.failed)
    heard_all = min(out.heard, default=0) >= len(w.ok) and max(out.heard, default=0) <= written
    print(
        f"\nLoad: {CLIENTS} clients for {SECONDS} s on {target.provider} (wrk, {THREADS} "
        f"threads, {TIMEOUT:g} s timeout), {SUBSCRIBERS} event streams held open, "
        f"{WRITES_PER_SECOND} KV writes/s beside"
    )
    rows = [
        ("requests", f"{r.requests} ({r.rps:.0f}/s)", "", ""),
        ("p50 ms", f"{r.p50_ms:.1f}", "", ""),
        ("p99 ms", f"{r.p99_ms:.1f}", f"< {GOAL_P99_MS:.0f}", verdict(r.p99_ms < GOAL_P99_MS)),
        ("max ms", f"{r.max_ms:.1f}", f"< {GOAL_MAX_MS:.0f}", verdict(r.max_ms < GOAL_MAX_MS)),
        ("timeouts", str(r.timeouts), "0", verdict(r.timeouts == 0)),
        (
            "errors",
            f"{errors} ({r.socket_errors - r.timeouts} socket, {r.bad_status} status ≥ 400)",
            "0",
            verdict(errors == 0),
        ),
        (
            "event streams alive",
            f"{out.alive} of {SUBSCRIBERS}",
            str(SUBSCRIBERS),
            verdict(out.alive == SUBSCRIBERS),
        ),
        (
            "kv:changed heard",
            f"{min(out.heard, default=0)}-{max(out.heard, default=0)} per stream",
            f"each of {len(w.ok)}",
            verdict(heard_all),
        ),
        (
            "KV writes ok / failed / lost",
            f"{len(w.ok)} / {len(w.failed)} / {len(w.lost)}",
            "0 failed, 0 lost",
            verdict(not w.failed and not w.lost),
        ),
        (
            "KV write p50 / p99 / max ms",
            f"{percentile(w.took_ms, 0.5):.1f} / {percentile(w.took_ms, 0.99):.1f} / "
            f"{percentile(w.took_ms, 1.0):.1f}",
            "",
            "",
        ),
        (
            "shell RSS growth MiB",
            f"{growth:+.1f} ({out.rss_start / MIB:.1f} → {out.rss_end / MIB:.1f}, "
            f"peak {out.rss_peak / MIB:.1f})",
            f"< {GOAL_RSS_MIB:.0f}",
            verdict(growth < GOAL_RSS_MIB),
        ),
    ]
    print(f"{'measure':<30} {'value':<44} {'goal':<18} verdict")
    for name, value, goal, mark in rows:
        print(f"{name:<30} {value:<44} {goal:<18} {mark}")
    if w.failed:
        kinds: dict[str, int] = {}
        for why in w.failed.values():
            kinds[why] = kinds.get(why, 0) + 1
        print("  KV failures: " + ", ".join(f"{why} {n}" for why, n in kinds.items()))
    print(
        "CPU over the run (cores = CPU seconds / wall seconds); the shell's per request "
        f"(its events and writes included): {out.shell_cpu / max(r.requests, 1) * 1e6:.0f} µs"
    )
    for line in out.cpu:
        print(line)
    d = out.direct
    print(
        f"the machine's own spread: the same {CLIENTS} clients straight to the provider (no "
        f"shell, {min(SECONDS, DIRECT_SECONDS)} s, right after): {d.rps:.0f}/s, p50 / p99 / max "
        f"{d.p50_ms:.1f} / {d.p99_ms:.1f} / {d.max_ms:.1f} ms, {d.timeouts} timeouts"
    )
    marks = [mark for *_, mark in rows if mark]
    print(f"goals met: {marks.count('PASS')} of {len(marks)}")


async def main() -> None:
    raise_fd_limit(4 * (CLIENTS + SUBSCRIBERS) + 512)  # the shell inherits it
    with tempfile.TemporaryDirectory() as tmp_name:
        async with shell_with_provider(Path(tmp_name)) as target:
            # to profile the shell under the load: py-spy record -p <pid>
            print(f"load: the shell's pid is {target.proc.pid}", flush=True)
            outcome = await load(target)
    report(target, outcome)
