"""`GET /api/events`: the bus as server-sent events, with topic globs, heartbeats and replay.

A raw ASGI handler dispatched before Starlette (like the data proxy): one frame is one `send`,
with no middleware wrapping every write. The bus offers the heartbeat comments; a task watches
for the client going away and ends the subscription. A subscriber the bus drops as too slow has
its connection reset through the server's abort extension (`atrium.api.server`): its writer is
stuck behind a client that does not read, and only cutting the connection frees it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Final

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from atrium.api.auth import Access, authorize, identify, still_signed_in
from atrium.api.errors import CONNECTION_EXTENSION, error_response
from atrium.bus import Event, Subscription
from atrium.errors import AtriumError, InvalidRequest
from atrium.events import (
    DATA_CHANGED,
    GRANT_ADDED,
    GRANT_REVOKED,
    INSTANCE_ROUTED,
    INSTANCE_TOKEN,
    MAX_GLOBS,
    SYSTEM_USAGE,
    DataChanged,
    GrantAdded,
    GrantRevoked,
    SystemUsage,
    compile_glob,
)
from atrium.identity import AppCaller, Caller, UserCaller
from atrium.manifest import AUTHORITY_RE
from atrium.providers import canonical_path, related
from atrium.shell import Shell

PATH: Final = b"/api/events"
CONNECTED: Final = b": connected\n\n"
SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def parse_topics(raw: str | None) -> tuple[str, ...] | None:
    if raw is None or not raw.strip():
        return None
    globs = tuple(dict.fromkeys(g.strip() for g in raw.split(",") if g.strip()))
    if len(globs) > MAX_GLOBS:
        raise InvalidRequest(
            f"bad topics parameter: {len(globs)} globs; the limit is {MAX_GLOBS} per stream",
            problems=[{"field": "topics", "message": f"at most {MAX_GLOBS} globs"}],
        )
    for glob in globs:
        try:
            compile_glob(glob)
        except ValueError as err:
            raise InvalidRequest(
                f"bad topics parameter: {err}", problems=[{"field": "topics", "message": str(err)}]
            ) from err
    return globs


def parse_data_path(raw: str | None) -> tuple[str, str] | None:
    """``dataPath=<authority>/<prefix>`` → (authority, canonical prefix); no prefix is `/`."""
    if raw is None or not raw.strip():
        return None
    authority, slash, rest = raw.strip().partition("/")
    try:
        if not AUTHORITY_RE.fullmatch(authority):
            raise ValueError(f"{authority[:80]!r} is not an authority")
        return authority, canonical_path("/" + rest if slash else "/")
    except ValueError as err:
        raise InvalidRequest(
            f"bad dataPath parameter (<authority>/<path>): {err}",
            problems=[{"field": "dataPath", "message": str(err)}],
        ) from err


#: the topics heard only by the users their payload names: a row of one of them that this shell
#: cannot read as its payload class is heard by nobody
PRIVATE_TOPICS: Final = frozenset({GRANT_ADDED, GRANT_REVOKED, SYSTEM_USAGE})


def change_filter(
    shell: Shell, caller: Caller, watched: tuple[str, str] | None
) -> Callable[[Event], bool] | None:
    """Who hears what (docs/api.md "Event stream"). An event with an owner reaches that user's
    streams and their apps' only; the platform's (no owner) reach everyone. Of `data:changed`
    (owned by the announcing provider's owner) the user hears every one, an app only those under
    paths it may read; ``watched`` narrows to
    one subtree. A grant's events reach the grantee and the instance's owner only, never an app;
    `system:usage` its user only, never an app; `instance:routed` and `instance:token` nobody.
    The same test runs on replayed events."""
    app = caller if isinstance(caller, AppCaller) else None
    user = caller.user_id if isinstance(caller, UserCaller) else None
    hearer = user if app is None else app.owner

    def admit(event: Event) -> bool:
        if event.topic in (INSTANCE_ROUTED, INSTANCE_TOKEN):
            return False  # the shells' own: where instances run is no stream's business
        change = event.data
        if change is None and event.topic in PRIVATE_TOPICS:
            return False  # a row this shell cannot read (another version wrote it): nobody's
        if change is None and event.topic == DATA_CHANGED and app is not None:
            return False  # an app hears only paths it may read, and this one's is unknown
        if isinstance(change, GrantAdded | GrantRevoked):
            return user is not None and user in (change.user, change.owner)
        if isinstance(change, SystemUsage):
            return user is not None and change.owner == user
        if event.owner is not None and event.owner != hearer:
            return False
        if not isinstance(change, DataChanged):
            return True
        if watched is not None and (
            change.authority != watched[0] or not related(watched[1], change.path)
        ):
            return False
        return app is None or shell.dataproxy.may_read(app, change.authority, change.path)

    return admit


def parse_last_event_id(raw: str | None) -> int | None:
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip())
    except ValueError as err:
        raise InvalidRequest(
            f"Last-Event-ID {raw[:40]!r} is not an event id (a whole number)"
        ) from err


async def serve_events(
    shell: Shell, scope: Scope, receive: Receive, send: Send, caller: Caller | None = None
) -> None:
    """Answer `GET /api/events` (the user or an app; ``caller`` when identified by origin)."""
    request = Request(scope, receive)
    try:
        if scope["method"] not in {"GET", "HEAD"}:
            raise InvalidRequest(f"{scope['method']} /api/events: use GET")
        if caller is None:
            caller = await identify(request, shell)
        authorize(caller, Access.USER_OR_APP)
        globs = parse_topics(request.query_params.get("topics"))
        watched = parse_data_path(request.query_params.get("dataPath"))
        last_id = parse_last_event_id(
            request.headers.get("last-event-id") or request.query_params.get("lastEventId")
        )
        client = shell.presence.client_id(request.query_params.get("client"))
    except AtriumError as err:
        await error_response(err)(scope, receive, send)
        return
    admit = change_filter(shell, caller, watched)
    sub = shell.bus.subscribe(
        globs,
        last_id,
        on_drop=abort_of(scope),
        admit=admit,
        hearer=caller.user_id if isinstance(caller, UserCaller) else None,
    )
    if client is not None:
        shell.presence.connected(client)
    signed_out = _end_when_signed_out(shell, caller, sub)
    watcher = asyncio.create_task(_until_disconnect(receive, shell, sub), name="sse disconnect")
    try:
        await _stream(sub, send)
    except OSError:
        pass  # the client went away mid-write
    finally:
        if signed_out is not None:
            shell.users.on_change.remove(signed_out)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        shell.bus.unsubscribe(sub)
        if client is not None:
            shell.presence.disconnected(client)


def _end_when_signed_out(
    shell: Shell, caller: Caller, sub: Subscription
) -> Callable[[str], None] | None:
    """A user's stream ends as soon as the credential it was opened with stops identifying them
    (disabled, deleted, signed out, session or token ended): the check other requests make at
    their start, made for a request that lasts. The callback is the store's to call."""
    if not isinstance(caller, UserCaller):
        return None
    user_caller = caller

    def changed(user_id: str) -> None:
        if user_id == user_caller.user_id and not still_signed_in(shell, user_caller):
            shell.bus.unsubscribe(sub)

    shell.users.on_change.append(changed)
    return changed


def abort_of(scope: Scope) -> Callable[[], object] | None:
    """The server's way to reset this request's connection, when it offers one."""
    extension = scope.get("extensions", {}).get(CONNECTION_EXTENSION)
    abort = extension.get("abort") if isinstance(extension, dict) else None
    return abort if callable(abort) else None


async def _stream(sub: Subscription, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await send({"type": "http.response.body", "body": CONNECTED, "more_body": True})
    async for frame in sub:
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _until_disconnect(receive: Receive, shell: Shell, sub: Subscription) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    shell.bus.unsubscribe(sub)
