"""Run the API under uvicorn on a socket bound first, so port 0 works and the real URL is known."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import gc
import http
import json
import logging
import signal
import socket
import struct
import termios
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Final

import httptools
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from atrium.api.app import AtriumApp, create_app
from atrium.api.errors import CONNECTION_EXTENSION
from atrium.errors import AtriumError, HeadersTooLarge, InvalidRequest
from atrium.lifecycle.network import Network
from atrium.settings import ConfigError, Settings, setting_name
from atrium.shell import Shell, open_shell

_LOGGER = logging.getLogger(__name__)
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: the most bytes of request line and headers one request may send (httptools sets no limit)
MAX_HEAD_BYTES: Final = 64 << 10
_RESET_ON_CLOSE: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends RST
#: request body pieces shorter than this are gathered into one buffer (`BodyPieces`)
SMALL_PIECE: Final = 4096
#: bind to an address no interface holds (yet): the shell's on its bridge, made later
IP_FREEBIND: Final = 15
#: seconds given at shutdown to the requests cancelled after uvicorn's grace to write their
#: `503 shutting_down` (their cleanup: a trial instance removed, a staging folder deleted)
ANSWER_GRACE: Final = 5.0


class _HeldWrites:
    """A transport that holds one write until the next write or the end of the loop iteration.

    uvicorn writes a response's head and its body in two `write` calls, each a `send` system call
    on loopback; holding the head lets both leave in one `writev`. Anything but `write` and
    `close` passes straight to the real transport.
    """

    __slots__ = ("_closed", "_eof", "_held", "_loop", "_transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        closed: Callable[[], None],
    ) -> None:
        self._transport = transport
        self._loop = loop
        #: told after every close (the shell's or uvicorn's)
        self._closed = closed
        self._held: bytes | None = None
        #: half-closed (a refusal was the last word): later writes are dropped, not errors
        self._eof = False

    def write(self, data: bytes) -> None:
        if self._eof:
            return
        held = self._held
        if held is None:
            if data:
                self._held = data
                self._loop.call_soon(self.flush)
            return
        self._held = None
        self._transport.writelines((held, data))

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()
        self._closed()

    def is_closing(self) -> bool:  # asked several times per request: not through __getattr__
        return self._transport.is_closing()

    def write_eof(self) -> None:
        self.flush()
        self._eof = True
        self._transport.write_eof()

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


class BodyPieces:
    """A request body as the pieces the parser gave, standing in for uvicorn's `bytearray`.

    uvicorn appends each piece to a `bytearray` (a copy) and hands the app `bytes(...)` of it (a
    second copy). Kept as pieces, the usual case, one piece per read, reaches the app as the very
    `bytes` object the parser made: an upload crosses the shell with two copies fewer. Pieces
    under `SMALL_PIECE` (a body sent in tiny chunks) are gathered in one `bytearray` as uvicorn
    did, so a body waiting to be read is held in a few dozen objects at most, never one per
    chunk (a 1-byte chunk as a `bytes` of its own would cost ~35 bytes). It offers what uvicorn
    does with the body: `+=`, `len` and `bytes`.
    """

    __slots__ = ("_pieces", "_size", "_small")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._small = bytearray()
        self._size = 0

    def __iadd__(self, piece: bytes) -> BodyPieces:
        if len(piece) < SMALL_PIECE:
            self._small += piece
        else:
            if self._small:
                self._pieces.append(bytes(self._small))
                self._small = bytearray()
            self._pieces.append(piece)
        self._size += len(piece)
        return self

    def __len__(self) -> int:
        return self._size

    @property
    def held(self) -> int:
        """How many objects hold the body (the bound the class keeps)."""
        return len(self._pieces) + (1 if self._small else 0)

    def __bytes__(self) -> bytes:
        pieces = [*self._pieces, bytes(self._small)] if self._small else self._pieces
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)


#: the headers that announce a request body
_FRAMING: Final = frozenset({b"content-length", b"transfer-encoding"})


def _head_too_large() -> HeadersTooLarge:
    return HeadersTooLarge(
        f"the request line and headers are longer than {MAX_HEAD_BYTES} bytes",
        limit=MAX_HEAD_BYTES,
    )


class _StopParsing(Exception):
    """Raised inside a parser callback to end the parse (the protocol has noted why)."""


class _Flow(FlowControl):
    """uvicorn's flow control, telling the connection when the shell reads again: a body the
    shell stopped reading (its handler is not ready for more) is not the client's stall."""

    def __init__(self, transport: asyncio.Transport, resumed: Callable[[], None]) -> None:
        super().__init__(transport)
        self._resumed = resumed

    def resume_reading(self) -> None:
        if self.read_paused:
            super().resume_reading()
            self._resumed()


