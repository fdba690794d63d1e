"""The benchmark's upstream: an asyncio protocol server on httptools (keep-alive, no framework).

Routes: `/api/data/small` (200 B) and `/api/data/large` (64 KiB) from memory; for the streaming
benchmark `GET /api/data/stream?bytes=N` (Content-Length), `GET /api/data/chunked?bytes=N`
(Transfer-Encoding: chunked), `POST|PUT /api/data/sink` (any size, Content-Length or chunked,
counted and dropped, answers `{"received": N}`) and `GET /api/data/cut?bytes=N` (announces
Content-Length N, then closes the connection after N/2 bytes). Long bodies are written in 64 KiB
pieces under the transport's flow control (pause_writing/resume_writing), so the server never
buffers more than the transport's high-water mark.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import deque
from collections.abc import Iterator
from urllib.parse import parse_qs

import httptools
import uvloop

APP_ID = os.environ.get("OS_APP_ID", "bench.upstream")
INSTANCE_ID = os.environ.get("OS_INSTANCE_ID", "")
SMALL = b"s" * 200
LARGE = b"L" * 65536
HOOK = b'{"ok": true}'
PIECE_SIZE = 65536
PIECE = b"x" * PIECE_SIZE
CHUNK_FRAME = b"%x\r\n" % PIECE_SIZE + PIECE + b"\r\n"


def reply(body: bytes, content_type: bytes = b"application/octet-stream") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


RESPONSES = {
    b"/api/data/small": reply(SMALL),
    b"/api/data/large": reply(LARGE),
    b"/health": reply(json.dumps({"appId": APP_ID, "instanceId": INSTANCE_ID}).encode(),
                      b"application/json"),
}
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
STREAMED = {b"/api/data/stream", b"/api/data/chunked", b"/api/data/cut"}
SINK = b"/api/data/sink"


def pieces(size: int) -> Iterator[bytes]:
    """``size`` bytes in 64 KiB pieces (the last one shorter)."""
    full, rest = divmod(size, PIECE_SIZE)
    for _ in range(full):
        yield PIECE
    if rest:
        yield PIECE[:rest]


def head(size: int) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: "
            + str(size).encode() + b"\r\n\r\n")


def stream(size: int) -> Iterator[bytes]:
    yield head(size)
    yield from pieces(size)


def chunked(size: int) -> Iterator[bytes]:
    yield (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")
    full, rest = divmod(size, PIECE_SIZE)
    for _ in range(full):
        yield CHUNK_FRAME
    if rest:
        yield b"%x\r\n" % rest + PIECE[:rest] + b"\r\n"
    yield b"0\r\n\r\n"


class Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.received = 0
        self.transport: asyncio.WriteTransport | None = None
        #: responses still being written, each a sequence of pieces; the head one is current
        self.queue: deque[Iterator[bytes]] = deque()
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport

    def connection_lost(self, exc: Exception | None) -> None:
        self.queue.clear()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport:
                self.transport.close()

    def pause_writing(self) -> None:
        self.paused = True
        self.watch_drain()

    def watch_drain(self) -> None:
        """Debian's uvloop 0.17 sometimes never calls resume_writing once a peer that paused
        its reading resumes (seen through the shell's pool: the write buffer empty, every byte
        acknowledged, the response stalled before its last chunk). Look again every 20 ms."""
        transport = self.transport
        if not self.paused or transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size() == 0:
            self.resume_writing()
        else:
            asyncio.get_running_loop().call_later(0.02, self.watch_drain)

    def resume_writing(self) -> None:
        self.paused = False
        self.pump()

    def on_message_begin(self) -> None:
        self.received = 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.received += len(body)

    def on_message_complete(self) -> None:
        path, _, query = self.url.partition(b"?")
        self.url = b""
        if path.startswith(b"/api/lifecycle/"):
            response = (reply(b'{"path": "/"}') if path.endswith(b"onActivityCreate")
                        else reply(HOOK, b"application/json"))
        elif path == SINK:
            response = reply(json.dumps({"received": self.received}).encode(), b"application/json")
        elif path in STREAMED:
            self.send_long(path, query)
            return
        else:
            response = RESPONSES.get(path, NOT_FOUND)
        if self.queue:  # a long response is still being written: this one waits its turn
            self.queue.append(iter((response,)))
        elif self.transport:
            self.transport.write(response)

    def send_long(self, path: bytes, query: bytes) -> None:
        try:
            size = int(parse_qs(query.decode("latin-1"))["bytes"][0])
        except (KeyError, ValueError):
            size = -1
        if size < 0:
            self.queue.append(iter((BAD_REQUEST,)))
        elif path == b"/api/data/stream":
            self.queue.append(stream(size))
        elif path == b"/api/data/chunked":
            self.queue.append(chunked(size))
        else:
            self.queue.append(self.cut(size))
        self.pump()

    def cut(self, size: int) -> Iterator[bytes]:
        """Announce ``size`` bytes, send half of them, then close the connection."""
        yield head(size)
        yield from pieces(size // 2)
        if self.transport:
            self.transport.close()  # after the buffered half has been flushed

    def pump(self) -> None:
        """Write queued pieces until the transport asks to pause or nothing is left."""
        while (self.queue and not self.paused and self.transport is not None
               and not self.transport.is_closing()):
            piece = next(self.queue[0], None)
            if piece is None:
                self.queue.popleft()
            else:
                self.transport.write(piece)


async def main() -> None:
    data_dir = os.environ.get("OS_DATA_DIR")
    if data_dir:  # the benchmark calls the shell as this app (bench.caller is a copy)
        with open(os.path.join(data_dir, "token"), "w") as token:  # noqa: PTH123, ASYNC230
            token.write(os.environ.get("OS_APP_TOKEN", ""))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Protocol, os.environ.get("OS_HOST", "127.0.0.1"),
                                      int(os.environ["OS_PORT"]), backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    # new_event_loop, not uvloop.run: Debian's python3-uvloop (0.17) predates uvloop.run
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(main())
