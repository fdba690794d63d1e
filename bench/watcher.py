"""How fast a hand-copied app becomes visible: registry (watcher → rescan → event) vs raw watchfiles.

Target (foundation issue): a dropped-in app visible in ≤ 50 ms. Baseline: the bare inotify
notification of the same copy through watchfiles with the same step, measured in the same run.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

import watchfiles

from atrium.bus import Event, EventBus
from atrium.registry import AppRegistry
from atrium.scopes import Scope, ScopeLayout
from bench.report import table

ROUNDS = 30


def make_source(root: Path) -> Path:
    src = root / "src" / "com.example.bench"
    src.mkdir(parents=True)
    (src / "entrypoint.sh").write_text("#!/bin/sh\n")
    (src / "app.manifest.json").write_text(
        json.dumps({"id": "com.example.bench", "name": "Bench", "version": "1.0.0"})
    )
    for n in range(10):
        (src / f"file{n}.txt").write_text("x" * 1000)
    return src


async def registry_rounds(root: Path, src: Path) -> list[float]:
    layout = ScopeLayout(root / "home", root / "system")
    (root / "system").mkdir()
    apps = layout.apps_dir(Scope.GLOBAL)
    apps.mkdir(parents=True)
    samples: list[float] = []
    async with EventBus() as bus, AppRegistry(layout, bus):
        seen = asyncio.Event()

        def on_event(event: Event) -> None:
            seen.set()

        bus.listen(("app:installed",), on_event)
        for _ in range(ROUNDS):
            seen.clear()
            started = time.perf_counter()
            await asyncio.to_thread(shutil.copytree, src, apps / src.name)
            await asyncio.wait_for(seen.wait(), 5)
            samples.append(time.perf_counter() - started)
            removed = asyncio.Event()

            def on_removed(event: Event, done: asyncio.Event = removed) -> None:
                done.set()

            remover = bus.listen(("app:removed",), on_removed)
            await asyncio.to_thread(shutil.rmtree, apps / src.name)
            await asyncio.wait_for(removed.wait(), 5)
            remover()
    return samples


async def raw_rounds(root: Path, src: Path) -> list[float]:
    target = root / "raw"
    target.mkdir()
    samples: list[float] = []
    stop = asyncio.Event()
    changes: asyncio.Queue[set[tuple[watchfiles.Change, str]]] = asyncio.Queue()

    async def watch() -> None:
        async for batch in watchfiles.awatch(
            target, step=5, debounce=200, stop_event=stop, rust_timeout=100, yield_on_timeout=True
        ):
            await changes.put(batch)

    task = asyncio.create_task(watch())
    while await changes.get() != set():
        pass
    for _ in range(ROUNDS):
        started = time.perf_counter()
        await asyncio.to_thread(shutil.copytree, src, target / src.name)
        while not await changes.get():
            pass
        samples.append(time.perf_counter() - started)
        await asyncio.to_thread(shutil.rmtree, target / src.name)
        while not await changes.get():
            pass
    stop.set()
    await task
    return samples


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = make_source(root)
        raw = await raw_rounds(root, src)
        reg = await registry_rounds(root, src)
    table(
        f"Watcher: hand-copied app (12 files) → visible, {ROUNDS} rounds",
        [("raw watchfiles notification (baseline)", raw), ("registry: app:installed event", reg)],
        baseline="raw watchfiles notification (baseline)",
        target_ms=50,
    )
