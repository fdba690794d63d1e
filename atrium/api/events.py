"""`GET /api/events`: the bus as server-sent events, with topic globs, heartbeats and replay."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.bus import Subscription
from atrium.errors import InvalidRequest
from atrium.events import compile_glob
from atrium.identity import Caller

HEARTBEAT: Final = b": heartbeat\n\n"
SSE_HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def parse_topics(raw: str | None) -> tuple[str, ...] | None:
    if raw is None or not raw.strip():
        return None
    globs = tuple(g.strip() for g in raw.split(",") if g.strip())
    for glob in globs:
        try:
            compile_glob(glob)
        except ValueError as err:
            raise InvalidRequest(f"bad topics parameter: {err}") from err
    return globs


def parse_last_event_id(raw: str | None) -> int | None:
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip())
    except ValueError as err:
        raise InvalidRequest(
            f"Last-Event-ID {raw[:40]!r} is not an event id (a whole number)"
        ) from err


async def stream(sub: Subscription, heartbeat: float) -> AsyncIterator[bytes]:
    """Frames as they come, a heartbeat comment when the bus has been quiet for ``heartbeat`` s."""
    yield b": connected\n\n"
    while True:
        try:
            frame = await sub.next(heartbeat)
        except TimeoutError:
            yield HEARTBEAT
            continue
        if frame is None:
            return
        yield frame


async def events(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    globs = parse_topics(request.query_params.get("topics"))
    last_id = parse_last_event_id(
        request.headers.get("last-event-id") or request.query_params.get("lastEventId")
    )
    client = request.query_params.get("client")
    if client is not None and not shell.presence.is_client_id(client):
        raise InvalidRequest("client must be 8-64 letters, digits, '-' or '_'")
    sub = shell.bus.subscribe(globs, last_id)
    if client is not None:
        shell.presence.connected(client)

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in stream(sub, shell.settings.heartbeat_seconds):
                yield chunk
        finally:
            shell.bus.unsubscribe(sub)
            if client is not None:
                shell.presence.disconnected(client)

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)


routes: list[BaseRoute] = [
    endpoint("/api/events", events, methods=["GET"], access=Access.USER_OR_APP),
]
