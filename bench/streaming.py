"""Large bodies through the data proxy: throughput, and whether the shell's memory stays flat.

Through Atrium (`/api/data/bench/...`, the bench.caller app's token) and direct to the upstream,
alternating in each round: (a) a download with Content-Length, (b) a chunked download, (c) an
upload with Content-Length and (d) a chunked upload (500 MB down, 200 MB up; BENCH_STREAM_MB and
BENCH_UPLOAD_MB override, BENCH_ROUNDS the rounds). The client streams on a raw socket: it
never holds more than a few MiB, checks every byte count (the upstream's sink answers what it
received) and parses the chunked framing itself. The shell's RSS (VmRSS) is read before each transfer through
Atrium, every 20 ms during it (a thread) and after it; "RSS flat" when peak - before < 64 MiB in
every case. Then a robustness check: an upstream that announces Content-Length N and closes the
connection after N/2 bytes (`/cut`), buffered (N ≤ 256 KiB: the caller should get a 502) and
streamed (the caller should see the body cut short and the connection closed, never a complete
response), and the shell must still answer afterwards.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from bench.shell import Shell, rss_bytes, running_shell

MB = 1_000_000
MIB = 1 << 20
STREAM_MB = int(os.environ.get("BENCH_STREAM_MB", "500"))
UPLOAD_MB = int(os.environ.get("BENCH_UPLOAD_MB", "200"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
FLAT_LIMIT = 64 * MIB
SAMPLE_SECONDS = 0.02
PIECE = MIB
TIMEOUT = 120.0
CUT_BUFFERED = 100_000
CUT_STREAMED = 8 * MB
CUT_TIMEOUT = 10.0


class TransferError(Exception):
    """A transfer did not complete as it should (status, byte count, framing)."""


@dataclass(frozen=True)
class Endpoint:
    """Where the data paths are: `prefix + "/stream"` etc., with the token to present."""

    host: str
    port: int
    prefix: str
    token: str | None

    @classmethod
    def of(cls, base: str, token: str | None) -> Endpoint:
        parts = urlsplit(base)
        return cls(parts.hostname or "127.0.0.1", parts.port or 80, parts.path, token)


class RawClient:
    """One HTTP/1.1 connection on a plain socket; bodies are counted and dropped, never kept."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.sock = socket.create_connection((endpoint.host, endpoint.port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()
        self.scratch = memoryview(bytearray(MIB))

    def close(self) -> None:
        self.sock.close()

    def send_head(self, method: str, path: str, headers: dict[str, str] | None = None) -> None:
        lines = [f"{method} {self.endpoint.prefix}{path} HTTP/1.1", f"Host: {self.endpoint.host}"]
        if self.endpoint.token:
            lines.append(f"Authorization: Bearer {self.endpoint.token}")
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def _fill(self) -> bool:
        """Read more into the buffer; False at the end of the stream."""
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def _line(self) -> bytes:
        while (end := self.buffer.find(b"\r\n")) < 0:
            if not self._fill():
                raise TransferError("the connection closed in the middle of a line")
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 2]
        return line

    def read_head(self) -> tuple[int, dict[str, str]]:
        status_line = self._line()
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError) as err:
            raise TransferError(f"not a status line: {status_line[:100]!r}") from err
        headers: dict[str, str] = {}
        while line := self._line():
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    def discard(self, size: int) -> int:
        """Read and drop up to ``size`` body bytes; fewer only when the connection closes."""
        taken = min(size, len(self.buffer))
        del self.buffer[:taken]
        while taken < size:
            got = self.sock.recv_into(self.scratch, min(size - taken, len(self.scratch)))
            if not got:
                break
            taken += got
        return taken

    def drain_chunked(self) -> int:
        """Read and drop a chunked body (and its trailers); the number of body bytes."""
        total = 0
        while True:
            size_line = self._line()
            try:
                size = int(size_line.split(b";", 1)[0], 16)
            except ValueError as err:
                raise TransferError(f"bad chunk size line {size_line[:40]!r}") from err
            if size == 0:
                while self._line():
                    pass
                return total
            if self.discard(size) != size:
                raise TransferError(f"the connection closed inside a chunk after {total} bytes")
            total += size
            if self._line() != b"":
                raise TransferError("a chunk does not end with CRLF")

    def read_body(self, headers: dict[str, str]) -> int:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self.drain_chunked()
        return self.discard(int(headers.get("content-length", "0")))

    def read_small(self, headers: dict[str, str]) -> bytes:
        size = int(headers.get("content-length", "0"))
        while len(self.buffer) < size:
            if not self._fill():
                break
        body = bytes(self.buffer[:size])
        del self.buffer[:size]
        return body

    def at_eof(self) -> bool:
        """Whether the peer has closed the connection (waits up to the socket's timeout)."""
        return not self.buffer and not self._fill()


