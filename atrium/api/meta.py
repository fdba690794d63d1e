"""Open routes: the version, the login URL that sets the host page's cookie, the host page."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from atrium import API_VERSION, MANIFEST_SCHEMA, __version__
from atrium.api.auth import Access, audit_subject, endpoint, shell_of
from atrium.errors import Unauthenticated
from atrium.identity import SESSION_COOKIE, Caller
from atrium.users.model import SessionKind

WEB_DIR: Final = Path(__file__).resolve().parent.parent / "web"


async def version(request: Request, caller: Caller) -> Response:
    return JSONResponse(
        {"version": __version__, "api": API_VERSION, "manifestSchema": MANIFEST_SCHEMA}
    )


async def login(request: Request, caller: Caller) -> Response:
    """``/login?token=…``: trade the user token for an HttpOnly SameSite=Strict host-only cookie."""
    shell = shell_of(request)
    token = request.query_params.get("token", "")
    if not token or not shell.user_auth.is_token(token):
        raise Unauthenticated(
            "the login link's token is missing or wrong; run `atrium serve` again "
            "or read $ATRIUM_HOME/run/token"
        )
    audit_subject(request, shell.settings.user)
    client = request.client
    secret, _ = await shell.users.create_session(
        shell.settings.user,
        SessionKind.LINK,
        address=client.host if client else "",
        device=request.headers.get("user-agent", ""),
        link_key=shell.user_auth.link_key,
    )
    response = RedirectResponse("/", status_code=303)
    set_session_cookie(response, request, secret)
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def set_session_cookie(response: Response, request: Request, secret: str) -> None:
    """The host page's sign-in: HttpOnly, SameSite=Strict, host-only (no Domain attribute),
    Secure when the page was served over https."""
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        httponly=True,
        samesite="strict",
        path="/",
        secure=request.url.scheme == "https",
    )


async def host_page(request: Request, caller: Caller) -> Response:
    return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})


routes: list[BaseRoute] = [
    endpoint("/api/version", version, methods=["GET"], access=Access.ANYONE),
    endpoint(
        "/login",
        login,
        methods=["GET"],
        access=Access.ANYONE,
        query={"token": "the user token"},
        audit_safe=True,
    ),
    endpoint("/", host_page, methods=["GET"], access=Access.ANYONE),
    Mount("/static", app=StaticFiles(directory=WEB_DIR), name="static"),
]
