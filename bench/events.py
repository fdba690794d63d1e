"""A theme change delivered to 1, 100 and 1,000 server-sent-event subscribers.

The real shell runs as a subprocess (`python -m atrium serve`, its own uvloop); this process is
the one client, holding every `GET /api/events?topics=theme:changed` stream with the user's token.
Each stream is a bare asyncio protocol that only looks for two markers in the bytes (`: connected`,
then `event: theme:changed`), so the client adds as little as it can to what is measured: from just
before `POST /api/os/themes/select` (alternating the light slot between two light themes) to the
moment the LAST subscriber has the `theme:changed` frame. Subscribers are added between phases (1,
then 100, then 1,000), so each phase's server holds exactly that many streams.

Target (theming issue): 1,000 subscribers ≤ 50 ms median (measured on these machines: a plain Starlette
StreamingResponse with one encoded frame and a bounded queue per subscriber: 38 ms). Baseline:
delivery to one subscriber, same run. Also shown, as the floor of this machine and this client: a
bare uvloop protocol (no HTTP parsing, no framework) writing the same-sized frame to 1,000 sockets in
one loop, triggered over a control connection, measured by the same client.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import ClassVar, Final, cast

import aiohttp
import uvloop

from atrium.bus import encode_frame
from bench.report import table

ROUNDS: Final = int(os.environ.get("BENCH_ROUNDS", "15"))
WARMUP: Final = 3
PHASES: Final = (1, 100, 1000)
TARGET_MS: Final = 50.0
CONNECTED: Final = b": connected\n\n"
FRAME: Final = b"event: theme:changed\n"
ROOT: Final = Path(__file__).resolve().parent.parent
BASELINE: Final = "1 subscriber (baseline)"
FLOOR: Final = "floor: bare uvloop server, 1,000 subs: last"


class Hub:
    """What every stream reports to: connections, and the receipts of the current round."""

    def __init__(self) -> None:
        self.connected = 0
        self.lost = 0
        self.expected = 0
        self.received = 0
        self.first = 0.0
        self.last = 0.0
        self.all_connected: asyncio.Future[None] | None = None
        self.all_received: asyncio.Future[None] | None = None

    def on_connected(self) -> None:
        self.connected += 1
        done = self.all_connected
        if done is not None and self.connected >= self.expected and not done.done():
            done.set_result(None)

    def on_frames(self, count: int) -> None:
        now = time.perf_counter()
        if self.received == 0:
            self.first = now
        self.received += count
        if self.received >= self.expected:
            self.last = now
            if self.all_received is not None and not self.all_received.done():
                self.all_received.set_result(None)

    def on_failure(self, why: str) -> None:
        for future in (self.all_connected, self.all_received):
            if future is not None and not future.done():
                future.set_exception(RuntimeError(why))


class Stream(asyncio.Protocol):
    """One `GET /api/events` stream, read as raw bytes: chunk headers and ids are skipped over;
    ``frame`` is the marker of the event counted (the `event:` line of its topic)."""

    def __init__(self, hub: Hub, request: bytes, frame: bytes = FRAME) -> None:
        self.hub = hub
        self.request = request
        self.frame = frame
        self.keep = max(len(CONNECTED), len(frame)) - 1
        self.transport: asyncio.Transport | None = None
        self.status_seen = False
        self.is_connected = False
        self.frames = 0
        self.tail = b""
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's does not subclass it
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        buf = self.tail + data
        if not self.status_seen:
            self.status_seen = True
            if not buf.startswith(b"HTTP/1.1 200"):
                self.hub.on_failure(f"the event stream answered {buf[:200]!r}")
                return
        if not self.is_connected and CONNECTED in buf:
            self.is_connected = True
            self.hub.on_connected()
        if count := buf.count(self.frame):
            self.frames += count
            self.hub.on_frames(count)
        self.tail = buf[-self.keep :]

    def connection_lost(self, exc: Exception | None) -> None:
        self.hub.lost += 1
        if not self.closed.done():
            self.closed.set_result(None)


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        limit = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if limit < needed:
            raise RuntimeError(f"the open-files limit is {hard}; {needed} are needed")
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def start_shell(home: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    env = {
        **os.environ,
        "ATRIUM_HOME": str(home),
        "ATRIUM_PORT": "0",
        "ATRIUM_RUNNER": "process",
        "ATRIUM_LOG_LEVEL": "warning",
    }
    home.parent.mkdir(parents=True, exist_ok=True)
    home.parent.chmod(0o755)
    with (home.parent / "shell.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "atrium", "serve"], env=env, stdout=log, stderr=log
        )
    url_file = home / "run" / "url"
    deadline = time.monotonic() + 30
    while not url_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the shell did not start: {(home / 'shell.log').read_text()}")
        time.sleep(0.05)
    url = url_file.read_text().strip().replace("localhost", "127.0.0.1")
    return proc, url, (home / "run" / "token").read_text().strip()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


Trigger = Callable[[], Awaitable[None]]


class Streams:
    """The client's streams to one server, grown in phases, and the rounds timed over them;
    each stream hears ``topic`` and counts its frames."""

    def __init__(self, url: str, token: str, topic: str = "theme:changed") -> None:
        self.hub = Hub()
        self.streams: list[Stream] = []
        self.frame = f"event: {topic}\n".encode()
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.request = (
            f"GET /api/events?topics={topic} HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()

    async def grow(self, total: int) -> None:
        """Open streams until ``total`` are connected (each has sent `: connected`)."""
        loop = asyncio.get_running_loop()
        self.hub.expected = total
        self.hub.all_connected = loop.create_future()
        if self.hub.connected >= total:
            return
        gate = asyncio.Semaphore(64)

        async def open_one() -> None:
            async with gate:
                _, stream = await loop.create_connection(
                    lambda: Stream(self.hub, self.request, self.frame), self.host, self.port
                )
                self.streams.append(stream)

        await asyncio.gather(*(open_one() for _ in range(total - len(self.streams))))
        await asyncio.wait_for(self.hub.all_connected, 30)
        await asyncio.sleep(0.5)

    async def rounds(self, trigger: Trigger) -> tuple[list[float], list[float]]:
        """(to the last receipt, to the first receipt) per round, in seconds."""
        loop = asyncio.get_running_loop()
        lasts: list[float] = []
        firsts: list[float] = []
        for n in range(WARMUP + ROUNDS):
            await asyncio.sleep(0.1)  # let the previous round's writes and the GC settle
            self.hub.received = 0
            self.hub.all_received = loop.create_future()
            started = time.perf_counter()
            await asyncio.gather(trigger(), asyncio.wait_for(self.hub.all_received, 10))
            if n >= WARMUP:
                lasts.append(self.hub.last - started)
                firsts.append(self.hub.first - started)
            if self.hub.received != len(self.streams):
                raise RuntimeError(f"{self.hub.received} frames for {len(self.streams)} streams")
        return lasts, firsts

    async def close(self) -> None:
        for stream in self.streams:
            if stream.transport is not None:
                stream.transport.close()
        await asyncio.wait_for(asyncio.gather(*(s.closed for s in self.streams)), 10)


async def light_pair(api: aiohttp.ClientSession) -> tuple[str, str]:
    async with api.get("/api/os/themes") as answer:
        themes = await answer.json()
    light = [t["id"] for t in themes if t["tone"] == "light"]
    return light[0], light[1]


def selector(api: aiohttp.ClientSession, light: tuple[str, str]) -> Trigger:
    """`POST /api/os/themes/select`, the light slot flipping between two themes each call."""
    flip = itertools.cycle(light)

    async def select() -> None:
        async with api.post("/api/os/themes/select", json={"themeIdLight": next(flip)}) as answer:
            if answer.status != 200:
                raise RuntimeError(f"select answered {answer.status}: {await answer.text()}")
            await answer.read()

    return select


Rows = dict[str, list[float]]


async def atrium_rows(home: Path) -> tuple[Rows, str]:
    proc, url, token = start_shell(home)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(base_url=url, headers=headers) as api:
            select = selector(api, await light_pair(api))
            streams = Streams(url, token)
            results: dict[int, tuple[list[float], list[float]]] = {}
            rss: dict[int, int] = {}
            try:
                for count in PHASES:
                    await streams.grow(count)
                    rss[count] = rss_kib(proc.pid)
                    results[count] = await streams.rounds(select)
            finally:
                await streams.close()
    finally:
        await stop(proc, home / "shell.log")
    frames = sorted({s.frames for s in streams.streams})
    per_sub = (rss[1000] - rss[100]) / 900
    note = (
        f"shell RSS {rss[1] / 1024:.0f} MiB with 1 stream, {rss[1000] / 1024:.0f} MiB with 1,000 "
        f"(≈{per_sub:.0f} KiB per subscriber); frames per stream {frames} (streams joined in "
        f"phases: none lost or doubled); streams closed {streams.hub.lost}/{len(streams.streams)}"
    )
    rows = {
        BASELINE: results[1][0],
        "100 subscribers: last receipt": results[100][0],
        "1,000 subscribers: first receipt": results[1000][1],
        "1,000 subscribers: last receipt": results[1000][0],
    }
    return rows, note


async def stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.to_thread(proc.wait, 15)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if code != 0:
        print(f"{log.parent.name}: the server exited with {code}: {log.read_text()[-2000:]}")


# -- the floor: no framework, one write per socket ------------------------------------------------


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


FLOOR_FRAME: Final = chunk(
    encode_frame(
        1,
        "theme:changed",
        {
            "themeId": "atrium-light",
            "themeName": "Atrium Light",
            "themeIdLight": "atrium-light",
            "themeIdDark": "atrium-dark",
            "colorMode": "auto",
            "resolvedMode": None,
        },
    )
)


class FloorProtocol(asyncio.Protocol):
    """A GET becomes a subscriber; `GO` writes the frame to every subscriber, then answers."""

    subscribers: ClassVar[list[asyncio.Transport]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if data.startswith(b"GET "):
            self.subscribers.append(self.transport)
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + chunk(CONNECTED)
            )
        elif data.startswith(b"GO"):
            for subscriber in self.subscribers:
                subscriber.write(FLOOR_FRAME)
            self.transport.write(b"ok\n")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport in self.subscribers:
            self.subscribers.remove(self.transport)


def floor_server() -> None:
    """Run by `floor_rows` in a subprocess, on uvloop like `atrium serve`; prints its port."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(FloorProtocol, "127.0.0.1", 0, backlog=2048)
        print(server.sockets[0].getsockname()[1], flush=True)
        await loop.run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin

    uvloop.run(serve())


async def floor_rows() -> list[float]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from bench.events import floor_server; floor_server()",
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        port = int(await asyncio.wait_for(proc.stdout.readline(), 30))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def go() -> None:
            writer.write(b"GO\n")
            assert await reader.readline() == b"ok\n"

        streams = Streams(f"http://127.0.0.1:{port}", "-")
        try:
            await streams.grow(PHASES[-1])
            lasts, _ = await streams.rounds(go)
        finally:
            await streams.close()
            writer.close()
            await writer.wait_closed()
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 15)
    return lasts


async def main() -> None:
    raise_fd_limit(2 * PHASES[-1] + 512)  # the servers inherit it: they hold the other ends
    with tempfile.TemporaryDirectory() as tmp:
        rows, note = await atrium_rows(Path(tmp) / "home")
    rows[FLOOR] = await floor_rows()
    table(
        f"theme:changed over SSE, POST select → last subscriber has the frame, {ROUNDS} rounds",
        list(rows.items()),
        baseline=BASELINE,
        target_ms=TARGET_MS,
    )
    print(note)
