"""Candidate stacks for the data proxy: which HTTP server and client should carry it.

    python -m bench.candidates --stack NAME --port P --upstream-port U

Each stack is one process serving a minimal but honest proxy of `<METHOD> /api/data/<rest>?<query>`
to `http://127.0.0.1:U/api/data/<rest>?<query>`, with what Atrium's data proxy does to the
messages and none of its checks (no token, provider table or permission): hop-by-hop headers
(and those the `Connection` header names) dropped both ways, the caller's `Authorization` and
`Cookie` not forwarded, `Set-Cookie` dropped from responses; bodies up to 256 KiB buffered, larger
ones or those of unknown length streamed both ways in constant memory; a response the upstream
cuts short is cut short to the caller (the connection is closed), never completed.

A stack is a server and an upstream client:

- `aiohttp`: the raw ASGI app under uvicorn (uvloop, httptools, one worker, no access log) with
  one aiohttp ClientSession configured as Atrium's was (DummyCookieJar, no decompression,
  TCPConnector(limit=0, limit_per_host=256)): Atrium's data proxy before its own client pool;
- `pyreqwest`: the same ASGI app under uvicorn with a pyreqwest (Rust reqwest) client;
- `granian-pyreqwest`: the RSGI app (granian's native interface) under granian (one worker,
  uvloop, no access log) with the pyreqwest client;
- `atrium-pool`, `granian-atrium-pool`: Atrium's own keep-alive pool (atrium/httppool.py) under
  uvicorn and under granian, so the client and the server are each measured alone.

Adding a stack: see "Adding a stack" above `STACKS` at the end of this file.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol
from urllib.parse import urlsplit

import aiohttp
import uvicorn
from starlette.types import Message, Receive, Scope, Send
from yarl import URL

from atrium.httppool import HttpPool
from atrium.httppool import UpstreamError as PoolError
from atrium.httppool import UpstreamResponse as PoolResponse

if TYPE_CHECKING:
    from granian._granian import RSGIHTTPProtocol as RsgiProtocol  # type: ignore[import-not-found, unused-ignore]
    from granian.rsgi import Scope as RsgiScope  # type: ignore[import-not-found, unused-ignore]
    from pyreqwest.client import Client  # type: ignore[import-not-found, unused-ignore]
    from pyreqwest.request import StreamRequest  # type: ignore[import-not-found, unused-ignore]
    from pyreqwest.response import Response  # type: ignore[import-not-found, unused-ignore]

BUFFER_LIMIT: Final = 256 * 1024
CHUNK: Final = 64 * 1024
CONNECT_TIMEOUT: Final = 5.0
READ_TIMEOUT: Final = 30.0
PREFIX: Final = "/api/data/"
HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
#: `expect` too: the server in front answers `100-continue` itself (uvicorn and granian do)
DROPPED_REQUEST: Final = HOP_BY_HOP | {
    "host",
    "content-length",
    "authorization",
    "cookie",
    "expect",
}
DROPPED_RESPONSE: Final = HOP_BY_HOP | {"set-cookie", "set-cookie2", "content-length", "date"}
ENV_STACK: Final = "BENCH_CANDIDATE_STACK"
ENV_UPSTREAM: Final = "BENCH_CANDIDATE_UPSTREAM"

Headers = list[tuple[str, str]]
#: a request body: buffered, streamed, or none
Body = bytes | AsyncIterator[bytes] | None


class UpstreamError(Exception):
    """The upstream could not be reached or failed before answering (answered as 502)."""


class BadRequest(Exception):
    """The caller's request cannot be forwarded (answered as 400)."""


# ------------------------------------------------------------------------------------------------
# The client side: what a stack's HTTP client must offer


class UpstreamResponse(Protocol):
    """An upstream's answer whose body has not been read yet."""

    status: int
    #: the headers as received (the server side filters them)
    headers: Iterable[tuple[str, str]]
    #: the Content-Length, None when the body is chunked or delimited by the connection's end
    length: int | None

    async def read(self) -> bytes:
        """The whole body (only called when ``length`` ≤ 256 KiB or for HEAD)."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body piece by piece; raises if the upstream cuts it short."""
        ...

    async def close(self) -> None:
        """Give the connection back to the pool (or drop it when the body was not read)."""
        ...