class _Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing each response's head and body together, with limits
    on request heads that uvicorn lacks (issue 13, "also seen"):

    - **Head deadline.** A connection must finish each request's line and headers within
      ``head_timeout`` seconds of when the shell starts waiting for them (the connection opened,
      or the previous request was read); otherwise it is closed without an answer. uvicorn's own
      keep-alive timer covers only an idle connection, and only after a first response: 1,500
      half-sent requests were all held open.
    - **Stalls.** Once a request's head is read and while its body is not complete, a
      connection that sends no byte for ``stall`` seconds is closed without an answer (its
      handler sees the client gone). The time counts only while the client may send: not while
      the shell has paused reading (flow control: the handler is not ready for more) nor while
      an `Expect: 100-continue` client waits for the shell's go-ahead. The other way, a client
      that reads nothing of its answers for ``stall`` seconds while the shell's writes wait on
      it is reset (a client that pipelines requests and never reads held its handler for ever),
      also once the connection is closing: a close waits for what is unsent, and a client that
      never reads would hold a closing connection for ever. After an answer, the rest of that
      request's body does not keep the connection from its idle close.
    - **Head size.** More than `MAX_HEAD_BYTES` of request head, or of a chunked body's trailers,
      is `431 headers_too_large`, then the connection closes (httptools buffers a header of any
      length, and uvicorn keeps every trailer): counted both as the parser reports each line
      and as raw bytes that end no head and carry no body.
    - **Malformed requests.** Bytes that are not HTTP/1.1 get `400 bad_request` naming what the
      parser found wrong (uvicorn answers a text 400 and logs a warning for each, which any
      client could fill the log with), after the answers to the requests before them
      (pipelining: uvicorn's 400 went out first and those answers were lost). A request asking
      to switch protocols is answered as it is, then the connection closes: the parser reads
      nothing after it, so a request pipelined behind it would wait for ever.
    - **Abort.** Each request's scope carries ``extensions["atrium.connection"]["abort"]``, which
      resets the connection at once, dropping whatever is still buffered: the event stream uses it
      for a subscriber the bus dropped as too slow, whose writes are stuck behind a full socket.
    """

    head_timeout: float = 10.0
    stall: float = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._lost = False
        held = _HeldWrites(transport, self.loop, self._closing)
        super().connection_made(held)  # type: ignore[arg-type]
        self.flow = _Flow(self.transport, self._body_progress)
        self._awaiting_head = True
        self._heads_read = 0
        #: raw bytes read since a head ended or body came (a head or trailers being sent)
        self._head_bytes = 0
        #: the request line and header lines of the message being read, trailers included
        self._parsed_bytes = 0
        #: whether the read being handled carried body bytes
        self._body_seen = False
        #: the request whose handler is answering now (others wait in `pipeline`)
        self._answering: RequestResponseCycle | None = None
        #: the answer to the request a parser callback stopped (`_StopParsing`)
        self._stopped_by: AtriumError | None = None
        #: a refused request's bytes are dropped from then on (`_refuse`)
        self._refused = False
        #: the refusal to write once the requests before it are answered
        self._refusal: bytes | None = None
        #: the connection's one timer (`_reset_clock`), for the deadlines below
        self._clock: asyncio.TimerHandle | None = None
        self._clock_at = 0.0
        #: when the head being awaited must be complete
        self._head_deadline: float | None = None
        #: when a request body with no byte since is stalled (`stall`)
        self._body_deadline: float | None = None
        #: when a client that has read nothing of an answer waiting on it is stalled (`stall`),
        #: and how much was waiting for it then
        self._write_deadline: float | None = None
        self._write_left = 0
        #: when a connection that has said nothing since its last answer is closed (uvicorn's
        #: keep-alive, docs/api.md "Conventions"); cleared by the first byte of the next request
        self._idle_deadline: float | None = None
        #: the same for every request of the connection (nothing writes to it)
        self._extensions: dict[str, dict[object, object]] = {
            CONNECTION_EXTENSION: {"abort": self.abort, "stopping": self._is_stopping}
        }
        #: the server has begun its shutdown (`shutdown`): a request still running when its
        #: grace ends is cancelled, and answered `503 shutting_down` (`errors.guard`)
        self._stopping = False
        self._arm_head_timer()

    def shutdown(self) -> None:
        """The server's shutdown has begun (uvicorn: finish the answer in flight, then close)."""
        self._stopping = True
        super().shutdown()

    def _is_stopping(self) -> bool:
        return self._stopping

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True  # uvicorn closes the transport below: nothing is left to watch
        self._stop_clock()
        # uvicorn tells only the newest request; the one answering (pipelining) would write on
        # into the closed transport, an error and a traceback in the log for each
        for cycle in (self._answering, *(queued for queued, _ in self.pipeline)):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the rest of a refused request: read and dropped until the deadline
        heads_read = self._heads_read
        self._body_seen = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            refusal = self._stopped_by or InvalidRequest(
                f"the request is not valid HTTP/1.1: {err}"
            )
            _LOGGER.info("refused a request: %s", refusal.message)
            self._refuse(refusal)
            return
        except httptools.HttpParserUpgrade:
            # no protocol to switch to: answered as a plain request, then closed, and nothing
            # after it is read (the parser stops at an upgrade)
            self._refused = True
            if self.cycle is not None:
                self.cycle.keep_alive = False
            return
        cycle = self.cycle
        if self._awaiting_head or cycle is None or not cycle.response_complete:
            # a byte of a request not yet answered: the connection is not idle (the rest of an
            # answered request's body is no reason to keep it open)
            self._unset_keepalive_if_required()
        if heads_read != self._heads_read or self._body_seen:
            self._head_bytes = 0
        else:  # all of this read was head, trailers or chunk framing
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._refuse(_head_too_large())
                return
        if not self._awaiting_head:  # this read ended inside a body: more is due in time
            self._body_progress()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = self._extensions
        self._parsed_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._parsed_bytes += len(url)
        if self._parsed_bytes > MAX_HEAD_BYTES:
            self._stop(_head_too_large())
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        """uvicorn's, counting each line (a trailer too) against `MAX_HEAD_BYTES`."""
        self._parsed_bytes += len(name) + len(value)
        if self._parsed_bytes > MAX_HEAD_BYTES:
            self._stop(_head_too_large())
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def _stop(self, refusal: AtriumError) -> None:
        """End the parse from inside a callback; ``refusal`` answers the request."""
        self._stopped_by = refusal
        raise _StopParsing

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        # a `bytearray` is uvicorn's fresh, empty body: the pieces stand in for it (BodyPieces)
        if cycle is not None and type(cycle.body) is bytearray:
            cycle.body = BodyPieces()  # type: ignore[assignment]
        self._body_seen = True
        super().on_body(body)

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._heads_read += 1
        self._head_bytes = 0
        self._cancel_head_timer()
        if self.parser.should_upgrade() and any(
            name in _FRAMING and value != b"0" for name, value in self.headers
        ):
            # the parser takes whatever follows an upgrade request as the new protocol's, so
            # its body would be lost and the request answered as if it had none
            self._awaiting_head = True
            self._stop(
                InvalidRequest(
                    "the request is not valid HTTP/1.1: a request asking to switch protocols "
                    "(Upgrade) cannot carry a body here; send it without Upgrade"
                )
            )
        try:
            super().on_headers_complete()
        except (httptools.HttpParserInvalidURLError, ValueError) as err:
            # uvicorn parses the target as a URL and it is none: no request began
            self._awaiting_head = True
            self._stop(
                InvalidRequest(
                    f"the request is not valid HTTP/1.1: the request target is not a valid URL "
                    f"({err})"
                )
            )

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._answering = cycle
        super()._start_asgi_task(cycle, app)

    def pause_writing(self) -> None:
        """The client stopped reading: it has `stall` seconds to read on."""
        super().pause_writing()
        self._watch_reading(self.loop.time(), self._unsent())

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_deadline = None

    def _unsent(self) -> int:
        """Bytes of answers the client has not taken yet: the transport's buffer and the
        kernel's send queue (which is what drains, in steps, while a slow client reads)."""
        left = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
                left += struct.unpack("i", queued)[0]
        return left

    def _closing(self) -> None:
        """The transport is closing: a close waits for what is unsent, so what is unsent must
        keep moving to the client, or the connection is reset after `stall` seconds."""
        if self._lost:
            return
        self._head_deadline = self._idle_deadline = self._body_deadline = None
        left = self._unsent()
        if left:
            self._watch_reading(self.loop.time(), left)

    def _watch_reading(self, now: float, left: int) -> None:
        """``left`` bytes wait for the client: fewer must be left `stall` seconds from now."""
        self._write_left, self._write_deadline = left, now + self.stall
        self._reset_clock()

    def _busy(self) -> bool:
        """Whether a request before the one being read is still being answered."""
        answering = self._answering
        return bool(self.pipeline) or (
            answering is not None and not answering.response_complete and not answering.disconnected
        )

    def on_message_complete(self) -> None:
        self._awaiting_head = True
        self._body_deadline = None
        self._arm_head_timer()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """uvicorn's, with its keep-alive timer on the connection's one clock (`_reset_clock`)
        rather than a timer made and cancelled for every request."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:  # a pipelined request waits for this response: it starts now
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self._refusal is not None:  # the refused request's turn
            self._send_refusal()
        else:
            # idle from now until its next byte, whatever state the request was in (an answer
            # given before the body arrived, e.g. a 401 to an `Expect: 100-continue` upload)
            self._idle_deadline = self.loop.time() + self.timeout_keep_alive
            if self._awaiting_head:
                self._arm_head_timer()  # the wait for the next head starts now
            else:
                self._reset_clock()

    def _unset_keepalive_if_required(self) -> None:
        """A byte of the next request arrived: the connection is not idle (uvicorn's hook)."""
        self._idle_deadline = None

    def abort(self) -> None:
        """Reset the connection now (RST), discarding what is buffered either way."""
        if not self.transport.is_closing():
            self._reset()

    def _reset(self) -> None:
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        self.transport.abort()

    def _arm_head_timer(self) -> None:
        """The next head is due ``head_timeout`` from now."""
        self._head_deadline = self.loop.time() + self.head_timeout
        self._reset_clock()

    def _cancel_head_timer(self) -> None:
        self._head_deadline = None

    def _body_progress(self) -> None:
        """The body being read may stall for `stall` from now (a byte came, or the shell
        reads again after a pause)."""
        if not self._awaiting_head:
            self._body_deadline = self.loop.time() + self.stall
            self._reset_clock()

    def _reset_clock(self) -> None:
        """Make the connection's one timer fire no later than its nearest deadline.

        A deadline that moves later costs no timer: the timer, when it fires early, sleeps again
        until the deadline then due. Only a deadline earlier than the timer makes a new one (the
        first idle wait after a head deadline): in steady use a connection makes a timer every few
        seconds, not two per request (measured on the data path)."""
        when: float | None = None
        for due in (
            self._idle_deadline,
            self._head_deadline,
            self._body_deadline,
            self._write_deadline,
        ):
            if due is not None and (when is None or due < when):
                when = due
        if when is None:
            return
        if self._clock is not None:
            if self._clock_at <= when:
                return
            self._clock.cancel()
        self._clock_at = when
        self._clock = self.loop.call_at(when, self._clock_fired)

    def _stop_clock(self) -> None:
        self._head_deadline = self._idle_deadline = None
        self._body_deadline = self._write_deadline = None
        if self._clock is not None:
            self._clock.cancel()
            self._clock = None

    def _clock_fired(self) -> None:
        self._clock = None
        now = self.loop.time()
        if self.transport.is_closing():
            if self._write_deadline is not None:
                self._check_reading(now)
            return
        if self._idle_deadline is not None and now >= self._idle_deadline:
            self.transport.close()  # idle since its last answer for the keep-alive time
            return
        body = self._body_deadline
        if body is not None and now >= body:
            cycle = self.cycle
            if self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue):
                self._body_deadline = now + self.stall  # the wait is the shell's
            else:
                _LOGGER.info(
                    "closed a connection whose request body sent nothing for %g s", self.stall
                )
                self.transport.close()
                return
        if self._write_deadline is not None and not self._check_reading(now):
            return
        head = self._head_deadline
        if head is not None and now >= head:
            if not self._awaiting_head:
                self._head_deadline = None
            elif self._busy():
                self._arm_head_timer()  # still answering the previous request: its time is its own
                return
            else:
                self.transport.close()
                return
        self._reset_clock()

    def _check_reading(self, now: float) -> bool:
        """At or after the write deadline: False when the client read nothing since (the
        connection is reset), else the deadline moves on."""
        deadline = self._write_deadline
        if deadline is None or now < deadline:
            self._reset_clock()
            return True
        left = self._unsent()
        if left < self._write_left:  # it reads, slowly: another stall time from now
            self._watch_reading(now, left)
            return True
        _LOGGER.info("reset a connection whose client read nothing for %g s", self.stall)
        self._reset()  # what is buffered for it cannot be delivered: dropped
        return False

    def _refuse(self, err: AtriumError) -> None:
        """Answer the request being read with ``err`` and read nothing more of the connection,
        once the requests before it are answered (in order, as pipelining needs).

        When its head was complete, its handler has started or is queued: a queued one never
        runs, a running one hears the client gone and its answer goes nowhere (one already
        under way cannot be replaced: the connection is cut instead)."""
        self._refused = True
        cycle = self.cycle
        if not self._awaiting_head and cycle is not None:  # the broken part is cycle's body
            cycle.waiting_for_100_continue = False  # it will never be read: no go-ahead
            if self.pipeline and self.pipeline[0][0] is cycle:
                self.pipeline.popleft()
            elif cycle.response_started:
                self.transport.close()
                return
            else:
                cycle.disconnected = cycle.response_complete = True
                cycle.message_event.set()
        body = json.dumps(err.to_body(), separators=(",", ":")).encode()
        status = err.http_status
        self._refusal = (
            b"HTTP/1.1 %d %s\r\n"
            % (status, http.HTTPStatus(status).phrase.encode())
            + b"content-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n"
            b"connection: close\r\n\r\n" + body
        )
        if not self._busy():
            self._send_refusal()

    def _send_refusal(self) -> None:
        """Write the refusal, then half-close and keep reading (and dropping) until the client
        closes or the head deadline passes: closing with its bytes unread would reset the
        connection, and the client would lose the answer."""
        refusal, self._refusal = self._refusal, None
        if refusal is None or self.transport.is_closing():
            return
        self.transport.write(refusal)
        self.transport.write_eof()
        self._awaiting_head = True
        self._body_deadline = None
        self._arm_head_timer()
        self.flow.resume_reading()  # drained, whatever paused it


def settle_heap() -> None:
    """Collect once, then move every object alive now (modules, the app registry, settings,
    models: tens of thousands) out of the garbage collector's sight. A full collection then walks
    only what serving made, instead of pausing every request in flight for the whole start-up
    heap: that pause was the data path's p99 tail at 32 connections. For a process that is the
    shell (`atrium serve`), once it is open: in a process that hosts other work (tests start
    shells in their own process) it would keep that work's garbage forever."""
    gc.collect()
    gc.freeze()


def protocol_for(settings: Settings) -> type[_Protocol]:
    """The protocol class with this shell's head deadline and stall time."""
    return type(
        "ShellProtocol",
        (_Protocol,),
        {
            "head_timeout": settings.header_timeout_seconds,
            "stall": settings.stall_seconds,
        },
    )


def _bind_to_device(sock: socket.socket, device: bytes) -> None:
    """``sock`` takes only what arrives on ``device`` (a socket the server closed: nothing)."""
    if sock.fileno() != -1:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device)


