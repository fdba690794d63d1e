"""The instances' rows, views and tickets of several shells (`atrium.state.instances`), on both
databases: two `InstanceRows` named as two shells share one database and one bus, as two
shells share them through the event log. The instances are plain records of the fields a row
takes (the store reads nothing else of an `Instance`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from atrium.bus import EventBus
from atrium.lifecycle.instance import Instance
from atrium.lifecycle.states import InstanceState
from atrium.state.database import Database
from atrium.state.instances import InstanceRows, digest


@dataclass
class Record:
    id: str
    slug: str
    app_id: str = "com.example.notes"
    owner: str = "alice"
    state: InstanceState = InstanceState.STARTED
    child: Any = None
    host: str | None = "10.1.2.3"
    port: int | None = 8080
    network: str | None = "cluster"
    secret: str = "s3cret"
    views: dict[str, Any] = field(default_factory=dict)


def instance(record: Record) -> Instance:
    return cast(Instance, record)


@pytest.fixture
async def shells(db: Database) -> AsyncIterator[tuple[InstanceRows, InstanceRows]]:
    async with (
        EventBus(db=db) as bus,
        InstanceRows(db, bus, "host-a:/a", "kubernetes") as a,
        InstanceRows(db, bus, "host-b:/b", "kubernetes") as b,
    ):
        yield a, b


async def test_a_ticket_is_redeemed_once_though_both_shells_try_at_once(
    shells: tuple[InstanceRows, InstanceRows], db: Database
) -> None:
    a, b = shells
    one = Record("notes-1", "aaaaaaaaaaaa")
    a.touch(instance(one))
    await a.flush()
    ticket = "a-ticket-of-twenty-four-bytes"
    await a.add_view(instance(one), "v1", "/x", "alice", ticket, 60)
    got = await asyncio.gather(a.redeem(one.slug, ticket), b.redeem(one.slug, ticket))
    assert sorted(v is None for v in got) == [False, True]
    (view,) = [v for v in got if v is not None]
    assert (view.id, view.path, view.user) == ("v1", "/x", "alice")
    # the cookie the redeemer made is the view's, and only its hash is stored
    assert view.cookie
    assert (await b.view_of(one.slug, view.cookie)) is not None
    assert (await b.view_of("bbbbbbbbbbbb", view.cookie)) is None  # another origin
    async with db.connect() as conn:
        stored = (await conn.exec_driver_sql("SELECT hash FROM views")).scalar_one()
    assert stored == digest(view.cookie)
    assert ticket not in stored


async def test_an_expired_ticket_or_one_for_another_origin_opens_nothing(
    shells: tuple[InstanceRows, InstanceRows],
) -> None:
    a, b = shells
    one = Record("notes-1", "aaaaaaaaaaaa")
    await a.add_view(instance(one), "v1", "/", "alice", "t1", -1)
    assert await b.redeem(one.slug, "t1") is None
    await a.add_view(instance(one), "v2", "/", "alice", "t2", 60)
    assert await b.redeem("cccccccccccc", "t2") is None
    assert await b.redeem(one.slug, "t2") is None  # used by the wrong origin's attempt


async def test_another_shells_row_is_read_again_after_its_event_and_own_rows_are_not_served(
    shells: tuple[InstanceRows, InstanceRows],
) -> None:
    a, b = shells
    one = Record("notes-1", "aaaaaaaaaaaa")
    a.touch(instance(one))
    await a.flush()
    row = await b.by_slug(one.slug)
    assert row is not None
    assert (row.state, row.host, row.port, row.secret) == ("started", "10.1.2.3", 8080, "s3cret")
    assert await a.by_slug(one.slug) is None  # a shell serves its own from memory
    one.state = InstanceState.PAUSED
    a.touch(instance(one))
    await a.flush()
    changed = await b.by_slug(one.slug)
    assert changed is not None
    assert changed.state == "paused"
    a.gone(instance(one))
    await a.flush()
    assert await b.by_slug(one.slug) is None


async def test_only_a_pods_row_carries_the_secret(
    shells: tuple[InstanceRows, InstanceRows],
) -> None:
    a, b = shells
    local = Record("notes-2", "dddddddddddd", network="own")
    a.touch(instance(local))
    await a.flush()
    row = await b.by_slug(local.slug)
    assert row is not None
    assert row.secret is None
    assert row.network == "own"


async def test_a_starting_shell_sweeps_its_last_runs_rows_but_not_the_adopted_nor_others(
    shells: tuple[InstanceRows, InstanceRows],
) -> None:
    a, b = shells
    kept, left = Record("notes-1", "aaaaaaaaaaaa"), Record("notes-2", "bbbbbbbbbbbb")
    theirs = Record("notes-3", "cccccccccccc")
    for record in (kept, left):
        a.touch(instance(record))
        await a.add_view(instance(record), f"v-{record.id}", "/", "a", record.id, 60)
    cookies = {}
    for record in (kept, left):
        redeemed = await b.redeem(record.slug, record.id)
        assert redeemed is not None
        assert redeemed.cookie
        cookies[record.id] = redeemed.cookie
    b.touch(instance(theirs))
    await asyncio.gather(a.flush(), b.flush())
    assert await a.sweep({kept.id}) == 1
    assert await b.by_slug(kept.slug) is not None
    assert await b.by_slug(left.slug) is None
    assert await b.view_of(left.slug, cookies[left.id]) is None
    assert await b.view_of(kept.slug, cookies[kept.id]) is not None
    assert await a.by_slug(theirs.slug) is not None


async def test_an_instance_id_another_shell_has_stays_that_shells(
    shells: tuple[InstanceRows, InstanceRows],
) -> None:
    """Two shells number an app's instances alike: the second's row is refused (logged), and
    the first's row is neither replaced nor deleted by the second."""
    a, b = shells
    first, second = Record("notes-1", "aaaaaaaaaaaa"), Record("notes-1", "bbbbbbbbbbbb")
    a.touch(instance(first))
    await a.flush()
    b.touch(instance(second))
    await b.flush()
    b.gone(instance(second))
    await b.flush()
    assert await b.by_slug(first.slug) is not None
    assert await a.by_slug(second.slug) is None


