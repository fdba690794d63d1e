"""The only place where errors become responses: `{"error": {"code", "message", ...fields}}`."""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
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


class InternalErrorMiddleware:
    """Answer an unexpected exception with 500 `internal`, logging its traceback once."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            _LOGGER.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            body: dict[str, Any] = {
                "error": {
                    "code": "internal",
                    "message": "internal error; the shell's log has the details",
                }
            }
            await JSONResponse(body, status_code=500)(scope, receive, send)
