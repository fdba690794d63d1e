"""Open routes: the version, readiness, the login URL that sets the host page's cookie, the
host page."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final
from weakref import WeakKeyDictionary

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from atrium import API_VERSION, MANIFEST_SCHEMA, __version__
from atrium.api.auth import Access, audit_subject, endpoint, shell_of
from atrium.errors import DatabaseUnavailable, Unauthenticated
from atrium.identity import SESSION_COOKIE, Caller
from atrium.state.database import Database
from atrium.users.model import SessionKind

WEB_DIR: Final = Path(__file__).resolve().parent.parent / "web"
#: how long `/api/ready` waits for the database's ``SELECT 1`` (below the check timeout of
#: deploy/haproxy.cfg, so a slow database is a 503 rather than a check that timed out)
READY_TIMEOUT: Final = 1.0
_LOGGER = logging.getLogger(__name__)
#: the databases found unreachable, with why: logged when it changes, not at every check
_UNREACHABLE: WeakKeyDictionary[Database, str] = WeakKeyDictionary()


async def version(request: Request, caller: Caller) -> Response:
    return JSONResponse(
        {"version": __version__, "api": API_VERSION, "manifestSchema": MANIFEST_SCHEMA}
    )


async def ready(request: Request, caller: Caller) -> Response:
    """``GET /api/ready``: 200 while this shell reaches its database, else 503
    ``database_unavailable``: what a load balancer's health check asks. Anyone may ask; the
    answer names the kind of database, never its address or the driver's message (those go to
    the log, once when the database is lost and once when it is back)."""
    shell = shell_of(request)
    db = shell.db
    reason = await db.ping(READY_TIMEOUT)
    if reason is None and shell.coordination.lost is not None:
        # reached, yet cut off as a shell (its name held by another of the same host name and
        # home, or its lock sessions ended a moment ago): it acts on no instance meanwhile
        reason = f"cut off as a shell: {shell.coordination.lost}"
    if reason is not None:
        if _UNREACHABLE.get(db) is None:
            _LOGGER.warning("not ready: the database %s does not answer: %s", db.name, reason)
        _UNREACHABLE[db] = reason
        raise DatabaseUnavailable(db.dialect)
    if _UNREACHABLE.pop(db, None) is not None:
        _LOGGER.info("ready again: the database %s answers", db.name)
    return JSONResponse({"ready": True}, headers={"Cache-Control": "no-store"})


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
    endpoint("/api/ready", ready, methods=["GET"], access=Access.ANYONE),
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
