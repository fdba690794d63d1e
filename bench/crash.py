"""Crash detection latency: SIGKILL of a running app's own process → `app:crashed` on the bus.

The real shell in-process (open_shell), the notes app (SDK) started to `started`, then its app
process killed with SIGKILL: for the process runner the child itself (the leader of its process
group); for the bwrap runner the app's process inside the sandbox, found below bwrap's pid (bwrap,
then the sandbox's pid-1 reaper, then the app). The clock stops in a synchronous bus listener, so
nothing but detection is timed. Between rounds the instance is brought back with `retry`.

Target (lifecycle issue): none given ("detection latency measured in bench/"); the spec asks for
`app:crashed` "at once". Baseline: the process runner, same run. Also shown, as the floor: SIGKILL
→ `waitpid` returning for a bare interpreter that imported the SDK, with no shell at all (the
kernel tearing a Python process down is most of the time).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from atrium.bus import Event
from atrium.identity import new_token
from atrium.lifecycle.runners.process import descendants
from atrium.settings import Settings
from atrium.shell import Shell, open_shell
from bench.lifecycle import APP, system_apps
from bench.report import table

ROUNDS = 15
WARMUP = 2


def app_pid(shell: Shell, instance_id: str, runner: str) -> int:
    """The pid of the app's own process: the leaf below the keeper, or below bwrap and its
    reaper."""
    child = shell.lifecycle.get(instance_id).child
    assert child is not None
    assert child.pid is not None
    leaves = [s for s in descendants(child.pid) if not descendants(s.pid)]
    assert len(leaves) == 1, f"expected one app process below the {runner} runner, found {leaves}"
    return leaves[0].pid


async def rounds(shell: Shell, runner: str) -> list[float]:
    crashed: list[tuple[float, Event]] = []
    seen = asyncio.Event()

    def on_crash(event: Event) -> None:
        crashed.append((time.perf_counter(), event))
        seen.set()

    remove = shell.bus.listen(("app:crashed",), on_crash)
    instance = await shell.lifecycle.create(APP, new=True)
    samples: list[float] = []
    try:
        for n in range(WARMUP + ROUNDS):
            if n:
                instance = await shell.lifecycle.act(instance.id, "retry")
            assert instance.state.value == "started", instance.state
            pid = app_pid(shell, instance.id, runner)
            await asyncio.sleep(0.05)  # let the health poll and hooks settle
            crashed.clear()
            seen.clear()
            started = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            await asyncio.wait_for(seen.wait(), 10)
            at, event = crashed[0]
            assert event.payload["instanceId"] == instance.id
            assert event.payload["exitCode"] in (-9, 137), event.payload
            if n >= WARMUP:
                samples.append(at - started)
    finally:
        remove()
        await shell.lifecycle.remove(instance.id)
    return samples


def kernel_floor() -> list[float]:
    """SIGKILL → waitpid of `python -c "import atrium.sdk; sleep"`: what no shell can beat."""
    samples = []
    for n in range(WARMUP + ROUNDS):
        child = subprocess.Popen(
            [sys.executable, "-c", "import atrium.sdk, time; print(1, flush=True); time.sleep(60)"],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert child.stdout is not None
        child.stdout.readline()  # imports done
        time.sleep(0.05)
        started = time.perf_counter()
        os.kill(child.pid, signal.SIGKILL)
        child.wait()  # a blocking waitpid
        if n >= WARMUP:
            samples.append(time.perf_counter() - started)
        child.stdout.close()
    return samples


async def run(runner: str, root: Path) -> list[float]:
    settings = Settings(
        home=root / f"home-{runner}", system_apps=system_apps(root / runner), port=0, runner=runner
    )
    async with open_shell(settings, new_token()) as shell:
        return await rounds(shell, runner)


async def main() -> None:
    # each round logs "child exited with status 137" as a warning: expected here
    logging.getLogger("atrium.lifecycle").setLevel(logging.ERROR)
    floor = kernel_floor()
    with tempfile.TemporaryDirectory() as tmp:
        process = await run("process", Path(tmp))
        bwrap = await run("bwrap", Path(tmp))
    table(
        f"Crash detection, SIGKILL of the app process → app:crashed, {ROUNDS} rounds",
        [
            ("floor: bare interpreter, SIGKILL → waitpid", floor),
            ("process runner (baseline)", process),
            ("bwrap runner", bwrap),
        ],
        baseline="process runner (baseline)",
    )
