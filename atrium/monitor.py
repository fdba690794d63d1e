"""The usage sampler: `GET /api/system/usage`'s figures, and `system:usage` while anyone listens.

A CPU share needs two samples, so the monitor keeps the last one: an answer is the figures
between it and a new sample (a first answer samples twice, `FIRST_GAP` apart), and answers asked
for within `MIN_GAP` of each other share one sample. Every ``interval`` seconds, and only while
some user has an event stream open that takes `system:usage`, it samples and emits one event per
such user, with that user's own instances (the bus delivers an owned event to its owner only).
The reading (`atrium.usage`, a walk of /proc) runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from atrium.bus import EventBus
from atrium.events import SYSTEM_USAGE, SystemUsage
from atrium.usage import Running, Sample, Usage, figures, take

_LOGGER = logging.getLogger(__name__)

#: answers asked for closer together than this share one sample
MIN_GAP: Final = 1.0
#: the first answer's two samples are this far apart (a share over less would be noise)
FIRST_GAP: Final = 0.25


class UsageMonitor:
    """Samples the machine and the running instances (given by ``running``) on demand, and
    every ``interval`` seconds for the users listening on ``bus``."""

    def __init__(
        self,
        bus: EventBus,
        running: Callable[[], Iterable[Running]],
        home: Path,
        interval: float,
    ) -> None:
        self._bus = bus
        self._running = running
        self._home = home
        self._interval = interval
        self._last: Sample | None = None
        self._usage: Usage | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._loop(), name="usage monitor")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _sample(self) -> Sample:
        running = list(self._running())
        when = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return await asyncio.to_thread(take, running, self._home, at=time.monotonic(), when=when)

    async def current(self) -> Usage:
        """Every running instance's figures and the machine's, at most `MIN_GAP` old."""
        async with self._lock:
            if (
                self._usage is not None
                and self._last is not None
                and time.monotonic() - self._last.at < MIN_GAP
            ):
                return self._usage
            before = self._last
            if before is None:
                before = await self._sample()
                await asyncio.sleep(FIRST_GAP)
            now = await self._sample()
            self._last, self._usage = now, figures(before, now)
            return self._usage

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            if not self._bus.hearers(SYSTEM_USAGE):
                continue
            try:
                usage = await self.current()
            except Exception:  # one bad sample must not end the figures for good
                _LOGGER.exception("reading the usage figures failed")
                continue
            # who listens now: a stream that opened while the figures were read hears them too
            for user in sorted(self._bus.hearers(SYSTEM_USAGE)):
                self._bus.emit(
                    SystemUsage(dict(usage.machine), usage.instances_of(user), usage.at, owner=user)
                )
