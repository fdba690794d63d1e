"""The theme API (docs/api.md "Themes"; decisions.md "Themes"): the catalogue, the selection, the CSS.

`GET /api/os/themes` and `GET /api/os/theme.css` are open; reading a theme or the selection is
open to apps; selecting is each user's, reloading the catalogue an admin's.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.errors import InvalidRequest
from atrium.identity import AppCaller, Caller, UserCaller
from atrium.kv import PLATFORM
from atrium.theme.css import etag_matches
from atrium.theme.model import ColorMode, theme_contrast
from atrium.theme.prefs import VIEWER_SCOPE_KEY, ThemeService
from atrium.wire import WireModel

CSS_MODES = {"light": ColorMode.LIGHT, "dark": ColorMode.DARK}


def viewer(request: Request, caller: Caller) -> str:
    """Whose theme a caller sees: a user their own, an app page the user's looking through the
    view (a grantee's own), an app its owner's, a page nobody signed in to the platform default
    (`PLATFORM`)."""
    if isinstance(caller, UserCaller):
        return caller.user_id
    if isinstance(caller, AppCaller):
        looking = request.scope.get(VIEWER_SCOPE_KEY)
        return looking if isinstance(looking, str) else caller.owner
    return PLATFORM


def _service(request: Request) -> ThemeService:
    service: ThemeService = shell_of(request).theme
    return service


class ThemeSelect(WireModel):
    """`POST /api/os/themes/select` body: any of the three fields; the rest is kept as stored."""

    theme_id_light: str | None = None
    theme_id_dark: str | None = None
    color_mode: str | None = None


async def list_themes(request: Request, caller: Caller) -> Response:
    catalogue = _service(request).catalogue
    return JSONResponse([t.summary() for t in catalogue.themes()])


async def get_theme(request: Request, caller: Caller) -> Response:
    theme = _service(request).catalogue.require(request.path_params["theme_id"])
    return JSONResponse({**theme.wire(), "contrast": theme_contrast(theme)})


async def get_selection(request: Request, caller: Caller) -> Response:
    """The selection with the active theme, in the `theme:changed` payload's shape."""
    service = _service(request)
    return JSONResponse(service.payload(await service.current(viewer(request, caller))).wire())


async def select(request: Request, caller: Caller) -> Response:
    body = await read_model(request, ThemeSelect)
    partial = body.model_dump(by_alias=True, exclude_none=True)
    prefs = await _service(request).select(partial, viewer(request, caller))
    return JSONResponse(prefs.wire())


async def reload(request: Request, caller: Caller) -> Response:
    report = await _service(request).reload()
    return JSONResponse(report.wire())


async def theme_css(request: Request, caller: Caller) -> Response:
    raw_mode = request.query_params.get("mode")
    mode = CSS_MODES.get(raw_mode) if raw_mode is not None else None
    if raw_mode is not None and mode is None:
        raise InvalidRequest(
            f"mode {raw_mode[:40]!r} is not light or dark; leave it out for the stored colour mode",
            problems=[{"field": "mode", "message": "must be light or dark"}],
        )
    css = await _service(request).css(mode, viewer(request, caller))
    headers = {"ETag": css.etag, "Cache-Control": "no-cache"}
    if etag_matches(request.headers.get("if-none-match"), css.etag):
        return Response(status_code=304, headers=headers)
    return Response(css.text, media_type="text/css; charset=utf-8", headers=headers)


routes: list[BaseRoute] = [
    endpoint(
        "/api/os/theme.css",
        theme_css,
        methods=["GET"],
        access=Access.ANYONE,
        query={"mode": "light or dark (default: the stored colour mode)"},
    ),
    endpoint("/api/os/theme", get_selection, methods=["GET"], access=Access.USER_OR_APP),
    endpoint("/api/os/themes", list_themes, methods=["GET"], access=Access.ANYONE),
    endpoint(
        "/api/os/themes/select", select, methods=["POST"], access=Access.USER, body=ThemeSelect
    ),
    endpoint("/api/os/themes/reload", reload, methods=["POST"], access=Access.ADMIN),
    endpoint("/api/os/themes/{theme_id}", get_theme, methods=["GET"], access=Access.USER_OR_APP),
]
