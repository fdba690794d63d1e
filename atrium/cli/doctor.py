"""`atrium doctor`: a report on a home for the operator after a crash, and ``--repair`` (issue 14).

The report reads ``$ATRIUM_HOME`` directly (no shell needed, none contacted) and changes nothing,
so it is safe while a shell runs: install journals left by an interrupted operation, unreadable
journals and the quarantined staging they keep (the cause of ``409 scope_needs_repair``), other
staging folders, install records that cannot be read or whose app folder is missing, uncommitted
changes in the scope repositories, the KV database's ``PRAGMA quick_check``, backups whose files
do not match their ``backup.json``, and, when no shell holds the home, backup removals and
snapshots a kill cut off, import uploads and exports a killed shell left in ``cache/``
(`atrium.distribution.spool`) and processes still running from it. Exit status 1 when something
needs the operator, 0 when all is well.

``--repair`` takes ``run/serve.lock`` first (so it never races a shell; it refuses, naming the
shell, while one runs), runs the shell's own start-up recovery, brings each scope back to its last
commit (`atrium.distribution.repair`: nothing deleted, what is set aside goes to
``lost+found/<stamp>/``), finishes what start-up does for backups and sets damaged ones aside in
``lost+found/<stamp>/backups/``, removes the uploads and exports a start would, and rebuilds a
damaged KV file from its readable rows, keeping the original beside it. Then it reports again.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from atrium.distribution import spool
from atrium.distribution.backups import DELETING, BackupStore
from atrium.distribution.install import recover
from atrium.distribution.journal import JOURNAL_DIR, QUARANTINE_SUFFIX, UNREADABLE_SUFFIX
from atrium.distribution.records import RECORDS_DIR, RecordStore
from atrium.distribution.repair import repair_backups, repair_scope, uncommitted
from atrium.git import GitError, ScopeRepo
from atrium.lifecycle.limits import ceilings_of, held_here, in_words
from atrium.scopes import Scope, ScopeLayout
from atrium.settings import ConfigError, HomeLock, Settings

MUTABLE = (Scope.GLOBAL, Scope.USER)


def _scope_problems(layout: ScopeLayout, scope: Scope) -> list[str]:
    root = layout.root(scope)
    problems: list[str] = []
    if not root.is_dir():
        return problems
    journals = root / JOURNAL_DIR
    for path in sorted(journals.glob(f"*{UNREADABLE_SUFFIX}")) if journals.is_dir() else []:
        problems.append(
            f"unreadable journal {path}: the scope refuses install/update/uninstall; "
            "`atrium doctor --repair` (with the shell stopped) puts the runtime data back from "
            f"{layout.staging_dir(scope) / (path.stem + QUARANTINE_SUFFIX)} and sets the rest aside"
        )
    for path in sorted(journals.glob("*.json")) if journals.is_dir() else []:
        problems.append(f"pending journal {path}: the next start finishes or undoes it")
    staging = layout.staging_dir(scope)
    for path in sorted(staging.iterdir()) if staging.is_dir() else []:
        kind = "quarantined staging" if path.name.endswith(QUARANTINE_SUFFIX) else "staging"
        problems.append(f"{kind} {path}")
    for item in RecordStore(layout).damaged():
        if item["scope"] == scope.value:
            problems.append(f"unreadable install record {item['path']}: {item['problem']}")
    records = root / RECORDS_DIR
    for path in sorted(records.glob("*.json")) if records.is_dir() else []:
        if not layout.app_dir(scope, path.stem).is_dir():
            problems.append(
                f"install record {path} but no app folder {layout.app_dir(scope, path.stem)}"
            )
    if not (root / ".git").is_dir():
        return problems
    try:
        changed = asyncio.run(uncommitted(root))
    except GitError as err:
        problems.append(f"git status failed in {root}: {err}")
        return problems
    if changed:
        listed = ", ".join(f"{status} {name}" for status, name in changed)
        problems.append(f"uncommitted changes in {root}: {listed}")
    return problems


def _backup_problems(store: BackupStore, shell_running: bool) -> list[str]:
    """Damaged backups; and, when no shell runs (else they are its work in progress), removals
    and snapshots a kill cut off."""
    problems: list[str] = []
    for path in [] if shell_running else store.leftovers():
        if path.name.startswith(DELETING):
            problems.append(
                f"unfinished removal of the backup {path}: the next start or "
                "`atrium doctor --repair` finishes it"
            )
        else:
            problems.append(
                f"partial backup {path} (a snapshot cut off): the next start or "
                "`atrium doctor --repair` removes it"
            )
    for path, problem in store.unusable():
        problems.append(
            f"damaged backup {path}: {problem}; it is neither listed nor restored, "
            "`atrium doctor --repair` moves it to lost+found"
        )
    return problems


def _spool_problems(home: Path) -> list[str]:
    """Import uploads and exports a killed shell left in ``cache/``."""
    return [
        f"{what} {path} left by a shell that was killed: the next start or "
        "`atrium doctor --repair` removes it"
        for path, what in spool.leftovers(home)
    ]


def _kv_files(settings: Settings) -> list[tuple[Path, bool]]:
    """The SQLite files that hold KV rows, each with whether it is the state database: an older
    shell's ``kv.sqlite3`` not moved yet (a damaged one stops the move), and the state database
    when it is SQLite (a PostgreSQL one is its server's to check)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    files = [(settings.kv_path, False)] if settings.kv_path.exists() else []
    try:
        url = make_url(settings.state_url)
    except ArgumentError:  # `atrium serve` names what is wrong with it
        return files
    if url.get_backend_name() == "sqlite" and url.database:
        files.append((Path(url.database).expanduser(), True))
    return files


def _kv_problem(path: Path) -> tuple[str | None, bool]:
    """What is wrong with the KV file, and whether it is damage (which ``--repair`` rebuilds)."""
    if not path.exists():
        return None, False
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            rows = db.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as err:
        code = (getattr(err, "sqlite_errorcode", None) or 0) & 0xFF
        damaged = code in {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}
        return f"KV database {path} cannot be checked: {err}", damaged
    found = [str(row[0]) for row in rows]
    if found == ["ok"]:
        return None, False
    return f"KV database {path} is damaged: {'; '.join(found)}", True


def _lock_held(path: Path) -> bool:
    """Whether a shell holds ``run/serve.lock``, read from ``/proc/locks`` (taking the lock to
    find out could make a shell starting at that moment refuse)."""
    try:
        info = path.stat()
        locks = Path("/proc/locks").read_text()
    except OSError:
        return False
    wanted = f":{info.st_ino}"
    return any(
        line.split()[1] == "FLOCK" and line.split()[5].endswith(wanted)
        for line in locks.splitlines()
        if len(line.split()) > 5
    )


def _home_processes(home: Path) -> list[str]:
    """Processes working in the home, or started with a path inside it (an app, its keeper, its
    sandbox), other than this one."""
    home = home.resolve()
    found: list[str] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = [
                a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0")
            ]
            cwd = (entry / "cwd").readlink()
        except OSError:
            continue
        inside = cwd.is_relative_to(home) or any(a.startswith(f"{home}/") for a in argv)
        if inside and argv != [""]:
            found.append(f"process {entry.name} still runs from {home}: {' '.join(argv)[:200]}")
    return sorted(found)


async def _repair(settings: Settings, layout: ScopeLayout) -> list[str]:
    repos = {s: ScopeRepo(layout.root(s)) for s in MUTABLE if layout.root(s).is_dir()}
    for repo in repos.values():
        await repo.open()
    done = await recover(layout, repos)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    lost = settings.home / "lost+found" / stamp
    for scope, repo in repos.items():
        done += await repair_scope(layout, repo, scope, lost)
    done += await asyncio.to_thread(
        repair_backups, BackupStore(layout.backups_root, several=layout.shared), lost
    )
    done += await asyncio.to_thread(spool.sweep, settings.home)
    for path, state in _kv_files(settings):
        problem, damaged = _kv_problem(path)
        if problem is None or not damaged:
            continue
        if state:
            from atrium.kv import salvage_state  # SQLAlchemy: only for a repair

            kept, aside = await asyncio.to_thread(salvage_state, path, stamp)
        else:
            from atrium.kv import salvage

            kept, aside = await asyncio.to_thread(salvage, path, stamp, settings.user)
        done.append(
            f"{problem}: rebuilt with the {kept} rows still readable; original kept as {aside}"
        )
    return done


def _run_repair(settings: Settings, layout: ScopeLayout) -> None:
    try:
        settings.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = HomeLock.claim(settings)
    except (ConfigError, OSError) as err:
        typer.echo(f"atrium doctor --repair: {err}", err=True)
        raise typer.Exit(2) from err
    try:
        done = asyncio.run(_repair(settings, layout))
    except ConfigError as err:
        typer.echo(f"atrium doctor --repair: {err}", err=True)
        raise typer.Exit(2) from err
    finally:
        lock.release()
    for line in done:
        typer.echo(f"repaired: {line}")


def _kube_problems(settings: Settings) -> list[str]:
    """What keeps a shell with ``ATRIUM_RUNNER=kubernetes`` from reaching its cluster, said
    without contacting it: a kubeconfig that is not a file, or no in-cluster service account."""
    config = settings.kube_config
    if config is not None and not config.is_file():
        return [f"ATRIUM_KUBE_CONFIG {config}: not a file (a kubeconfig, or unset in a pod)"]
    if config is None and not Path("/var/run/secrets/kubernetes.io/serviceaccount/token").is_file():
        return [
            "ATRIUM_KUBE_CONFIG is unset and this is not a pod with a service account: "
            "set it to a kubeconfig"
        ]
    return []


def doctor(
    home: Annotated[Path | None, typer.Option(help="data directory [env ATRIUM_HOME]")] = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="repair what can be repaired safely (no shell may run; nothing is deleted)",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='print {"home", "problems", "limits", "network"} (exit 1 when any problem)',
        ),
    ] = False,
) -> None:
    """Report what needs the operator in a home (read-only; safe while a shell runs)."""
    try:
        settings = Settings.load(home=home)
    except ConfigError as err:
        typer.echo(f"atrium doctor: {err}", err=True)
        raise typer.Exit(2) from err
    layout = ScopeLayout(settings.home, settings.system_apps, settings.user, settings.scopes_dir)
    if repair:
        _run_repair(settings, layout)
    problems = [p for s in MUTABLE for p in _scope_problems(layout, s)]
    for path, _ in _kv_files(settings):
        kv_problem, _ = _kv_problem(path)
        problems += [kv_problem] if kv_problem else []
    shell_running = _lock_held(settings.lock_path)
    # while a shell runs, a file in cache/imports or cache/exports is a request in progress
    problems += [] if shell_running else _spool_problems(settings.home)
    problems += _backup_problems(
        BackupStore(layout.backups_root, several=layout.shared), shell_running
    )
    if settings.home.is_dir() and not shell_running:
        problems += _home_processes(settings.home)
    limits = held_here(
        ceilings_of(settings.app_memory_mib, settings.app_cpu_milli, settings.app_pids),
        settings.cgroup_parent,
        settings.app_limits,
    )
    line = limits.line()
    if settings.runner == "kubernetes":
        problems += _kube_problems(settings)
        line = (
            f"limits: the pods' resources (memory and CPU) on Kubernetes, namespace "
            f"{settings.kube_namespace}; ceilings: {in_words(limits.ceilings)}"
        )
    from atrium.lifecycle.network import isolation_here

    network = isolation_here(settings.app_network, settings.app_network_apps)
    if as_json:
        found = {"home": str(settings.home), "problems": problems, "limits": limits.wire()}
        typer.echo(json.dumps({**found, "network": network}))
        raise typer.Exit(1 if problems else 0)
    typer.echo(line)
    typer.echo(network)
    for problem in problems:
        typer.echo(problem)
    if problems:
        raise typer.Exit(1)
    typer.echo(f"{settings.home}: nothing to repair")