class Upstream(Protocol):
    """A pooled HTTP/1.1 client, built once per server process inside its running event loop."""

    async def send(self, method: str, url: str, headers: Headers, body: Body) -> UpstreamResponse:
        """Send one request and return once the response's head has arrived.

        ``url`` is already percent-encoded (pass it on as is); ``headers`` carry Content-Length
        when ``body`` is a stream of known length and nothing about framing otherwise (a bytes
        body's length is the client's to set). Raises UpstreamError when no response head came.
        """
        ...

    async def aclose(self) -> None: ...


class AiohttpResponse:
    __slots__ = ("_response", "headers", "length", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: Iterable[tuple[str, str]] = response.headers.items()
        self.length = response.content_length

    async def read(self) -> bytes:
        return await self._response.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.content.iter_chunked(CHUNK):
            yield chunk

    async def close(self) -> None:
        self._response.release()


class AiohttpUpstream:
    """One aiohttp ClientSession set up as Atrium's (atrium/upstream.py)."""

    def __init__(self) -> None:
        self.session = aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=256, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT),
            skip_auto_headers=("User-Agent",),
        )
        self.timeout = aiohttp.ClientTimeout(total=None, sock_read=READ_TIMEOUT)

    async def send(self, method: str, url: str, headers: Headers, body: Body) -> UpstreamResponse:
        try:
            response = await self.session.request(
                method,
                URL(url, encoded=True),
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=self.timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as err:
            raise UpstreamError(f"aiohttp: {err!r}") from err
        return AiohttpResponse(response)

    async def aclose(self) -> None:
        await self.session.close()


class PyreqwestResponse:
    __slots__ = ("_request", "_response", "headers", "length", "status")

    def __init__(self, request: StreamRequest, response: Response) -> None:
        self._request = request
        self._response = response
        self.status: int = response.status
        self.headers: Iterable[tuple[str, str]] = response.headers.items()
        length = response.get_header("content-length")
        self.length = int(length) if length is not None and length.isdigit() else None

    async def read(self) -> bytes:
        return bytes(await self._response.bytes())

    async def chunks(self) -> AsyncIterator[bytes]:
        reader = self._response.body_reader
        while (chunk := await reader.read(CHUNK)) is not None:
            yield bytes(chunk)

    async def close(self) -> None:
        await self._request.__aexit__(None, None, None)


class PyreqwestUpstream:
    """One pyreqwest client: pooled, no cookie store, no decompression, no redirects."""

    def __init__(self) -> None:
        # optional (the extra `bench`): imported here so that the module loads without it
        from pyreqwest.client import ClientBuilder  # type: ignore[import-not-found, unused-ignore]
        from pyreqwest.exceptions import PyreqwestError  # type: ignore[import-not-found, unused-ignore]

        self.errors: tuple[type[Exception], ...] = (PyreqwestError, TimeoutError)
        self.client: Client = (
            ClientBuilder()
            .gzip(False)
            .brotli(False)
            .zstd(False)
            .deflate(False)
            .follow_redirects(False)
            .referer(False)
            .connect_timeout(timedelta(seconds=CONNECT_TIMEOUT))
            .read_timeout(timedelta(seconds=READ_TIMEOUT))
            .build()
        )

    async def send(self, method: str, url: str, headers: Headers, body: Body) -> UpstreamResponse:
        builder = self.client.request(method, url).headers(headers)
        if isinstance(body, bytes):
            builder = builder.body_bytes(body)
        elif body is not None:
            builder = builder.body_stream(body)
        request = builder.build_streamed()
        try:
            response = await request.__aenter__()
        except self.errors as err:
            raise UpstreamError(f"pyreqwest: {err!r}") from err
        return PyreqwestResponse(request, response)

    async def aclose(self) -> None:
        await self.client.close()


# ------------------------------------------------------------------------------------------------
# The proxy's rules, shared by both server interfaces


def forward_headers(pairs: Iterable[tuple[str, str]]) -> tuple[Headers, int | None, bool]:
    """The request headers to send on, the body's Content-Length, and whether it is chunked."""
    out: Headers = []
    length: int | None = None
    chunked = False
    named: set[str] | None = None
    for name, value in pairs:
        lower = name.lower()
        if lower in DROPPED_REQUEST:
            if lower == "content-length":
                if not value.isdigit():
                    raise BadRequest(f"Content-Length {value!r} is not a number")
                length = int(value)
            elif lower == "transfer-encoding":
                chunked = True
            elif lower == "connection":
                named = {token.strip().lower() for token in value.split(",")}
            continue
        out.append((lower, value))
    if named:
        out = [(name, value) for name, value in out if name not in named]
    return out, length, chunked


def response_headers(pairs: Iterable[tuple[str, str]]) -> Headers:
    """The upstream's response headers minus hop-by-hop ones, cookies, length and date."""
    out = [(name.lower(), value) for name, value in pairs]
    named = {
        token.strip().lower()
        for name, value in out
        if name == "connection"
        for token in value.split(",")
    }
    return [
        (name, value)
        for name, value in out
        if name not in DROPPED_RESPONSE and (not named or name not in named)
    ]


def body_mode(
    length: int | None, chunked: bool, headers: Headers
) -> Literal["read", "stream", None]:
    """Buffer a body of known length ≤ 256 KiB; stream a longer one or a chunked one.

    A streamed body of known length keeps its Content-Length (appended to ``headers``).
    """
    if chunked:
        return "stream"
    if length is None:
        return None
    if length <= BUFFER_LIMIT:
        return "read"
    headers.append(("content-length", str(length)))
    return "stream"


def upstream_url(base: str, path: str, query: str) -> str:
    return base + path + ("?" + query if query else "")


# ------------------------------------------------------------------------------------------------
# The raw ASGI app (uvicorn)


def _latin1(pairs: Iterable[tuple[bytes, bytes]]) -> Iterable[tuple[str, str]]:
    return ((name.decode("latin-1"), value.decode("latin-1")) for name, value in pairs)


async def _asgi_read(receive: Receive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    chunks = [body]
    async for chunk in _asgi_stream(receive):
        chunks.append(chunk)
    return b"".join(chunks)


async def _asgi_stream(receive: Receive) -> AsyncIterator[bytes]:
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("the caller went away while sending the body")
        chunk: bytes = message.get("body", b"")
        if chunk:
            yield chunk
        more = message.get("more_body", False)


async def _asgi_plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class AsgiProxy:
    """The raw ASGI proxy; the upstream client is built in the lifespan's startup."""

    def __init__(self, make_upstream: Callable[[], Upstream], base: str) -> None:
        self.make_upstream = make_upstream
        self.base = base
        self.upstream: Upstream | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "lifespan.startup":
                self.upstream = self.make_upstream()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.upstream is not None:
                    await self.upstream.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        path = raw_path.decode("latin-1")
        if not path.startswith(PREFIX) or self.upstream is None:
            await _asgi_plain(send, 404, "not found")
            return
        method: str = scope["method"]
        try:
            headers, length, chunked = forward_headers(_latin1(scope["headers"]))
        except BadRequest as err:
            await _asgi_plain(send, 400, str(err))
            return
        mode = body_mode(length, chunked, headers)
        body: Body = (
            await _asgi_read(receive)
            if mode == "read"
            else _asgi_stream(receive)
            if mode == "stream"
            else None
        )
        url = upstream_url(self.base, path, scope.get("query_string", b"").decode("latin-1"))
        try:
            response = await self.upstream.send(method, url, headers, body)
        except UpstreamError as err:
            await _asgi_plain(send, 502, f"the upstream failed: {err}")
            return
        try:
            await self.respond(method, response, send)
        finally:
            await response.close()

    async def respond(self, method: str, response: UpstreamResponse, send: Send) -> None:
        headers = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in response_headers(response.headers)
        ]
        length = response.length
        if method == "HEAD" or (length is not None and length <= BUFFER_LIMIT):
            try:
                payload = await response.read()
            except Exception as err:  # noqa: BLE001  # any client's failure before the head is sent
                await _asgi_plain(send, 502, f"the upstream failed while answering: {err!r}")
                return
            size = length if method == "HEAD" and length is not None else len(payload)
            headers.append((b"content-length", str(size).encode()))
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            await send({"type": "http.response.body", "body": payload})
            return
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        # a failure from here on propagates: uvicorn closes the connection mid-body
        async for chunk in response.chunks():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def serve_uvicorn(make_upstream: Callable[[], Upstream], port: int, upstream_port: int) -> None:
    app = AsgiProxy(make_upstream, f"http://127.0.0.1:{upstream_port}")
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        ws="none",
        lifespan="on",
        access_log=False,
        log_level="warning",
        backlog=1024,
        # as Atrium's server (atrium/api/server.py), which also merges each head and body write
        server_header=False,
        proxy_headers=False,
    )
    uvicorn.Server(config).run()


