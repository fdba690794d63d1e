"""Which host pages are still there: a view belongs to a host-page client, and a client whose event
streams have all been gone for a grace period (30 s) has its views released (decisions.md
"Lifecycle"). A tab that reloads reconnects within the grace and keeps its views.

With several shells (`atrium.state.clients`) a page's stream and its views may each be on any
shell: each shell writes whether it has a stream of the page, a shell whose last stream of it
ended asks the table once the grace is over, and the leader looks every `SWEEP_EVERY` s for the
pages whose shell died (or ended before its grace was over). A page found gone has every view it
holds released, on whichever shell (`ViewDesk.release_client`)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Final

from sqlalchemy.exc import SQLAlchemyError

from atrium.errors import InvalidRequest

if TYPE_CHECKING:
    from atrium.state.clients import ClientStreams

_LOGGER = logging.getLogger(__name__)
CLIENT_RE: Final = re.compile(r"[A-Za-z0-9_-]{8,64}")
#: seconds between two of the leader's looks for host pages gone with their shell (at most;
#: a shorter grace looks as often)
SWEEP_EVERY: Final = 10.0


class Presence:
    """Counts open event streams per client; calls ``on_gone(client)`` after ``grace`` seconds
    without any. ``on_gone`` answers False when the database refused some of the release: with
    several shells the page's row is written again as ended, so that the leader's look releases
    it again a grace later (the page's rows went with the decision, and nothing else would)."""

    def __init__(
        self,
        grace: float,
        on_gone: Callable[[str], Awaitable[bool]],
        shared: ClientStreams | None = None,
        is_leader: Callable[[], bool] = lambda: False,
    ) -> None:
        self._grace = grace
        self._on_gone = on_gone
        self._streams: dict[str, int] = {}
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._shared = shared
        self._is_leader = is_leader
        #: the pages whose row of this shell is to be written as they are now (`_write_loop`)
        self._dirty: dict[str, None] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """With several shells: this shell's earlier run's rows say its streams ended (the
        leader's look counts those pages gone a grace later), its writer and the leader's
        look start."""
        if self._shared is None:
            return
        await self._shared.sweep()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._write_loop(), name="host page streams"),
            loop.create_task(self._sweep_loop(), name="host pages gone"),
        ]

    @staticmethod
    def client_id(value: str | None) -> str | None:
        """``value`` when it is a valid host-page client id (or None); else 400."""
        if value is not None and CLIENT_RE.fullmatch(value) is None:
            raise InvalidRequest("client must be 8-64 letters, digits, '-' or '_'")
        return value

    def connected(self, client: str) -> None:
        self._streams[client] = self._streams.get(client, 0) + 1
        timer = self._timers.pop(client, None)
        if timer is not None:
            timer.cancel()
        if self._streams[client] == 1:
            self._mark(client)

    def disconnected(self, client: str) -> None:
        left = self._streams.get(client, 0) - 1
        if left > 0:
            self._streams[client] = left
            return
        self._streams.pop(client, None)
        self._mark(client)
        if client not in self._timers:
            self._timers[client] = asyncio.create_task(
                self._expire(client), name=f"presence {client}"
            )

    def is_present(self, client: str) -> bool:
        return client in self._streams

    async def _expire(self, client: str) -> None:
        try:
            await asyncio.sleep(self._grace)
            if client in self._streams:
                return
            if self._shared is not None:
                try:
                    await self._flush(client)
                    if not await self._shared.gone(self._grace, client):
                        return  # another shell has a stream of it, or lost one lately
                except SQLAlchemyError as err:
                    _LOGGER.warning("host page %s: its streams unknown (%s)", client, err)
                    self._mark(client)
                    return  # the leader's look finds it later
            _LOGGER.info("host page %s gone for %.0f s: releasing its views", client, self._grace)
            if not await self._on_gone(client):
                self._mark(client)  # the leader's look releases it again
        finally:
            if self._timers.get(client) is asyncio.current_task():
                del self._timers[client]

    def _mark(self, client: str) -> None:
        if self._shared is not None:
            self._dirty[client] = None
            self._wake.set()

    async def _flush(self, client: str) -> None:
        """This shell's row of ``client`` as it is now, before a decision reads it."""
        if self._shared is not None and client in self._dirty:
            del self._dirty[client]
            await self._shared.write(client, streaming=client in self._streams)

    async def _write_loop(self) -> None:
        """Writes each marked page's row as this shell's streams of it are when written (so a
        later write is never overtaken by an earlier one); a write the database did not take is
        tried again a second later."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            for client in list(self._dirty):
                try:
                    await self._flush(client)
                except SQLAlchemyError as err:
                    _LOGGER.warning("host page %s: its stream here not written: %s", client, err)
                    self._dirty[client] = None
                    await asyncio.sleep(1.0)
                    self._wake.set()
                    break

    async def _sweep_loop(self) -> None:
        assert self._shared is not None  # noqa: S101 - started with it
        while True:
            await asyncio.sleep(min(max(self._grace, 0.5), SWEEP_EVERY))
            if not self._is_leader():
                continue
            try:
                found = await self._shared.gone(self._grace)
            except SQLAlchemyError as err:
                _LOGGER.warning("looking for host pages gone with their shell: %s", err)
                continue
            for client in found:
                if client in self._streams:
                    continue  # connected here since: its row is written again
                _LOGGER.info(
                    "host page %s gone for %.0f s (its shell gone): releasing its views",
                    client,
                    self._grace,
                )
                try:
                    if not await self._on_gone(client):
                        self._mark(client)  # looked at again a grace later
                except Exception:  # the next page is released all the same
                    _LOGGER.exception("releasing the views of host page %s failed", client)

    async def close(self) -> None:
        """Every timer and task ended, and awaited: one cancelled inside a database call gives
        its connection back before the shell disposes of the engine (left to the garbage
        collector, it was dropped unclosed)."""
        timers = list(self._timers.values())
        for timer in timers:
            timer.cancel()
        self._timers.clear()
        await asyncio.gather(*timers, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
