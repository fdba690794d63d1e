"""The only place where errors become responses: `{"error": {"code", "message", ...fields}}`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atrium.errors import AtriumError, InvalidRequest, NotFound

_LOGGER = logging.getLogger(__name__)


def error_response(err: AtriumError) -> JSONResponse:
    return JSONResponse(err.to_body(), status_code=err.http_status, headers=dict(err.headers()))


async def atrium_error_handler(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, AtriumError):  # pragma: no cover - registered for AtriumError only
        raise exc
    _LOGGER.info(
        "%s %s → %d %s: %s",
        request.method,
        request.url.path,
        exc.http_status,
        exc.code,
        exc.message,
    )
    return error_response(exc)


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in our error shape."""
    if not isinstance(exc, HTTPException):  # pragma: no cover - registered for HTTPException only
        raise exc
    err: AtriumError
    if exc.status_code == 404:
        err = NotFound("route", request.url.path, f"no route {request.method} {request.url.path}")
    else:
        err = InvalidRequest(f"{request.method} {request.url.path}: {exc.detail}")
    response = error_response(err)
    response.status_code = exc.status_code if exc.status_code >= 400 else 400
    if exc.headers:
        response.headers.update(exc.headers)
    return response


INTERNAL_MESSAGE = "internal error; the shell's log has the details"
Handler = Callable[[Send], Awaitable[None]]


async def guard(handler: Handler, scope: Scope, receive: Receive, send: Send) -> None:
    """The one error boundary of the HTTP edge: ``handler(send)`` runs, an AtriumError becomes
    its error body, anything else a 500 `internal` with its traceback logged once. Once the
    response has started nothing can be said any more: the exception propagates and the server
    cuts the connection (the caller sees a truncated answer, never a wrong success)."""
    started = False

    async def tracking_send(message: Message) -> None:
        nonlocal started
        if message["type"] == "http.response.start":
            started = True
        await send(message)

    try:
        await handler(tracking_send)
    except AtriumError as err:
        if started:
            raise
        await error_response(err)(scope, receive, send)
    except ClientDisconnect:
        # nobody is left to answer, and it is the caller's doing: a line, not a traceback
        # (any caller could otherwise fill the log with them)
        _LOGGER.info(
            "%s %s: the client went away before its request was read",
            scope.get("method"),
            scope.get("path"),
        )
    except Exception:
        _LOGGER.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
        if started:
            raise
        await error_response(AtriumError(INTERNAL_MESSAGE))(scope, receive, send)


class InternalErrorMiddleware:
    """Starlette's routes inside the one boundary (`guard`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await guard(lambda sending: self.app(scope, receive, sending), scope, receive, send)
