"""`create_app(settings)`: the Starlette application (`ShellServer.serve` opens the shell)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.types import Receive, Scope, Send

from atrium.api import (
    apps,
    dist,
    instances,
    intents,
    kv,
    meta,
    publish,
    scopes,
    theme,
    tools,
)
from atrium.api.errors import InternalErrorMiddleware, atrium_error_handler, http_error_handler
from atrium.api.origins import AppOrigins
from atrium.errors import AtriumError
from atrium.lifecycle.instance import Instance
from atrium.settings import Settings
from atrium.shell import Shell
from atrium.theme.inject import HtmlTransform
from atrium.theme.prefs import html_transform_for


class AtriumApp:
    """The ASGI entry point: app origins and the data proxy (the hot path) are dispatched here,
    before Starlette's middleware stack; everything else is the Starlette application."""

    def __init__(self, starlette: Starlette, dispatch: AppOrigins) -> None:
        self.starlette = starlette
        self._dispatch = dispatch

    @property
    def state(self) -> State:
        return self.starlette.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._dispatch(scope, receive, send)


def create_app(settings: Settings) -> AtriumApp:
    """The application; `ShellServer.serve` opens the shell and sets ``state.shell`` before any
    request is served."""

    def current_shell() -> Shell | None:
        shell: Shell | None = getattr(app.state, "shell", None)
        return shell

    app = Starlette(
        routes=[
            *meta.routes,
            *apps.routes,
            *scopes.routes,
            *kv.routes,
            *instances.routes,
            *tools.routes,
            *intents.routes,
            *theme.routes,
            *publish.routes,
            *dist.routes,
        ],
        middleware=[Middleware(InternalErrorMiddleware)],
        exception_handlers={AtriumError: atrium_error_handler, HTTPException: http_error_handler},
    )

    # app origins are dispatched before any host-page route can see the request
    def transform_for(instance: Instance) -> HtmlTransform | None:
        shell = current_shell()
        return None if shell is None else html_transform_for(instance, shell.theme)

    return AtriumApp(app, AppOrigins(app, shell=current_shell, transform_html=transform_for))
