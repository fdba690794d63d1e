"""Rollback speed, and what the data backup adds to an update.

An app of 1,000 small files (1 KiB each, plus the stdlib server) with 100 MB of runtime data (100
files of 1 MiB in `<appId>-1/`), in the global scope of an in-process shell. Cases, 5 rounds each:

- rollback between two versions (each round goes back to the version before: snapshot of the
  100 MB, the old tree from `git archive`, the old version's data restored from its backup,
  journal, swap, commit);
- update with the 100 MB of data (backup included) against the same update with no runtime
  data: the difference is the backup's cost;
- the backup method alone on the same 100 MB: clone-or-copy as the shell does it
  (`copy_tree`), next to a hard-linked tree, which the shell does not use (a hard link is not a
  snapshot of a file written in place) but which the issue asks to measure.

Goal (issue 16): none given; the figures are the baseline for later work.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path

from atrium.distribution.backups import copy_tree
from atrium.distribution.fetchers import ProgressEvent
from atrium.distribution.pipeline import Approval
from atrium.distribution.refs import parse_ref
from atrium.identity import new_token
from atrium.scopes import Scope
from atrium.settings import Settings
from atrium.shell import Shell, open_shell
from bench.report import table

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tests" / "apps" / "test.plain.stdlib" / "server.py"
APP = "bench.rolled.app"
ROUNDS = 5
FILES = 1000
DATA_FILES = 100
MIB = 1024 * 1024


def write_app(source: Path, version: str) -> None:
    source.mkdir(parents=True, exist_ok=True)
    shutil.copy(SERVER, source / "server.py")
    files = source / "files"
    files.mkdir(exist_ok=True)
    for n in range(FILES):
        (files / f"f{n:04}.txt").write_bytes(os.urandom(1024))
    manifest = {"id": APP, "name": APP, "version": version, "entrypoint": ["python3", "server.py"]}
    (source / "app.manifest.json").write_text(json.dumps(manifest))


def fill_data(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(DATA_FILES):
        (folder / f"d{n:03}.bin").write_bytes(os.urandom(MIB))


async def run_events(events: AsyncGenerator[ProgressEvent, None]) -> list[str]:
    async with aclosing(events) as stream:
        kinds = [str(item["type"]) async for item in stream]
    if kinds[-1] != "result":
        raise RuntimeError(f"the operation ended with {kinds[-1]}")
    return kinds


async def timed_update(shell: Shell, source: Path, version: str) -> float:
    manifest = json.loads((source / "app.manifest.json").read_text())
    (source / "app.manifest.json").write_text(json.dumps({**manifest, "version": version}))
    started = time.perf_counter()
    await run_events(shell.dist.update(APP, Approval(auto_approve=True), check=False))
    return time.perf_counter() - started


async def measure(root: Path) -> dict[str, list[float]]:
    source = root / "source" / APP
    write_app(source, "1.0.0")
    settings = Settings(home=root / "home", system_apps=root / "none", port=0, runner="process")
    results: dict[str, list[float]] = {"rollback": [], "update": [], "update, no data": []}
    async with open_shell(settings, new_token()) as shell:
        await run_events(
            shell.dist.install(parse_ref(f"local:{source}"), Scope.GLOBAL, Approval(True))
        )
        app_dir = shell.layout.app_dir(Scope.GLOBAL, APP)
        # updates without runtime data first, then with it
        for n in range(ROUNDS):
            results["update, no data"].append(await timed_update(shell, source, f"1.{n + 1}.0"))
        fill_data(app_dir / f"{APP}-1")
        for n in range(ROUNDS):
            results["update"].append(await timed_update(shell, source, f"2.{n}.0"))
        for _ in range(ROUNDS):
            started = time.perf_counter()
            await run_events(shell.dist.rollback(APP, Scope.GLOBAL))
            results["rollback"].append(time.perf_counter() - started)
    return results


def methods(root: Path) -> dict[str, list[float]]:
    data = root / "data" / f"{APP}-1"
    fill_data(data)
    found: dict[str, list[float]] = {"copy_tree": [], "hard links": []}
    method = "?"
    for n in range(ROUNDS):
        started = time.perf_counter()
        method = copy_tree(data, root / f"copy{n}")
        found["copy_tree"].append(time.perf_counter() - started)
        started = time.perf_counter()
        linked = root / f"links{n}"
        linked.mkdir()
        for entry in data.iterdir():
            os.link(entry, linked / entry.name)
        found["hard links"].append(time.perf_counter() - started)
    print(f"copy_tree used {method!r} on this filesystem")
    return found


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        results = await measure(root / "shell")
        found = methods(root / "methods")
    table(
        f"Rollback of a {FILES}-file app with {DATA_FILES} MiB of data, {ROUNDS} rounds",
        [("rollback (backup + old tree + data restore)", results["rollback"])],
        baseline="rollback (backup + old tree + data restore)",
    )
    table(
        f"Update of the same app, {ROUNDS} rounds",
        [
            ("update, no runtime data (baseline)", results["update, no data"]),
            (f"update with {DATA_FILES} MiB of data (backup)", results["update"]),
        ],
        baseline="update, no runtime data (baseline)",
    )
    added = statistics.median(results["update"]) - statistics.median(results["update, no data"])
    print(f"the backup adds {added * 1000:.0f} ms to an update at the median")
    table(
        f"Snapshot of {DATA_FILES} MiB alone, {ROUNDS} rounds",
        [("copy_tree (reflink or copy)", found["copy_tree"]), ("hard links", found["hard links"])],
        baseline="copy_tree (reflink or copy)",
    )
