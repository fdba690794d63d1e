"""The event bus: `emit` never blocks; each subscriber has a bounded queue.

With a `Database` (the shell's), every event is a row of the events table
(`atrium.state.events`), its id the one-row counter's (commit order), and streams are fed from the
table, so a stream resumed with ``Last-Event-ID`` on any shell sharing the database misses nothing
and gets nothing twice:

- `emit` calls this shell's listeners at once (as the event happens, with ``id`` 0: the row is not
  written yet) and queues the event; a writer task writes what is queued, several events per
  transaction. A store that writes its event in the transaction of its change calls `committed`
  after the commit instead.
- One reader reads the rows it has not seen, once, in id order (woken by its writer, by
  `committed`, and on PostgreSQL by ``NOTIFY``), calls the listeners of the events other shells
  committed (this shell's own ones were heard already), and offers each event's frame to the
  subscribers whose globs and admission take it.
- A resumed subscription first reads the table after its id by itself, then joins the reader's
  fan-out at the id it reached (`Subscription.cursor`): no event between the two is lost or sent
  twice.
- A payload that is not replayed (a figure stale seconds later) is no row: it goes to this shell's
  streams at once, its frame carrying the id of the stream's last event, so a resume from it misses
  nothing.

Without a database (the bus's own tests and components tested without a shell) the bus is
in memory: ids from the clock, the last `HISTORY` events kept for replay, frames offered as the
event is published.

A frame is encoded once per event and shared by every subscriber. A subscriber whose queue is full is
dropped (its stream ends; it may reconnect with ``Last-Event-ID`` and replay what it missed). Its
queue is full because its writer is stuck behind a client that does not read, so ending the queue
alone would end nothing: the subscription's ``on_drop`` is called too, and the HTTP edge cuts the
connection there. ``close`` ends every stream so open streams never hold up shutdown; leaving the
bus (``async with``) also writes what was emitted before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, Self

from atrium.events import PAYLOADS, Payload, matches_any

if TYPE_CHECKING:  # SQLAlchemy loads with a shell's database, not with every import of the bus
    from atrium.state.database import Database
    from atrium.state.events import StoredEvent

_LOGGER = logging.getLogger(__name__)

#: how many events a resume can reach back (the events table keeps as many)
#: as many as the events table keeps (`atrium.state.events.KEEP`; a test holds them equal)
HISTORY: Final = 10_000


QUEUE_SIZE: Final = 1024
HEARTBEAT: Final = b": heartbeat\n\n"
#: the most events the writer puts in one transaction
BATCH: Final = 200
#: the most events waiting for the writer; beyond, the oldest are given up (and logged)
PENDING_LIMIT: Final = 100_000
#: how long leaving the bus waits for the writer to write what was emitted
FLUSH_WAIT: Final = 10.0
#: how long a failed read, write or LISTEN waits before it is tried again
RETRY: Final = 0.5

Listener = Callable[["Event"], object]
#: which listeners hear an event: every one (this shell's event), only those that hear other
#: shells' events (read from the table), or only the others (an own event the reader read first)
Hearers = Literal["every", "others", "own-only"]
EVERY: Final[Hearers] = "every"
OTHERS: Final[Hearers] = "others"
OWN_ONLY: Final[Hearers] = "own-only"
#: how many of the ids read as other shells' are remembered for a late `EventBus.committed`
READ_AS_OTHERS: Final = 4096


@dataclass(frozen=True, slots=True)
class Event:
    """One event; ``frame`` is its SSE encoding, made once. ``data`` is the typed payload it was
    emitted with (None for a raw `publish`, or a row this shell cannot read as one); ``payload``
    its wire form. ``id`` is 0 while the row is not written (what `emit` returns and this shell's
    listeners hear, with ``frame`` empty)."""

    id: int
    topic: str
    payload: Mapping[str, Any]
    frame: bytes
    data: Payload | None = None
    #: the user it belongs to (the payload's ``owner``, or the row's): who may hear it, even
    #: when ``data`` is None
    owner: str | None = None
    #: read from the table as another shell's: a listener that keeps a cache refreshes it, and
    #: announces nothing (the shell that made the change did)
    foreign: bool = False


def encode_frame(event_id: int, topic: str, payload: Mapping[str, Any]) -> bytes:
    data = json.dumps({**payload, "type": topic}, separators=(",", ":"), default=str)
    return f"id: {event_id}\nevent: {topic}\ndata: {data}\n\n".encode()


def _camel(name: str) -> str:
    head, *rest = name.rstrip("_").split("_")
    return head + "".join(part.title() for part in rest)


def decode(stored: StoredEvent) -> Payload | None:
    """The typed payload of a row (the inverse of `Payload.wire`, with the row's owner); None
    for a topic without a payload class or a row that does not fit its class."""
    cls = PAYLOADS.get(stored.topic)
    if cls is None:
        return None
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.kw_only:
            continue
        key = _camel(f.name)
        if key in stored.data:
            values[f.name] = stored.data[key]
        elif f.default is dataclasses.MISSING:
            return None
    try:
        return cls(**values, owner=stored.owner)
    except TypeError:
        return None


@dataclass(eq=False, slots=True)
class Subscription:
    """One subscriber: iterate it for frames (bytes); iteration ends when it is closed or dropped."""

    globs: tuple[str, ...] | None
    #: called once when the bus drops this subscriber for being too slow
    on_drop: Callable[[], object] | None = None
    #: a further per-subscriber test of each event its globs match (who may hear what)
    admit: Callable[[Event], bool] | None = None
    #: the user this stream is for (None: an app's, or the bus's own tests)
    hearer: str | None = None
    queue: asyncio.Queue[bytes | None] = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))
    closed: bool = False
    dropped: bool = False
    #: when a frame was last queued (the heartbeat goes to streams quiet for longer)
    last_offer: float = field(default_factory=time.monotonic)
    #: with a database: the last event id this stream has been given or passed over
    cursor: int = 0
    #: with a database: still reading the table after its ``Last-Event-ID`` (the reader's
    #: fan-out passes it over until it has caught up)
    resuming: bool = False
    #: with a database: how many events this shell had emitted when the stream began without an
    #: id; those are older than the stream even when their rows come later, and are not sent
    since: int = 0

    def offer(self, frame: bytes) -> bool:
        """Queue ``frame`` without waiting; False when the queue is full."""
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            return False
        self.last_offer = time.monotonic()
        return True

    async def put(self, frame: bytes) -> None:
        """Queue ``frame``, waiting for room: a resume's backlog goes at the client's pace (one
        that stops reading is dropped by the heartbeat, which does not wait)."""
        await self.queue.put(frame)
        self.last_offer = time.monotonic()

    def end(self) -> None:
        """End the stream: discard what is queued (the client can replay it) and wake the reader."""
        if self.closed:
            return
        self.closed = True
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)

    async def next(self, wait: float | None = None) -> bytes | None:
        """The next frame; None when the stream ended. Raises TimeoutError after ``wait`` s."""
        async with asyncio.timeout(wait):
            return await self.queue.get()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (frame := await self.queue.get()) is not None:
            yield frame


class EventBus:
    """Publish/subscribe by topic with globs, replay, and synchronous listeners.

    While open (``async with``), a streams' heartbeat is offered to every subscriber that has
    been quiet for ``heartbeat`` seconds: one timer for all, none per frame. With ``db`` the bus
    must be open to write and read events (see the module docstring).
    """

    def __init__(
        self,
        history: int = HISTORY,
        heartbeat: float | None = None,
        *,
        db: Database | None = None,
        batch: int = BATCH,
    ) -> None:
        # in memory: ids stay increasing across restarts, so a client holding an id from a
        # previous process replays everything the new process still has
        self._next_id = int(time.time() * 1000) * 1000
        self._history: deque[Event] = deque(maxlen=history)
        self._subscribers: set[Subscription] = set()
        #: (globs, listener, whether it hears other shells' events too)
        self._listeners: list[tuple[tuple[str, ...] | None, Listener, bool]] = []
        #: called when the reader found rows gone before it read them (`_fell_behind`): whoever
        #: keeps a copy of what other shells' events announce changes must read it all again
        self.on_fell_behind: list[Callable[[], None]] = []
        self._closed = False
        self._heartbeat = heartbeat
        self._beat: asyncio.Task[None] | None = None
        self._db = db
        self._batch = batch
        #: emitted, not yet written
        self._pending: deque[Event] = deque()
        #: each pending event's place in the order this shell emitted them (`_emitted`)
        self._pending_seq: deque[int] = deque()
        #: when each pending event was emitted (monotonic seconds; the writer's fence)
        self._pending_at: deque[float] = deque()
        #: how many events this shell has emitted or committed (a new stream's `since`)
        self._emitted = 0
        #: the place of this shell's events whose rows the reader has not met yet, by id
        self._own_seq: dict[int, int] = {}
        #: this shell's events written (or `committed`) and not yet read back: their listeners
        #: were called already
        self._own: dict[int, Event] = {}
        #: ids the reader took for other shells' events (their listeners heard them then): a
        #: store's `committed` for one of them tells this shell's own listeners, once
        self._read_as_others: dict[int, None] = {}
        #: the newest id the reader has fanned out
        self._seen = 0
        self._write_wake = asyncio.Event()
        self._read_wake = asyncio.Event()
        #: set while nothing emitted waits to be written or read back (`flush`)
        self._idle = asyncio.Event()
        self._writing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._catching_up: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        if self._heartbeat is not None:
            self._beat = asyncio.create_task(self._beat_loop(self._heartbeat), name="bus heartbeat")
        if self._db is not None:
            from atrium.state import events as log  # SQLAlchemy: with a database only

            async with self._db.connect() as conn:
                self._seen = await log.newest_id(conn)
            self._spawn(self._write_loop(self._db), "bus writer")
            self._spawn(self._read_loop(self._db), "bus reader")
            if self._db.dialect == "postgresql":
                listening = asyncio.Event()
                self._spawn(self._listen_loop(self._db, listening), "bus listen")
                # events other shells commit from now on are heard (a first LISTEN that fails
                # is retried; the reader catches up when it succeeds)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        await listening.wait()
        return self

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.add(asyncio.create_task(coro, name=name))

    async def _beat_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval / 4)
            quiet_since = time.monotonic() - interval
            for sub in tuple(self._subscribers):
                if sub.last_offer <= quiet_since and not sub.offer(HEARTBEAT):
                    self._drop(sub)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._beat is not None:
            self._beat.cancel()
        self.close()
        try:
            await self.flush(FLUSH_WAIT)
        finally:
            for task in (*self._tasks, *self._catching_up):
                task.cancel()
            for task in (*self._tasks, *self._catching_up):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self._beat is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._beat
            if self._pending:
                _LOGGER.error(
                    "%d events emitted were not written: the database did not take them",
                    len(self._pending),
                )

    async def flush(self, wait: float | None = None) -> None:
        """Wait until what was emitted so far is written and read back (fanned out here)."""
        if self._db is None or not self._tasks:
            return
        self._check_idle()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._idle.wait()

    def _check_idle(self) -> None:
        if self._pending or self._writing or self._own or self._read_wake.is_set():
            self._idle.clear()
        else:
            self._idle.set()

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def emit(self, data: Payload) -> Event:
        """Publish a typed payload under its topic: how the shell announces everything."""
        return self.publish(data.TOPIC, data.wire(), data=data)

    def publish(
        self, topic: str, payload: Mapping[str, Any], *, data: Payload | None = None
    ) -> Event:
        """Deliver to every matching subscriber and listener; never waits. The shell itself uses
        `emit`; a raw topic and mapping is for the bus's own tests. With a database the event
        returned has id 0 (its row is written after): nothing may rely on its id."""
        replayed = data is None or data.REPLAYED
        owner = data.owner if data is not None else None
        if self._db is None:
            self._next_id += 1
            event = Event(
                self._next_id,
                topic,
                dict(payload),
                encode_frame(self._next_id, topic, payload),
                data,
                owner,
            )
            if replayed:
                self._history.append(event)
            self._fan_out(event)
        else:
            event = Event(0, topic, dict(payload), b"", data, owner)
            if not replayed:
                self._fan_out_unstored(event)
            elif len(self._pending) >= PENDING_LIMIT:
                _LOGGER.error(
                    "the event writer is %d events behind: %s not written",
                    len(self._pending),
                    topic,
                )
            else:
                self._emitted += 1
                self._pending.append(event)
                self._pending_seq.append(self._emitted)
                self._pending_at.append(time.monotonic())
                self._write_wake.set()
        self._tell_listeners(event, EVERY)
        return event

    def tell(self, data: Payload) -> None:
        """Tell this shell's own listeners, and nothing else: no row, no stream. For what another
        shell already announced to every stream, which this shell learns of on its own (the
        registry reading a scope again after another shell's `scope:changed`): the listeners of
        this shell's events only act as on their own shell's event (those of every shell's
        heard the other shell's row), and no stream hears it twice."""
        event = Event(0, data.TOPIC, data.wire(), b"", data, data.owner)
        self._tell_listeners(event, OWN_ONLY)

    def committed(self, items: Sequence[tuple[StoredEvent, Payload]]) -> None:
        """What a store calls right after its transaction that wrote these events
        (`atrium.state.events.append`) committed: this shell's listeners hear them now, and the
        reader fans them out. Never waits. (In memory they are published as new events.)"""
        if self._db is None:
            for stored, data in items:
                self.publish(stored.topic, stored.data, data=data)
            return
        for stored, data in items:
            event = Event(stored.id, stored.topic, dict(stored.data), b"", data, stored.owner)
            if stored.id <= self._seen:
                # the reader read it first, as another shell's: the listeners of every shell's
                # events heard it then, this shell's own listeners hear it now (once)
                if self._read_as_others.pop(stored.id, 0) is None:
                    self._tell_listeners(event, OWN_ONLY)
                continue
            self._own[stored.id] = event
            self._emitted += 1
            self._own_seq[stored.id] = self._emitted
            self._tell_listeners(event, EVERY)
        self._read_wake.set()

    def _tell_listeners(self, event: Event, which: Hearers = EVERY) -> None:
        for globs, listener, others in tuple(self._listeners):
            if (which == EVERY or others == (which == OTHERS)) and matches_any(event.topic, globs):
                try:
                    listener(event)
                except Exception:  # a listener's bug must not break publishing
                    _LOGGER.exception("event listener failed on %s", event.topic)

    def _fan_out(self, event: Event, seq: int | None = None) -> None:
        """Offer ``event``'s frame to every live subscriber that takes it (in id order);
        ``seq``: its place among this shell's own events (None: another shell's)."""
        matched: dict[tuple[str, ...] | None, bool] = {}  # subscribers mostly share a few filters
        for sub in tuple(self._subscribers):
            if self._db is not None:
                if sub.resuming or event.id <= sub.cursor:
                    continue
                sub.cursor = event.id
                if seq is not None and seq <= sub.since:
                    continue  # emitted here before the stream began
            hit = matched.get(sub.globs)
            if hit is None:
                hit = matched[sub.globs] = matches_any(event.topic, sub.globs)
            if not hit or (sub.admit is not None and not sub.admit(event)):
                continue
            if not sub.offer(event.frame):
                self._drop(sub)

    def _fan_out_unstored(self, event: Event) -> None:
        """A payload that is not replayed: to this shell's live streams now, each frame carrying
        the id of its stream's last event (a resume from it misses nothing, repeats nothing)."""
        frames: dict[int, bytes] = {}
        for sub in tuple(self._subscribers):
            if sub.resuming or not matches_any(event.topic, sub.globs):
                continue
            if sub.admit is not None and not sub.admit(event):
                continue
            event_id = max(sub.cursor, self._seen)
            frame = frames.get(event_id)
            if frame is None:
                frame = frames[event_id] = encode_frame(event_id, event.topic, event.payload)
            if not sub.offer(frame):
                self._drop(sub)

    async def _write_loop(self, db: Database) -> None:
        from atrium.state import events as log  # SQLAlchemy: with a database only

        while True:
            await self._write_wake.wait()
            self._write_wake.clear()
            while self._pending:
                batch: list[Event] = []
                ids: list[int] = []
                self._writing = True
                try:
                    async with db.transaction() as tx:
                        # fenced on the connection it writes with (getting it may have found
                        # the link broken): what was emitted before the last loss is not written
                        self._give_up_before(db.link_lost_at)
                        count = min(self._batch, len(self._pending))
                        batch = [self._pending[i] for i in range(count)]
                        seqs = [self._pending_seq[i] for i in range(count)]
                        written = await log.append_many(
                            tx,
                            [(e.topic, e.owner, e.payload) for e in batch],
                        )
                        for stored, event, seq in zip(written, batch, seqs, strict=True):
                            ids.append(stored.id)
                            # known before the commit: the reader meets the row only after it
                            self._own[stored.id] = event
                            self._own_seq[stored.id] = seq
                except Exception:
                    for event_id in ids:
                        self._own.pop(event_id, None)
                        self._own_seq.pop(event_id, None)
                    _LOGGER.exception("writing %d events failed; trying again", len(self._pending))
                    self._writing = False
                    await asyncio.sleep(RETRY)
                    continue
                for _ in batch:
                    self._pending.popleft()
                    self._pending_seq.popleft()
                    self._pending_at.popleft()
                self._writing = False
                self._read_wake.set()

    def _give_up_before(self, moment: float | None) -> None:
        """Give up the pending events emitted before ``moment`` (when this shell last found its
        link to the database broken), unwritten: the shell's sessions of that time are gone
        with every lock they held, other shells have acted since, and a row written now would
        tell of a past this shell no longer speaks for, after newer rows (docs/reliability.md
        "Several shells"). This shell's listeners heard them when they were emitted; its
        streams, which never will, end (as when the reader fell behind): their clients resume
        from the table and read what they show again."""
        if moment is None:
            return
        given_up = 0
        while self._pending_at and self._pending_at[0] <= moment:
            self._pending.popleft()
            self._pending_seq.popleft()
            self._pending_at.popleft()
            given_up += 1
        if given_up:
            _LOGGER.error(
                "%d events emitted before the link to the database broke were not written",
                given_up,
            )
            for sub in tuple(self._subscribers):
                if not sub.resuming:
                    self._drop(sub)

    async def _read_loop(self, db: Database) -> None:
        while True:
            await self._read_wake.wait()
            self._read_wake.clear()
            try:
                await self._read_new(db)
            except Exception:
                _LOGGER.exception("reading new events failed; trying again")
                await asyncio.sleep(RETRY)
                self._read_wake.set()
            self._check_idle()

    async def _read_new(self, db: Database) -> None:
        from atrium.state import events as log  # SQLAlchemy: with a database only

        while True:
            async with db.connect() as conn:
                rows = await log.after(conn, self._seen)
            for stored in rows:
                if stored.id != self._seen + 1:
                    self._fell_behind(stored.id)
                own = self._own.pop(stored.id, None)
                seq = self._own_seq.pop(stored.id, None)
                data = own.data if own is not None else decode(stored)
                event = Event(
                    stored.id,
                    stored.topic,
                    stored.data,
                    encode_frame(stored.id, stored.topic, stored.data),
                    data,
                    stored.owner,
                    foreign=own is None,
                )
                self._seen = stored.id
                if own is None:
                    self._read_as_others[stored.id] = None
                    if len(self._read_as_others) > READ_AS_OTHERS:
                        del self._read_as_others[next(iter(self._read_as_others))]
                    self._tell_listeners(event, OTHERS)
                self._fan_out(event, seq)
            if len(rows) < log.PAGE:
                return

    def _fell_behind(self, next_id: int) -> None:
        """Ids have no gaps: the rows between were dropped from the table before this shell read
        them. Its streams end (their clients resume from the table and learn what it still has)."""
        _LOGGER.error(
            "the event reader fell behind: events %d to %d were gone before it read them",
            self._seen + 1,
            next_id - 1,
        )
        for event_id in [i for i in self._own if i < next_id]:
            del self._own[event_id]
        for sub in tuple(self._subscribers):
            if not sub.resuming:
                self._drop(sub)
        for callback in tuple(self.on_fell_behind):
            try:
                callback()
            except Exception:  # one keeper's bug must not stop the reader or the others
                _LOGGER.exception("a fell-behind callback failed")

    async def _listen_loop(self, db: Database, listening: asyncio.Event) -> None:
        from atrium.state import events as log  # SQLAlchemy: with a database only

        while True:
            try:
                async for event_id in log.notified_ids(db):
                    if event_id == 0:  # listening (again): catch up with what came before
                        listening.set()
                        self._read_wake.set()
                    elif event_id > self._seen:
                        self._read_wake.set()
            except Exception:
                _LOGGER.warning("listening for events failed; trying again", exc_info=True)
            await asyncio.sleep(RETRY)

    def _drop(self, sub: Subscription) -> None:
        _LOGGER.warning("dropping a slow event subscriber (%d frames queued)", QUEUE_SIZE)
        sub.dropped = True
        self.unsubscribe(sub)
        if sub.on_drop is not None:
            try:
                sub.on_drop()
            except Exception:  # the edge's bug must not break publishing
                _LOGGER.exception("ending a dropped subscriber failed")

    def subscribe(
        self,
        globs: tuple[str, ...] | None = None,
        last_event_id: int | None = None,
        on_drop: Callable[[], object] | None = None,
        admit: Callable[[Event], bool] | None = None,
        hearer: str | None = None,
    ) -> Subscription:
        """A new subscription, first fed the missed events after ``last_event_id`` (if any);
        ``on_drop`` is called if the bus later drops it for being too slow; ``admit`` further
        filters the events its globs match; ``hearer`` is the user the stream is for."""
        sub = Subscription(globs, on_drop, admit, hearer)
        if self._closed:
            sub.end()
            return sub
        if self._db is not None:
            sub.cursor = self._seen
            sub.since = self._emitted
            # a resume reads the table even from an id this shell's reader has not reached
            # (another shell gave it): the table, not the reader, knows what came after it
            if last_event_id is not None:
                sub.cursor = max(last_event_id, 0)
                sub.since = 0  # everything after its id, whenever it was emitted
                sub.resuming = True
                task = asyncio.create_task(self._catch_up(self._db, sub), name="bus resume")
                self._catching_up.add(task)
                task.add_done_callback(self._catching_up.discard)
        elif last_event_id is not None:
            for event in self._history:
                if (
                    event.id > last_event_id
                    and matches_any(event.topic, globs)
                    and (admit is None or admit(event))
                ):
                    sub.offer(event.frame)
        self._subscribers.add(sub)
        return sub

    async def _catch_up(self, db: Database, sub: Subscription) -> None:
        """Feed ``sub`` the table's events after its cursor, then hand it to the reader's
        fan-out: the hand-over happens with no wait between the last read and the check, so the
        reader gives it exactly the ids after the last one read here."""
        from atrium.state import events as log  # SQLAlchemy: with a database only

        try:
            async with db.connect() as conn:
                # an id beyond the newest given out (another database's): from now on
                sub.cursor = min(sub.cursor, await log.newest_id(conn))
            while sub in self._subscribers:
                async with db.connect() as conn:
                    rows = await log.after(conn, sub.cursor)
                for stored in rows:
                    if sub not in self._subscribers:
                        return
                    own = self._own.get(stored.id)
                    event = Event(
                        stored.id,
                        stored.topic,
                        stored.data,
                        encode_frame(stored.id, stored.topic, stored.data),
                        own.data if own is not None else decode(stored),
                        stored.owner,
                    )
                    sub.cursor = stored.id
                    if not matches_any(event.topic, sub.globs) or (
                        sub.admit is not None and not sub.admit(event)
                    ):
                        continue
                    await sub.put(event.frame)
                if len(rows) < log.PAGE and sub.cursor >= self._seen:
                    sub.resuming = False
                    return
        except Exception:
            _LOGGER.exception("resuming an event stream failed; it ends (its client resumes)")
            self.unsubscribe(sub)

    def hearers(self, topic: str) -> set[str]:
        """The users with a stream open whose globs take ``topic``: who a figure made only for
        listeners (`atrium.monitor`) is worth making for."""
        return {
            s.hearer
            for s in tuple(self._subscribers)
            if s.hearer is not None and matches_any(topic, s.globs)
        }

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)
        sub.end()

    def listen(
        self, globs: tuple[str, ...] | None, listener: Listener, *, others: bool = False
    ) -> Callable[[], None]:
        """Call ``listener`` synchronously for each matching event this shell emitted or
        committed; with ``others``, for every shell's (each once). Returns the remover.

        Only this shell's by default: a component written for one shell (the data proxy's
        routes, the warm pool, the launcher) reads another shell's ``app:state`` or
        ``app:installed`` as its own, and would route to an instance that runs elsewhere or act
        on a registry it has not reread. A listener that keeps a cache of shared state (users,
        theme preferences) asks for ``others``."""
        entry = (globs, listener, others)
        self._listeners.append(entry)
        return lambda: self._listeners.remove(entry)

    def close(self) -> None:
        """End every stream; later subscriptions end at once. Events emitted after are still
        written (leaving the bus waits for them)."""
        self._closed = True
        for sub in tuple(self._subscribers):
            self.unsubscribe(sub)
