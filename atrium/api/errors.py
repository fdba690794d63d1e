"""The only place where errors become responses: `{"error": {"code", "message", ...fields}}`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atrium.errors import AtriumError, InvalidRequest, NotFound, ShuttingDown

_LOGGER = logging.getLogger(__name__)
#: the scope extension `atrium.api.server` gives every request of a connection: ``abort`` resets
#: the connection, ``stopping`` tells whether the server is shutting down
CONNECTION_EXTENSION: Final = "atrium.connection"


def shutting_down(scope: Scope) -> bool:
    """Whether the server serving ``scope`` has begun its shutdown (False when it does not say)."""
    extension = scope.get("extensions", {}).get(CONNECTION_EXTENSION)
    stopping = extension.get("stopping") if isinstance(extension, dict) else None
    return bool(stopping()) if callable(stopping) else False


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
    cuts the connection (the caller sees a truncated answer, never a wrong success).

    A shutdown waits a grace for the requests in flight, then cancels their tasks; the
    cancellation is a BaseException that no `except Exception` sees, and uvicorn answered it
    with a plain-text `Internal Server Error`. Here it becomes `503 shutting_down` (an answer
    that had started and ended, a stream that said so itself, just ends)."""
    started = completed = False

    async def tracking_send(message: Message) -> None:
        nonlocal started, completed
        if message["type"] == "http.response.start":
            started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            completed = True
        await send(message)

    try:
        await handler(tracking_send)
    except asyncio.CancelledError:
        if not shutting_down(scope) or (started and not completed):
            raise  # not the shutdown's, or half an answer: the connection is cut
        if not started:
            await error_response(ShuttingDown())(scope, receive, send)
        _LOGGER.info(
            "%s %s: still running at the end of the shutdown grace; answered %s",
            scope.get("method"),
            scope.get("path"),
            "503 shutting_down" if not started else "before it was stopped",
        )
        # the task ends here, answered: the server cancels a request only once, to stop it
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
