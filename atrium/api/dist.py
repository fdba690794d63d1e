"""The distribution API (docs/api.md "Distribution"; decisions.md "Distribution"), user only.

Install, preview and update answer server-sent events when ``Accept`` names
``text/event-stream`` (``event: <type>`` / ``data: <json>``; a failure is an ``error`` event
carrying the error object, then the stream ends), otherwise one JSON document built from the
pipeline's ``result`` event. Checks of the request itself (body, ref, scope) answer a plain error
status before any stream starts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Final, TypeVar
from weakref import WeakKeyDictionary

from pydantic import Field
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute
from starlette.types import Scope as AsgiScope

from atrium.api.auth import Access, audit_target, endpoint, shell_of
from atrium.api.bodies import bounded_body, read_model
from atrium.api.errors import shutting_down
from atrium.distribution import spool
from atrium.distribution.exports import MAX_ARCHIVE
from atrium.distribution.fetchers import ProgressEvent
from atrium.distribution.pipeline import Approval, Distribution
from atrium.distribution.refs import GitRef, LocalRef, Ref, parse_ref
from atrium.distribution.updates import UpdateChecks
from atrium.errors import AtriumError, InvalidRequest, NotFound, ShuttingDown
from atrium.events import ERROR, IMPORT_CHECKED, RESULT
from atrium.identity import Caller, UserCaller, require_admin, user_id_of
from atrium.manifest import APP_ID_RE
from atrium.scopes import Scope, parse_scope
from atrium.wire import WireModel

_LOGGER = logging.getLogger(__name__)
B = TypeVar("B", bound=WireModel)
SSE_HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: the `scope` query parameter of the per-app endpoints
SCOPE_QUERY: Final = {"scope": "global or user (default: the winning changeable scope)"}
INTERNAL: Final = {"code": "internal", "message": "internal error; the shell's log has the details"}


class ApprovalBody(WireModel):
    """The approval fields of install and update."""

    auto_approve: bool = False
    approve: bool | None = None
    approved_digest: str | None = None

    def approval(self) -> Approval:
        return Approval(self.auto_approve, self.approve, self.approved_digest)


class UpdateBody(ApprovalBody):
    """`POST /api/dist/update/{id}` (the body may be empty)."""

    #: boot the new version before switching: true always, false never, null when running
    check: bool | None = None
    #: a newer version tag of the recorded source to take (its `newerTags`)
    to: str | None = Field(default=None, min_length=1, max_length=128)


class InstallBody(ApprovalBody):
    """`POST /api/dist/install`."""

    ref: str
    scope: str = Scope.GLOBAL.value
    #: a dev copy (`atrium dev`; user scope only)
    dev: bool = False


class DevProblemBody(WireModel):
    """`POST /api/dist/dev/{id}/problems`: what `atrium dev` found wrong with a save."""

    message: str = Field(min_length=1, max_length=4000)


class RollbackBody(WireModel):
    """`POST /api/dist/rollback/{id}` (the body may be empty)."""

    scope: str | None = None
    #: an earlier version, or a scope commit (7-40 hex digits); default: the previous version
    to: str | None = Field(default=None, min_length=1, max_length=200)
    #: keep the current runtime data instead of restoring the target version's backup
    keep_data: bool = False


class BackupBody(WireModel):
    """`POST /api/dist/backups/{id}` (the body may be empty)."""

    scope: str | None = None


class RestoreBody(WireModel):
    """`POST /api/dist/restore/{id}`."""

    backup: str = Field(min_length=1, max_length=200)
    scope: str | None = None


class PreviewBody(WireModel):
    """`POST /api/dist/install/preview`."""

    ref: str
    scope: str = Scope.GLOBAL.value


def scope_named(raw: str | None) -> Scope | None:
    if raw is None:
        return None
    scope = parse_scope(raw)
    if scope is None:
        raise InvalidRequest(f"unknown scope {raw!r}; scopes are system, global and user")
    return scope


async def optional_body(request: Request, model: type[B]) -> B:
    """The body as ``model``; an empty body means the model's defaults."""
    raw = await bounded_body(request)
    return await read_model(request, model) if raw.strip() else model()