class _Server(uvicorn.Server):
    """Ends every event stream as soon as shutdown begins, so open streams never hold it up."""

    def __init__(self, config: uvicorn.Config, app: AtriumApp) -> None:
        super().__init__(config)
        self._app = app
        self._wake: asyncio.Event | None = None
        self._wake_loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        """uvicorn's, but a request to stop (`wake`) ends the wait at once: uvicorn's looks at
        ``should_exit`` every 0.1 s, so each stop waited up to that long for nothing."""
        self._wake = asyncio.Event()
        self._wake_loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)
            should_exit = await self.on_tick(counter)

    def wake(self) -> None:
        """Make the main loop look at ``should_exit`` now; safe from any thread and from a
        signal handler (the event is set on the loop's own thread)."""
        loop, event = self._wake_loop, self._wake
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self.wake()

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM start a graceful shutdown that ends with exit status 0 (uvicorn would
        re-raise the signal afterwards, killing the process before `serve` can clean up)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's: the requests in flight get a grace, then their tasks are cancelled. Those
        answer `503 shutting_down` as they end (`errors.guard`); they are given that moment here,
        before the shell they may still be using is closed."""
        shell: Shell | None = getattr(self._app.state, "shell", None)
        if shell is not None:
            shell.bus.close()
        await super().shutdown(sockets)
        cancelled = set(self.server_state.tasks)
        if cancelled:
            await asyncio.wait(cancelled, timeout=ANSWER_GRACE)


def cannot_listen(host: str, port: int, err: OSError) -> str:
    """The one-line report of a socket that could not be bound."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    port_name = setting_name("port", ("port",))
    if err.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {address}: the address is already in use; choose another port "
            f"with {port_name} (0 for any free port)"
        )
    return (
        f"cannot listen on {address}: {err.strerror or err}; check "
        f"{setting_name('host', ('host',))} and {port_name}"
    )


