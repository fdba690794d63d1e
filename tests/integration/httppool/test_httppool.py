"""The data proxy's HTTP/1.1 client pool against real sockets: keep-alive, framing, failures.

Each test serves a scripted upstream with asyncio streams on 127.0.0.1 (and runs under both the
standard event loop and uvloop: see conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from atrium.httppool import HttpPool, UpstreamError

pytestmark = pytest.mark.integration

Handler = Callable[["Exchange"], Awaitable[bool]]


@dataclass
class Exchange:
    """One request as the upstream read it, and the stream to answer on."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    writer: asyncio.StreamWriter
    connection: int


@dataclass
class Upstream:
    """A scripted HTTP/1.1 server: ``handler`` answers each request and says whether the
    connection stays open; requests and connections are counted."""

    handler: Handler
    port: int = 0
    connections: int = 0
    requests: list[Exchange] = field(default_factory=list)
    open_now: int = 0
    most_open: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        number = self.connections
        try:
            while True:
                exchange = await read_request(reader, writer, number)
                if exchange is None:
                    return
                self.requests.append(exchange)
                if not await self.handler(exchange):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self.open_now -= 1
            writer.close()


async def read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: int
) -> Exchange | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    return Exchange(method, target, headers, body, writer, connection)


def answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


async def echo(exchange: Exchange) -> bool:
    exchange.writer.write(
        answer(f"{exchange.method} {exchange.target} {len(exchange.body)}".encode())
    )
    await exchange.writer.drain()
    return True


@contextlib.asynccontextmanager
async def upstream(handler: Handler) -> AsyncIterator[Upstream]:
    up = Upstream(handler)
    server = await asyncio.start_server(up.serve, "127.0.0.1", 0)
    up.port = server.sockets[0].getsockname()[1]
    async with server:
        yield up
        # let the server's handlers see their clients go before the server and loop close
        for _ in range(100):
            if not up.open_now:
                break
            await asyncio.sleep(0.01)


async def get(pool: HttpPool, up: Upstream, target: bytes = b"/x", **kwargs: object) -> bytes:
    response = await pool.request("GET", "127.0.0.1", up.port, target, [], **kwargs)  # type: ignore[arg-type]
    return await response.read()


async def test_keep_alive_reuses_one_connection() -> None:
    async with upstream(echo) as up, HttpPool() as pool:
        for n in range(3):
            assert await get(pool, up, f"/x?n={n}".encode()) == f"GET /x?n={n} 0".encode()
        assert up.connections == 1
        assert pool.idle_count == 1
        assert up.requests[0].headers["host"] == f"127.0.0.1:{up.port}"


async def test_headers_pass_and_bodies_are_framed() -> None:
    async with upstream(echo) as up, HttpPool() as pool:
        response = await pool.request(
            "POST", "127.0.0.1", up.port, b"/p", [(b"x-one", b"1")], b"hello"
        )
        assert (response.status, await response.read()) == (200, b"POST /p 5")
        empty = await pool.request("PUT", "127.0.0.1", up.port, b"/p", [], b"")
        assert await empty.read() == b"PUT /p 0"
        assert up.requests[0].headers["x-one"] == "1"
        assert up.requests[1].headers["content-length"] == "0"
        assert "content-length" not in (await _get_headers(pool, up))


async def _get_headers(pool: HttpPool, up: Upstream) -> dict[str, str]:
    await get(pool, up)
    return up.requests[-1].headers


async def test_a_chunked_answer_is_read_whole_and_streamed() -> None:
    async def chunked(exchange: Exchange) -> bool:
        exchange.writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )
        await exchange.writer.drain()
        return True

    async with upstream(chunked) as up, HttpPool() as pool:
        assert await get(pool, up) == b"hello world"
        response = await pool.request("GET", "127.0.0.1", up.port, b"/", [])
        assert response.content_length is None
        assert b"".join([c async for c in response.iter_chunks()]) == b"hello world"
        assert up.connections == 1


async def test_a_body_ended_by_closing_is_read_and_the_connection_is_not_kept() -> None:
    async def until_close(exchange: Exchange) -> bool:
        exchange.writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await exchange.writer.drain()
        return False

    async with upstream(until_close) as up, HttpPool() as pool:
        assert await get(pool, up) == b"all of it"
        assert await get(pool, up) == b"all of it"
        assert up.connections == 2
        assert pool.idle_count == 0


