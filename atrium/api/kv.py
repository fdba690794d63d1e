"""The KV API: `/api/kv/os/<key>` and `/api/kv/app/<appId>/<key>`, envelope `{value, updatedAt}`.

The user may do everything; an app owns its own namespace and needs `system.kv.…` permissions,
listed in its manifest, for anything else (docs/api.md "Callers").
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.errors import InvalidRequest, NotFound, PermissionDenied
from atrium.identity import AppCaller, Caller
from atrium.manifest import APP_ID_RE
from atrium.permissions import KV_KEY_RE, Verb, holds, kv_permission_needed
from atrium.shell import Shell


class KvPut(BaseModel):
    """`PUT` body: `{value}`, any JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: Any


def _address(request: Request) -> tuple[str, str]:
    key: str = request.path_params["key"]
    if not KV_KEY_RE.fullmatch(key):
        raise InvalidRequest(
            f"{key[:140]!r} is not a KV key: 1-128 characters of letters, digits, '.', '_' and '-', "
            "starting with a letter or digit",
            key=key[:140],
        )
    app_id = request.path_params.get("app_id")
    if app_id is None:
        return "os", key
    if not APP_ID_RE.fullmatch(app_id):
        raise InvalidRequest(f"{app_id!r} is not an app id (reverse-domain, lowercase)")
    return f"app/{app_id}", key


def _check(shell: Shell, caller: Caller, namespace: str, key: str, verb: Verb) -> None:
    if not isinstance(caller, AppCaller):
        return  # the user may do everything
    needed = kv_permission_needed(caller.app_id, namespace, key, verb)
    copy = shell.registry.get(caller.app_id)
    granted = copy.manifest.permissions if copy and copy.manifest else []
    if not holds(granted, needed):
        raise PermissionDenied(
            f"app {caller.app_id!r} needs permission {needed!r} in its manifest to {verb} "
            f"{namespace}/{key}",
            caller_app_id=caller.app_id,
            permission=needed,
        )


async def get_value(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    namespace, key = _address(request)
    _check(shell, caller, namespace, key, Verb.READ)
    entry = await shell.kv.get(namespace, key)
    if entry is None:
        raise NotFound("key", f"{namespace}/{key}")
    return JSONResponse(entry.wire())


async def put_value(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    namespace, key = _address(request)
    _check(shell, caller, namespace, key, Verb.WRITE)
    body = await read_model(request, KvPut)
    try:
        entry = await shell.kv.set(namespace, key, body.value)
    except ValueError as err:
        raise InvalidRequest(f"cannot store {namespace}/{key}: {err}") from err
    return JSONResponse(entry.wire())


async def delete_value(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    namespace, key = _address(request)
    _check(shell, caller, namespace, key, Verb.WRITE)
    if not await shell.kv.delete(namespace, key):
        raise NotFound("key", f"{namespace}/{key}")
    return JSONResponse({"ok": True, "namespace": namespace, "key": key})


def _routes(path: str) -> list[BaseRoute]:
    return [
        endpoint(path, get_value, methods=["GET"], access=Access.USER_OR_APP),
        endpoint(path, put_value, methods=["PUT"], access=Access.USER_OR_APP, body=KvPut),
        endpoint(path, delete_value, methods=["DELETE"], access=Access.USER_OR_APP),
    ]


routes: list[BaseRoute] = [
    *_routes("/api/kv/os/{key:path}"),
    *_routes("/api/kv/app/{app_id}/{key:path}"),
]
