"""Alembic migrations run in-process (its CLI costs seconds of imports per call), and the check a
shell makes at start: a database whose schema is newer than this shell knows is refused, naming
both versions; one that is behind is named with the command that brings it up to date.

The revision ids are the schema versions people read: ``0001``, ``0002``…
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from atrium.state.database import Database
from atrium.state.versions import EMPTY, SchemaTooNew, check_version, unusable

MIGRATIONS: Final = Path(__file__).resolve().parent / "migrations"


def config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head() -> str:
    """The newest schema version this shell knows."""
    found = ScriptDirectory.from_config(config()).get_current_head()
    assert found is not None, "the migrations folder has one head"  # noqa: S101
    return found


async def current(db: Database) -> str:
    """The database's schema version, or `EMPTY`."""
    async with db.connect() as conn:
        return await conn.run_sync(_current)


def _current(conn: Connection) -> str:
    heads = MigrationContext.configure(conn).get_current_heads()
    return heads[0] if heads else EMPTY


async def check(db: Database) -> str:
    """The database's schema version when it is this shell's; else SchemaTooNew or SchemaBehind
    (what a shell calls at start, through `atrium.state.versions.open_checked`)."""
    found = await current(db)
    check_version(db.name, found)
    return found


def _known(revision: str) -> bool:
    if revision == EMPTY:
        return True
    try:
        return ScriptDirectory.from_config(config()).get_revision(revision) is not None
    except CommandError:
        return False


async def upgrade(db: Database, revision: str = "head") -> tuple[str, str]:
    """Migrate to ``revision`` in one transaction (PostgreSQL and SQLite both have transactional
    DDL); returns the versions before and after. A newer schema is refused, not touched."""
    before = await current(db)
    if not _known(before):
        raise SchemaTooNew(db.name, before, head())
    await _run(db, command.upgrade, revision)
    return before, await current(db)


async def downgrade(db: Database, revision: str) -> tuple[str, str]:
    """Migrate down to ``revision`` (``base``: no tables); returns the versions before and after."""
    before = await current(db)
    await _run(db, command.downgrade, revision)
    return before, await current(db)


async def _run(db: Database, step: object, revision: str) -> None:
    def run(conn: Connection) -> None:
        cfg = config()
        cfg.attributes["connection"] = conn
        step(cfg, revision)  # type: ignore[operator]

    async with db.transaction() as conn:
        await conn.run_sync(run)


def upgrade_now(url: str) -> tuple[str, str, str]:
    """`upgrade` the database at ``url`` from a command (no loop running): its printable name and
    the versions before and after. A database that cannot be reached is a ConfigError naming it."""

    async def run() -> tuple[str, str, str]:
        async with Database.open(url) as db:
            try:
                before, after = await upgrade(db)
            except DBAPIError as err:
                raise unusable(db, err) from err
            return db.name, before, after

    return asyncio.run(run())


def status_now(url: str) -> tuple[str, str, str]:
    """The database's printable name, its schema version and this shell's."""

    async def run() -> tuple[str, str, str]:
        async with Database.open(url) as db:
            try:
                return db.name, await current(db), head()
            except DBAPIError as err:
                raise unusable(db, err) from err

    return asyncio.run(run())
