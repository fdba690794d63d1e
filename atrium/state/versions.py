"""The schema versions this shell knows, and the check a shell makes at start, without Alembic.

Importing Alembic costs most of a second; a shell start only needs to read one row
(``alembic_version``) and compare it with `KNOWN`. Alembic is imported only to upgrade.
`KNOWN` lists the migrations in ``migrations/versions`` oldest first (a test holds the two to
each other); a new migration appends its revision here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from atrium.settings import ConfigError
from atrium.state.database import Database

#: every schema version this shell knows, oldest first
KNOWN: Final = (
    "0001",
    "0002",
    "0003",
    "0004",
    "0005",
    "0006",
    "0007",
    "0008",
    "0009",
    "0010",
    "0011",
)
HEAD: Final = KNOWN[-1]
#: how a database with no schema yet is named
EMPTY: Final = "none"


class SchemaTooNew(ConfigError):
    """The database was migrated by a newer shell: this one would misread or damage it."""

    def __init__(self, database: str, found: str, known: str) -> None:
        super().__init__(
            f"the database {database} has schema version {found}, newer than this shell knows "
            f"(up to {known}): run a shell of the version that migrated it, or a newer one"
        )
        self.found = found
        self.known = known


class SchemaBehind(ConfigError):
    """The database's schema is older than this shell's: it is migrated only when asked to."""

    def __init__(self, database: str, found: str, known: str) -> None:
        super().__init__(
            f"the database {database} has schema version {found}, older than this shell's "
            f"{known}: run `atrium db upgrade` (or `atrium serve --migrate`) first"
        )
        self.found = found
        self.known = known


async def current(db: Database) -> str:
    """The database's schema version, or `EMPTY` (no ``alembic_version`` table, or no row)."""
    async with db.connect() as conn:
        has_table = await conn.run_sync(lambda c: sa.inspect(c).has_table("alembic_version"))
        if not has_table:
            return EMPTY
        found = (await conn.execute(sa.text("SELECT version_num FROM alembic_version"))).first()
    return EMPTY if found is None else str(found[0])


def check_version(database: str, found: str) -> None:
    """Nothing when ``found`` is this shell's version; else SchemaTooNew or SchemaBehind."""
    if found == HEAD:
        return
    if found != EMPTY and found not in KNOWN:
        raise SchemaTooNew(database, found, HEAD)
    raise SchemaBehind(database, found, HEAD)


def unusable(db: Database, err: DBAPIError) -> ConfigError:
    """The driver's own words on one line (libpq adds a hint line), the URL without its password."""
    return ConfigError(f"the database {db.name} cannot be used: {' '.join(str(err.orig).split())}")


@asynccontextmanager
async def open_checked(url: str) -> AsyncIterator[Database]:
    """The database a shell runs on, its schema checked (what `open_shell` does first).

    The embedded SQLite file is this shell's alone: one behind (or new) is upgraded here, so a
    machine that pulls a newer Atrium needs no extra step. A PostgreSQL database is shared by
    several shells and upgraded only when asked (`atrium db upgrade`, `atrium serve --migrate`):
    one behind is SchemaBehind, naming the command. A newer schema is refused on both, untouched.
    A database that cannot be reached is a ConfigError naming it (its password hidden).
    """
    async with Database.open(url) as db:
        try:
            found = await current(db)
            if found != HEAD and found in (EMPTY, *KNOWN) and db.dialect == "sqlite":
                from atrium.state.migrate import upgrade

                await upgrade(db)
                found = HEAD
            check_version(db.name, found)
        except DBAPIError as err:
            raise unusable(db, err) from err
        yield db