# ------------------------------------------------------------------------------------------------
# The RSGI app (granian)


async def _rsgi_stream(protocol: RsgiProtocol) -> AsyncIterator[bytes]:
    async for chunk in protocol:
        if chunk:
            yield bytes(chunk)


class RsgiProxy:
    """The same proxy on granian's RSGI; the client is built on the first request."""

    def __init__(self, make_upstream: Callable[[], Upstream], base: str) -> None:
        self.make_upstream = make_upstream
        self.base = base
        self.upstream: Upstream | None = None

    def __rsgi_init__(self, loop: Any) -> None:
        pass  # the loop is not running yet: the client is built by the first request

    def __rsgi_del__(self, loop: Any) -> None:
        if self.upstream is not None:
            loop.run_until_complete(self.upstream.aclose())

    async def __rsgi__(self, scope: RsgiScope, protocol: RsgiProtocol) -> None:
        if scope.proto != "http":
            return
        upstream = self.upstream
        if upstream is None:
            upstream = self.upstream = self.make_upstream()
        path: str = scope.path
        if not path.startswith(PREFIX):
            protocol.response_str(404, [("content-type", "text/plain")], "not found")
            return
        method: str = scope.method
        try:
            headers, length, chunked = forward_headers(scope.headers.items())
        except BadRequest as err:
            protocol.response_str(400, [("content-type", "text/plain")], str(err))
            return
        mode = body_mode(length, chunked, headers)
        body: Body = (
            await protocol()
            if mode == "read"
            else _rsgi_stream(protocol)
            if mode == "stream"
            else None
        )
        url = upstream_url(self.base, path, scope.query_string)
        try:
            response = await upstream.send(method, url, headers, body)
        except UpstreamError as err:
            protocol.response_str(502, [("content-type", "text/plain")], f"upstream: {err}")
            return
        try:
            await self.respond(method, response, protocol)
        finally:
            await response.close()

    async def respond(
        self, method: str, response: UpstreamResponse, protocol: RsgiProtocol
    ) -> None:
        headers = response_headers(response.headers)
        length = response.length
        if method == "HEAD" or (length is not None and length <= BUFFER_LIMIT):
            try:
                payload = await response.read()
            except Exception as err:  # noqa: BLE001  # any client's failure before the head is sent
                protocol.response_str(502, [("content-type", "text/plain")], f"upstream: {err!r}")
                return
            if method == "HEAD" and length is not None:
                headers.append(("content-length", str(length)))
                protocol.response_empty(response.status, headers)
            else:
                protocol.response_bytes(response.status, headers, payload)
            return
        if length is not None:
            headers.append(("content-length", str(length)))
        transport = protocol.response_stream(response.status, headers)
        # a failure from here on propagates: granian closes the connection mid-body
        async for chunk in response.chunks():
            await transport.send_bytes(chunk)


