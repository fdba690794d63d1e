"""The scope writer locks (`atrium.state.scopelocks`) on PostgreSQL: many scopes written at once
leave the database to the shell's other work."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import text

from atrium.state.database import Database
from atrium.state.migrate import upgrade
from atrium.state.scopelocks import ScopeLocks
from tests.postgres import new_database


async def test_twenty_user_scopes_written_at_once_leave_connections_to_everything_else(
    postgres_server: str, tmp_path: Path
) -> None:
    """Each write holds a transaction for its whole length (an install takes seconds): twenty
    members installing at once must not take every connection of the pool, or every KV write,
    sign-in and event of the shell waits for one."""
    async with Database.open(new_database(postgres_server)) as db:
        await upgrade(db)
        locks = ScopeLocks(db, tmp_path, shared=True)
        release = asyncio.Event()
        inside: list[str] = []

        async def write(user: str) -> None:
            async with locks.hold(tmp_path / "users" / user, lambda: True):
                inside.append(user)
                await release.wait()

        writers = [asyncio.create_task(write(f"member{n}")) for n in range(20)]
        while not inside:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # the other writers get as far as they can meanwhile
        try:
            # a deadlock's bound, not a timing: without a free connection this waits for the
            # pool's 30 s timeout
            async with asyncio.timeout(10), db.transaction() as tx:
                assert (await tx.execute(text("SELECT 1"))).scalar_one() == 1
        finally:
            release.set()
            await asyncio.gather(*writers)
        assert sorted(inside) == sorted(f"member{n}" for n in range(20))
        async with db.connect() as conn:
            topics = (await conn.execute(text("SELECT count(*) FROM events"))).scalar_one()
        assert topics == 20  # one scope:changed each
