"""The client commands' wall time: `atrium version`, `ps`, `apps`, `kv get`, `logs`, each a fresh
`python -m atrium` process against a running shell (fresh ATRIUM_HOME, no apps running).

Target: <= 100 ms median on a quiet machine. Baseline: `python -c pass`, the interpreter's own
start-up, which no command can go below. `logs` asks for an instance that does not exist (the
shell answers 404): the command's imports and its round trip are what it costs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import table
from bench.shell import serve, stop

SAMPLES = 10
TARGET_MS = 100.0
COMMANDS = (
    ["version"],
    ["ps"],
    ["apps"],
    ["kv", "get", "os/bench"],
    ["logs", "bench-missing-1"],
)


def timed(argv: list[str], env: dict[str, str]) -> list[float]:
    samples = []
    for _ in range(SAMPLES):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return samples


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home, system = Path(tmp) / "home", Path(tmp) / "system"
        system.mkdir()
        proc, url, token = serve(home, system)
        try:
            env = {**os.environ, "ATRIUM_URL": url, "ATRIUM_TOKEN": token}
            atrium = [sys.executable, "-m", "atrium"]
            subprocess.run([*atrium, "kv", "set", "os/bench", "1"], env=env, check=True)
            rows = [("baseline: python -c pass", timed([sys.executable, "-c", "pass"], env))]
            rows += [
                (f"atrium {' '.join(argv)}", timed([*atrium, *argv], env)) for argv in COMMANDS
            ]
        finally:
            stop([proc])
    table(
        f"CLI client commands (a fresh process each, median of {SAMPLES})",
        rows,
        baseline="baseline: python -c pass",
        target_ms=TARGET_MS,
    )
