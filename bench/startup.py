"""A shell's start-up, as the integration tests pay it (tests/integration/conftest.py
`launch_shell`: `ShellServer` on uvloop in a thread of this process, port 0), until it serves.

Two cases, median of SAMPLES each: a fresh ATRIUM_HOME (git init of both scope repositories, the
baseline commits, the state database created) and a restart on the same home (open, recover,
load). Also how many git runs each start made. The integration suite starts well over a thousand
shells: every millisecond here is seconds of CI.

Measured on the shared 2-core development VM (load 4-8 from other work), the integration
fixture's start, interleaved runs of the trees, median of six rounds' medians:
- before (every git run forked the whole test process to run a Python ``preexec_fn``; 3
  ``git config`` and a ``rev-parse`` per repository on every start): fresh 1613 ms, restart
  898 ms, 12 and 8 git runs (quiet machine, median of 20: fresh 516 ms, restart 361 ms)
- git started by vfork (setpriv asks for the death signal): fresh 768 ms, restart 373 ms
- and 6 / 2 git runs (config written into a fresh repository, read once on a restart, HEAD read
  from its files): the same within this machine's noise (a git run is now ~4-8 ms, the two
  repositories open side by side); both steps against before, four rounds at load 8: fresh
  1944 -> 830 ms, restart 1118 -> 380 ms
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

import atrium.git
from atrium.api.server import ShellServer
from atrium.identity import new_token
from atrium.settings import Settings
from bench.report import table

SAMPLES = 20
ROOT = Path(__file__).resolve().parent.parent


def start(home: Path, system_apps: Path) -> tuple[float, Callable[[], None]]:
    """Start a shell on ``home``; seconds until it serves, and a function stopping it."""
    server = ShellServer(
        Settings(home=home, system_apps=system_apps, host="127.0.0.1", port=0), new_token()
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            uvloop.run(server.serve())
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    began = time.perf_counter()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while not server.started:
        if errors or not thread.is_alive():
            raise RuntimeError(f"the shell failed to start: {errors}")
        time.sleep(0.002)
    took = time.perf_counter() - began

    def stop() -> None:
        server.request_exit()
        thread.join(timeout=30)

    return took, stop


async def main() -> None:
    spawned: list[object] = []
    spawn = atrium.git._spawn

    def counting(*args: Any, **kwargs: Any) -> Any:
        spawned.append(args)
        return spawn(*args, **kwargs)

    atrium.git._spawn = counting  # counts the git runs, changes nothing
    fresh: list[float] = []
    again: list[float] = []
    runs: dict[str, list[int]] = {"fresh": [], "restart": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            system_apps = Path(tmp) / "system-apps"
            shutil.copytree(ROOT / "apps", system_apps)
            start(Path(tmp) / "warm-up", system_apps)[1]()  # imports, compiled SDK
            for n in range(SAMPLES):
                home = Path(tmp) / f"home-{n}"
                for samples, case in ((fresh, "fresh"), (again, "restart")):
                    spawned.clear()
                    took, stop = start(home, system_apps)
                    runs[case].append(len(spawned))
                    samples.append(took)
                    stop()
    finally:
        atrium.git._spawn = spawn
    table(
        f"Shell start-up until it serves (in-process, as the tests; median of {SAMPLES})",
        [("restart on the same home", again), ("fresh home", fresh)],
        baseline="restart on the same home",
    )
    for case, counts in runs.items():
        print(f"git runs per start, {case}: {statistics.median(counts):g}")


if __name__ == "__main__":
    asyncio.run(main())
