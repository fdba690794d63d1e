"""`atrium doctor`: a read-only report on a home, for the operator after a crash (issue 14).

It reads ``$ATRIUM_HOME`` directly (no shell needed, none contacted) and changes nothing, so it is
safe while a shell runs: install journals left by an interrupted operation, unreadable journals
and the quarantined staging they keep (the cause of ``409 scope_needs_repair``), other staging
folders, install records that cannot be read or whose app folder is missing, uncommitted changes
in the scope repositories, and the KV database's ``PRAGMA quick_check``. Exit status 1 when
something needs the operator, 0 when all is well.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from atrium.distribution.journal import JOURNAL_DIR, QUARANTINE_SUFFIX, UNREADABLE_SUFFIX
from atrium.distribution.records import RECORDS_DIR, RecordStore
from atrium.scopes import Scope, ScopeLayout
from atrium.settings import ConfigError, Settings


def _scope_problems(layout: ScopeLayout, scope: Scope) -> list[str]:
    root = layout.root(scope)
    problems: list[str] = []
    if not root.is_dir():
        return problems
    journals = root / JOURNAL_DIR
    for path in sorted(journals.glob(f"*{UNREADABLE_SUFFIX}")) if journals.is_dir() else []:
        problems.append(
            f"unreadable journal {path}: the scope refuses install/update/uninstall; move any "
            f"runtime data back from {layout.staging_dir(scope) / (path.stem + QUARANTINE_SUFFIX)}"
            ", then delete the journal and that folder"
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
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=False
    )
    if status.returncode != 0:
        problems.append(f"git status failed in {root}: {status.stderr.strip()}")
    elif status.stdout.strip():
        problems.append(f"uncommitted changes in {root}: {status.stdout.strip()!r}")
    return problems


def _kv_problems(path: Path) -> list[str]:
    if not path.exists():
        return []
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            rows = db.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as err:
        return [f"KV database {path} cannot be checked: {err}"]
    found = [str(row[0]) for row in rows]
    return [] if found == ["ok"] else [f"KV database {path} is damaged: {'; '.join(found)}"]


def doctor(
    home: Annotated[Path | None, typer.Option(help="data directory [env ATRIUM_HOME]")] = None,
) -> None:
    """Report what needs the operator in a home (read-only; safe while a shell runs)."""
    try:
        settings = Settings.load(home=home)
    except ConfigError as err:
        typer.echo(f"atrium doctor: {err}", err=True)
        raise typer.Exit(2) from err
    layout = ScopeLayout(settings.home, settings.system_apps, settings.user)
    problems = [p for s in (Scope.GLOBAL, Scope.USER) for p in _scope_problems(layout, s)]
    problems += _kv_problems(settings.kv_path)
    for problem in problems:
        typer.echo(problem)
    if problems:
        raise typer.Exit(1)
    typer.echo(f"{settings.home}: nothing to repair")
