"""`/api/data/<authority>/<path>`: the data proxy, the hot path, as a raw ASGI handler.

No routing framework in between: the path is checked on its raw bytes (canonical form first,
decisions.md "Data proxy"), the caller identified by the one `identify`, the route decided by
`DataProxy.route`, and the request forwarded over the shell's connection pool
(`atrium.httppool`), headers kept as the bytes they arrived as. Bodies up to 256 KiB are buffered
both ways; larger ones, and chunked ones, stream in constant memory. Of the provider's answer
headers only an allow-list reaches the caller (`headers.DATA_ANSWER`: the answer is served on the
host page's or a calling app's origin, where a `Set-Cookie`, `Clear-Site-Data` or
`Access-Control-*` would act with that origin's authority), and no cookie of the caller reaches
the provider. Hop-by-hop headers, and those the `Connection` header names, stop here in both
directions (RFC 9110 7.6.1).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from typing import Final
from urllib.parse import unquote

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from atrium.api.auth import check_cookie_origin, identify_raw
from atrium.api.errors import guard
from atrium.api.proxy.headers import DATA, Inbound, outbound
from atrium.api.proxy.pages import BUFFER_LIMIT, NO_BODY_STATUS, UPSTREAM_TIMEOUT
from atrium.dataproxy import Route
from atrium.errors import AtriumError, InvalidRequest, UpstreamFailed, UpstreamTimeout
from atrium.httppool import UpstreamError, UpstreamResponse
from atrium.identity import Caller, UserCaller
from atrium.lifecycle.calls import KIND_HEADER, SECRET_HEADER, AppAddress
from atrium.shell import Shell

_LOGGER = logging.getLogger(__name__)
PREFIX: Final = b"/api/data/"
#: what a provider's server may read as another path than the table matched: `.`/`..`
#: segments (raw or encoded), empty segments (`/a//b` read as `/a/b`), a segment ending in a dot
#: or a space (dropped by some servers), `;` (path parameters: `/a;x/b` read as `/a/b`), an
#: encoded `%` (decoded twice), encoded `/` `\` or NUL, raw `\` or NUL
NON_CANONICAL: Final = re.compile(
    rb"(?:^|/)(?:\.|%2e){1,2}(?:/|$)|//|(?:\.|%2e|%20)(?:/|$)|;|%3b|%25|%2f|%5c|%00|\\|\x00",
    re.IGNORECASE,
)
SECRET: Final = SECRET_HEADER.encode()
KIND_DATA: Final = (KIND_HEADER.encode(), b"data")
CALLER_APP_ID: Final = b"X-Os-Caller-App-Id"
PERMISSION: Final = b"X-Os-Permission"


def split_path(raw: bytes) -> tuple[str, bytes, str]:
    """``raw`` after the prefix → (authority, raw upstream rest, decoded path for matching)."""
    if NON_CANONICAL.search(raw):
        shown = raw.decode("latin-1")[:200]
        raise InvalidRequest(
            f"data path {shown!r} is not canonical: no '.', '..' or empty segments, no segment "
            "ending in '.' or a space, no ';', no encoded '%', '/', '\\' or NUL"
        )
    authority_raw, slash, rest = raw.partition(b"/")
    authority = unquote(authority_raw.decode("latin-1"))
    if not authority:
        raise InvalidRequest("the data path needs an authority: /api/data/<authority>/<path>")
    rest_raw = b"/" + rest if slash else b"/"
    try:
        return authority, rest_raw, unquote(rest_raw.decode("latin-1"), errors="strict")
    except UnicodeDecodeError as err:
        shown = raw.decode("latin-1")[:200]
        raise InvalidRequest(
            f"data path {shown!r}: its percent-escapes are not UTF-8 ({err.reason} at byte "
            f"{err.start})"
        ) from err


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
    """The request body as it arrives; a client that goes away midway raises, so the provider
    never receives half a body as a whole one."""
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidRequest("the client went away while sending the body")
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

    Served outside Starlette's middleware stack (the hot path), inside the edge's one boundary.
    """
    await guard(
        lambda sending: _proxy(shell, raw_rest, scope, receive, sending, caller),
        scope,
        receive,
        send,
    )


