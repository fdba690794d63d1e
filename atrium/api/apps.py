"""`GET /api/apps`: visible apps with scope and masks, and every invalid copy's problems."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.errors import NotFound
from atrium.identity import Caller
from atrium.registry import AppView
from atrium.shell import Shell


def record_of(shell: Shell, view: AppView) -> dict[str, Any] | None:
    """The install record of the listed copy (decisions.md "Lifecycle": null for apps placed by
    hand)."""
    record = shell.dist.record(view.copy.scope, view.copy.id)
    return record.wire() if record else None


def app_wire(shell: Shell, view: AppView) -> dict[str, Any]:
    """An app as listed, with the authorities it declares that another visible app serves."""
    body = view.wire(record_of(shell, view))
    body["conflicts"] = [
        {"authority": clash.authority, "servedBy": clash.served_by}
        for clash in shell.dataproxy.table.clashes
        if clash.app_id == view.copy.id
    ]
    return body


async def list_apps(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    return JSONResponse([app_wire(shell, view) for view in shell.registry.views()])


async def get_app(request: Request, caller: Caller) -> Response:
    app_id = request.path_params["app_id"]
    shell = shell_of(request)
    for view in shell.registry.views():
        if view.copy.id == app_id:
            body = app_wire(shell, view)
            if view.copy.manifest is not None:
                body["manifest"] = view.copy.manifest.wire()
            return JSONResponse(body)
    raise NotFound("app", app_id)


routes: list[BaseRoute] = [
    endpoint("/api/apps", list_apps, methods=["GET"], access=Access.USER_OR_APP),
    endpoint("/api/apps/{app_id}", get_app, methods=["GET"], access=Access.USER_OR_APP),
]
