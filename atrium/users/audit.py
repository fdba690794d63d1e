"""The audit log: the append-only ``audit`` table of the state database (a trigger refuses
UPDATE on both databases).

Every state-changing API call and every sign-in attempt becomes one `AuditRecord`. Appending never
waits for the database: `AuditLog.append` queues the record in memory and one writer task writes
whatever is queued in one transaction (a killed process loses only what was still queued, at most
the last moments). A query first writes every record queued before it, so a caller reads its own
writes; on several shells of one database each writes its own records, and every shell's query
sees all of them (ids are the table's, in insert order).

Nothing changes or deletes a record except `prune`, which drops records older than the retention
(`ATRIUM_AUDIT_RETENTION_DAYS`) and the oldest anonymous records beyond `MAX_ANONYMOUS_ROWS`, at
open and once a day; of several shells on one database, only the leader (`AuditLog.open`).

Anonymous records (no credentials, or refused ones) are bounded, since anyone who can reach the
shell can make them: within one `WINDOW`, an address gets `PER_ADDRESS` records of its own and all
addresses together `ALL_ADDRESSES`; every further anonymous call is only counted, and the counts
are written as one record per address and action with its ``count`` (`AnonymousBudget`).

A signed-in user's or an app's refused calls are bounded the same way, per actor (`RefusedBudget`):
nothing else limits how fast a member or an app may be refused, so a loop grew the file a row a
call. Beyond `PER_ACTOR_REFUSED` a window, their refused calls are counted into one record per
actor and action, still under their name. A call that succeeded always has a record of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from atrium.state.schema import audit

if TYPE_CHECKING:
    from atrium.state.database import Database
    from atrium.state.locks import Coordination

_LOGGER = logging.getLogger(__name__)
PRUNE_EVERY: Final = timedelta(days=1)
MAX_LIMIT: Final = 1000
DEFAULT_LIMIT: Final = 100
#: a field longer than this is cut (a path segment an attacker chose, an unknown user name)
MAX_FIELD: Final = 200
#: the bounds on anonymous records (see the module's docstring)
WINDOW: Final = timedelta(minutes=10)
PER_ADDRESS: Final = 20
ALL_ADDRESSES: Final = 100
#: addresses counted one by one in a window; the rest are counted together under ``*``
MAX_COUNTED: Final = 50
MAX_ANONYMOUS_ROWS: Final = 100_000
#: refused calls of one signed-in user or app written one by one in a window (`RefusedBudget`)
PER_ACTOR_REFUSED: Final = 100

ANONYMOUS: Final = "anonymous"


def stamp(when: datetime) -> str:
    """How a time is stored: UTC, milliseconds, ``Z`` (sorts as text)."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def app_actor(app_id: str, instance_id: str) -> str:
    return f"app:{app_id}/{instance_id}"


