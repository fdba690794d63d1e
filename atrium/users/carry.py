"""Carrying a home's old SQLite files (``users.sqlite3``: users, sessions, tokens, identities,
grants; ``audit.sqlite3``) into the state database, once, at open.

Each file is copied in one transaction, which also writes its path into ``carried_over``; only
after that commit is the file renamed aside (``<name>.carried-over``, with its ``-wal`` and
``-shm``), so a crash at any point loses nothing: before the commit the database has none of
it and the next start copies it again; after, the marker says it is done and the next start only
renames it. Rows the database already holds (the same key) are kept as they are: a database
several homes share gets each home's users once. The files are read, never changed, before the
rename; a damaged one stops the start naming it, as the stores did.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa

from atrium.settings import ConfigError
from atrium.state.schema import audit, carried_over, grants, identities, sessions, tokens, users

if TYPE_CHECKING:
    from atrium.state.database import Database

_LOGGER = logging.getLogger(__name__)
#: what a carried file is renamed to (beside it)
SUFFIX: Final = ".carried-over"

_USER_TABLES: Final = (users, sessions, tokens, identities, grants)

Rows = dict[str, list[dict[str, Any]]]


async def carry_over(db: Database, users_file: Path, audit_file: Path) -> None:
    """Copy ``users_file`` and ``audit_file`` in if they are there (see the module docstring)."""
    for path, tables in ((users_file, _USER_TABLES), (audit_file, (audit,))):
        if not path.is_file():
            continue
        name = str(path.resolve())
        async with db.connect() as conn:
            done = (
                await conn.execute(
                    sa.select(carried_over.c.name).where(carried_over.c.name == name)
                )
            ).first()
        if done is None:
            rows = await asyncio.to_thread(_read, path, tables)
            async with db.transaction() as tx:
                for table in tables:
                    found = rows.get(table.name, [])
                    if found:
                        await tx.execute(_insert_new(db.dialect, table), found)
                await tx.execute(sa.insert(carried_over).values(name=name, at=_now()))
            _LOGGER.warning(
                "%s carried into the state database: %s",
                path,
                ", ".join(f"{len(v)} {k}" for k, v in rows.items()),
            )
        await asyncio.to_thread(_set_aside, path)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _insert_new(dialect: str, table: sa.Table) -> Any:
    """An INSERT that keeps the row already there on any key conflict."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).on_conflict_do_nothing()


def _read(path: Path, tables: Sequence[sa.Table]) -> Rows:
    """Every row of ``tables`` the file has (a table or column it lacks: none, or the default)."""
    try:
        conn = sqlite3.connect(path)
    except sqlite3.Error as err:
        raise ConfigError(f"{path} cannot be carried over: {err}") from err
    try:
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)").fetchall()]
        if problems != ["ok"]:
            said = " ".join("; ".join(problems).split())  # one line, as SQLite's spans several
            raise ConfigError(f"{path} is damaged: {said}")
        found: Rows = {}
        for table in tables:
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table.name})")}
            if not have:
                continue
            have_cols = [c.name for c in table.c if c.name in have]
            order = " ORDER BY seq" if table is audit else ""
            if table is audit:
                have_cols = [c for c in have_cols if c != "seq"]
            cursor = conn.execute(f"SELECT {', '.join(have_cols)} FROM {table.name}{order}")  # noqa: S608
            found[table.name] = [
                _row(table, dict(zip(have_cols, r, strict=True))) for r in cursor.fetchall()
            ]
        return found
    except sqlite3.Error as err:
        raise ConfigError(f"{path} cannot be carried over: {err}") from err
    finally:
        conn.close()


def _row(table: sa.Table, row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if table is users:
        out["disabled"] = bool(out.get("disabled", 0))
    if table is audit:
        out.setdefault("count", 1)
    return out


def _set_aside(path: Path) -> None:
    # the main file first: once it is gone the next start has nothing to carry
    for suffix in ("", "-wal", "-shm"):
        part = path.with_name(path.name + suffix)
        if part.exists():
            part.rename(path.with_name(path.name + SUFFIX + suffix))
