"""`/api/data/<authority>/<path>`: the data proxy, the hot path, as a raw ASGI handler.

No routing framework in between: the path is checked on its raw bytes (canonical form first,
decisions.md "Data proxy"), the caller identified by the one `identify`, the route decided by
`DataProxy.route`, and the request forwarded over the shared aiohttp session. Bodies up to
256 KiB are buffered both ways; larger ones stream in constant memory. The provider's
`Set-Cookie` never reaches the caller (a provider must not plant cookies on the host page's or
another app's origin), and no cookie of the caller reaches the provider.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from typing import Final
from urllib.parse import unquote

import aiohttp
from starlette.requests import Request
from starlette.types import Receive, Scope, Send
from yarl import URL

from atrium.api.auth import check_cookie_origin, identify
from atrium.api.errors import error_response
from atrium.api.forward import BUFFER_LIMIT, CHUNK, HOP_BY_HOP, UPSTREAM_TIMEOUT
from atrium.errors import AtriumError, InvalidRequest, UpstreamFailed, UpstreamTimeout
from atrium.identity import Caller, UserCaller
from atrium.lifecycle.calls import SECRET_HEADER
from atrium.shell import Shell

_LOGGER = logging.getLogger(__name__)
PREFIX: Final = b"/api/data/"
#: `.`/`..` segments (raw or encoded), encoded `/` `\` or NUL, raw `\` or NUL
NON_CANONICAL: Final = re.compile(
    rb"(?:^|/)(?:\.|%2e){1,2}(?:/|$)|%2f|%5c|%00|\\|\x00", re.IGNORECASE
)
DROPPED: Final = HOP_BY_HOP | {"host", "authorization", "cookie", "content-length"}
DROPPED_RESPONSE: Final = HOP_BY_HOP | {"set-cookie", "set-cookie2", "content-length", "date"}
TIMEOUT: Final = aiohttp.ClientTimeout(total=None, sock_read=UPSTREAM_TIMEOUT)


def split_path(raw: bytes) -> tuple[str, bytes, str]:
    """``raw`` after the prefix → (authority, raw upstream rest, decoded path for matching)."""
    if NON_CANONICAL.search(raw):
        shown = raw.decode("latin-1")[:200]
        raise InvalidRequest(
            f"data path {shown!r} is not canonical: no '.' or '..' segments, no encoded '/', "
            "'\\' or NUL"
        )
    authority_raw, slash, rest = raw.partition(b"/")
    authority = unquote(authority_raw.decode("latin-1"))
    if not authority:
        raise InvalidRequest("the data path needs an authority: /api/data/<authority>/<path>")
    rest_raw = b"/" + rest if slash else b"/"
    return authority, rest_raw, unquote(rest_raw.decode("latin-1"), errors="strict")


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidRequest("the client went away while sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise InvalidRequest("the request body is longer than its Content-Length")
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


async def _stream_body(receive: Receive) -> AsyncIterator[bytes]:
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        more = message.get("more_body", False)


async def serve_data(
    shell: Shell,
    raw_rest: bytes,
    scope: Scope,
    receive: Receive,
    send: Send,
    caller: Caller | None = None,
) -> None:
    """Answer one data request; ``raw_rest`` is the raw path after `/api/data/`.

    Served outside Starlette's middleware stack (the hot path), so it answers its own failures.
    """
    try:
        await _proxy(shell, raw_rest, scope, receive, send, caller)
    except AtriumError as err:
        await error_response(err)(scope, receive, send)
    except Exception:
        _LOGGER.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
        try:
            await error_response(AtriumError("internal error; the shell's log has the details"))(
                scope, receive, send
            )
        except RuntimeError:  # the response had started: the server cuts the connection
            raise


async def _proxy(
    shell: Shell, raw_rest: bytes, scope: Scope, receive: Receive, send: Send, caller: Caller | None
) -> None:
    authority, upstream_rest, path = split_path(raw_rest)
    method: str = scope["method"]
    request = Request(scope, receive)
    if caller is None:
        caller = identify(request, shell)
        if isinstance(caller, UserCaller) and caller.via_cookie:
            check_cookie_origin(request, shell)
    headers = request.headers
    route = shell.dataproxy.route(
        authority,
        path,
        method,
        caller,
        headers.get("x-os-caller-app-id"),
        headers.get("x-os-permission"),
    )
    out: dict[str, str] = {}
    for name, value in scope["headers"]:
        lower = name.decode("latin-1").lower()
        if lower in DROPPED or lower.startswith("x-os-"):
            continue
        out[lower] = value.decode("latin-1")
    out[SECRET_HEADER] = route.address.secret
    if route.caller_app_id is not None:
        out["X-Os-Caller-App-Id"] = route.caller_app_id
    if route.permission is not None:
        out["X-Os-Permission"] = route.permission
    length = headers.get("content-length")
    body: bytes | AsyncIterator[bytes] | None
    if length is not None and length.isdigit() and int(length) <= BUFFER_LIMIT:
        body = await _read_body(receive, int(length))
    elif length is None and "transfer-encoding" not in headers:
        body = None
    else:
        body = _stream_body(receive)
    query = scope.get("query_string", b"")
    url = URL.build(
        scheme="http",
        host=route.address.host,
        port=route.address.port,
        path="/api/data" + upstream_rest.decode("latin-1"),
        query_string=query.decode("latin-1"),
        encoded=True,
    )
    await _forward(shell, route.app_id, method, url, out, body, send)


async def _forward(
    shell: Shell,
    app_id: str,
    method: str,
    url: URL,
    headers: dict[str, str],
    body: bytes | AsyncIterator[bytes] | None,
    send: Send,
) -> None:
    try:
        upstream = await shell.upstream.session.request(
            method,
            url,
            data=body,
            headers=headers,
            allow_redirects=False,
            timeout=TIMEOUT,
        )
    except TimeoutError as err:
        raise UpstreamTimeout(
            f"the provider {app_id} did not answer within {UPSTREAM_TIMEOUT:.0f} s"
        ) from err
    except aiohttp.ClientError as err:
        raise UpstreamFailed(f"the provider {app_id} failed: {err}") from err
    try:
        response_headers = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in upstream.headers.items()
            if k.lower() not in DROPPED_RESPONSE
        ]
        size = upstream.content_length
        if method == "HEAD" or (size is not None and size <= BUFFER_LIMIT):
            try:
                payload = await upstream.read()
            except (aiohttp.ClientError, TimeoutError) as err:
                raise UpstreamFailed(
                    f"the provider {app_id} failed while answering: {err}"
                ) from err
            length = size if method == "HEAD" and size is not None else len(payload)
            response_headers.append((b"content-length", str(length).encode()))
            await send(
                {
                    "type": "http.response.start",
                    "status": upstream.status,
                    "headers": response_headers,
                }
            )
            await send({"type": "http.response.body", "body": payload})
            return
        await _send_streamed(upstream, response_headers, send)
    finally:
        upstream.release()


async def _send_streamed(
    upstream: aiohttp.ClientResponse, headers: list[tuple[bytes, bytes]], send: Send
) -> None:
    if upstream.content_length is not None:
        headers.append((b"content-length", str(upstream.content_length).encode()))
    await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
    # a failure from here on cannot change the status line: it propagates and the server cuts
    # the connection, so the caller sees a truncated body rather than a wrong success
    async for chunk in upstream.content.iter_chunked(CHUNK):
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