def rsgi_app() -> RsgiProxy:
    """granian's factory target: the stack and upstream port come from the environment."""
    stack = STACKS[os.environ[ENV_STACK]]()
    return RsgiProxy(stack.upstream, f"http://127.0.0.1:{os.environ[ENV_UPSTREAM]}")


def serve_granian(name: str, port: int, upstream_port: int) -> None:
    from granian import Granian  # type: ignore[import-not-found, unused-ignore]
    from granian.constants import Interfaces, Loops  # type: ignore[import-not-found, unused-ignore]
    from granian.log import LogLevels  # type: ignore[import-not-found, unused-ignore]

    os.environ[ENV_STACK] = name  # the worker process imports the app and reads these
    os.environ[ENV_UPSTREAM] = str(upstream_port)
    uvloop = importlib.util.find_spec("uvloop") is not None
    Granian(
        "bench.candidates:rsgi_app",
        address="127.0.0.1",
        port=port,
        interface=Interfaces.RSGI,
        workers=1,
        loop=Loops.uvloop if uvloop else Loops.asyncio,
        log_access=False,
        log_level=LogLevels.warning,
        backlog=1024,
        factory=True,
    ).serve()


# ------------------------------------------------------------------------------------------------
# The stacks


@dataclass(frozen=True)
class Stack:
    """A server interface and the upstream client its proxy uses."""

    #: "uvicorn": the raw ASGI app under uvicorn; "granian": the RSGI app under granian
    server: Literal["uvicorn", "granian"]
    #: builds the client; called once per server process, inside its running event loop
    upstream: Callable[[], Upstream]


