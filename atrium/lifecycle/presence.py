"""Which host pages are still there: a view belongs to a host-page client, and a client whose event
streams have all been gone for a grace period (30 s) has its views released (decisions.md
"Lifecycle"). A tab that reloads reconnects within the grace and keeps its views."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Final

from atrium.errors import InvalidRequest

_LOGGER = logging.getLogger(__name__)
CLIENT_RE: Final = re.compile(r"[A-Za-z0-9_-]{8,64}")


class Presence:
    """Counts open event streams per client; calls ``on_gone(client)`` after ``grace`` seconds
    without any."""

    def __init__(self, grace: float, on_gone: Callable[[str], Awaitable[None]]) -> None:
        self._grace = grace
        self._on_gone = on_gone
        self._streams: dict[str, int] = {}
        self._timers: dict[str, asyncio.Task[None]] = {}

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

    def disconnected(self, client: str) -> None:
        left = self._streams.get(client, 0) - 1
        if left > 0:
            self._streams[client] = left
            return
        self._streams.pop(client, None)
        if client not in self._timers:
            self._timers[client] = asyncio.create_task(
                self._expire(client), name=f"presence {client}"
            )

    def is_present(self, client: str) -> bool:
        return client in self._streams

    async def _expire(self, client: str) -> None:
        try:
            await asyncio.sleep(self._grace)
            if client not in self._streams:
                _LOGGER.info(
                    "host page %s gone for %.0f s: releasing its views", client, self._grace
                )
                await self._on_gone(client)
        finally:
            if self._timers.get(client) is asyncio.current_task():
                del self._timers[client]

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
