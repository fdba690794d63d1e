"""App tokens in the database, so that a pod's calls are its app's on every shell (with a
PostgreSQL database only: one SQLite shell keeps them in memory, `atrium.identity.AppTokens`).

- A row per token (``app_tokens``): its sha256, never the token, with the instance, app, owner
  and the shell that holds the instance. `issue` writes it before the server gets the token
  (`stored`), so a token absent from the table was never handed out, or is revoked.
- `revoke` (the instance's server ended: destroyed, crashed) deletes it; `forget` (a pod left
  running for the next shell, or taken over by another) leaves it; `register` (a pod adopted or
  taken over, holding the token in its Secret) writes it again naming this shell. Deletes and
  `register`'s writes append `instance:token` in their transaction: every shell forgets what it
  remembered of the instance's token. Writes run in the order they were made, one at a time,
  each tried again every second while the database does not take it.
- `find`: this shell's own tokens in memory (the hot path reads no row), then what it remembers
  of other shells' (until the instance's `instance:token`), then one read. A token the table
  does not hold is remembered as unknown for `UNKNOWN_SECONDS` (`UNKNOWN_KEPT` of them, oldest
  dropped): a forged token repeated costs no read, and a token written again (`register`, whose
  event also forgets every unknown one) is not refused for long. Only a token of the form
  `new_token` makes is read at all.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Self

import sqlalchemy as sa

from atrium.events import InstanceToken
from atrium.identity import AppCaller, AppTokens, token_hash
from atrium.state.events import StoredEvent, append
from atrium.state.schema import app_tokens, instances

if TYPE_CHECKING:
    from types import TracebackType

    from sqlalchemy.ext.asyncio import AsyncConnection

    from atrium.bus import Event, EventBus
    from atrium.state.database import Database

_LOGGER = logging.getLogger(__name__)
#: the form of every token `atrium.identity.new_token` makes: anything else is never read
_FORM: Final = re.compile(r"[A-Za-z0-9_-]{43}")
#: other shells' tokens remembered (the oldest dropped beyond)
KEPT: Final = 4096
#: tokens the table does not hold, remembered (the oldest dropped beyond), and for how long
UNKNOWN_KEPT: Final = 10_000
UNKNOWN_SECONDS: Final = 30.0
#: seconds between tries of a write the database did not take
RETRY_SECONDS: Final = 1.0
#: seconds a spawn waits for its token's row, and a closing shell for its last writes
STORE_WAIT: Final = 10.0
CLOSE_WAIT: Final = 5.0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class _Write:
    """One change of the table: the token's row written (``caller``, announced when
    ``announce``) or deleted (``caller`` None, always announced)."""

    hashed: str
    instance_id: str
    app_id: str
    owner: str
    caller: AppCaller | None
    announce: bool
    #: told when done (a spawn waits for its token's row); None: tried until it is done
    done: asyncio.Future[None] | None = field(default=None)
    #: a delete of every row of the instance, whichever its hash (`revoke_rows`)
    every: bool = False
    #: tried before and refused (the link to the database lost)
    retried: bool = False


class SharedAppTokens(AppTokens):
    """`AppTokens` whose tokens are valid on every shell of the database."""

    def __init__(self, db: Database, bus: EventBus, shell: str) -> None:
        super().__init__()
        self._db = db
        self._bus = bus
        self.shell = shell
        self._writes: deque[_Write] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        #: token → its row's write (`stored` waits for it)
        self._issued: dict[str, asyncio.Future[None]] = {}
        #: the instances whose tokens are this shell's alone (`issue` not ``shared``): no row
        self._local: set[str] = set()
        #: hashes of this shell's tokens revoked whose rows are still to be deleted
        self._revoked: set[str] = set()
        #: hash → another shell's instance, until its `instance:token`
        self._others: OrderedDict[str, AppCaller] = OrderedDict()
        #: hash → until when (monotonic) it is known not to be in the table
        self._unknown: OrderedDict[str, float] = OrderedDict()
        #: counts the events heard: a read one overtook is not remembered
        self._heard = 0
        self._unlisten: Any = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.get_running_loop().create_task(self._write_loop(), name="app tokens")
        self._unlisten = self._bus.listen((InstanceToken.TOPIC,), self._heard_event, others=True)
        self._bus.on_fell_behind.append(self._forget_all)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await asyncio.wait_for(self._idle.wait(), CLOSE_WAIT)
        except TimeoutError:
            _LOGGER.warning("%d app token rows left unwritten at shutdown", len(self._writes))
        if self._unlisten is not None:
            self._unlisten()
        if self._forget_all in self._bus.on_fell_behind:
            self._bus.on_fell_behind.remove(self._forget_all)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- this shell's tokens ----------------------------------------------------------------------

    def issue(self, app_id: str, instance_id: str, owner: str, *, shared: bool = True) -> str:
        token = super().issue(app_id, instance_id, owner)
        if not shared:
            # a local server's: no row, which a killed shell would leave valid everywhere
            self._local.add(instance_id)
            return token
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._issued[token] = done
        done.add_done_callback(lambda _: self._issued.pop(token, None))
        caller = AppCaller(app_id, instance_id, owner)
        self._queue(_Write(token_hash(token), instance_id, app_id, owner, caller, False, done))
        return token

    async def flush(self) -> None:
        """Until every change made so far is written (or, for an issue, given up)."""
        await self._idle.wait()

    async def stored(self, token: str) -> None:
        """Until the token's row is written (the database's error when it could not be)."""
        done = self._issued.get(token)
        if done is not None:
            await asyncio.wait_for(asyncio.shield(done), STORE_WAIT)

    def register(self, app_id: str, instance_id: str, owner: str, token: str) -> None:
        super().register(app_id, instance_id, owner, token)
        hashed = token_hash(token)
        self._revoked.discard(hashed)
        caller = AppCaller(app_id, instance_id, owner)
        self._queue(_Write(hashed, instance_id, app_id, owner, caller, True))

    def revoke(self, instance_id: str) -> None:
        if instance_id in self._local:
            self._local.discard(instance_id)
            super().revoke(instance_id)
            return
        token = self._by_instance.get(instance_id)
        known = None if token is None else self._by_token.get(token)
        super().revoke(instance_id)
        if token is None or known is None:
            return
        hashed = token_hash(token)
        self._revoked.add(hashed)
        self._queue(_Write(hashed, instance_id, known.app_id, known.owner, None, True))

    def forget(self, instance_id: str) -> None:
        """Only this shell's memory: the row stays for the shell that adopts or takes the pod."""
        self._local.discard(instance_id)
        super().revoke(instance_id)

    def revoke_rows(self, instance_id: str) -> None:
        """Every row of the instance goes, whichever shell it names: one taken over once its
        pod ended kept the gone shell's row, and its token (the app may have sent it out) acted
        for its owner on every shell while the instance sat here in `error`, and after."""
        super().revoke_rows(instance_id)
        self._queue(_Write("", instance_id, "", "", None, True, every=True))

    def _queue(self, write: _Write) -> None:
        self._writes.append(write)
        self._idle.clear()
        self._wake.set()

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._writes:
                write = self._writes[0]
                try:
                    stored = await self._write(write)
                except Exception as err:  # noqa: BLE001 - the writer outlives a lost link
                    if write.done is not None:
                        self._writes.popleft()
                        if not write.done.done():
                            write.done.set_exception(err)
                        continue
                    _LOGGER.warning(
                        "%s %s: its app token's row was not %s (tried again in %.0f s): %s",
                        write.app_id,
                        write.instance_id,
                        "deleted" if write.caller is None else "written",
                        RETRY_SECONDS,
                        err,
                    )
                    write.retried = True
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                self._writes.popleft()
                if write.caller is None:
                    self._revoked.discard(write.hashed)
                if stored is not None:
                    self._bus.committed([stored])
                if write.done is not None and not write.done.done():
                    write.done.set_result(None)
            self._idle.set()

    async def _write(self, write: _Write) -> tuple[StoredEvent, InstanceToken] | None:
        async with self._db.transaction() as tx:
            if write.every:
                gone = (
                    await tx.execute(
                        sa.delete(app_tokens)
                        .where(app_tokens.c.instance_id == write.instance_id)
                        .returning(app_tokens.c.app_id, app_tokens.c.owner)
                    )
                ).first()
                if gone is None:
                    return None
                return await _announce(tx, write.instance_id, gone.app_id, gone.owner, None)
            if write.caller is None:
                # this shell's row only: the pod may be another shell's since (taken over while
                # this delete waited on a lost link), its row naming that shell
                await tx.execute(
                    sa.delete(app_tokens).where(
                        app_tokens.c.hash == write.hashed, app_tokens.c.shell == self.shell
                    )
                )
            elif write.retried and not await self._still_ours(tx, write.instance_id):
                # held up by a lost link while another shell took the pod over (and maybe
                # removed it): written now, the row would make the token valid again
                _LOGGER.warning(
                    "%s %s: its app token's row is not written: the instance is no longer "
                    "this shell's",
                    write.app_id,
                    write.instance_id,
                )
                return None
            else:
                await tx.execute(sa.delete(app_tokens).where(app_tokens.c.hash == write.hashed))
            if write.caller is not None:
                await tx.execute(
                    sa.insert(app_tokens).values(
                        hash=write.hashed,
                        instance_id=write.instance_id,
                        app_id=write.app_id,
                        owner=write.owner,
                        shell=self.shell,
                        issued_at=_now(),
                    )
                )
            if not write.announce:
                return None
            return await _announce(tx, write.instance_id, write.app_id, write.owner, write.caller)

    async def _still_ours(self, tx: AsyncConnection, instance_id: str) -> bool:
        """Whether the instance's row names this shell (under a lock on it until ``tx`` ends)."""
        shell = (
            await tx.execute(
                sa.select(instances.c.shell).where(instances.c.id == instance_id).with_for_update()
            )
        ).scalar()
        return shell == self.shell

    async def sweep(self) -> int:
        """At start, once the survivors are adopted: delete the rows this shell's earlier run
        left, but those of the tokens it holds now. How many went."""
        await self.flush()
        held = {token_hash(token) for token in self._by_token}
        announced: list[tuple[StoredEvent, InstanceToken]] = []
        async with self._db.transaction() as tx:
            rows = (
                await tx.execute(sa.select(app_tokens).where(app_tokens.c.shell == self.shell))
            ).all()
            for row in rows:
                if row.hash in held:
                    continue
                await tx.execute(sa.delete(app_tokens).where(app_tokens.c.hash == row.hash))
                announced.append(await _announce(tx, row.instance_id, row.app_id, row.owner, None))
        if announced:
            self._bus.committed(announced)
        return len(announced)

    # -- any shell's tokens -----------------------------------------------------------------------

    async def find(self, token: str) -> AppCaller | None:
        own = self._by_token.get(token)
        if own is not None or _FORM.fullmatch(token) is None:
            return own
        hashed = token_hash(token)
        known = self._others.get(hashed)
        if known is not None:
            return known
        until = self._unknown.get(hashed)
        if until is not None:
            if until > time.monotonic():
                return None
            del self._unknown[hashed]
        if hashed in self._revoked:
            return None  # this shell's, revoked: its row's delete is on its way
        heard = self._heard
        async with self._db.connect() as conn:
            row = (
                await conn.execute(sa.select(app_tokens).where(app_tokens.c.hash == hashed))
            ).first()
        # a row naming this shell whose token it does not hold is one it let go of
        found = None
        if row is not None and row.shell != self.shell:
            found = AppCaller(row.app_id, row.instance_id, row.owner)
        if heard != self._heard or hashed in self._revoked:
            return found if hashed not in self._revoked else None  # heard meanwhile: not kept
        if found is not None:
            self._others[hashed] = found
            if len(self._others) > KEPT:
                self._others.popitem(last=False)
        elif row is None:
            self._unknown[hashed] = time.monotonic() + UNKNOWN_SECONDS
            if len(self._unknown) > UNKNOWN_KEPT:
                self._unknown.popitem(last=False)
        return found

    def _heard_event(self, event: Event) -> None:
        self._heard += 1
        instance_id = event.payload.get("instanceId")
        for hashed in [h for h, c in self._others.items() if c.instance_id == instance_id]:
            del self._others[hashed]
        if event.payload.get("gone") is not True:
            self._unknown.clear()  # a token written again may be one refused a moment ago

    def _forget_all(self) -> None:
        self._heard += 1
        self._others.clear()
        self._unknown.clear()


async def _announce(
    tx: AsyncConnection, instance_id: str, app_id: str, owner: str, caller: AppCaller | None
) -> tuple[StoredEvent, InstanceToken]:
    """The `instance:token` of a row written (``caller``) or deleted, in its transaction."""
    told = InstanceToken(instance_id, app_id, caller is None, owner=owner)
    return await append(tx, told.TOPIC, told.owner, told.wire()), told


__all__ = ["SharedAppTokens"]
