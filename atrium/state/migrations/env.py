"""Alembic's environment: run on the connection `atrium.state.migrate` hands over (in-process), or
(the ``alembic`` command, for writing a revision against PostgreSQL) on one of ``sqlalchemy.url``."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from atrium.state.schema import metadata


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite alters a table by copying it
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_own() -> None:
    engine = create_async_engine(context.config.get_main_option("sqlalchemy.url") or "")
    async with engine.begin() as conn:
        await conn.run_sync(run_on)
    await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported")
given = context.config.attributes.get("connection")
if given is not None:
    run_on(given)
else:
    asyncio.run(run_own())
