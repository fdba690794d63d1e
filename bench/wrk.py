"""Run wrk and read its summary: requests/s, p50 and p99 latency, socket errors, bad statuses."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: wrk's format_time units
UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
PERCENTILE = re.compile(r"^\s+(\d+(?:\.\d+)?)%\s+([\d.]+)(us|ms|s|m|h)\s*$", re.MULTILINE)
REQUESTS = re.compile(r"^\s+(\d+) requests in ([\d.]+)(us|ms|s|m|h)", re.MULTILINE)
RPS = re.compile(r"^Requests/sec:\s+([\d.]+)", re.MULTILINE)
SOCKET_ERRORS = re.compile(
    r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", re.MULTILINE
)
NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)", re.MULTILINE)
#: the thread stats' latency line: average, standard deviation, max, share within one deviation
LATENCY = re.compile(
    r"^\s+Latency\s+([\d.]+)(us|ms|s|m|h)\s+([\d.]+)(us|ms|s|m|h)\s+([\d.]+)(us|ms|s|m|h)",
    re.MULTILINE,
)


@dataclass(frozen=True)
class WrkResult:
    """One wrk run's summary (latencies in ms)."""

    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    socket_errors: int
    #: responses with a status ≥ 400 (wrk's "Non-2xx or 3xx responses")
    bad_status: int
    output: str
    #: the slowest answer (0 when wrk printed no latency line)
    max_ms: float = 0.0
    #: requests not answered within wrk's --timeout (part of socket_errors)
    timeouts: int = 0

    @property
    def errors(self) -> int:
        return self.socket_errors + self.bad_status


def parse(output: str) -> WrkResult:
    """Read wrk's `--latency` output; raises ValueError when a line is missing."""
    latencies = {float(p): float(v) * UNITS[unit] for p, v, unit in PERCENTILE.findall(output)}
    requests, rps = REQUESTS.search(output), RPS.search(output)
    if requests is None or rps is None or 50.0 not in latencies or 99.0 not in latencies:
        raise ValueError(f"unexpected wrk output:\n{output}")
    socket_errors = SOCKET_ERRORS.search(output)
    non_2xx = NON_2XX.search(output)
    latency = LATENCY.search(output)
    return WrkResult(
        requests=int(requests.group(1)),
        seconds=float(requests.group(2)) * UNITS[requests.group(3)] / 1000,
        rps=float(rps.group(1)),
        p50_ms=latencies[50.0],
        p99_ms=latencies[99.0],
        socket_errors=sum(int(n) for n in socket_errors.groups()) if socket_errors else 0,
        bad_status=int(non_2xx.group(1)) if non_2xx else 0,
        output=output,
        max_ms=float(latency.group(5)) * UNITS[latency.group(6)] if latency else 0.0,
        timeouts=int(socket_errors.group(4)) if socket_errors else 0,
    )


def command(
    url: str,
    connections: int,
    seconds: int,
    token: str | None = None,
    script: Path | None = None,
    script_args: Sequence[str] = (),
    threads: int | None = None,
    headers: Sequence[str] = (),
    timeout_seconds: float | None = None,
) -> list[str]:
    """``headers`` are extra ``Name: value`` lines; ``timeout_seconds`` is wrk's --timeout (2 s
    unless given): a request not answered within it counts as a timeout, not a latency."""
    cmd = [
        "wrk",
        f"-t{threads or min(connections, 2)}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--latency",
    ]
    if timeout_seconds is not None:
        cmd += ["--timeout", f"{timeout_seconds:g}s"]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    for header in headers:
        cmd += ["-H", header]
    if script is not None:
        cmd += ["-s", str(script)]
    cmd.append(url)
    if script_args:
        cmd += ["--", *script_args]
    return cmd


def wrk(url: str, connections: int, seconds: int, token: str | None = None) -> WrkResult:
    """wrk for ``seconds`` at ``connections`` (2 threads at most), with a bearer token if given."""
    out = subprocess.run(
        command(url, connections, seconds, token), capture_output=True, text=True, check=True
    ).stdout
    return parse(out)
