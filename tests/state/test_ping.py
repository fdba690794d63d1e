"""`Database.ping`, what `GET /api/ready` asks: one ``SELECT 1`` within a bound, shared by the
callers who ask at the same time, and a reason (never an exception) when the database does not
answer."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from sqlalchemy import event

from atrium.state.database import Database


async def test_callers_at_once_share_one_select(db: Database) -> None:
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(db.engine.sync_engine, "before_cursor_execute", seen)
    assert await asyncio.gather(*(db.ping(5) for _ in range(20))) == [None] * 20
    assert statements.count("SELECT 1") == 1
    assert await db.ping(5) is None  # the next caller asks again
    assert statements.count("SELECT 1") == 2


async def test_a_database_that_refuses_is_a_reason() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    async with Database.open(f"postgresql+psycopg://atrium@127.0.0.1:{port}/gone") as db:
        reason = await db.ping(5)
    assert reason is not None
    assert str(port) in reason


async def test_a_database_that_never_answers_is_given_up_on() -> None:
    with socket.socket() as silent:  # the handshake completes in the backlog; nothing is said
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        async with Database.open(f"postgresql+psycopg://atrium@127.0.0.1:{port}/mute") as db:
            assert await db.ping(0.3) == "no answer within 0.3 s"
