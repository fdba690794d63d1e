"""The bounds on anonymous audit records: which are written alone, and the counts of the rest."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from atrium.state.schema import audit
from atrium.state.versions import open_checked
from atrium.users.audit import (
    ALL_ADDRESSES,
    MAX_ANONYMOUS_ROWS,
    MAX_COUNTED,
    MAX_LIMIT,
    PER_ACTOR_REFUSED,
    PER_ADDRESS,
    WINDOW,
    AnonymousBudget,
    AuditLog,
    AuditQuery,
    AuditRecord,
    RefusedBudget,
    stamp,
)
from atrium.users.carry import carry_over

START = datetime(2026, 5, 1, tzinfo=UTC)


def refused(address: str, action: str = "token.create") -> AuditRecord:
    return AuditRecord(
        time="t", actor="anonymous", action=action, target="", status=401, address=address
    )


def test_an_address_beyond_its_share_is_counted_and_the_count_comes_out_when_the_window_ends() -> (
    None
):
    budget = AnonymousBudget()
    alone = [budget.admit(refused("192.0.2.1"), START)[0] for _ in range(PER_ADDRESS + 7)]
    assert alone == [True] * PER_ADDRESS + [False] * 7
    assert budget.admit(refused("192.0.2.2"), START)[0]  # another address has its own share
    admitted, ended = budget.admit(refused("192.0.2.1"), START + WINDOW)
    assert admitted
    assert [(r.address, r.action, r.count) for r in ended] == [("192.0.2.1", "token.create", 7)]
    assert budget.drain() == []


def test_all_addresses_together_have_a_cap_and_the_counts_a_bounded_number_of_rows() -> None:
    budget = AnonymousBudget()
    written = sum(
        budget.admit(refused(f"10.0.{n // 250}.{n % 250}"), START)[0] for n in range(1000)
    )
    assert written == ALL_ADDRESSES
    counts = budget.drain()
    assert len(counts) == MAX_COUNTED + 1
    assert sum(r.count for r in counts) == 1000 - ALL_ADDRESSES
    assert ("*", "*") in {(r.address, r.action) for r in counts}


def test_the_oldest_anonymous_rows_beyond_the_cap_are_pruned_and_no_others(
    tmp_path: Path,
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'state.sqlite3'}"

    async def fill_and_reopen() -> tuple[list[AuditRecord], tuple[int, int], int]:
        async with open_checked(url) as db:
            async with AuditLog.open(db, retention_days=90) as log:
                log.append(actor="alice", action="kv.put", target="", status=200, address="a")
                await log.search(AuditQuery())
            async with db.transaction() as tx:
                await tx.execute(
                    sa.insert(audit),
                    [
                        {
                            "time": stamp(datetime.now(UTC)),
                            "actor": "anonymous",
                            "action": "token.create",
                            "target": "",
                            "outcome": "failure",
                            "status": 401,
                            "address": str(n),
                            "count": 1,
                        }
                        for n in range(MAX_ANONYMOUS_ROWS + 5)
                    ],
                )
            async with AuditLog.open(db, retention_days=90) as log:
                found = await log.search(AuditQuery(limit=MAX_LIMIT))
            async with db.connect() as conn:
                anonymous = (
                    await conn.execute(
                        sa.text(
                            "SELECT min(CAST(address AS INTEGER)), count(*) FROM audit"
                            " WHERE actor = 'anonymous'"
                        )
                    )
                ).one()
                users = (
                    await conn.execute(sa.text("SELECT count(*) FROM audit WHERE actor = 'alice'"))
                ).scalar_one()
        return found, (anonymous[0], anonymous[1]), users

    found, anonymous, users = asyncio.run(fill_and_reopen())
    assert anonymous == (5, MAX_ANONYMOUS_ROWS)  # the five oldest went
    assert users == 1
    assert found[0].address == str(MAX_ANONYMOUS_ROWS + 4)


def test_an_audit_file_from_before_counts_is_carried_over_with_each_record_one_call(
    tmp_path: Path,
) -> None:
    """An older home's audit.sqlite3 (here one from before records had a count) goes into the
    state database at the first open, in its order, and is renamed aside: a second open finds
    nothing to carry and the records once."""
    path = tmp_path / "audit.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, time TEXT NOT NULL,"
            " actor TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL,"
            " outcome TEXT NOT NULL, status INTEGER NOT NULL, error TEXT, address TEXT NOT NULL)"
        )
        conn.executemany(
            "INSERT INTO audit (time, actor, action, target, outcome, status, address)"
            " VALUES (?, 'alice', 'put_value', ?, 'success', 200, 'a')",
            [(stamp(datetime.now(UTC)), "key=k"), (stamp(datetime.now(UTC)), "key=l")],
        )
    url = f"sqlite+aiosqlite:///{tmp_path / 'state.sqlite3'}"

    async def read() -> list[AuditRecord]:
        async with open_checked(url) as db:
            for _ in range(2):
                await carry_over(db, tmp_path / "users.sqlite3", path)
            async with AuditLog.open(db, retention_days=90) as log:
                return await log.search(AuditQuery())

    first, second = asyncio.run(read())
    assert (second.actor, second.target, second.count) == ("alice", "key=k", 1)
    assert first.target == "key=l"
    assert first.seq > second.seq
    assert not path.exists()
    assert (tmp_path / "audit.sqlite3.carried-over").is_file()


def members(actor: str, action: str = "kv.global.put") -> AuditRecord:
    return AuditRecord(
        time="t", actor=actor, action=action, target="key=x", status=403, address="192.0.2.1"
    )


def test_a_users_refused_calls_beyond_their_share_are_counted_under_their_name() -> None:
    budget = RefusedBudget()
    alone = [budget.admit(members("bob"), START)[0] for _ in range(PER_ACTOR_REFUSED + 5)]
    assert alone == [True] * PER_ACTOR_REFUSED + [False] * 5
    assert budget.admit(members("carol"), START)[0]  # another user has their own share
    for n in range(MAX_COUNTED + 3):
        budget.admit(members("bob", f"a.n{n}"), START)
    counted = {(r.actor, r.action): r.count for r in budget.drain()}
    assert counted[("bob", "kv.global.put")] == 5
    assert counted[("bob", "*")] == 4  # beyond MAX_COUNTED actions: one row for the rest
    assert {actor for actor, _ in counted} == {"bob"}
    assert sum(counted.values()) == 5 + MAX_COUNTED + 3
    # a new window: a share again
    assert budget.admit(members("bob"), START + WINDOW)[0]
