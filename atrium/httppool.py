"""A small keep-alive HTTP/1.1 client pool over httptools: the data proxy's upstream client.

Why it exists (decisions.md "Data proxy"): aiohttp's request machinery was a third of the shell's
CPU on the proxy path; this pool does only what a reverse proxy to loopback apps needs.

Rules:
1. One connection carries one exchange at a time (no pipelining). It goes back to the pool only
   when its response was read to the end and both sides keep it alive; anything else (an error, a
   body left unread, an upstream that closed mid-body, a request body not sent whole) closes it.
2. A reused connection that fails before any byte of the answer arrives is retried once on a new
   connection when the method is idempotent (RFC 9110 9.2.2: GET, HEAD, PUT, DELETE, OPTIONS):
   the upstream may have closed the idle connection just as it was reused. A POST is not sent
   twice. Streamed bodies always use a new connection.
3. The timeout is an inactivity deadline: every wait for the upstream (headers, each piece of the
   body, the drain of a write) gets ``read_timeout`` seconds, like a socket read timeout.
4. No cookies, no redirects, no decompression: bytes pass through as sent.
5. Reading pauses when 256 KiB of a streamed body wait unread, so a slow reader keeps the
   memory of a large response bounded; writing waits for the transport to drain.
6. At most ``max_per_upstream`` exchanges with one upstream at once, so at most that many
   connections to it (a new one is opened only when none is idle). The others wait for a slot in
   the order they asked (first come, first served), each at most its ``read_timeout``, then fail
   with `TimeoutError`. An upstream must be able to take that many connections at once: the
   kernel drops a connection its listen backlog has no room for, and the client's TCP only tries
   again 1, 3, 7, 15... s later (Python's `http.server` listens with a backlog of 5).

Knows nothing of Atrium: callers map `UpstreamError` and `TimeoutError` to their own errors.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Final, Self

import httptools

Key = tuple[str, int]
Headers = list[tuple[bytes, bytes]]

HIGH_WATER: Final = 256 * 1024
IDLE_SECONDS: Final = 4.0  # below common servers' keep-alive (uvicorn 5 s), so reuse rarely races
#: connections to one upstream (one app instance) at once. An app's server serves best with a
#: few: the SDK's threaded server answered most at 16-32 connections and less with more (more
#: threads contending for one interpreter: 5,700 req/s at 16, 4,800 at 64, 3,100 at 200 with a
#: p99 of 1.9 s), so more requests wait their turn here, in order, rather than in the app. 64
#: leaves room for slow handlers and long streamed answers. Every app server Atrium ships listens
#: with a backlog of 1,024 (docs/api.md "What the shell calls on an app").
MAX_PER_UPSTREAM: Final = 64
IDEMPOTENT: Final = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class UpstreamError(Exception):
    """The upstream could not be reached, or broke the exchange."""


class _Stale(UpstreamError):
    """A reused connection failed before any byte of the answer: safe to send again."""


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _Connection(asyncio.Protocol):
    """One TCP connection and the exchange it is carrying; fed by httptools' callbacks."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, key: Key, forget: Callable[[_Connection], None]
    ) -> None:
        self.loop = loop
        self.key = key
        self._forget = forget
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self._lost: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._write_paused = False
        self._read_paused = False
        self._parser: httptools.HttpResponseParser | None = None
        self._spare: httptools.HttpResponseParser | None = None
        # the exchange in progress
        self.status = 0
        self.headers: Headers = []
        self.content_length: int | None = None
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.received_any = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self._no_body = False
        self._length_known = False
        self.streaming = True  # pause reading when a body piles up unread (rule 5)

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        if self._parser is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(UpstreamError(f"malformed response: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._forget(self)
        self.keep_alive = False
        if self.headers_done and not self.complete and not self._length_known:
            self.complete = True  # a body delimited by the end of the connection
        elif self._lost is None:
            self._lost = exc or ConnectionResetError("the upstream closed the connection")
        self._wake()
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_exception(UpstreamError("the upstream closed the connection"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    # -- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        if parser is None:  # bytes after the end of the answer: nobody asked for them
            raise UpstreamError("the upstream sent more than one answer")
        status = parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue, 103): wait for the real one
            self.headers = []
            return
        self.status = status
        self.keep_alive = parser.should_keep_alive()
        self.headers_done = True
        for name, value in self.headers:
            if len(name) == 14 and name.lower() == b"content-length":
                self.content_length = int(value) if value.isdigit() else None
                self._length_known = True
            elif len(name) == 17 and name.lower() == b"transfer-encoding":
                self._length_known = True
        if self._no_body:  # HEAD: httptools would wait for the announced body
            self._length_known = self.complete = True
            self._parser = None
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if (
            self.buffered > HIGH_WATER
            and self.streaming
            and not self._read_paused
            and self.transport is not None
        ):
            self._read_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self.headers_done:  # the end of an interim answer
            return
        self.complete = True
        self._spare, self._parser = self._parser, None
        self._wake()

    # -- the exchange ----------------------------------------------------------------------
    def begin(self, head_request: bool) -> None:
        self._reset()
        self._no_body = head_request
        # a parser that saw its answer to the end is ready for the next one (not after HEAD)
        self._parser = self._spare or httptools.HttpResponseParser(self)
        self._spare = None

    def rest(self) -> None:
        """Back in the pool: no exchange; any byte that arrives now is unexpected."""
        self._reset()
        self.reused = True
        self.idle_since = self.loop.time()

    def _reset(self) -> None:
        self.status = 0
        self.headers = []
        self.content_length = None
        self.headers_done = self.complete = self.received_any = False
        self.chunks.clear()
        self.buffered = 0
        self.streaming = True
        self._length_known = False

    def read_whole(self) -> None:
        """The caller wants the whole body at once: reading never pauses for it."""
        self.streaming = False
        self._resume()

    def take(self) -> list[bytes]:
        """The body bytes received so far; reading resumes if it was paused."""
        out = list(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        self._resume()
        return out

    def _resume(self) -> None:
        if self._read_paused and self.transport is not None and not self.closed:
            self._read_paused = False
            self.transport.resume_reading()

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self.chunks

    async def wait(self, read_timeout: float) -> None:
        """Until the next piece of the answer (or its end) arrives."""
        self._check()
        waiter = self._waiter = self.loop.create_future()
        timer = self.loop.call_later(read_timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        self._check()

    def _check(self) -> None:
        lost = self._lost
        if lost is None or self.complete:
            return
        if self.reused and not self.received_any:
            raise _Stale(str(lost))
        raise UpstreamError(f"the upstream closed the connection: {lost}")

    def write(self, *data: bytes) -> None:
        if self.transport is None or self.closed:
            raise UpstreamError("the upstream closed the connection")
        self.transport.writelines(data)

    async def drain(self, read_timeout: float) -> None:
        if self.closed:
            raise UpstreamError("the upstream closed the connection")
        if not self._write_paused:
            return
        drain = self._drain = self.loop.create_future()
        timer = self.loop.call_later(read_timeout, _expire, drain)
        try:
            await drain
        finally:
            timer.cancel()

    def close(self) -> None:
        self.keep_alive = False
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    def _fail(self, err: BaseException) -> None:
        self._lost = err
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def marked_socket(family: int, mark: int) -> socket.socket:
    """A non-blocking TCP socket whose packets carry ``mark`` (SO_MARK: root only)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def marked_connection(
    loop: asyncio.AbstractEventLoop, host: str, port: int, mark: int
) -> socket.socket:
    """A connected `marked_socket` to ``host:port`` (its first address)."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"no address for {host}")
    family, _, _, _, address = infos[0]
    sock = marked_socket(family, mark)
    try:
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock


class UpstreamResponse:
    """An upstream's answer once its headers arrived. Read it whole or stream it, then it is
    released (back to the pool or closed); `release()` is safe to call at any time and again."""

    __slots__ = ("_conn", "_pool", "_timeout", "content_length", "headers", "status")

    def __init__(self, pool: HttpPool, conn: _Connection, timeout: float) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._timeout = timeout
        self.status = conn.status
        self.headers = conn.headers
        self.content_length = conn.content_length

    async def read(self) -> bytes:
        conn = self._connection()
        conn.read_whole()
        try:
            while not conn.complete:
                await conn.wait(self._timeout)
            return b"".join(conn.take())
        finally:
            self.release()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        conn = self._connection()
        try:
            while True:
                if conn.chunks:  # what arrived while the caller had the last piece, first
                    for chunk in conn.take():
                        yield chunk
                elif conn.complete:
                    return
                else:
                    await conn.wait(self._timeout)
        finally:
            self.release()

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn)

    def _connection(self) -> _Connection:
        if self._conn is None:
            raise RuntimeError("the response was already released")
        return self._conn


class HttpPool:
    """Keep-alive connections to upstreams, at most `max_per_upstream` at once to each.

    `request()` sends one request and returns once the response headers arrived; raises
    `UpstreamError` (refused, reset, closed early, malformed) or `TimeoutError`.
    """

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        idle_seconds: float = IDLE_SECONDS,
        max_per_upstream: int = MAX_PER_UPSTREAM,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._idle_seconds = idle_seconds
        self._max = max_per_upstream
        self._idle: dict[Key, list[_Connection]] = {}
        self._active: dict[Key, int] = {}
        self._queued: dict[Key, deque[asyncio.Future[None]]] = {}
        self._open: set[_Connection] = set()
        self._closing = False
        #: SO_MARK of every new connection (0: none); the instances' network lets through only
        #: the shell's marked connections to an instance's address (`marked_socket`)
        self.mark = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._closing = True
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()

    def _forget(self, conn: _Connection) -> None:
        """A connection closed: an idle one leaves the pool now, not when its upstream is next
        asked for (instances come and go; their ports may never be asked for again)."""
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle is not None and conn in idle:
            idle.remove(conn)
            if not idle:
                del self._idle[conn.key]

    @property
    def idle_count(self) -> int:
        return sum(len(conns) for conns in self._idle.values())

    async def request(
        self,
        method: str,
        host: str,
        port: int,
        target: bytes,
        headers: Headers,
        body: bytes | AsyncIterator[bytes] | None = None,
        *,
        content_length: int | None = None,
        read_timeout: float = 30.0,
    ) -> UpstreamResponse:
        """``target`` is the request target as sent (path and query, already encoded);
        ``headers`` must not carry Host or framing headers (Content-Length, Transfer-Encoding):
        the pool sets them. A streamed ``body`` is sent with ``content_length`` when given
        (it must then be exactly that long), else chunked."""
        if self._closing:
            raise UpstreamError("the client is closed")
        key = (host, port)
        streamed = body is not None and not isinstance(body, bytes)
        retry = method in IDEMPOTENT
        head = _head(method, target, key, headers, body, content_length)
        await self._acquire(key, read_timeout)
        try:
            conn = None if streamed else self._checkout(key)
            if conn is not None:
                try:
                    return await self._exchange(
                        conn, method, head, body, content_length, read_timeout
                    )
                except _Stale as err:
                    if not retry:
                        raise UpstreamError(str(err)) from err
                    # rule 2: once more on a new connection
            conn = await self._connect(key)
            try:
                return await self._exchange(conn, method, head, body, content_length, read_timeout)
            except _Stale as err:
                raise UpstreamError(str(err)) from err
        except BaseException:
            self._settle(key)
            raise

    def release(self, conn: _Connection) -> None:
        if conn.reusable and not self._closing:
            conn.rest()
            self._idle.setdefault(conn.key, []).append(conn)
        else:
            conn.close()
            self._open.discard(conn)
        self._settle(conn.key)

    # -- internals -------------------------------------------------------------------------
    async def _acquire(self, key: Key, wait_seconds: float) -> None:
        """A slot for one exchange with ``key``: at once when fewer than the cap are busy, else
        after those queued before (rule 6), waiting at most ``wait_seconds``."""
        active = self._active.get(key, 0)
        if active < self._max:
            self._active[key] = active + 1
            return
        waiter = asyncio.get_running_loop().create_future()
        queued = self._queued.setdefault(key, deque())
        queued.append(waiter)
        try:
            async with asyncio.timeout(wait_seconds):
                await waiter  # `_settle` hands over its slot
        except BaseException as err:
            if waiter.done() and not waiter.cancelled():
                self._settle(key)  # the slot arrived with the cancellation: pass it on
            elif waiter in queued:
                queued.remove(waiter)
            if not queued and self._queued.get(key) is queued:
                del self._queued[key]
            if isinstance(err, TimeoutError):
                raise TimeoutError(
                    f"all {self._max} connections to {key[0]}:{key[1]} stayed busy for "
                    f"{wait_seconds:g} s"
                ) from None
            raise

    def _settle(self, key: Key) -> None:
        """One exchange with ``key`` is over: hand its slot to a queued request, or free it."""
        queued = self._queued.get(key)
        while queued:
            waiter = queued.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        if queued is not None:
            del self._queued[key]
        left = self._active[key] - 1
        if left:
            self._active[key] = left
        else:
            del self._active[key]  # instances come and go: their ports leave no entries behind

    def _checkout(self, key: Key) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()  # the most recently used: warmest, least likely closed
            if not conn.closed and conn.loop.time() - conn.idle_since < self._idle_seconds:
                return conn
            conn.close()
            self._open.discard(conn)
        return None

    async def _connect(self, key: Key) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                if self.mark:
                    sock = await marked_connection(loop, key[0], key[1], self.mark)
                    _, conn = await loop.create_connection(
                        lambda: _Connection(loop, key, self._forget), sock=sock
                    )
                else:
                    _, conn = await loop.create_connection(
                        lambda: _Connection(loop, key, self._forget), *key
                    )
        except OSError as err:
            raise UpstreamError(f"cannot connect to {key[0]}:{key[1]}: {err}") from err
        self._open.add(conn)
        return conn

    async def _exchange(
        self,
        conn: _Connection,
        method: str,
        head: bytes,
        body: bytes | AsyncIterator[bytes] | None,
        content_length: int | None,
        read_timeout: float,
    ) -> UpstreamResponse:
        try:
            conn.begin(method == "HEAD")
            if body is None:
                conn.write(head)
            elif isinstance(body, bytes):
                conn.write(head, body)
            else:
                conn.write(head)
                await _send_streamed(conn, body, content_length, read_timeout)
            while not conn.headers_done:
                await conn.wait(read_timeout)
        except BaseException:
            conn.close()
            self._open.discard(conn)
            raise
        return UpstreamResponse(self, conn, read_timeout)


async def _send_streamed(
    conn: _Connection, body: AsyncIterator[bytes], length: int | None, read_timeout: float
) -> None:
    """Send ``body`` (chunked when ``length`` is None). The iterator raises if its source went
    away; the connection is then closed by the caller, so a partial body is never taken as whole."""
    sent = 0
    async for chunk in body:
        if conn.headers_done or conn.closed:
            # the upstream answered (or left) early: the rest is not wanted, and the connection
            # cannot carry another exchange with half a body in it
            conn.keep_alive = False
            return
        if not chunk:
            continue
        sent += len(chunk)
        if length is None:
            conn.write(b"%x\r\n" % len(chunk), chunk, b"\r\n")
        elif sent > length:
            raise UpstreamError(f"the request body is longer than its Content-Length ({length})")
        else:
            conn.write(chunk)
        await conn.drain(read_timeout)
    if length is None:
        conn.write(b"0\r\n\r\n")
    elif sent != length:
        raise UpstreamError(f"the request body ended after {sent} of {length} bytes")


def _head(
    method: str,
    target: bytes,
    key: Key,
    headers: Headers,
    body: bytes | AsyncIterator[bytes] | None,
    content_length: int | None,
) -> bytes:
    host = b"%s:%d" % (key[0].encode("ascii"), key[1])
    parts = [method.encode("ascii"), b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n"]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    lines = len(headers) + 3  # request line, host, the headers, the blank line
    if isinstance(body, bytes):
        if body or method not in ("GET", "HEAD"):
            parts.append(b"content-length: %d\r\n" % len(body))
            lines += 1
    elif body is not None:
        if content_length is not None:
            parts.append(b"content-length: %d\r\n" % content_length)
        else:
            parts.append(b"transfer-encoding: chunked\r\n")
        lines += 1
    parts.append(b"\r\n")
    head = b"".join(parts)
    # one check for header injection: every line break is one of ours
    if head.count(b"\n") != lines or head.count(b"\r") != lines or b"\0" in head or b" " in target:
        raise ValueError("a request line or header contains a line break, NUL or space")
    return head