async def test_a_new_view_writes_the_row_and_tells_shells_that_found_none(
    shells: tuple[InstanceRows, InstanceRows],
) -> None:
    """A shell asked for the origin before its row was written remembers 'none'; the view's
    write (which writes the row as it is) tells it to read again."""
    a, b = shells
    one = Record("notes-1", "aaaaaaaaaaaa")
    assert await b.by_slug(one.slug) is None
    await a.add_view(instance(one), "v1", "/", "alice", "t", 60)
    assert await b.by_slug(one.slug) is not None


async def test_a_view_elsewhere_is_written_only_while_the_locked_row_says_it_serves(
    shells: tuple[InstanceRows, InstanceRows],
) -> None:
    """Another shell reads the row, then the instance stops, then that shell writes the view:
    the state is checked under the row's lock, not as it was read (a view written for a
    stopped instance kept it from its stop-when-unviewed after its next start)."""
    a, b = shells
    one = Record("notes-1", "aaaaaaaaaaaa")
    a.touch(instance(one))
    await a.flush()
    read = await b.by_id(one.id)
    assert read is not None
    assert read.state == "started"
    one.state = InstanceState.STOPPED
    a.touch(instance(one))
    await a.flush()
    assert await b.add_view_elsewhere(read, "v1", "/", "alice", "t1", 60) == "stopped"
    assert await b.view_by_id(one.slug, "v1") is None
    assert await b.redeem(one.slug, "t1") is None
    one.state = InstanceState.STARTED
    a.touch(instance(one))
    await a.flush()
    assert await b.add_view_elsewhere(read, "v2", "/", "alice", "t2", 60) == "started"
    assert await b.view_by_id(one.slug, "v2") is not None
