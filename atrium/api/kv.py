"""The KV API: `/api/kv/os/<key>`, `/api/kv/app/<appId>/<key>` and `/api/kv/global/<key>`,
envelope `{value, updatedAt}`.

`os` and `app/<appId>` are per user: a user reads and writes their own rows, an app its owner's.
The user may do everything there; an app owns its own namespace and needs `system.kv.…`
permissions, listed in its manifest, for anything else (docs/api.md "Callers"). `global` holds
the platform's defaults: an admin writes them, everyone reads them (an app with the read
permission of the `os` key it defaults).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, Handler, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.errors import InvalidRequest, NotFound, PermissionDenied
from atrium.identity import AppCaller, Caller, UserCaller
from atrium.kv import GLOBAL
from atrium.manifest import APP_ID_RE
from atrium.permissions import KV_KEY_RE, Verb, holds, kv_permission_needed
from atrium.shell import Shell


class KvPut(BaseModel):
    """`PUT` body: `{value}`, any JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: Any


def _address(request: Request, space: str | None) -> tuple[str, str]:
    """(namespace, key) of the request: ``space`` (`os` or `global`) or `app/<appId>`."""
    key: str = request.path_params["key"]
    if not KV_KEY_RE.fullmatch(key):
        raise InvalidRequest(
            f"{key[:140]!r} is not a KV key: 1-128 characters of letters, digits, '.', '_' and '-', "
            "starting with a letter or digit",
            key=key[:140],
        )
    app_id = request.path_params.get("app_id")
    if app_id is None:
        return space or "os", key
    if not APP_ID_RE.fullmatch(app_id):
        raise InvalidRequest(f"{app_id!r} is not an app id (reverse-domain, lowercase)")
    return f"app/{app_id}", key


def _owner(caller: Caller) -> str | None:
    """Whose rows the caller's `os` and `app/…` are: the user's own, an app's owner's."""
    if isinstance(caller, UserCaller):
        return caller.user_id
    if isinstance(caller, AppCaller):
        return caller.owner
    return None


def _check(shell: Shell, caller: Caller, namespace: str, key: str, verb: Verb) -> None:
    if namespace == GLOBAL and verb is Verb.WRITE:
        if isinstance(caller, UserCaller) and caller.is_admin:
            return
        who = f"app {caller.app_id!r}" if isinstance(caller, AppCaller) else "a member"
        raise PermissionDenied(
            f"{who} cannot change {namespace}/{key}: platform defaults are an admin's to write "
            f"(each user's own setting is /api/kv/os/{key})",
            **({"caller_app_id": caller.app_id} if isinstance(caller, AppCaller) else {}),
        )
    if not isinstance(caller, AppCaller):
        return  # the user may do everything with their own rows, and read the defaults
    # a platform default is read with the permission of the setting it defaults
    needed = kv_permission_needed(
        caller.app_id, "os" if namespace == GLOBAL else namespace, key, verb
    )
    copy = shell.registry.get(caller.app_id, caller.owner)
    granted = copy.manifest.permissions if copy and copy.manifest else []
    if not holds(granted, needed):
        raise PermissionDenied(
            f"app {caller.app_id!r} needs permission {needed!r} in its manifest to {verb} "
            f"{namespace}/{key}",
            caller_app_id=caller.app_id,
            permission=needed,
        )


async def get_value(request: Request, caller: Caller, space: str | None = None) -> Response:
    shell = shell_of(request)
    namespace, key = _address(request, space)
    _check(shell, caller, namespace, key, Verb.READ)
    entry = await shell.kv.get(namespace, key, owner=_owner(caller))
    if entry is None:
        raise NotFound("key", f"{namespace}/{key}")
    return JSONResponse(entry.wire())


async def put_value(request: Request, caller: Caller, space: str | None = None) -> Response:
    shell = shell_of(request)
    namespace, key = _address(request, space)
    _check(shell, caller, namespace, key, Verb.WRITE)
    body = await read_model(request, KvPut)
    try:
        entry = await shell.kv.set(namespace, key, body.value, owner=_owner(caller))
    except ValueError as err:
        raise InvalidRequest(f"cannot store {namespace}/{key}: {err}") from err
    return JSONResponse(entry.wire())


async def delete_value(request: Request, caller: Caller, space: str | None = None) -> Response:
    shell = shell_of(request)
    namespace, key = _address(request, space)
    _check(shell, caller, namespace, key, Verb.WRITE)
    if not await shell.kv.delete(namespace, key, owner=_owner(caller)):
        raise NotFound("key", f"{namespace}/{key}")
    return JSONResponse({"ok": True, "namespace": namespace, "key": key})


def _routes(path: str, space: str | None = None) -> list[BaseRoute]:
    """The three routes of one path; ``space`` names the namespace when the path has no app id."""

    def bound(handler: Callable[[Request, Caller, str | None], Awaitable[Response]]) -> Handler:
        async def answer(request: Request, caller: Caller) -> Response:
            return await handler(request, caller, space)

        answer.__name__ = (
            handler.__name__ if space in (None, "os") else f"{handler.__name__}_{space}"
        )
        return answer

    return [
        endpoint(path, bound(get_value), methods=["GET"], access=Access.USER_OR_APP),
        endpoint(path, bound(put_value), methods=["PUT"], access=Access.USER_OR_APP, body=KvPut),
        endpoint(path, bound(delete_value), methods=["DELETE"], access=Access.USER_OR_APP),
    ]


routes: list[BaseRoute] = [
    *_routes("/api/kv/os/{key:path}", "os"),
    *_routes(f"/api/kv/{GLOBAL}/{{key:path}}", GLOBAL),
    *_routes("/api/kv/app/{app_id}/{key:path}"),
]