async def dist_of(caller: Caller, request: Request) -> Distribution:
    """The caller's own pipeline: their user scope (made on first use) over the shared ones."""
    shell = shell_of(request)
    return await shell.user_scopes.open(user_id_of(caller) or shell.layout.user)


async def dist_for(
    caller: Caller, request: Request, scope: Scope | None, app_id: str | None, what: str
) -> tuple[Distribution, Scope]:
    """The caller's pipeline and the scope the operation works in (``scope``, else the winning
    changeable scope holding ``app_id`` for them); the global scope is shared, so changing it
    (``what``) is an admin's: a member gets ``403 permission_denied``."""
    dist = await dist_of(caller, request)
    target = scope or (dist.mutable_scope_of(app_id) if app_id else Scope.GLOBAL)
    if target is Scope.GLOBAL:
        require_admin(caller, f"{what} in the global scope (a member's is --scope user)")
    return dist, target


async def data_dist_for(
    caller: Caller, request: Request, scope: Scope | None, app_id: str | None
) -> tuple[Distribution, Scope]:
    """The caller's pipeline and the scope of an operation on the caller's own data of the app
    (backup, restore, export): any user's, in a shared scope too, since each user's instances
    keep their own data and `DataKeeping.own` acts on theirs alone (decisions.md "Users: a
    member's own data of a shared app")."""
    dist = await dist_of(caller, request)
    return dist, scope or (dist.mutable_scope_of(app_id) if app_id else Scope.GLOBAL)


async def scope_or_winning(
    caller: Caller, request: Request, app_id: str
) -> tuple[Distribution, Scope]:
    """The caller's pipeline, and the `scope` query parameter, else the winning changeable scope
    holding the app for them."""
    dist = await dist_of(caller, request)
    return dist, scope_named(request.query_params.get("scope")) or dist.mutable_scope_of(app_id)


def app_id_of(request: Request) -> str:
    app_id: str = request.path_params["app_id"]
    if not APP_ID_RE.fullmatch(app_id):
        raise InvalidRequest(f"{app_id!r} is not an app id (reverse-domain, lowercase)")
    return app_id


def frame(item: ProgressEvent) -> bytes:
    data = json.dumps(dict(item), separators=(",", ":"), default=str)
    return f"event: {item['type']}\ndata: {data}\n\n".encode()


async def stream(
    events: AsyncGenerator[ProgressEvent, None], scope: AsgiScope
) -> AsyncIterator[bytes]:
    """The events as frames. The `result` frame goes last, once the pipeline has finished: a
    client that answers it at once (approve, deny) must not find the app still locked.

    A stream still running when the shell's shutdown grace ends (its task cancelled) ends with an
    `error` event `shutting_down` and a proper end of stream, like any other failure."""
    held: ProgressEvent | None = None
    async with aclosing(events):
        try:
            async for item in events:
                if item["type"] == RESULT:
                    held = item
                else:
                    yield frame(item)
        except asyncio.CancelledError:
            if not shutting_down(scope):
                raise
            yield frame({"type": ERROR, **ShuttingDown().to_body()["error"]})
            return
        except AtriumError as err:
            _LOGGER.info("distribution stream ended with %s: %s", err.code, err.message)
            yield frame({"type": ERROR, **err.to_body()["error"]})
        except Exception:
            _LOGGER.exception("distribution stream failed")
            yield frame({"type": ERROR, **INTERNAL})
    if held is not None:
        yield frame(held)


async def collect(events: AsyncGenerator[ProgressEvent, None]) -> Response:
    """One JSON document: the ``result`` event, with the events before it when ``ok``."""
    seen: list[ProgressEvent] = []
    result: dict[str, Any] = {}
    async with aclosing(events):
        async for item in events:
            if item["type"] == RESULT:
                result = {k: v for k, v in item.items() if k != "type"}
            else:
                seen.append(item)
    if result.get("ok"):
        result["events"] = seen
    return JSONResponse(result)