async def test_head_204_and_304_have_no_body_and_keep_the_connection() -> None:
    async def no_body(exchange: Exchange) -> bool:
        if exchange.method == "HEAD":
            exchange.writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
        elif exchange.target == "/204":
            exchange.writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        else:
            exchange.writer.write(b"HTTP/1.1 304 Not Modified\r\ncontent-length: 7\r\n\r\n")
        await exchange.writer.drain()
        return True

    async with upstream(no_body) as up, HttpPool() as pool:
        head = await pool.request("HEAD", "127.0.0.1", up.port, b"/", [])
        assert (head.status, head.content_length, await head.read()) == (200, 1000, b"")
        for target, status in ((b"/204", 204), (b"/304", 304)):
            response = await pool.request("GET", "127.0.0.1", up.port, target, [])
            assert (response.status, await response.read()) == (status, b"")
        assert up.connections == 1


async def test_an_interim_100_continue_is_skipped() -> None:
    async def continue_first(exchange: Exchange) -> bool:
        exchange.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"final", "201 Created"))
        await exchange.writer.drain()
        return True

    async with upstream(continue_first) as up, HttpPool() as pool:
        response = await pool.request("POST", "127.0.0.1", up.port, b"/", [], b"x")
        assert (response.status, await response.read()) == (201, b"final")
        assert await get(pool, up) == b"final"
        assert up.connections == 1


async def test_an_upstream_closing_mid_body_fails_and_does_not_poison_the_pool() -> None:
    async def cut(exchange: Exchange) -> bool:
        if exchange.target == "/cut":
            exchange.writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"x" * 500)
            await exchange.writer.drain()
            return False
        return await echo(exchange)

    async with upstream(cut) as up, HttpPool() as pool:
        assert await get(pool, up) == b"GET /x 0"
        response = await pool.request("GET", "127.0.0.1", up.port, b"/cut", [])
        with pytest.raises(UpstreamError, match="closed"):
            await response.read()
        streamed = await pool.request("GET", "127.0.0.1", up.port, b"/cut", [])
        with pytest.raises(UpstreamError):
            async for _ in streamed.iter_chunks():
                pass
        assert pool.idle_count == 0
        assert [await get(pool, up) for _ in range(2)] == [b"GET /x 0"] * 2
        assert up.connections == 3  # the first, the cut one's, and one for the rest


async def test_a_stale_reused_connection_is_retried_for_idempotent_methods_only() -> None:
    async def one_per_connection(exchange: Exchange) -> bool:
        if sum(r.connection == exchange.connection for r in up.requests) > 1:
            return False  # closes without answering, as a server that timed the idle one out
        return await echo(exchange)

    async with upstream(one_per_connection) as up, HttpPool() as pool:
        assert await get(pool, up) == b"GET /x 0"
        assert await get(pool, up) == b"GET /x 0"  # reused, closed unanswered, sent again
        assert up.connections == 2
        with pytest.raises(UpstreamError):
            await pool.request("POST", "127.0.0.1", up.port, b"/x", [], b"once")
        assert [r.method for r in up.requests].count("POST") == 1


async def test_an_idle_connection_the_upstream_closes_leaves_the_pool_at_once() -> None:
    async def answer_then_close(exchange: Exchange) -> bool:
        exchange.writer.write(answer(b"bye"))  # keep-alive announced, then the server leaves
        await exchange.writer.drain()
        return False

    async with upstream(answer_then_close) as up, HttpPool() as pool:
        assert await get(pool, up) == b"bye"
        for _ in range(100):
            if not pool.idle_count:
                break
            await asyncio.sleep(0.01)
        assert pool.idle_count == 0


async def test_silence_is_a_timeout_and_refusal_an_upstream_error() -> None:
    async def silent(exchange: Exchange) -> bool:
        await asyncio.sleep(5)
        return False

    async with upstream(silent) as up, HttpPool() as pool:
        with pytest.raises(TimeoutError):
            await get(pool, up, read_timeout=0.2)
        assert pool.idle_count == 0
        port = up.port
    async with HttpPool() as pool:
        with pytest.raises(UpstreamError, match="cannot connect"):
            await pool.request("GET", "127.0.0.1", port, b"/", [])


async def pieces(total: int, size: int = 65536) -> AsyncIterator[bytes]:
    for start in range(0, total, size):
        yield b"u" * min(size, total - start)


async def test_streamed_uploads_are_sent_chunked_or_with_their_length() -> None:
    async with upstream(echo) as up, HttpPool() as pool:
        total = 5 * 1024 * 1024
        chunked = await pool.request("POST", "127.0.0.1", up.port, b"/up", [], pieces(total))
        assert await chunked.read() == f"POST /up {total}".encode()
        sized = await pool.request(
            "PUT", "127.0.0.1", up.port, b"/up", [], pieces(total), content_length=total
        )
        assert await sized.read() == f"PUT /up {total}".encode()
        assert up.requests[0].headers["transfer-encoding"] == "chunked"
        assert up.requests[1].headers["content-length"] == str(total)


