"""Which shells have an event stream of a host page open (``client_streams``; PostgreSQL only):
what `atrium.lifecycle.presence` asks before it releases a host page's views, since with no
stickiness the page's stream and its views may each be on any shell.

A shell writes its row of a page when its first stream of the page opens (``since`` None) and
when its last one there ends (``since``: the database's clock then, so that shells whose clocks
differ agree on how long ago). A page is gone when no living shell has a stream of it and the
last one anywhere ended a grace ago; a shell found dead (its lock free, `Coordination`) counts
as having lost its streams when that is seen.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

from atrium.state.schema import client_streams

if TYPE_CHECKING:
    from atrium.state.database import Database
    from atrium.state.locks import Coordination

_EPOCH = sa.func.extract("epoch", sa.func.now())


class ClientStreams:
    """This shell's rows of ``client_streams``, and the others' read."""

    def __init__(self, db: Database, coordination: Coordination, shell: str) -> None:
        self._db = db
        self._coordination = coordination
        self.shell = shell

    async def write(self, client: str, *, streaming: bool) -> None:
        """This shell has a stream of ``client`` now, or its last one here just ended."""
        since = sa.null() if streaming else _EPOCH
        async with self._db.transaction() as tx:
            await tx.execute(
                insert(client_streams)
                .values(client=client, shell=self.shell, since=since)
                .on_conflict_do_update(
                    index_elements=[client_streams.c.client, client_streams.c.shell],
                    set_={"since": since},
                )
            )

    async def sweep(self) -> None:
        """At start: this shell's earlier run's streams ended with it, at the latest now. Its
        rows stay (ended now, or when they said): deleted, a page whose last stream was on the
        earlier run and that was not counted gone before this start (a restart within the
        grace, or a grace under way at a stop) was never counted gone, and its views were
        held for as long as their instances ran."""
        async with self._db.transaction() as tx:
            await tx.execute(
                sa.update(client_streams)
                .where((client_streams.c.shell == self.shell) & client_streams.c.since.is_(None))
                .values(since=_EPOCH)
            )

    async def _maybe_gone(self) -> list[str]:
        """The pages no living shell streams, as a read without locks says: those `gone` then
        decides on under their rows' locks."""
        async with self._db.connect() as conn:
            rows = (
                await conn.execute(
                    sa.select(client_streams.c.client, client_streams.c.shell).where(
                        client_streams.c.since.is_(None)
                    )
                )
            ).all()
            every = set((await conn.execute(sa.select(client_streams.c.client))).scalars())
        others = {row.shell for row in rows} - {self.shell}
        alive = await self._coordination.shells_alive(others) | {self.shell}
        streamed = {row.client for row in rows if row.shell in alive}
        return sorted(every - streamed)

    async def gone(self, grace: float, client: str | None = None) -> list[str]:
        """The host pages (``client`` only, when given) no living shell has had a stream of for
        ``grace`` s, their rows deleted in the same transaction (another shell that asks next
        finds none: one release). With ``client``, asked by this shell once its own grace of
        the page is over, this shell's row counts as ended a grace ago (it is written a moment
        after the stream's end that began that grace). Rows naming a dead shell as streaming
        are counted as ended now. Without ``client`` (the leader's look) only the pages that
        may be gone are locked: every open page's row, locked at each look, was written each
        time."""
        where: sa.ColumnElement[bool]
        if client is None:
            candidates = await self._maybe_gone()
            if not candidates:
                return []
            where = client_streams.c.client.in_(candidates)
        else:
            where = client_streams.c.client == client
        async with self._db.transaction() as tx:
            rows = (
                await tx.execute(
                    sa.select(
                        client_streams.c.client,
                        client_streams.c.shell,
                        client_streams.c.since,
                        _EPOCH.label("now"),
                    )
                    .where(where)
                    .with_for_update()
                )
            ).all()
            if not rows:
                return []
            now = float(rows[0].now)
            streaming = {row.shell for row in rows if row.since is None}
            alive = await self._coordination.shells_alive(streaming - {self.shell})
            if self.shell in streaming:
                alive.add(self.shell)
            dead = streaming - alive
            if dead:
                await tx.execute(
                    sa.update(client_streams)
                    .where(
                        where & client_streams.c.shell.in_(dead) & client_streams.c.since.is_(None)
                    )
                    .values(since=_EPOCH)
                )
            by_client: dict[str, list[float | None]] = defaultdict(list)
            for row in rows:
                if client is not None and row.shell == self.shell:
                    end = None if row.since is None else now - grace
                else:
                    end = now if row.since is None and row.shell in dead else row.since
                by_client[row.client].append(end)
            found = [
                name
                for name, ends in by_client.items()
                if all(end is not None and end <= now - grace for end in ends)
            ]
            if found:
                await tx.execute(
                    sa.delete(client_streams).where(client_streams.c.client.in_(found))
                )
        return found