def ref_for(caller: Caller, raw: str) -> Ref:
    """The parsed ref, if ``caller`` may fetch from it: a `local:` or `git+file://` ref reads
    whatever the shell's own account can read on its machine (other users' folders among it), so
    only an admin may name one."""
    ref = parse_ref(raw)
    if isinstance(ref, LocalRef) or (isinstance(ref, GitRef) and ref.url.startswith("file://")):
        require_admin(caller, "install from a path on the shell's machine (local: or git+file:)")
    return ref


async def install(request: Request, caller: Caller) -> Response:
    body = await read_model(request, InstallBody)
    ref = ref_for(caller, body.ref)
    dist, scope = await dist_for(caller, request, scope_named(body.scope), None, "install")
    audit_target(request, scope=scope.value)
    events = dist.install(ref, scope, body.approval(), dev=body.dev)
    return await _answer(request, events)


async def preview(request: Request, caller: Caller) -> Response:
    body = await read_model(request, PreviewBody)
    ref = ref_for(caller, body.ref)
    scope = scope_named(body.scope) or Scope.GLOBAL
    dist = await dist_of(caller, request)
    return await _answer(request, dist.preview(ref, scope))


async def update(request: Request, caller: Caller) -> Response:
    app_id = app_id_of(request)
    body = await optional_body(request, UpdateBody)
    dist, scope = await dist_for(caller, request, None, app_id, "update an app")
    audit_target(request, scope=scope.value)
    events = dist.update(app_id, body.approval(), body.check, body.to)
    return await _answer(request, events)


async def rollback(request: Request, caller: Caller) -> Response:
    app_id = app_id_of(request)
    body = await optional_body(request, RollbackBody)
    dist, scope = await dist_for(caller, request, scope_named(body.scope), app_id, "roll back")
    audit_target(request, scope=scope.value)
    events = dist.rollback(app_id, scope, body.to, body.keep_data)
    return await _answer(request, events)


async def history(request: Request, caller: Caller) -> Response:
    app_id = app_id_of(request)
    dist, scope = await scope_or_winning(caller, request, app_id)
    entries = await dist.history(app_id, scope)
    record = dist.record(scope, app_id)
    # the caller's own data's backups: in a shared scope each user's are their own
    backups = await asyncio.to_thread(dist.data.own.all, scope, app_id)
    if record is None and not entries and not backups:
        raise NotFound("app", app_id)  # nothing of it in this scope: as for an unknown id
    return JSONResponse(
        {
            "id": app_id,
            "scope": scope.value,
            "current": record.version if record else None,
            "entries": [e.wire() for e in entries],
            "backups": [b.wire() for b in backups],
        }
    )


async def list_backups(request: Request, caller: Caller) -> Response:
    """The app's data backups in a scope, newest first."""
    app_id = app_id_of(request)
    dist, scope = await scope_or_winning(caller, request, app_id)
    backups = await asyncio.to_thread(dist.data.own.all, scope, app_id)
    if not backups and dist.record(scope, app_id) is None:
        raise NotFound("app", app_id)  # nothing of it in this scope: as for an unknown id
    return JSONResponse([b.wire() for b in backups])


async def backup(request: Request, caller: Caller) -> Response:
    """Back up the app's runtime data now."""
    app_id = app_id_of(request)
    body = await optional_body(request, BackupBody)
    dist, scope = await data_dist_for(caller, request, scope_named(body.scope), app_id)
    taken = await dist.data.backup(app_id, scope)
    return JSONResponse(taken.wire())


async def restore(request: Request, caller: Caller) -> Response:
    """Put a backup's data back."""
    app_id = app_id_of(request)
    body = await read_model(request, RestoreBody)
    dist, scope = await data_dist_for(caller, request, scope_named(body.scope), app_id)
    answer = await dist.data.restore(app_id, body.backup, scope)
    return JSONResponse(answer)