def _cut(value: str) -> str:
    cleaned = "".join(ch if ch.isprintable() else "?" for ch in value)
    return cleaned[:MAX_FIELD]


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audited request. ``actor`` is a user id, ``app:<appId>/<instanceId>`` or ``anonymous``;
    ``outcome`` is ``success`` (2xx/3xx) or ``failure``, with the HTTP ``status`` and error code."""

    time: str
    actor: str
    action: str
    target: str
    status: int
    address: str
    error: str | None = None
    seq: int = 0
    #: how many calls this record stands for: more than 1 for anonymous calls counted together
    count: int = 1

    @property
    def outcome(self) -> str:
        return "success" if self.status < 400 else "failure"

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.seq,
            "time": self.time,
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "outcome": self.outcome,
            "status": self.status,
            "error": self.error,
            "address": self.address,
            "count": self.count,
        }


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """The filters of `GET /api/audit`, already checked."""

    since: str | None = None
    actor: str | None = None
    action: str | None = None
    limit: int = DEFAULT_LIMIT


class AnonymousBudget:
    """Which anonymous records are written one by one, and the counts of the others (pure).

    Windows are `WINDOW` long and start at the first anonymous call after the last one ended. In a
    window an address has `PER_ADDRESS` records of its own and all addresses `ALL_ADDRESSES`; a call
    beyond that adds one to the count of its (address, action), of which `MAX_COUNTED` are kept
    apart and the rest counted together as address ``*``, action ``*``. The counts are handed out
    when the window ends and whenever someone reads the log (`drain`), so an attack in progress is
    visible at once: at most ``ALL_ADDRESSES + MAX_COUNTED + 1`` rows a window, however many calls.
    """

    def __init__(self) -> None:
        self._start: datetime | None = None
        self._own: dict[str, int] = {}
        self._total = 0
        self._counted: dict[tuple[str, str], AuditRecord] = {}

    def admit(self, record: AuditRecord, when: datetime) -> tuple[bool, list[AuditRecord]]:
        """Whether ``record`` is written on its own, and the counts of a window that has ended."""
        ended: list[AuditRecord] = []
        if self._start is None or not self._start <= when < self._start + WINDOW:
            ended = self.drain()
            self._start, self._own, self._total = when, {}, 0
        own = self._own.get(record.address, 0)
        if own < PER_ADDRESS and self._total < ALL_ADDRESSES:
            self._own[record.address] = own + 1
            self._total += 1
            return True, ended
        key = (record.address, record.action)
        if key not in self._counted and len(self._counted) >= MAX_COUNTED:
            key = ("*", "*")
        before = self._counted.get(key)
        self._counted[key] = replace(
            record,
            address=key[0],
            action=key[1],
            target="",
            count=(before.count if before else 0) + 1,
        )
        return False, ended

    def drain(self) -> list[AuditRecord]:
        """The counts so far (each the last call's time, status and error); counting restarts."""
        counted = list(self._counted.values())
        self._counted = {}
        return counted


class RefusedBudget:
    """Which refused calls of signed-in users and apps are written one by one (pure).

    Windows as `AnonymousBudget`'s. In a window each actor has `PER_ACTOR_REFUSED` records of
    refused calls of their own; a refused call beyond that adds one to the count of its (actor,
    action), `MAX_COUNTED` actions an actor, the rest under action ``*``. The actor is always
    kept: a member or an app stays accountable for every call, counted or not. At most
    ``PER_ACTOR_REFUSED + MAX_COUNTED + 1`` rows an actor a window, however many calls.
    """

    def __init__(self) -> None:
        self._start: datetime | None = None
        self._own: dict[str, int] = {}
        self._counted: dict[tuple[str, str], AuditRecord] = {}
        self._actions: dict[str, int] = {}

    def admit(self, record: AuditRecord, when: datetime) -> tuple[bool, list[AuditRecord]]:
        """Whether ``record`` (a refused call) is written on its own, and the counts of a window
        that has ended."""
        ended: list[AuditRecord] = []
        if self._start is None or not self._start <= when < self._start + WINDOW:
            ended = self.drain()
            self._start, self._own = when, {}
        own = self._own.get(record.actor, 0)
        if own < PER_ACTOR_REFUSED:
            self._own[record.actor] = own + 1
            return True, ended
        key = (record.actor, record.action)
        if key not in self._counted:
            if self._actions.get(record.actor, 0) >= MAX_COUNTED:
                key = (record.actor, "*")
            if key not in self._counted:
                self._actions[record.actor] = self._actions.get(record.actor, 0) + 1
        before = self._counted.get(key)
        self._counted[key] = replace(
            record, action=key[1], target="", count=(before.count if before else 0) + 1
        )
        return False, ended

    def drain(self) -> list[AuditRecord]:
        """The counts so far (each the last call's time, status, error and address)."""
        counted = list(self._counted.values())
        self._counted, self._actions = {}, {}
        return counted


class AuditLog:
    """The append-only audit table and its one writer task."""

    def __init__(self, db: Database, retention: timedelta) -> None:
        self._db = db
        self._retention = retention
        self._queue: list[AuditRecord] = []
        self._writing = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._budget = AnonymousBudget()
        self._refused = RefusedBudget()
        #: set once the final flush has begun: a request answered after that (one finishing
        #: while the shell stops) cannot reach the table, and must not fail for it
        self._closed = False
        #: whether this shell prunes (the leader of several shells; see `open`)
        self._leads: Callable[[], bool] = lambda: True
        self._pruning: set[asyncio.Task[None]] = set()

    @classmethod
    @asynccontextmanager
    async def open(
        cls, db: Database, *, retention_days: int, coordination: Coordination | None = None
    ) -> AsyncIterator[AuditLog]:
        """The log, pruned now and once a day. With ``coordination`` (several shells on one
        database) only the leader prunes: at its start if it leads then, each day while it
        leads, and at once when it takes the lead from a shell that is gone (whose daily
        prune went with it). Pruning is idempotent, so a prune of the old leader still running
        when the new one begins costs a wait on the rows' locks, nothing more."""
        log = cls(db, timedelta(days=retention_days))
        log._leads = (lambda: True) if coordination is None else (lambda: coordination.is_leader)
        pruner: asyncio.Task[None] | None = None
        try:
            if log._leads():
                await log.prune()
            pruner = asyncio.create_task(log._prune_daily(), name="audit prune")
            if coordination is not None:
                coordination.on_lead(log._lead_taken)
            yield log
        finally:
            log._leads = lambda: False  # a lead taken from now on prunes nothing here
            for task in (pruner, *log._pruning):
                if task is None:
                    continue
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            log._closed = True
            log._queue.extend(log._budget.drain() + log._refused.drain())
            try:
                await log._flush()
            except SQLAlchemyError as err:
                _LOGGER.error("the audit log could not be written at close: %s", err)

    # ---- writing -------------------------------------------------------------------------

    def append(
        self,
        *,
        actor: str,
        action: str,
        target: str,
        status: int,
        address: str,
        error: str | None = None,
        when: datetime | None = None,
    ) -> None:
        """Queue one record; it reaches the table in the writer task's next transaction. Never
        blocks and never raises into the request it records (a failed write is logged). An
        anonymous record, or a user's or an app's refused call, may only be counted
        (`AnonymousBudget`, `RefusedBudget`)."""
        now = when or datetime.now(UTC)
        record = AuditRecord(
            time=stamp(now),
            actor=_cut(actor),
            action=_cut(action),
            target=_cut(target),
            status=status,
            address=_cut(address),
            error=error,
        )
        if self._closed:
            # the writer is gone (the shell is stopping): the record goes to the shell's log
            _LOGGER.warning("audit record after the audit log closed: %s", record)
            return
        budget = (
            self._budget if record.actor == ANONYMOUS else self._refused if status >= 400 else None
        )
        if budget is not None:
            alone, ended = budget.admit(record, now)
            self._queue.extend(ended)
            if not alone:
                if ended:
                    self._schedule()
                return
        self._queue.append(record)
        self._schedule()

    def _schedule(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush_logged(), name="audit write"
            )

    async def _flush_logged(self) -> None:
        try:
            await self._flush()
        except SQLAlchemyError as err:
            _LOGGER.error("the audit log could not be written: %s", err)

    async def _flush(self) -> None:
        """Write what is queued, in one transaction; one writer at a time, in queue order."""
        async with self._writing:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    async with self._db.transaction() as tx:
                        await tx.execute(sa.insert(audit), [_row(r) for r in batch])
                except BaseException:
                    self._queue[:0] = batch  # kept for the next attempt, in order
                    raise

    # ---- reading -------------------------------------------------------------------------

    async def search(self, query: AuditQuery) -> list[AuditRecord]:
        """Newest first; written records and every one queued before this call, with the
        anonymous calls counted so far."""
        self._queue.extend(self._budget.drain() + self._refused.drain())
        await self._flush()
        select = sa.select(audit).order_by(audit.c.seq.desc()).limit(query.limit)
        if query.since is not None:
            select = select.where(audit.c.time >= query.since)
        if query.actor is not None:
            select = select.where(audit.c.actor == query.actor)
        if query.action is not None:
            select = select.where(audit.c.action == query.action)
        async with self._db.connect() as conn:
            rows = (await conn.execute(select)).all()
        return [
            AuditRecord(
                seq=r.seq,
                time=r.time,
                actor=r.actor,
                action=r.action,
                target=r.target,
                status=r.status,
                error=r.error,
                address=r.address,
                count=r._mapping["count"],  # ``Row.count`` is the tuple's method
            )
            for r in rows
        ]

    # ---- retention -----------------------------------------------------------------------

    async def prune(self, now: datetime | None = None) -> int:
        """Drop the records older than the retention, and the oldest anonymous records beyond
        `MAX_ANONYMOUS_ROWS`; the only removal there is (idempotent: of several shells on one
        database the leader runs it, and two at once only wait for each other's row locks)."""
        cutoff = stamp((now or datetime.now(UTC)) - self._retention)
        await self._flush()
        async with self._db.transaction() as tx:
            old = (await tx.execute(sa.delete(audit).where(audit.c.time < cutoff))).rowcount
            if old:
                _LOGGER.info("audit log: %d records older than %s pruned", old, cutoff)
            # the newest anonymous record beyond the cap: it and every older one go
            edge = (
                await tx.execute(
                    sa.select(audit.c.seq)
                    .where(audit.c.actor == ANONYMOUS)
                    .order_by(audit.c.seq.desc())
                    .offset(MAX_ANONYMOUS_ROWS)
                    .limit(1)
                )
            ).scalar()
            extra = 0
            if edge is not None:
                extra = (
                    await tx.execute(
                        sa.delete(audit).where(audit.c.actor == ANONYMOUS, audit.c.seq <= edge)
                    )
                ).rowcount
                _LOGGER.info("audit log: the %d oldest anonymous records pruned", extra)
        return int(old) + int(extra)

    async def _prune_daily(self) -> None:
        while True:
            await asyncio.sleep(PRUNE_EVERY.total_seconds())
            if self._leads():
                await self._prune_logged()

    async def _prune_logged(self) -> None:
        try:
            await self.prune()
        except SQLAlchemyError as err:
            _LOGGER.error("the audit log could not be pruned: %s", err)

    def _lead_taken(self) -> None:
        if not self._leads():
            return
        task = asyncio.create_task(self._prune_logged(), name="audit prune (new leader)")
        self._pruning.add(task)
        task.add_done_callback(self._pruning.discard)


def _row(record: AuditRecord) -> dict[str, Any]:
    return {
        "time": record.time,
        "actor": record.actor,
        "action": record.action,
        "target": record.target,
        "outcome": record.outcome,
        "status": record.status,
        "error": record.error,
        "address": record.address,
        "count": record.count,
    }
