"""Failover of two shells behind HAProxy, timed: the scenario of the failover test
(tests/integration/test_failover.py, whose `failover` this runs as it is, namespaces and load
included).

PostgreSQL, two shells, HAProxy and a client each in a network namespace; while the client holds
an event stream, sends 50 data requests a second and makes 2,000 KV writes through HAProxy,
shell 1 is hit (c) with 5 % packet loss and 100 ms delay each way on its link for 3 s, then (b)
its link is cut while it stays alive, then (a) it is killed (`kill -9`). For each: the longest
time without a successful data answer from the fault on (the time until traffic is back, on
shell 2 for (a) and (b)), and the same for acknowledged KV writes; for (b) also when the server
had ended shell 1's sessions (its locks free for shell 2), and for (b) and (a) when shell 2 had
taken over shell 1's instances (their pods in the fake cluster of tests/kube). One run: about
half a minute, and it needs root, ip, iptables, bwrap and Debian's haproxy.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

CASES = {
    "c": "(c) 5 % loss + 100 ms delay",
    "b": "(b) link cut, shell alive",
    "a": "(a) kill -9",
}


def main_sync() -> None:
    if os.geteuid() != 0 or not all(map(shutil.which, ("haproxy", "iptables", "ip", "bwrap"))):
        print("failover skipped: needs root, ip, iptables, bwrap and Debian's haproxy")
        return
    from tests.integration.test_failover import failover

    with (
        tempfile.TemporaryDirectory(prefix="atrium-bench-failover-") as tmp,
        failover(Path(tmp), settle=False) as run,
    ):
        figures = dict(run.figures)
    print("\nFailover of shell 1 of two behind HAProxy (one run; seconds)")
    print(f"{'fault':<32} {'answers back':>13} {'writes back':>12}")
    for key, name in CASES.items():
        print(f"{name:<32} {figures[key]:>13.2f} {figures[f'{key} writes']:>12.2f}")
    print(
        f"(b): the server ended shell 1's sessions {figures['sessions gone']:.2f} s after the cut"
    )
    for key, moment in (("b", "cut"), ("a", "kill")):
        taken = figures[f"{key} takeover"]
        print(f"({key}): shell 2 held shell 1's instances {taken:.2f} s after the {moment}")


async def main() -> None:
    import asyncio

    await asyncio.to_thread(main_sync)