async def export(request: Request, caller: Caller) -> Response:
    """The app's archive: tree, record and runtime data (zstd-compressed tar)."""
    app_id = app_id_of(request)
    shell = shell_of(request)
    scope = scope_named(request.query_params.get("scope"))
    dist, scope = await data_dist_for(caller, request, scope, app_id)
    folder = spool.folder(shell.settings.home, "exports")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = folder / f"{app_id}-{secrets.token_hex(6)}.tar.zst"
    try:
        await dist.data.export(app_id, target, scope)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return FileResponse(
        target,
        media_type="application/zstd",
        filename=f"{app_id}.tar.zst",
        background=BackgroundTask(target.unlink, missing_ok=True),
    )


async def import_app(request: Request, caller: Caller) -> Response:
    """Install an exported app with its data; the body is the archive."""
    shell = shell_of(request)
    params = request.query_params
    scope = scope_named(params.get("scope"))
    # the caller's own data into the installed copy, its tree untouched: what a member's import
    # into a shared scope is, and an admin's with dataOnly
    data_only = params.get("dataOnly", "").lower() in {"1", "true", "yes"} or (
        scope not in (None, Scope.USER) and not (isinstance(caller, UserCaller) and caller.is_admin)
    )
    if data_only:
        dist, scope = await data_dist_for(caller, request, scope, None)
    else:
        dist, scope = await dist_for(caller, request, scope, None, "import")
    auto = params.get("autoApprove", "").lower() in {"1", "true", "yes"}
    # the app the caller means (the host page's detail of one app): an archive of another is
    # refused once it is read, before anything of it is installed
    expected = params.get("appId")
    if expected is not None and not APP_ID_RE.fullmatch(expected):
        raise InvalidRequest(f"appId {expected[:300]!r} is not an app id", appId=expected[:300])
    archive = await spool.receive(request.stream(), shell.settings.home, MAX_ARCHIVE)

    async def events() -> AsyncGenerator[ProgressEvent, None]:
        try:
            if data_only:
                run = dist.import_data(archive, scope)
            else:
                run = dist.import_archive(archive, scope, Approval(auto_approve=auto))
            async with aclosing(run) as steps:
                async for item in steps:
                    named = item.get("appId")
                    if item.get("type") == IMPORT_CHECKED and expected not in (None, named):
                        raise InvalidRequest(
                            f"the archive holds {named}, not {expected}: nothing was imported",
                            appId=named,
                            expected=expected,
                        )
                    yield item
        finally:
            archive.unlink(missing_ok=True)

    return await _answer(request, events())


async def _naming(
    request: Request, events: AsyncGenerator[ProgressEvent, None]
) -> AsyncGenerator[ProgressEvent, None]:
    """The events, naming the app and version they concern in the call's audit record once the
    pipeline knows them (an install's ref names neither, and is never written)."""
    async with aclosing(events):
        async for item in events:
            app_id, version = item.get("appId"), item.get("version")
            if isinstance(app_id, str):
                audit_target(request, app_id=app_id)
                if isinstance(version, str):
                    audit_target(request, version=version)
            yield item


async def _answer(request: Request, events: AsyncGenerator[ProgressEvent, None]) -> Response:
    events = _naming(request, events)
    if "text/event-stream" in request.headers.get("accept", ""):
        return StreamingResponse(
            stream(events, request.scope), media_type="text/event-stream", headers=SSE_HEADERS
        )
    return await collect(events)


async def uninstall(request: Request, caller: Caller) -> Response:
    app_id = app_id_of(request)
    scope = scope_named(request.query_params.get("scope"))
    dev_only = request.query_params.get("devOnly", "").lower() in {"1", "true", "yes"}
    dist, target = await dist_for(caller, request, scope, app_id, "uninstall")
    audit_target(request, scope=target.value)
    return JSONResponse(await dist.uninstall(app_id, target if scope else None, dev_only=dev_only))


async def dev_problems(request: Request, caller: Caller) -> Response:
    """`atrium dev` found a save's folder wrong (the last good version keeps running): the
    author's page shows ``message`` over that version (`dev:failed`)."""
    app_id = app_id_of(request)
    dist = await dist_of(caller, request)
    dist.require_dev_copy(app_id)
    body = await read_model(request, DevProblemBody)
    dist.dev_failed(app_id, body.message)
    return JSONResponse({"ok": True})


