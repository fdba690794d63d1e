"""The data proxy through HAProxy vs direct: what the load balancer of several shells
(deploy/haproxy.cfg, docs/deploying.md "Several shells") adds to a data request.

One shell (bench.upstream and bench.caller launched) behind Debian's HAProxy running the
repository's deploy/haproxy.cfg as it is (both of its `server` lines name that one shell: the
figure is what the hop costs, not what a second shell adds). wrk at 32 connections (requests/s,
p50/p99) and at 1 (latency), 200 B and 64 KiB bodies, the two paths interleaved in every round;
medians of the rounds and the ratio of HAProxy's to direct. Every request carries the caller
app's token and `Host: localhost`, one of the shell's names (the app domain the health check
sends).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import httpx

from bench.shell import ROOT, Shell, free_port, running_shell, stop, wait_port
from bench.wrk import WrkResult, command, parse

CONFIG = ROOT / "deploy" / "haproxy.cfg"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "4"))
SIZES = {"small": 200, "large": 65536}
HOST = "localhost"


def start_haproxy(tmp: Path, shell: Shell) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    address = shell.url.removeprefix("http://")
    env = {
        **os.environ,
        "ATRIUM_APP_DOMAIN": HOST,
        "ATRIUM_LB_BIND": f"127.0.0.1:{port}",
        "ATRIUM_LB_STATS": str(tmp / "haproxy.sock"),
        "ATRIUM_SHELL_1": address,
        "ATRIUM_SHELL_2": address,
    }
    proc = subprocess.Popen(
        ["haproxy", "-db", "-f", str(CONFIG)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, proc=proc)
    return proc, port


def run_wrk(url: str, connections: int, token: str) -> WrkResult:
    out = subprocess.run(
        command(url, connections, SECONDS, token, headers=[f"Host: {HOST}"]),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse(out)


def main_sync() -> None:
    if shutil.which("haproxy") is None:
        print("haproxy skipped: not installed (make bench installs Debian's haproxy)")
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with running_shell(tmp) as shell:
            proc, port = start_haproxy(tmp, shell)
            try:
                paths = {
                    "direct (the shell)": shell.data_url,
                    "through haproxy": f"http://127.0.0.1:{port}/api/data/bench",
                }
                with httpx.Client(
                    headers={"Authorization": f"Bearer {shell.caller_token}", "Host": HOST},
                    timeout=10,
                ) as client:
                    for base in paths.values():  # up (health checks passed) and answering
                        for size, length in SIZES.items():
                            answer = client.get(f"{base}/{size}")
                            if answer.status_code != 200 or len(answer.content) != length:
                                raise RuntimeError(f"{base}/{size}: {answer.status_code}")
                measure(paths, shell.caller_token)
            finally:
                stop([proc])


def measure(paths: dict[str, str], token: str) -> None:
    results: dict[tuple[str, str, int], list[WrkResult]] = {}
    for _ in range(ROUNDS):
        for size in SIZES:
            for name, base in paths.items():
                for connections in (32, 1):
                    results.setdefault((name, size, connections), []).append(
                        run_wrk(f"{base}/{size}", connections, token)
                    )

    def med(name: str, size: str, connections: int, field: str) -> float:
        return statistics.median(
            float(getattr(r, field)) for r in results[(name, size, connections)]
        )

    direct, through = paths
    for size, label in (("small", "200 B"), ("large", "64 KiB")):
        print(
            f"\nData proxy through HAProxy vs direct, {label} bodies, medians of {ROUNDS} "
            f"interleaved rounds (wrk, {SECONDS} s each)"
        )
        print(
            f"{'path':<20} {'req/s @32':>10} {'p50 ms @32':>11} {'p99 ms @32':>11} "
            f"{'p50 ms @1':>10} {'p99 ms @1':>10}"
        )
        for name in paths:
            print(
                f"{name:<20} {med(name, size, 32, 'rps'):>10.0f} "
                f"{med(name, size, 32, 'p50_ms'):>11.3f} {med(name, size, 32, 'p99_ms'):>11.3f} "
                f"{med(name, size, 1, 'p50_ms'):>10.3f} {med(name, size, 1, 'p99_ms'):>10.3f}"
            )
        print(
            f"haproxy / direct: {med(through, size, 32, 'rps') / med(direct, size, 32, 'rps'):.2f}x"
            f" req/s @32; +{med(through, size, 1, 'p50_ms') - med(direct, size, 1, 'p50_ms'):.3f}"
            " ms median latency @1"
        )
        for name in paths:
            runs = results[(name, size, 32)] + results[(name, size, 1)]
            if errors := sum(r.errors for r in runs):
                print(f"  {name}: {errors} errors over its runs: its figures are not comparable")


async def main() -> None:
    main_sync()
