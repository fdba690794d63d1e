"""`GET /api/apps`: visible apps with scope and masks, and every invalid copy's problems."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, audit_target, endpoint, shell_of
from atrium.distribution.validate import runtime_folders
from atrium.egress import asked
from atrium.errors import InvalidRequest, NotFound
from atrium.files import tree_bytes
from atrium.identity import Caller, UserCaller, require_admin, user_id_of
from atrium.permissions import describe
from atrium.registry import AppView
from atrium.scopes import Scope
from atrium.shell import Shell


def record_of(shell: Shell, view: AppView, user: str | None = None) -> dict[str, Any] | None:
    """The install record of the listed copy (decisions.md "Lifecycle": null for apps placed by
    hand); a user scope's copy is ``user``'s."""
    record = shell.user_scopes.dist(user).record(view.copy.scope, view.copy.id)
    return record.wire() if record else None


def app_wire(shell: Shell, view: AppView, user: str | None = None) -> dict[str, Any]:
    """An app as listed, with the authorities it declares that another app ``user`` sees
    serves."""
    body = view.wire(record_of(shell, view, user))
    table = shell.dataproxy.table_for(user) if user else shell.dataproxy.table
    body["conflicts"] = [
        {"authority": clash.authority, "servedBy": clash.served_by}
        for clash in table.clashes
        if clash.app_id == view.copy.id
    ]
    return body


async def list_apps(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    user = user_id_of(caller)
    return JSONResponse([app_wire(shell, view, user) for view in shell.registry.views(user)])


async def get_app(request: Request, caller: Caller) -> Response:
    app_id = request.path_params["app_id"]
    shell = shell_of(request)
    user = user_id_of(caller)
    for view in shell.registry.views(user):
        if view.copy.id == app_id:
            body = app_wire(shell, view, user)
            mine = caller.user_id if isinstance(caller, UserCaller) else None
            body["dataBytes"] = (
                None
                if mine is None
                else await asyncio.to_thread(tree_bytes, own_data(shell, view, mine))
            )
            # the bootstrap admin's data is inside the app directory: an uninstall deletes it;
            # anyone else's is in their own folder and stays
            body["dataWithApp"] = None if mine is None else mine == shell.layout.user
            if view.copy.manifest is not None:
                body["manifest"] = view.copy.manifest.wire()
                labels = shell.registry.permission_labels(user)
                body["permissions"] = [
                    describe(name, labels) for name in view.copy.manifest.permissions
                ]
                if shell.egress is not None:
                    body["network"] = shell.egress.wire(view.copy, user)
            return JSONResponse(body)
    raise NotFound("app", app_id)


async def grant_egress(request: Request, caller: Caller) -> Response:
    """Grant again what the app's manifest asks to reach (after a revoke)."""
    return await _set_egress(request, caller, grant=True)


async def revoke_egress(request: Request, caller: Caller) -> Response:
    """Take back the app's egress: its running instances lose it at once."""
    return await _set_egress(request, caller, grant=False)


async def _set_egress(request: Request, caller: Caller, *, grant: bool) -> Response:
    """A shared copy's egress is the admins' to change; a user scope's copy's, its user's.
    Answers the app's ``network`` as `GET /api/apps/{appId}` does."""
    app_id = request.path_params["app_id"]
    shell = shell_of(request)
    user = user_id_of(caller)
    copy = shell.registry.get(app_id, user)
    if copy is None or copy.manifest is None:
        raise NotFound("app", app_id)
    what = "grant" if grant else "revoke"
    if copy.scope is not Scope.USER:
        require_admin(caller, f"{what} the network egress of an app all users share")
    if asked(copy.manifest) is False:
        raise InvalidRequest(
            f"{app_id!r} asks to reach nothing beyond the shell (its manifest has no "
            f"network.egress), so there is nothing to {what}",
            appId=app_id,
        )
    if shell.egress is None:  # pragma: no cover - every open shell has one
        raise InvalidRequest("this shell keeps no egress grants")
    audit_target(request, scope=copy.scope.value)
    by = caller.user_id if isinstance(caller, UserCaller) else "?"
    await shell.egress.set(copy, user, grant, by)
    return JSONResponse({"appId": app_id, "network": shell.egress.wire(copy, user)})