class ShellServer:
    """One shell on one listening socket."""

    def __init__(self, settings: Settings, user_token: str) -> None:
        self.socket = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((settings.host, settings.port))
        except OSError as err:  # every bind failure is about the host or port the user chose
            self.socket.close()
            raise ConfigError(cannot_listen(settings.host, settings.port, err)) from err
        self.socket.listen(2048)
        self.socket.setblocking(False)
        port = self.socket.getsockname()[1]
        self.settings = settings.model_copy(update={"port": port})
        self._user_token = user_token
        self.app = create_app(self.settings)
        config = uvicorn.Config(
            self.app,
            loop="none",
            http=protocol_for(self.settings),
            ws="none",
            # the shell is opened by `serve` below, not in an ASGI lifespan: a ConfigError found
            # while opening it (a damaged KV file or scope repository) then reaches the caller as
            # itself, not as a logged traceback and uvicorn's exit status 3
            lifespan="off",
            timeout_graceful_shutdown=3,
            log_config=None,
            access_log=False,
            server_header=False,
            # X-Forwarded-For is read by AtriumApp, and only from ATRIUM_TRUSTED_PROXIES
            proxy_headers=False,
        )
        self._server = _Server(config, self.app)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://localhost:{self.settings.port}"

    @property
    def started(self) -> bool:
        return self._server.started

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Open the shell, call ``ready`` (nothing is served before), serve until asked to stop,
        then close the shell. SIGINT/SIGTERM while the shell opens stop it as soon as it is open."""
        self._loop = asyncio.get_running_loop()
        try:
            with self._server.capture_signals():
                async with open_shell(self.settings, self._user_token) as shell:
                    # open_shell closes the bus (ending every stream) on the way out; the server's
                    # own shutdown closes it first, so open streams never hold up the shutdown
                    self.app.state.shell = shell
                    if shell.network is not None:  # its instances are no proxy of anyone's
                        self.app.distrust(shell.network.plan.range)
                    extra = self._bridge_socket(shell.network)
                    if ready is not None:
                        ready()
                    try:
                        await self._server.serve(sockets=[self.socket, *extra])
                    finally:
                        for sock in extra:
                            sock.close()
        finally:
            self.socket.close()  # also when the shell failed to open: the port is let go

    def _bridge_socket(self, network: Network | None) -> list[socket.socket]:
        """The shell's port on its bridge, where instances reach the API (none when the shell
        listens on every address already, or has no network of its instances)."""
        if network is None or self.settings.host in ("", "0.0.0.0", "::"):  # noqa: S104
            return []
        sock = socket.socket(socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bridge = network.plan.bridge.encode()
        try:
            # only what arrives on the bridge: a neighbour on the host's network that routes the
            # range to this machine would otherwise reach a shell that listens on loopback. The
            # bridge waits for the first instance: until then the socket is bound to an address
            # no interface holds yet (IP_FREEBIND) on loopback, where nothing arrives for it,
            # and moves to the bridge once it is up (a listening socket's device is looked at
            # for every connection, so no new bind is needed)
            sock.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_BINDTODEVICE, bridge if network.bridged else b"lo"
            )
            sock.bind((str(network.plan.shell_address), self.settings.port))
            network.on_bridge.append(lambda: _bind_to_device(sock, bridge))
        except OSError as err:
            sock.close()
            raise ConfigError(
                cannot_listen(str(network.plan.shell_address), self.settings.port, err)
            ) from err
        sock.listen(2048)
        sock.setblocking(False)
        return [sock]

    def request_exit(self) -> None:
        """Ask the server to stop; safe from any thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(setattr, self._server, "should_exit", True)
            self._server.wake()  # after the line above: the loop sets should_exit first
        else:
            self._server.should_exit = True