async def index(request: Request, caller: Caller) -> Response:
    refresh = request.query_params.get("refresh", "").lower() in {"1", "true", "yes"}
    client = shell_of(request).dist.index
    snapshot = await client.get(refresh=refresh)
    return JSONResponse(snapshot.wire(client.ttl))


async def installed(request: Request, caller: Caller) -> Response:
    dist = await dist_of(caller, request)
    damaged = [{**d, "damaged": True} for d in await asyncio.to_thread(dist.records.damaged)]
    return JSONResponse([r.wire() for r in dist.installed()] + damaged)


#: each user's pipeline's update check (its cache lives as long as the pipeline)
_CHECKS: WeakKeyDictionary[Distribution, UpdateChecks] = WeakKeyDictionary()


async def updates(request: Request, caller: Caller) -> Response:
    """Which of the caller's installs (their user scope and the global one) have a newer
    version: read only, nothing is fetched into the shell or changed."""
    refresh = request.query_params.get("refresh", "").lower() in {"1", "true", "yes"}
    dist = await dist_of(caller, request)
    checks = _CHECKS.get(dist)
    if checks is None:
        checks = _CHECKS[dist] = UpdateChecks(dist.resolver)
    states = await checks.check(dist.installed(), refresh)
    return JSONResponse(
        {"updates": [s.wire() for s in states], "available": sum(s.available for s in states)}
    )


routes: list[BaseRoute] = [
    endpoint("/api/dist/install", install, methods=["POST"], access=Access.USER, body=InstallBody),
    endpoint(
        "/api/dist/install/preview", preview, methods=["POST"], access=Access.USER, body=PreviewBody
    ),
    endpoint(
        "/api/dist/update/{app_id}",
        update,
        methods=["POST"],
        access=Access.USER,
        body=UpdateBody,
        body_required=False,
    ),
    endpoint(
        "/api/dist/rollback/{app_id}",
        rollback,
        methods=["POST"],
        access=Access.USER,
        body=RollbackBody,
        body_required=False,
    ),
    endpoint(
        "/api/dist/history/{app_id}",
        history,
        methods=["GET"],
        access=Access.USER,
        query=SCOPE_QUERY,
    ),
    endpoint(
        "/api/dist/backups/{app_id}",
        list_backups,
        methods=["GET"],
        access=Access.USER,
        query=SCOPE_QUERY,
    ),
    endpoint(
        "/api/dist/backups/{app_id}",
        backup,
        methods=["POST"],
        access=Access.USER,
        body=BackupBody,
        body_required=False,
    ),
    endpoint(
        "/api/dist/restore/{app_id}",
        restore,
        methods=["POST"],
        access=Access.USER,
        body=RestoreBody,
    ),
    endpoint(
        "/api/dist/export/{app_id}",
        export,
        methods=["GET"],
        access=Access.USER,
        query=SCOPE_QUERY,
    ),
    endpoint(
        "/api/dist/import",
        import_app,
        methods=["POST"],
        access=Access.USER,
        query={
            "scope": "global (default) or user",
            "autoApprove": "1, true or yes: approve the permission diff",
        },
    ),
    endpoint(
        "/api/dist/uninstall/{app_id}",
        uninstall,
        methods=["DELETE"],
        access=Access.USER,
        query=SCOPE_QUERY,
    ),
    endpoint(
        "/api/dist/index",
        index,
        methods=["GET"],
        access=Access.USER,
        query={"refresh": "1, true or yes: fetch the index again"},
    ),
    endpoint("/api/dist/installed", installed, methods=["GET"], access=Access.USER),
    endpoint(
        "/api/dist/updates",
        updates,
        methods=["GET"],
        access=Access.USER,
        query={"refresh": "1, true or yes: read every source again"},
    ),
    endpoint(
        "/api/dist/dev/{app_id}/problems",
        dev_problems,
        methods=["POST"],
        access=Access.USER,
        body=DevProblemBody,
    ),
]
