"""The in-process event bus: `publish` never blocks; each subscriber has a bounded queue.

A frame is encoded once per event and shared by every subscriber. A subscriber whose queue is full is
dropped (its stream ends; it may reconnect with ``Last-Event-ID`` and replay what it missed from the
last ``history`` events). Its queue is full because its writer is stuck behind a client that does
not read, so ending the queue alone would end nothing: the subscription's ``on_drop`` is called
too, and the HTTP edge cuts the connection there. ``close`` ends every stream so open streams
never hold up shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Self

from atrium.events import Payload, matches_any

_LOGGER = logging.getLogger(__name__)

HISTORY: Final = 1000
QUEUE_SIZE: Final = 1024
HEARTBEAT: Final = b": heartbeat\n\n"

Listener = Callable[["Event"], object]


@dataclass(frozen=True, slots=True)
class Event:
    """One published event; ``frame`` is its SSE encoding, made once. ``data`` is the typed
    payload it was emitted with (None for a raw `publish`); ``payload`` its wire form."""

    id: int
    topic: str
    payload: Mapping[str, Any]
    frame: bytes
    data: Payload | None = None


def encode_frame(event_id: int, topic: str, payload: Mapping[str, Any]) -> bytes:
    data = json.dumps({**payload, "type": topic}, separators=(",", ":"), default=str)
    return f"id: {event_id}\nevent: {topic}\ndata: {data}\n\n".encode()


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

    def offer(self, frame: bytes) -> bool:
        """Queue ``frame`` without waiting; False when the queue is full."""
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            return False
        self.last_offer = time.monotonic()
        return True

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
    """Publish/subscribe by topic with globs, history for replay, and synchronous listeners.

    While open (``async with``), a streams' heartbeat is offered to every subscriber that has
    been quiet for ``heartbeat`` seconds: one timer for all, none per frame.
    """

    def __init__(self, history: int = HISTORY, heartbeat: float | None = None) -> None:
        # ids stay increasing across restarts, so a client holding an id from a previous process
        # replays everything the new process still has
        self._next_id = int(time.time() * 1000) * 1000
        self._history: deque[Event] = deque(maxlen=history)
        self._subscribers: set[Subscription] = set()
        self._listeners: list[tuple[tuple[str, ...] | None, Listener]] = []
        self._closed = False
        self._heartbeat = heartbeat
        self._beat: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        if self._heartbeat is not None:
            self._beat = asyncio.create_task(self._beat_loop(self._heartbeat), name="bus heartbeat")
        return self

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
        `emit`; a raw topic and mapping is for the bus's own tests."""
        self._next_id += 1
        event = Event(
            self._next_id, topic, dict(payload), encode_frame(self._next_id, topic, payload), data
        )
        if data is None or data.REPLAYED:
            self._history.append(event)
        matched: dict[tuple[str, ...] | None, bool] = {}  # subscribers mostly share a few filters
        for sub in tuple(self._subscribers):
            hit = matched.get(sub.globs)
            if hit is None:
                hit = matched[sub.globs] = matches_any(topic, sub.globs)
            if not hit or (sub.admit is not None and not sub.admit(event)):
                continue
            if not sub.offer(event.frame):
                self._drop(sub)
        for globs, listener in tuple(self._listeners):
            if matches_any(topic, globs):
                try:
                    listener(event)
                except Exception:  # a listener's bug must not break publishing
                    _LOGGER.exception("event listener failed on %s", topic)
        return event

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
        if last_event_id is not None:
            for event in self._history:
                if (
                    event.id > last_event_id
                    and matches_any(event.topic, globs)
                    and (admit is None or admit(event))
                ):
                    sub.offer(event.frame)
        self._subscribers.add(sub)
        return sub

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

    def listen(self, globs: tuple[str, ...] | None, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` synchronously for each matching event; returns the remover."""
        entry = (globs, listener)
        self._listeners.append(entry)
        return lambda: self._listeners.remove(entry)

    def close(self) -> None:
        """End every stream; later subscriptions end at once."""
        self._closed = True
        for sub in tuple(self._subscribers):
            self.unsubscribe(sub)