async def test_an_upload_shorter_than_its_length_fails_and_closes() -> None:
    async with upstream(echo) as up, HttpPool() as pool:
        with pytest.raises(UpstreamError, match="ended after 100 of 200"):
            await pool.request(
                "POST", "127.0.0.1", up.port, b"/", [], pieces(100), content_length=200
            )
        assert pool.idle_count == 0


async def test_an_early_answer_stops_the_upload_and_the_connection_is_not_reused() -> None:
    finished = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"z" * 65536
            await asyncio.sleep(0.001)

    async def refuse_at_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer(b"too big", "413 Content Too Large"))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
            while await reader.read(65536):
                pass
        writer.close()
        finished.set()

    server = await asyncio.start_server(refuse_at_headers, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, HttpPool() as pool:
        response = await pool.request("POST", "127.0.0.1", port, b"/", [], endless())
        assert (response.status, await response.read()) == (413, b"too big")
        assert pool.idle_count == 0
        await asyncio.wait_for(finished.wait(), 5)


async def test_a_large_answer_streams_with_reading_paused_for_a_slow_reader() -> None:
    total = 32 * 1024 * 1024

    async def big(exchange: Exchange) -> bool:
        exchange.writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {total}\r\n\r\n".encode())
        block = b"b" * 65536
        for _ in range(total // len(block)):
            exchange.writer.write(block)
            await exchange.writer.drain()
        return True

    async with upstream(big) as up, HttpPool() as pool:
        response = await pool.request("GET", "127.0.0.1", up.port, b"/", [])
        assert response.content_length == total
        received = 0
        async for chunk in response.iter_chunks():
            received += len(chunk)
            assert pool_buffered(response) <= 2 * 1024 * 1024
            await asyncio.sleep(0)
        assert received == total
        assert pool.idle_count == 1
        assert len(await get(pool, up)) == total  # read whole: reading never pauses
        assert up.connections == 1


def pool_buffered(response: object) -> int:
    conn = getattr(response, "_conn", None)
    return 0 if conn is None else int(conn.buffered)


async def test_at_most_max_per_upstream_connections_at_once() -> None:
    async def slow(exchange: Exchange) -> bool:
        await asyncio.sleep(0.05)
        return await echo(exchange)

    async with upstream(slow) as up, HttpPool(max_per_upstream=2) as pool:
        bodies = await asyncio.gather(*(get(pool, up, f"/{n}".encode()) for n in range(6)))
        assert sorted(bodies) == sorted(f"GET /{n} 0".encode() for n in range(6))
        assert up.most_open == 2


async def test_a_request_waits_for_a_busy_upstream_in_turn_and_at_most_its_timeout() -> None:
    """Rule 6: with every slot busy, a request waits for one at most its read timeout (then a
    TimeoutError naming the cause, and it leaves the queue); those that wait are served in the
    order they asked."""
    release = asyncio.Event()

    async def held(exchange: Exchange) -> bool:
        await release.wait()
        return await echo(exchange)

    async with upstream(held) as up, HttpPool(max_per_upstream=1) as pool:
        first = asyncio.create_task(get(pool, up, b"/first"))
        while not up.requests:
            await asyncio.sleep(0.01)
        with pytest.raises(
            TimeoutError, match=r"all 1 connections to 127\.0\.0\.1:\d+ stayed busy"
        ):
            # the outer limit only keeps a pool that waits forever from hanging the test
            await asyncio.wait_for(get(pool, up, b"/late", read_timeout=0.2), 20)
        waiting = []
        for n in range(5):
            waiting.append(asyncio.create_task(get(pool, up, f"/{n}".encode())))
            await asyncio.sleep(0)  # each asks before the next
        release.set()
        assert await first == b"GET /first 0"
        assert await asyncio.gather(*waiting) == [f"GET /{n} 0".encode() for n in range(5)]
        assert [e.target for e in up.requests] == ["/first", *(f"/{n}" for n in range(5))]
        assert up.connections == 1  # one slot, one connection, reused in turn


async def test_an_unread_answer_closes_its_connection_on_release() -> None:
    async with upstream(echo) as up, HttpPool() as pool:
        response = await pool.request("GET", "127.0.0.1", up.port, b"/", [])
        response.release()
        response.release()
        assert await get(pool, up) == b"GET /x 0"


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        (b"/x", [(b"x-bad", b"a\r\nx-injected: 1")]),
        (b"/x", [(b"x-bad\r\nx-injected", b"1")]),
        (b"/x", [(b"x-bad", b"nul\x00")]),
        (b"/x HTTP/1.1\r\nx: y", []),
    ],
)
async def test_line_breaks_nul_and_spaces_in_the_request_head_are_refused(
    target: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    async with upstream(echo) as up, HttpPool() as pool:
        with pytest.raises(ValueError, match="line break"):
            await pool.request("GET", "127.0.0.1", up.port, target, headers)
        assert up.connections == 0
