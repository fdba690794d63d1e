"""An app's pages: a browser request on the app's origin (or the user's `/api/proxy/…`) forwarded
to the app's own server over the shell's connection pool, the answer handed back.

Bodies up to 256 KiB are buffered both ways (measured 1.3-1.6x faster than streaming them);
larger ones stream in constant memory. Headers go through `headers.PAGE`; the shell sets the
secret and the request kind. An HTML page may be rewritten for the app's theme strategy
(`atrium.theme.inject`), and then loses the validators that described the app's bytes. An answer
naming another app in `X-Os-App-Id` is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from atrium.api.proxy.headers import PAGE, Headers, Inbound, outbound
from atrium.errors import UpstreamFailed, UpstreamTimeout
from atrium.httppool import HttpPool, UpstreamError, UpstreamResponse
from atrium.lifecycle.calls import APP_ID_HEADER, KIND_HEADER, SECRET_HEADER, AppAddress
from atrium.theme.inject import HtmlTransform

BUFFER_LIMIT: Final = 256 * 1024
UPSTREAM_TIMEOUT: Final = 30.0
#: validators of the app's bytes, wrong once the shell changed the body
CHANGED_BODY_HEADERS: Final = frozenset({b"etag", b"content-md5", b"last-modified"})
#: answers that never carry a body (RFC 9110 6.4.1), whatever their Content-Length says
NO_BODY_STATUS: Final = frozenset({204, 304})
_APP_ID: Final = APP_ID_HEADER.lower().encode()
USER_ID_HEADER: Final = "X-Os-User-Id"
USER_NAME_HEADER: Final = "X-Os-User-Name"
USER_ROLE_HEADER: Final = "X-Os-User-Role"
#: what a decoded path keeps as is when it becomes a request target again (RFC 3986 pchar and /)
PATH_SAFE: Final = "/:@!$&'()*+,;=-._~"


async def request_body(request: Request) -> bytes | AsyncIterator[bytes] | None:
    """Buffered up to BUFFER_LIMIT when the length is declared, streamed otherwise."""
    length = request.headers.get("content-length")
    if length is None and "transfer-encoding" not in request.headers:
        return None
    if length is not None and length.isascii() and length.isdigit() and int(length) <= BUFFER_LIMIT:
        return await request.body()

    async def chunks() -> AsyncIterator[bytes]:
        async for chunk in request.stream():
            if chunk:
                yield chunk

    return chunks()


async def forward_page(
    pool: HttpPool,
    request: Request,
    address: AppAddress,
    path: str,
    *,
    kind: str,
    app_id: str,
    transform_html: HtmlTransform | None = None,
    looking: Headers | None = None,
) -> Response:
    """Send ``request`` to the app's server at ``path`` (query kept) and answer with its reply.
    ``kind`` `page` (the app's origin) passes the request's Authorization on to the app, `user`
    (the user's bearer `/api/proxy/`) never. ``looking``: the `X-Os-User-*` headers naming who
    is looking (`user_headers`)."""
    inbound = Inbound(request.scope["headers"], PAGE)
    headers = inbound.forwarded
    if kind == "page" and inbound.authorization is not None:
        # on the app's own origin the shell knows the browser by the view cookie: an
        # Authorization there is the app's (its page's sign-in, a password prompt of its own
        # origin), never the user's bearer, which only `/api/proxy/` (kind `user`) takes
        headers.append((b"authorization", inbound.authorization.encode("latin-1")))
    headers.append((SECRET_HEADER.encode(), address.secret.encode("latin-1")))
    headers.append((KIND_HEADER.encode(), kind.encode("latin-1")))
    if looking:
        headers.extend(looking)
    query: bytes = request.scope.get("query_string", b"")
    target = quote(path, safe=PATH_SAFE).encode("ascii") + (b"?" + query if query else b"")
    body = await request_body(request)
    try:
        upstream = await pool.request(
            request.method,
            address.host,
            address.port,
            target,
            headers,
            body,
            content_length=inbound.content_length if not isinstance(body, bytes) else None,
            read_timeout=UPSTREAM_TIMEOUT,
        )
    except TimeoutError as err:
        raise UpstreamTimeout(f"{app_id} did not answer within {UPSTREAM_TIMEOUT:.0f} s") from err
    except UpstreamError as err:
        raise UpstreamFailed(f"{app_id} failed: {err}") from err
    claimed = next((v for n, v in upstream.headers if n.lower() == _APP_ID), None)
    if claimed is not None and claimed.decode("latin-1") != app_id:
        upstream.release()
        raise UpstreamFailed(f"the server of {app_id} answered as {claimed.decode('latin-1')!r}")
    return _PageResponse(upstream, request.method, app_id, transform_html)


def user_headers(user_id: str, name: str, role: str) -> Headers:
    """`X-Os-User-Id`, `X-Os-User-Name` and `X-Os-User-Role` of a page request: who is looking
    and what they may do with the instance (`owner`, `editor`, `viewer`). A name is any text, a
    header value is bytes: printable ASCII but `%` passes as it is, every other byte of its UTF-8
    is `%XX` (percent-decoding gives the name back)."""
    encoded = "".join(
        chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in name.encode()
    )
    return [
        (USER_ID_HEADER.encode(), user_id.encode("ascii")),
        (USER_NAME_HEADER.encode(), encoded.encode("ascii")),
        (USER_ROLE_HEADER.encode(), role.encode("ascii")),
    ]


class _PageResponse(Response):
    """The app's answer, sent as it comes: whole (and maybe themed) when small, else streamed."""

    def __init__(
        self,
        upstream: UpstreamResponse,
        method: str,
        app_id: str,
        transform_html: HtmlTransform | None,
    ) -> None:
        super().__init__(status_code=upstream.status)
        self._upstream = upstream
        self._method = method
        self._app_id = app_id
        self._transform = transform_html

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._send(send)
        finally:
            self._upstream.release()

    async def _send(self, send: Send) -> None:
        upstream = self._upstream
        headers = outbound(upstream.headers, PAGE)
        size = upstream.content_length
        no_body = self._method == "HEAD" or upstream.status in NO_BODY_STATUS
        if not no_body and (size is None or size > BUFFER_LIMIT):
            if size is not None:
                headers.append((b"content-length", b"%d" % size))
            await send(
                {"type": "http.response.start", "status": upstream.status, "headers": headers}
            )
            # a failure from here on cannot change the status line: it propagates and the
            # server cuts the connection, so the browser sees a truncated body
            async for chunk in upstream.iter_chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        try:
            body = await upstream.read()
        except TimeoutError as err:
            raise UpstreamTimeout(
                f"{self._app_id} stopped answering for {UPSTREAM_TIMEOUT:.0f} s"
            ) from err
        except UpstreamError as err:
            raise UpstreamFailed(f"{self._app_id} failed while answering: {err}") from err
        themed = self._theme(headers)
        if themed is not None and not no_body:
            changed = themed(body)
            if changed != body:
                headers = [(n, v) for n, v in headers if n.lower() not in CHANGED_BODY_HEADERS]
                body = changed
        if self._method == "HEAD":
            # the length a GET would have; unknown for a themed page without its body
            if size is not None and themed is None:
                headers.append((b"content-length", b"%d" % size))
        elif upstream.status not in NO_BODY_STATUS:
            headers.append((b"content-length", b"%d" % len(body)))
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        await send({"type": "http.response.body", "body": body if not no_body else b""})

    def _theme(self, headers: Headers) -> _Themer | None:
        if self._transform is None:
            return None
        content_type = _header(headers, b"content-type")
        if not content_type.startswith("text/html"):
            return None
        return _Themer(self._transform, content_type, _header(headers, b"content-encoding") or None)


class _Themer:
    __slots__ = ("_encoding", "_transform", "_type")

    def __init__(self, transform: HtmlTransform, content_type: str, encoding: str | None) -> None:
        self._transform, self._type, self._encoding = transform, content_type, encoding

    def __call__(self, body: bytes) -> bytes:
        return self._transform(body, self._type, self._encoding)


def _header(headers: Headers, name: bytes) -> str:
    return next((v.decode("latin-1") for n, v in headers if n.lower() == name), "")
