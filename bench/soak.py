"""A soak of the data proxy: many small requests in a row, and nothing may fail or pile up.

100,000 requests (BENCH_SOAK_REQUESTS) of the 200 B body through Atrium's data proxy at 64
connections, driven by wrk with bench/soak.lua: each of wrk's 2 threads stops after its share of
the requests and counts the statuses other than 200; as soon as every thread has stopped, wrk is
interrupted (it would otherwise sleep out its -d, BENCH_SOAK_MAX_SECONDS, which also bounds the
run). Reported: requests, errors (wrk's socket errors + non-200 statuses), requests/s, p50/p99
latency, and the shell's RSS before (after a 1 s warm-up) and after. Verdict: "zero errors" or
"N errors".
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path

from bench.shell import Shell, rss_bytes, running_shell
from bench.wrk import command, parse, wrk

REQUESTS = int(os.environ.get("BENCH_SOAK_REQUESTS", "100000"))
MAX_SECONDS = int(os.environ.get("BENCH_SOAK_MAX_SECONDS", "600"))
CONNECTIONS = 64
THREADS = 2
SCRIPT = Path(__file__).resolve().parent / "soak.lua"
LUA_SUMMARY = re.compile(r"^soak: responses (\d+) non200 (\d+)$", re.MULTILINE)
MIB = 1 << 20


def soak(shell: Shell) -> str:
    """Run wrk until every thread has had its share; its stdout."""
    cmd = command(
        f"{shell.data_url}/small",
        CONNECTIONS,
        MAX_SECONDS,
        shell.caller_token,
        script=SCRIPT,
        script_args=[str(REQUESTS), str(THREADS)],
        threads=THREADS,
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    finished = 0
    for line in proc.stderr:
        if line.strip() == "soak: thread done":
            finished += 1
            if finished == THREADS:
                break
    while True:
        if finished == THREADS:
            proc.send_signal(signal.SIGINT)  # wrk then joins its threads and reports
        try:
            out, err = proc.communicate(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue  # the signal reached a thread that was ending, not wrk's main thread
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {err[:500]}")
    return out


def main_sync() -> None:
    if REQUESTS < THREADS:
        raise ValueError(f"BENCH_SOAK_REQUESTS must be at least {THREADS}")
    with tempfile.TemporaryDirectory() as tmp_name, running_shell(Path(tmp_name)) as shell:
        wrk(f"{shell.data_url}/small", CONNECTIONS, 1, shell.caller_token)  # warm-up
        before = rss_bytes(shell.proc.pid)
        out = soak(shell)
        after = rss_bytes(shell.proc.pid)
    result = parse(out)
    lua = LUA_SUMMARY.search(out)
    if lua is None:
        raise RuntimeError(f"soak.lua printed no summary:\n{out}")
    responses, non200 = int(lua.group(1)), int(lua.group(2))
    errors = result.socket_errors + non200
    print(
        f"\nSoak: {REQUESTS} requests of 200 B through the data proxy at {CONNECTIONS} "
        f"connections (wrk, {THREADS} threads)"
    )
    print(f"{'requests':<22} {responses}")
    print(f"{'errors':<22} {errors} ({result.socket_errors} socket errors, {non200} non-200)")
    print(f"{'req/s':<22} {result.rps:.0f} ({result.requests} in {result.seconds:.2f} s)")
    print(f"{'p50 / p99 ms':<22} {result.p50_ms:.3f} / {result.p99_ms:.3f}")
    print(
        f"{'shell RSS MiB':<22} {before / MIB:.1f} before, {after / MIB:.1f} after, "
        f"{(after - before) / MIB:+.1f}"
    )
    if responses < REQUESTS:
        print(f"INCOMPLETE: {responses} of {REQUESTS} within {MAX_SECONDS} s")
    print("zero errors" if errors == 0 and responses == REQUESTS else f"{errors} errors")


async def main() -> None:
    main_sync()
