"""The KV store through a real shell on PostgreSQL: an answered write is in the shared database,
readable by another connection, with its `kv:changed` row under the id the stream carried."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from atrium.kv import MOVED_OWNER
from atrium.state.database import Database
from atrium.state.migrate import upgrade_now
from atrium.state.schema import events, kv
from tests.integration.conftest import SseReader, StartShell, run_async
from tests.postgres import new_database

pytestmark = pytest.mark.integration


async def _stored(url: str) -> tuple[list[tuple[str, str, str, str]], list[tuple[int, str, str]]]:
    """The KV rows and the events, read through a Database of this test's own."""
    async with Database.open(url) as db, db.connect() as conn:
        rows = await conn.execute(
            sa.select(kv.c.owner, kv.c.namespace, kv.c.key, kv.c.value)
            .where(kv.c.owner != MOVED_OWNER)
            .order_by(kv.c.key)
        )
        logged = await conn.execute(
            sa.select(events.c.id, events.c.topic, events.c.data["key"].as_string())
            .where(events.c.topic == "kv:changed")
            .order_by(events.c.id)
        )
        return [tuple(r) for r in rows], [tuple(e) for e in logged]


def test_an_answered_write_is_in_the_shared_database_with_its_event(
    start_shell: StartShell, postgres_server: str
) -> None:
    url = new_database(postgres_server)
    upgrade_now(url)
    shell = start_shell(database_url=url)
    with shell.client() as api:
        stream = SseReader(api, {"topics": "kv:*"})
        assert api.put("/api/kv/os/a", json={"value": {"n": 1}}).status_code == 200
        assert api.put("/api/kv/os/b", json={"value": "two"}).status_code == 200
        assert api.delete("/api/kv/os/a").status_code == 200
        heard = stream.wait(3)
    rows, logged = run_async(_stored(url))
    assert rows == [(shell.settings.user, "os", "b", '"two"')]
    assert [(topic, key) for _, topic, key in logged] == [
        ("kv:changed", "a"),
        ("kv:changed", "b"),
        ("kv:changed", "a"),
    ]
    assert [int(e.id) for e in heard] == [event_id for event_id, _, _ in logged]
