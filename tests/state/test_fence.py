"""The write fence (`atrium.state.fence`): a request that arrived before the shell last lost its
database link writes nothing; what it started, and later requests, write as before. The failover
of a real shell whose link is cut is tests/integration/test_failover.py."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from atrium.errors import DatabaseLost
from atrium.state import fence
from atrium.state.database import Database


async def write(db: Database) -> None:
    async with db.transaction() as tx:
        await tx.execute(text("UPDATE event_counter SET value = value"))


async def test_a_request_from_before_the_loss_writes_nothing(db: Database) -> None:
    async def request() -> None:
        fence.request_began()
        await write(db)  # no loss yet
        started = asyncio.create_task(write(db))  # a task the request starts
        db.link_lost()
        with pytest.raises(DatabaseLost, match="arrived before the link broke"):
            await write(db)
        await started
        await asyncio.create_task(write(db))  # not the request's own task: not fenced

    async def later_request() -> None:
        fence.request_began()
        await write(db)

    await asyncio.create_task(request())
    await asyncio.create_task(later_request())
    await write(db)  # no request at all