async def _proxy(
    shell: Shell, raw_rest: bytes, scope: Scope, receive: Receive, send: Send, caller: Caller | None
) -> None:
    method: str = scope["method"]
    inbound = Inbound(scope["headers"], DATA)
    if caller is None:
        try:
            caller = await identify_raw(scope, inbound.authorization, inbound.cookie, shell)
            if isinstance(caller, UserCaller) and caller.via_cookie:
                check_cookie_origin(Request(scope), shell)
        except AtriumError:
            split_path(raw_rest)  # a path that is not canonical is 400, whoever asks
            raise
    proxy = shell.dataproxy
    # the raw path is the key: only bytes that passed `split_path` are ever kept, so another
    # spelling of a path (an encoded dot segment, another case) is decided, and refused, afresh
    decided = proxy.decided(caller, method, raw_rest)
    if decided is None:
        authority, upstream_rest, path = split_path(raw_rest)
        route = proxy.route(
            authority,
            path,
            method,
            caller,
            inbound.claimed_app_id,
            inbound.asserted_permission,
            raw_rest,
        )
    else:
        slash = raw_rest.find(b"/")
        upstream_rest = raw_rest[slash:] if slash >= 0 else b"/"
        route = proxy.route_decided(
            decided, method, inbound.claimed_app_id, inbound.asserted_permission
        )
    if route.address is None:
        route = await shell.dataproxy.wake(route)
    address = route.address
    if address is None:  # pragma: no cover - wake routes or raises
        raise RuntimeError("a woken route without an address")
    if route.woken is None:
        await _forward(shell, route, address, upstream_rest, scope, receive, send, inbound)
        return
    route.woken.begin()
    try:
        await _forward(shell, route, address, upstream_rest, scope, receive, send, inbound)
    finally:
        route.woken.end()


async def _forward(
    shell: Shell,
    route: Route,
    address: AppAddress,
    upstream_rest: bytes,
    scope: Scope,
    receive: Receive,
    send: Send,
    inbound: Inbound,
) -> None:
    method: str = scope["method"]
    out = inbound.forwarded
    out.append((SECRET, address.secret.encode("latin-1")))
    out.append(KIND_DATA)
    if route.caller_app_id is not None:
        out.append((CALLER_APP_ID, route.caller_app_id.encode("latin-1")))
    if route.permission is not None:
        out.append((PERMISSION, route.permission.encode("latin-1")))
    declared = inbound.content_length
    body: bytes | AsyncIterator[bytes] | None
    if declared is not None and declared <= BUFFER_LIMIT:
        body = await _read_body(receive, declared)
    elif declared is None and not inbound.chunked:
        body = None
    else:
        body = _stream_body(receive)
    query: bytes = scope.get("query_string", b"")
    target = b"/api/data" + upstream_rest + (b"?" + query if query else b"")
    try:
        upstream = await shell.upstream.pool.request(
            method,
            address.host,
            address.port,
            target,
            out,
            body,
            content_length=declared,
            read_timeout=UPSTREAM_TIMEOUT,
        )
    except TimeoutError as err:
        raise UpstreamTimeout(
            f"the provider {route.app_id} did not answer within {UPSTREAM_TIMEOUT:.0f} s"
        ) from err
    except UpstreamError as err:
        raise UpstreamFailed(f"the provider {route.app_id} failed: {err}") from err
    try:
        await _answer(upstream, method, route.app_id, send)
    finally:
        upstream.release()


async def _answer(upstream: UpstreamResponse, method: str, app_id: str, send: Send) -> None:
    headers = outbound(upstream.headers, DATA)
    size = upstream.content_length
    no_body = method == "HEAD" or upstream.status in NO_BODY_STATUS
    if no_body or (size is not None and size <= BUFFER_LIMIT):
        try:
            payload = await upstream.read()
        except TimeoutError as err:
            raise UpstreamTimeout(
                f"the provider {app_id} stopped answering for {UPSTREAM_TIMEOUT:.0f} s"
            ) from err
        except UpstreamError as err:
            raise UpstreamFailed(f"the provider {app_id} failed while answering: {err}") from err
        if method == "HEAD":  # the length a GET would have, when the provider said it
            if size is not None:
                headers.append((b"content-length", b"%d" % size))
        elif upstream.status not in NO_BODY_STATUS:
            headers.append((b"content-length", b"%d" % len(payload)))
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        return
    if size is not None:
        headers.append((b"content-length", b"%d" % size))
    await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
    # a failure from here on cannot change the status line: it propagates and the server cuts
    # the connection, so the caller sees a truncated body rather than a wrong success
    async for chunk in upstream.iter_chunks():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