def own_data(shell: Shell, view: AppView, user: str) -> list[Path]:
    """The runtime data folders of ``user``'s own instances of the listed copy, where the
    lifecycle puts them (`ScopeLayout.runtime_dir`): the bootstrap admin's beside the app,
    anyone else's in their own folder (`<appId>~<user>-<n>`). Another user's are never among
    them."""
    layout = shell.layout
    app_id = view.copy.id
    home = layout.runtime_dir(view.copy.scope, app_id, app_id, user).parent
    return runtime_folders(home, app_id, None if user == layout.user else user)


#: icon files the host page shows, by extension
ICON_TYPES: Final = {
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".webp": "image/webp",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
}
#: an icon is an image, never a document: an SVG opened directly runs no script, loads nothing
ICON_HEADERS: Final = {
    "Content-Security-Policy": "sandbox; default-src 'none'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
MAX_ICON: Final = 512 * 1024


async def app_icon(request: Request, caller: Caller) -> Response:
    """The visible copy's icon file (an SVG, PNG, WebP, JPEG or GIF in the app directory)."""
    app_id = request.path_params["app_id"]
    copy = shell_of(request).registry.get(app_id, user_id_of(caller))
    icon = copy.manifest.icon if copy and copy.manifest else None
    if copy is None or icon is None or len(icon) <= 3:
        raise NotFound("icon", app_id, f"{app_id} has no icon file (a glyph or none)")
    media = ICON_TYPES.get(Path(icon).suffix.lower())
    data = None if media is None else await asyncio.to_thread(read_icon, copy.path, icon, app_id)
    if media is None or data is None:
        raise NotFound("icon", app_id, f"{app_id}'s icon {icon!r} is not an image file in the app")
    return Response(data, media_type=media, headers=ICON_HEADERS)


def read_icon(app_dir: Path, icon: str, app_id: str) -> bytes | None:
    """The icon's bytes, or None when it is not a regular file of the app's own tree.

    The file is opened first and judged by what was opened (``/proc/self/fd``), never by a path
    checked earlier: an app that can write below its folder (its runtime data) could otherwise
    swap the checked file for a link between the check and the read. Files in a runtime data
    folder (``<appId>-…``) are never an icon. A file larger than ``MAX_ICON`` is refused.
    """
    root = app_dir.resolve()
    try:
        # links inside the tree are followed here; one swapped in after is not (O_NOFOLLOW), and
        # a swapped directory shows in what was opened
        path = (root / icon).resolve()
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        opened = Path(f"/proc/self/fd/{fd}").readlink()
        info = os.fstat(fd)
        inside = opened.is_relative_to(root) and opened != root
        if not inside or opened.relative_to(root).parts[0].startswith(f"{app_id}-"):
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ICON:
            return None
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(MAX_ICON + 1)
        return data if len(data) <= MAX_ICON else None
    except OSError:
        return None
    finally:
        os.close(fd)


routes: list[BaseRoute] = [
    endpoint("/api/apps", list_apps, methods=["GET"], access=Access.USER_OR_APP),
    endpoint("/api/apps/{app_id}", get_app, methods=["GET"], access=Access.USER_OR_APP),
    endpoint("/api/apps/{app_id}/icon", app_icon, methods=["GET"], access=Access.USER_OR_APP),
    endpoint("/api/apps/{app_id}/egress", grant_egress, methods=["PUT"], access=Access.USER),
    endpoint("/api/apps/{app_id}/egress", revoke_egress, methods=["DELETE"], access=Access.USER),
]