def _aiohttp() -> Stack:
    return Stack("uvicorn", AiohttpUpstream)


def _pyreqwest() -> Stack:
    import pyreqwest  # type: ignore[import-not-found, unused-ignore]  # noqa: F401

    return Stack("uvicorn", PyreqwestUpstream)


def _granian_pyreqwest() -> Stack:
    import granian  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    import pyreqwest  # type: ignore[import-not-found, unused-ignore]  # noqa: F401

    return Stack("granian", PyreqwestUpstream)


class AtriumPoolResponse:
    __slots__ = ("_response", "headers", "length", "status")

    def __init__(self, response: PoolResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers = _latin1(response.headers)
        self.length = response.content_length

    async def read(self) -> bytes:
        return await self._response.read()

    def chunks(self) -> AsyncIterator[bytes]:
        return self._response.iter_chunks()

    async def close(self) -> None:
        self._response.release()


class AtriumPoolUpstream:
    """Atrium's own keep-alive HTTP/1.1 pool (atrium/httppool.py), as the shell uses it."""

    def __init__(self) -> None:
        self.pool = HttpPool(connect_timeout=CONNECT_TIMEOUT)

    async def send(self, method: str, url: str, headers: Headers, body: Body) -> UpstreamResponse:
        parts = urlsplit(url)
        target = (parts.path + ("?" + parts.query if parts.query else "")).encode("latin-1")
        length = None
        raw: list[tuple[bytes, bytes]] = []
        for name, value in headers:
            if name.lower() == "content-length":
                length = int(value)
            else:
                raw.append((name.encode("latin-1"), value.encode("latin-1")))
        try:
            response = await self.pool.request(
                method,
                parts.hostname or "127.0.0.1",
                parts.port or 80,
                target,
                raw,
                body,
                content_length=length,
                read_timeout=READ_TIMEOUT,
            )
        except (PoolError, TimeoutError) as err:
            raise UpstreamError(f"atrium pool: {err!r}") from err
        return AtriumPoolResponse(response)

    async def aclose(self) -> None:
        self.pool.close()


def _atrium_pool() -> Stack:
    return Stack("uvicorn", AtriumPoolUpstream)


def _granian_atrium_pool() -> Stack:
    import granian  # type: ignore[import-not-found, unused-ignore]  # noqa: F401

    return Stack("granian", AtriumPoolUpstream)


# Adding a stack ---------------------------------------------------------------------------------
# Write one factory that imports what the stack needs (an ImportError raised there makes the
# benchmark print why and skip the stack) and returns a Stack, and list it in STACKS: dataproxy.py
# benchmarks every stack listed here (BENCH_CANDIDATES=a,b picks some). The client is any class
# with `send()` → UpstreamResponse and `aclose()` (see AiohttpUpstream, AtriumPoolUpstream).
STACKS: dict[str, Callable[[], Stack]] = {
    "aiohttp": _aiohttp,
    "pyreqwest": _pyreqwest,
    "granian-pyreqwest": _granian_pyreqwest,
    "atrium-pool": _atrium_pool,
    "granian-atrium-pool": _granian_atrium_pool,
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.candidates", description=__doc__)
    parser.add_argument("--stack", required=True, choices=sorted(STACKS))
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--upstream-port", required=True, type=int)
    args = parser.parse_args()
    try:
        stack = STACKS[args.stack]()
    except ImportError as err:
        print(f"{args.stack}: {err} (make bench installs the extra `bench`)", file=sys.stderr)
        sys.exit(3)
    if stack.server == "granian":
        serve_granian(args.stack, args.port, args.upstream_port)
    else:
        serve_uvicorn(stack.upstream, args.port, args.upstream_port)


if __name__ == "__main__":
    main()
