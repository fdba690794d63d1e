"""The pooled HTTP clients the shell uses to reach apps.

`pool` (atrium.httppool, our own keep-alive HTTP/1.1 client over httptools) carries the data
proxy and app pages; `session` (aiohttp) carries health checks and hooks. Neither
keeps cookies or decompresses (bodies pass through as sent); httpx is never used to reach apps
(it was 10-20x slower on this path and replayed one provider's cookie to the next caller).
"""

from __future__ import annotations

import socket
from types import TracebackType
from typing import Any, Self

import aiohttp

from atrium.httppool import HttpPool, marked_socket


class UpstreamClient:
    """Owns the shell's one connection pool and one aiohttp session."""

    def __init__(self, connect_timeout: float = 5.0) -> None:
        self._connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None
        self.pool = HttpPool(connect_timeout=connect_timeout)

    @property
    def mark(self) -> int:
        """SO_MARK of every connection the shell opens to an app (0: none). The instances'
        network refuses a connection to an instance's address that does not carry it: image
        apps check no shell secret, so only the shell's own connections may reach them."""
        return self.pool.mark

    @mark.setter
    def mark(self, value: int) -> None:
        self.pool.mark = value

    def _socket(self, info: tuple[Any, ...]) -> socket.socket:
        family, kind, proto = info[0], info[1], info[2]
        if self.mark:
            return marked_socket(family, self.mark)
        return socket.socket(family, kind, proto)

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            connector=aiohttp.TCPConnector(
                limit=0, limit_per_host=256, keepalive_timeout=30, socket_factory=self._socket
            ),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
            skip_auto_headers=("User-Agent",),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection to apps (again does nothing)."""
        self.pool.close()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the upstream client is not open")
        return self._session
