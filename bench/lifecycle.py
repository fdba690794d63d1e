"""Lifecycle speed: cold start (spawn → started) with process vs bwrap, warm-pool launch, and a
50-instance start/destroy loop checked for leaked processes, ports and file descriptors.

Targets: cold start of a Python SDK app ≤ 40 ms median with bwrap (it was 150 ms when the
lifecycle was first built); warm-pool launch → resumed ≤ 5 ms. Baseline for the cold start: the process runner, in the same run.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from atrium.identity import new_token
from atrium.settings import Settings
from atrium.shell import Shell, open_shell
from bench.report import table

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 15
APP = "com.atrium.notes"
POOLED = "bench.pooled"


#: as root, the process runner drops to the app's uid, which cannot exec an interpreter under
#: /root (where this venv's may live): both runners then run Debian's python3, as the wake bench
#: does, so they still compare like with like
APP_PYTHON = "/usr/bin/python3" if os.geteuid() == 0 else None


def use_reachable_python(folder: Path) -> None:
    """Point the app in ``folder`` at `APP_PYTHON` (when there is one)."""
    if APP_PYTHON is None:
        return
    path = folder / "app.manifest.json"
    manifest = json.loads(path.read_text())
    manifest["entrypoint"] = [APP_PYTHON, *manifest["entrypoint"][1:]]
    path.write_text(json.dumps(manifest))


def system_apps(root: Path) -> Path:
    target = root / "system"
    shutil.copytree(ROOT / "apps" / APP, target / APP)
    use_reachable_python(target / APP)
    pooled = target / POOLED
    shutil.copytree(ROOT / "apps" / APP, pooled)
    manifest = json.loads((pooled / "app.manifest.json").read_text())
    manifest.update({"id": POOLED, "warmPool": True})
    manifest.pop("dataProvider")
    manifest.pop("permissionInfo")  # labels Notes' own permissions, not this copy's
    (pooled / "app.manifest.json").write_text(json.dumps(manifest))
    use_reachable_python(pooled)
    return target


async def cold_starts(shell: Shell) -> list[float]:
    samples = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        instance = await shell.lifecycle.create(APP, new=True)
        samples.append(time.perf_counter() - started)
        await shell.lifecycle.remove(instance.id)
    return samples


async def pooled_launches(shell: Shell) -> list[float]:
    samples = []
    for _ in range(ROUNDS):
        while not any(
            shell.lifecycle.is_pooled(i) and i.state == "resumed"
            for i in shell.lifecycle.of_app(POOLED)
        ):
            await asyncio.sleep(0.01)
        started = time.perf_counter()
        instance = await shell.lifecycle.create(POOLED)
        samples.append(time.perf_counter() - started)
        assert instance.state == "resumed"
        await shell.lifecycle.remove(instance.id)
    return samples


def open_fds() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


def children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        pid = entry.name
        if pid.isdigit():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if stat[1] == me and stat[0] != "Z":
                found.add(int(pid))
    return found


async def leak_loop(shell: Shell, count: int = 50) -> str:
    await asyncio.sleep(0.5)
    fds, kids, ports = open_fds(), children(), shell.lifecycle.ports_in_use()
    for _ in range(count):
        instance = await shell.lifecycle.create(APP, new=True)
        await shell.lifecycle.remove(instance.id)
    await asyncio.sleep(0.5)
    after = (open_fds(), children(), shell.lifecycle.ports_in_use())
    return (
        f"{count} instances started and destroyed: file descriptors {fds} → {after[0]}, "
        f"child processes {len(kids)} → {len(after[1])}, ports held {ports} → {after[2]}"
    )


async def run(runner: str, root: Path) -> tuple[list[float], list[float] | None, str | None]:
    settings = Settings(
        home=root / f"home-{runner}", system_apps=system_apps(root / runner), port=0, runner=runner
    )
    async with open_shell(settings, new_token()) as shell:
        await cold_starts(shell)  # warm the page cache and bytecode first
        cold = await cold_starts(shell)
        pooled = await pooled_launches(shell) if runner == "bwrap" else None
        leaks = await leak_loop(shell) if runner == "bwrap" else None
    return cold, pooled, leaks


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)  # the process runner's apps run under their own uid
        if APP_PYTHON is not None:
            print(f"as root: the apps run {APP_PYTHON} (the app uid cannot reach {sys.executable})")
        process, _, _ = await run("process", Path(tmp))
        bwrap, pooled, leaks = await run("bwrap", Path(tmp))
    table(
        f"Cold start of {APP} (SDK), spawn → started, {ROUNDS} rounds",
        [("process runner (baseline)", process), ("bwrap runner", bwrap)],
        baseline="process runner (baseline)",
        target_ms=40,
    )
    assert pooled is not None
    table(
        "Warm-pool launch → resumed",
        [("claim a pooled instance", pooled)],
        baseline="claim a pooled instance",
        target_ms=5,
    )
    print(leaks)