def download(endpoint: Endpoint, path: str, size: int) -> None:
    client = RawClient(endpoint)
    try:
        client.send_head("GET", f"{path}?bytes={size}")
        status, headers = client.read_head()
        if status != 200:
            raise TransferError(f"GET {path} answered {status}")
        got = client.read_body(headers)
        if got != size:
            raise TransferError(f"GET {path}: {got} bytes of {size}")
    finally:
        client.close()


def upload(endpoint: Endpoint, size: int, chunked: bool) -> None:
    client = RawClient(endpoint)
    piece = b"u" * PIECE
    try:
        framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(size)}
        client.send_head("POST", "/sink", {"Content-Type": "application/octet-stream", **framing})
        frame = b"%x\r\n" % PIECE + piece + b"\r\n" if chunked else piece
        full, rest = divmod(size, PIECE)
        for _ in range(full):
            client.sock.sendall(frame)
        if rest:
            client.sock.sendall(
                b"%x\r\n" % rest + piece[:rest] + b"\r\n" if chunked else piece[:rest]
            )
        if chunked:
            client.sock.sendall(b"0\r\n\r\n")
        status, headers = client.read_head()
        body = client.read_small(headers)
        if status != 200:
            raise TransferError(f"POST /sink answered {status}: {body[:200]!r}")
        received = json.loads(body)["received"]
        if received != size:
            raise TransferError(f"POST /sink: the upstream received {received} bytes of {size}")
    finally:
        client.close()


