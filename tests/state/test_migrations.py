"""Migrations upgrade and downgrade both databases; a shell refuses a schema newer than it knows."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from atrium.settings import ConfigError
from atrium.state import migrate, versions
from atrium.state.database import Database, parse_url

TABLES = {"event_counter", "events", "kv", "users", "sessions", "tokens", "identities"}
TABLES |= {"grants", "audit", "carried_over", "egress_revokes"}
TABLES |= {"instances", "views", "view_tickets"}
TABLES |= {"sign_in_failures", "bootstrap_tokens", "instance_requests", "app_tokens"}
TABLES |= {"state_key", "client_streams", "app_operations"}


async def tables(db: Database) -> set[str]:
    async with db.connect() as conn:
        names = await conn.run_sync(lambda c: set(sa.inspect(c).get_table_names()))
    return names - {"alembic_version"}


async def test_upgrade_from_empty_then_downgrade_and_again(database_url: str) -> None:
    async with Database.open(database_url) as db:
        assert await migrate.current(db) == versions.EMPTY
        assert await migrate.upgrade(db) == (versions.EMPTY, migrate.head())
        assert await tables(db) == TABLES
        assert await migrate.upgrade(db) == (migrate.head(), migrate.head())  # nothing to do
        assert await migrate.downgrade(db, "base") == (migrate.head(), versions.EMPTY)
        assert await tables(db) == set()
        await migrate.upgrade(db)
        assert await tables(db) == TABLES


async def test_the_schema_the_migrations_make_is_the_one_the_code_describes(db: Database) -> None:
    """What `alembic check` says: no difference between the migrations and schema.py."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from atrium.state.schema import metadata

    def diff(conn: sa.Connection) -> list[object]:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))

    async with db.connect() as conn:
        assert await conn.run_sync(diff) == []


async def test_a_newer_schema_is_refused_naming_both_versions(db: Database) -> None:
    async with db.transaction() as tx:
        await tx.execute(sa.text("UPDATE alembic_version SET version_num = '0999'"))
    with pytest.raises(versions.SchemaTooNew) as refused:
        await migrate.check(db)
    message = str(refused.value)
    assert f"schema version 0999, newer than this shell knows (up to {versions.HEAD})" in message
    assert isinstance(refused.value, ConfigError)
    # upgrading does not touch it either
    with pytest.raises(versions.SchemaTooNew):
        await migrate.upgrade(db)
    assert await migrate.current(db) == "0999"


async def test_an_older_schema_names_the_command_that_upgrades_it(database_url: str) -> None:
    async with Database.open(database_url) as db:
        with pytest.raises(
            versions.SchemaBehind,
            match=r"version none, older than this shell's "
            rf"{versions.HEAD}: run `atrium db upgrade`",
        ):
            await migrate.check(db)
        await migrate.upgrade(db)
        assert await migrate.check(db) == versions.HEAD


def test_database_urls_refused_name_what_is_accepted() -> None:
    with pytest.raises(ConfigError, match="driver 'mysql' is not supported"):
        parse_url("mysql://root:hunter2@db/atrium")
    with pytest.raises(ConfigError) as refused:
        parse_url("postgresql+asyncpg://atrium:hunter2@db/atrium")
    assert "hunter2" not in str(refused.value)
    with pytest.raises(ConfigError, match="names its file"):
        parse_url("sqlite+aiosqlite://")


def test_the_versions_a_shell_knows_are_the_migrations_in_order() -> None:
    """A shell checks its schema without Alembic, against `versions.KNOWN`: a migration added
    without its version there would leave every shell refusing (or upgrading past) it."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.config())
    ordered = [rev.revision for rev in reversed(list(script.walk_revisions()))]
    assert tuple(ordered) == versions.KNOWN
    assert migrate.head() == versions.HEAD
