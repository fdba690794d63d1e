"""`GET /api/system/usage`: the machine's CPU, memory and disk, and the caller's own running
instances' memory and CPU (docs/api.md "System usage"). Users only: an app is not told what its
owner's other apps use."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.errors import PermissionDenied
from atrium.identity import Caller, UserCaller


async def system_usage(request: Request, caller: Caller) -> Response:
    if not isinstance(caller, UserCaller):  # Access.USER lets no one else in
        raise PermissionDenied("only a user may read the usage figures")
    usage = await shell_of(request).usage.current()
    return JSONResponse(usage.wire(caller.user_id), headers={"Cache-Control": "no-store"})


routes: list[BaseRoute] = [
    endpoint("/api/system/usage", system_usage, methods=["GET"], access=Access.USER),
]