class RssSampler:
    """The peak RSS of a process, sampled every 20 ms in a thread while in the `with` block."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))


@dataclass
class Case:
    """One transfer, measured through Atrium and direct."""

    name: str
    size: int
    run: Callable[[Endpoint], None]
    atrium: list[float] = field(default_factory=list)
    direct: list[float] = field(default_factory=list)
    rss_before: int | None = None
    rss_peak: int = 0
    rss_after: int = 0
    failure: str | None = None


def timed(case: Case, endpoint: Endpoint) -> float:
    """MB/s of one run."""
    start = time.perf_counter()
    case.run(endpoint)
    return case.size / MB / (time.perf_counter() - start)


def measure(shell: Shell, case: Case, atrium: Endpoint, direct: Endpoint) -> None:
    before = rss_bytes(shell.proc.pid)
    with RssSampler(shell.proc.pid) as sampler:
        case.atrium.append(timed(case, atrium))
    case.rss_after = rss_bytes(shell.proc.pid)
    if case.rss_before is None:
        case.rss_before = before
    case.rss_peak = max(case.rss_peak, sampler.peak)
    case.direct.append(timed(case, direct))


def cut_checks(atrium: Endpoint) -> list[str]:
    """The upstream cuts a response short: what the caller sees through Atrium."""
    lines = []
    for size, how in ((CUT_BUFFERED, "buffered"), (CUT_STREAMED, "streamed")):
        label = f"cut upstream, {size} B announced ({how}):"
        client = RawClient(atrium)
        client.sock.settimeout(CUT_TIMEOUT)
        try:
            lines.append(f"{label} {cut_verdict(client, size)}")
        except TimeoutError:
            lines.append(
                f"{label} WRONG: neither the rest nor a close within {CUT_TIMEOUT:g} s (hangs)"
            )
        except (TransferError, OSError) as err:
            lines.append(f"{label} WRONG: {err!r}")
        finally:
            client.close()
    client = RawClient(atrium)
    try:
        client.send_head("GET", "/small")
        status, headers = client.read_head()
        body = client.read_small(headers)
        verdict = "ok" if status == 200 and len(body) == 200 else "WRONG"
        lines.append(f"the shell after the cuts: GET /small answered {status}: {verdict}")
    except (TransferError, OSError) as err:
        lines.append(f"the shell after the cuts: WRONG: {err!r}")
    finally:
        client.close()
    return lines


def cut_verdict(client: RawClient, size: int) -> str:
    client.send_head("GET", f"/cut?bytes={size}")
    status, headers = client.read_head()
    if status != 200:
        client.read_small(headers)
        return f"answered {status}: {'ok' if status == 502 else 'WRONG (expected 502)'}"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        try:
            got = client.drain_chunked()
        except TransferError as err:
            return f"answered 200 (chunked), then {err}: ok"
        return f"answered 200 (chunked) and ended the body cleanly after {got} bytes: WRONG"
    announced = headers.get("content-length")
    if announced is not None and announced != str(size):
        return f"answered 200 with Content-Length {announced}, not {size}: WRONG (a cut as a whole)"
    got = client.discard(size)
    if got == size:
        return f"answered 200 with all {size} bytes: WRONG (the upstream sent only half)"
    closed = client.at_eof()
    return f"answered 200 (Content-Length {announced}), sent {got} bytes, then " + (
        "closed the connection: ok" if closed else "left the connection open: WRONG"
    )


def report(cases: list[Case], cut_lines: list[str]) -> None:
    print(
        f"\nStreaming through the data proxy vs direct to the upstream, medians of {ROUNDS} "
        f"rounds ({STREAM_MB} MB down, {UPLOAD_MB} MB up); shell RSS in MiB"
    )
    print(
        f"{'case':<26} {'atrium MB/s':>12} {'direct MB/s':>12} {'vs direct':>10} "
        f"{'RSS before':>11} {'peak':>7} {'after':>7} {'peak-before':>12}"
    )
    not_flat = []
    for case in cases:
        if case.failure is not None:
            print(f"{case.name:<26} FAILED: {case.failure}")
            not_flat.append(f"{case.name} (failed)")
            continue
        atrium, direct = statistics.median(case.atrium), statistics.median(case.direct)
        before = case.rss_before or 0
        growth = case.rss_peak - before
        if growth >= FLAT_LIMIT:
            not_flat.append(f"{case.name} (+{growth / MIB:.0f} MiB)")
        print(
            f"{case.name:<26} {atrium:>12.0f} {direct:>12.0f} {atrium / direct:>9.2f}x "
            f"{before / MIB:>11.1f} {case.rss_peak / MIB:>7.1f} {case.rss_after / MIB:>7.1f} "
            f"{growth / MIB:>12.1f}"
        )
    if not_flat:
        print(f"RSS NOT flat: {', '.join(not_flat)} (limit: peak - before < 64 MiB)")
    else:
        print("RSS flat (peak - before < 64 MiB in every case)")
    for line in cut_lines:
        print(line)


def main_sync() -> None:
    down, up = STREAM_MB * MB, UPLOAD_MB * MB
    cases = [
        Case("download, Content-Length", down, lambda e: download(e, "/stream", down)),
        Case("download, chunked", down, lambda e: download(e, "/chunked", down)),
        Case("upload, Content-Length", up, lambda e: upload(e, up, chunked=False)),
        Case("upload, chunked", up, lambda e: upload(e, up, chunked=True)),
    ]
    with tempfile.TemporaryDirectory() as tmp_name, running_shell(Path(tmp_name)) as shell:
        atrium = Endpoint.of(shell.data_url, shell.caller_token)
        direct = Endpoint.of(shell.direct_url, None)
        for _ in range(ROUNDS):
            for case in cases:
                if case.failure is None:
                    try:
                        measure(shell, case, atrium, direct)
                    except (TransferError, OSError) as err:
                        case.failure = str(err) or repr(err)
        report(cases, cut_checks(atrium))


async def main() -> None:
    main_sync()
