"""`GET /api/apps`: visible apps with scope and masks, and every invalid copy's problems."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.errors import NotFound
from atrium.identity import Caller


async def list_apps(request: Request, caller: Caller) -> Response:
    registry = shell_of(request).registry
    return JSONResponse([view.wire() for view in registry.views()])


async def get_app(request: Request, caller: Caller) -> Response:
    app_id = request.path_params["app_id"]
    registry = shell_of(request).registry
    for view in registry.views():
        if view.copy.id == app_id:
            body = view.wire()
            if view.copy.manifest is not None:
                body["manifest"] = view.copy.manifest.wire()
            return JSONResponse(body)
    raise NotFound("app", app_id)


routes: list[BaseRoute] = [
    endpoint("/api/apps", list_apps, methods=["GET"], access=Access.USER_OR_APP),
    endpoint("/api/apps/{app_id}", get_app, methods=["GET"], access=Access.USER_OR_APP),
]
