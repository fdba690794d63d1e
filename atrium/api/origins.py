"""Serving each instance to the browser on its own origin `http://<slug>.<app domain>:<port>/`.

Requests whose Host names an app origin never reach the host page's routes. On an app origin,
`/_os/` is the shell's: `/_os/enter` (one-time ticket → host-only view cookie), `/_os/client.js`,
and `/_os/api/…`, the shell's API called *as that app*. Everything else needs the view cookie and
is proxied to the app at `/` (decisions.md "Browser boundary"). The user's cookie lives on the host page's
origin only, so an app page can never act as the user.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from atrium.api.errors import guard
from atrium.api.events import PATH as EVENTS_PATH
from atrium.api.events import serve_events
from atrium.api.proxy.data import PREFIX as DATA_PREFIX
from atrium.api.proxy.data import serve_data
from atrium.api.proxy.pages import forward_page, user_headers
from atrium.errors import (
    InstanceElsewhere,
    InstanceUnheld,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from atrium.identity import CALLER_SCOPE_KEY, AppCaller
from atrium.lifecycle.calls import AppAddress
from atrium.lifecycle.instance import Instance, View
from atrium.lifecycle.states import SERVING, InstanceState
from atrium.lifecycle.views import is_local_path
from atrium.manifest import Manifest
from atrium.shell import Shell
from atrium.state.instances import InstanceRow
from atrium.theme.inject import HtmlTransform, transform_html
from atrium.theme.prefs import VIEWER_SCOPE_KEY
from atrium.users.grants import OWNER, GrantRole, access_to
from atrium.users.model import User

_LOGGER = logging.getLogger(__name__)
#: a viewer's page requests, unless the app enforces roles itself
VIEWER_METHODS: Final = frozenset({"GET", "HEAD"})
VIEW_COOKIE: Final = "atrium_view"
SLUG_RE: Final = re.compile(r"[a-z0-9]{12}")
CLIENT_JS: Final = Path(__file__).resolve().parent.parent / "web" / "client.js"
#: the shim an app's HTML pages load first: an XHR's own user and password reach its own origin
XHR_AUTH_JS: Final = Path(__file__).resolve().parent.parent / "web" / "xhr-auth.js"
XHR_AUTH_SRC: Final = "/_os/xhr-auth.js"
XHR_AUTH_SNIPPET: Final = f'<script src="{XHR_AUTH_SRC}"></script>'.encode()
_SCRIPT_TAG: Final = re.compile(rb"<script[\t\n\f\r />]", re.IGNORECASE)
SAFE: Final = frozenset({"GET", "HEAD", "OPTIONS"})


class Served(Protocol):
    """What an app origin serves: this shell's `Instance`, or another shell's (`Elsewhere`)."""

    @property
    def id(self) -> str: ...

    @property
    def app_id(self) -> str: ...

    @property
    def owner(self) -> str: ...

    @property
    def manifest(self) -> Manifest: ...

    @property
    def state(self) -> InstanceState: ...

    @property
    def address(self) -> AppAddress: ...


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """Another shell's instance, as its row in the shared database says."""

    row: InstanceRow
    manifest: Manifest

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def app_id(self) -> str:
        return self.row.app_id

    @property
    def owner(self) -> str:
        return self.row.owner

    @property
    def state(self) -> InstanceState:
        return InstanceState(self.row.state)

    @property
    def reachable(self) -> bool:
        """Whether every shell reaches its server (a pod's address in the cluster)."""
        return self.row.address is not None

    def refusal(self, *, named: bool = True) -> InstanceElsewhere:
        """Why this shell does not serve it: only its own shell reaches it (shells do not
        forward to each other). ``named``: the machine it runs on is named, to its owner only;
        a grantee learns no more of where it runs than with one shell."""
        row = self.row
        if not named:
            return InstanceElsewhere(
                f"instance {row.id} runs on another shell, on an address only that shell "
                "reaches: open it again from the host page (its owner may run it on a cluster "
                "for any shell to serve it)",
                instanceId=row.id,
            )
        machine = row.shell.partition(":")[0]  # its home's path is the operator's to know
        return InstanceElsewhere(
            f"{row.app_id}'s instance {row.id} runs on another shell (on {machine}), on an "
            f"address only that shell reaches ({row.network or 'no'} network): open it "
            "again from the host page, or run instances on a cluster (the kubernetes "
            "runner) for any shell to serve them",
            instanceId=row.id,
            shell=machine,
        )

    async def checked(self, shell: Shell) -> None:
        """InstanceUnheld unless its pod may be sent requests at its row's address: its shell
        lives (and watches it), or the cluster says the pod the row names runs there
        (`atrium.lifecycle.unheld`; the answer is kept a few seconds)."""
        pods = shell.lifecycle.pods
        row = self.row
        if pods is None or row.address is None:
            return  # no address: `address` refuses it
        refusal = (await pods.verdict(row)).refusal
        if refusal is not None:
            raise InstanceUnheld(
                f"{row.app_id}'s instance {row.id} is not served now: {refusal}. Nothing is "
                "sent to the address its row gives, which the cluster may have given another "
                "pod; it is served again once its shell is back or another shell takes it over",
                instanceId=row.id,
            )

    @property
    def address(self) -> AppAddress:
        """Where every shell reaches it; InstanceElsewhere when only its own shell does (a
        local runner's child on another machine: shells do not forward to each other)."""
        address = self.row.address
        if address is None:
            raise self.refusal()
        return address


@dataclass(frozen=True, slots=True)
class Looking:
    """The user looking at an instance, and their role on it (`owner`, `editor`, `viewer`)."""

    user: User
    role: str


#: an app's routes that only the shell calls (docs/api.md "Page requests")
SHELL_ROUTES: Final = ("/api/data", "/api/lifecycle", "/health")
#: percent-decoding rounds a page path gets before the check (a server that decodes again)
_DECODE_ROUNDS: Final = 3


def shell_route(path: str) -> bool:
    """Does the (once percent-decoded) page ``path`` name one of an app's shell-only routes, as
    any server could read it: decoded again, `\\` as `/`, empty and dot segments removed, any
    case, trailing dots and spaces of a segment ignored?"""
    for _ in range(_DECODE_ROUNDS):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    segments: list[str] = []
    for segment in path.replace("\\", "/").split("/"):
        segment = segment.rstrip(". ").lower() if segment not in {".", ".."} else segment
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in {"", "."}:
            segments.append(segment)
    canonical = "/" + "/".join(segments)
    return any(canonical == route or canonical.startswith(route + "/") for route in SHELL_ROUTES)


def wants_page(scope: Scope) -> bool:
    """A browser's navigation: a GET or HEAD that asks for `text/html` by name, outside the
    shell's API on the origin (`Accept: */*`, what scripts send, is not a page request)."""
    if scope["method"] not in VIEWER_METHODS or scope["path"].startswith("/_os/api"):
        return False
    accept = b",".join(v for k, v in scope["headers"] if k == b"accept").decode("latin-1")
    return "text/html" in accept.lower()


def host_page_url(shell: Shell) -> str:
    """The host page as a browser on the LAN names it: the app domain itself (see HostNames)."""
    return f"http://{shell.settings.app_domain}:{shell.settings.port}/"


def explain_page(shell: Shell, err: Unauthenticated | NotFound) -> HTMLResponse:
    """The refusal as a page with the way back: apps open from the host page, which hands the
    browser a one-time view of this origin."""
    home = html.escape(host_page_url(shell), quote=True)
    why = (
        "No app is served on this address any more."
        if isinstance(err, NotFound)
        else "This address shows an app only inside Atrium: open it from the host page."
    )
    body = (
        '<!doctype html><html lang="en"><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>Open it from the host page</title>"
        "<style>body{font:16px/1.5 system-ui,sans-serif;max-width:36rem;margin:4rem auto;"
        "padding:0 1rem}</style>"
        f"<h1>Open it from the host page</h1><p>{html.escape(why)}</p>"
        f'<p><a href="{home}">{home}</a></p>'
        f"<p><small>{html.escape(err.code)}: {html.escape(err.message)}</small></p></html>"
    )
    return HTMLResponse(
        body,
        status_code=err.http_status,
        headers={
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",
            # the shell's words on the app's origin: nothing in it runs or loads
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
        },
    )


def slug_of(host_header: str, app_domain: str) -> str | None:
    """The slug when ``host_header`` names an app origin (`<slug>.<app domain>[:port]`)."""
    host = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
    suffix = f".{app_domain}"
    if not host.endswith(suffix):
        return None
    slug = host[: -len(suffix)]
    return slug if SLUG_RE.fullmatch(slug) else None


class AppOrigins:
    """HTTP dispatcher behind the edge's Host check (`AtriumApp`): app-origin requests here,
    the data proxy and the event stream to their raw handlers, the rest to the host
    application."""

    def __init__(
        self,
        app: ASGIApp,
        shell: Callable[[], Shell | None],
        transform_html: Callable[[Served, str], HtmlTransform | None] | None = None,
    ) -> None:
        self.app = app
        self._shell = shell
        self._transform_html = transform_html
        self._open_shell: Shell | None = None

    async def dispatch(self, scope: Scope, receive: Receive, send: Send, host: str) -> None:
        """An HTTP request whose ``Host`` header the caller has read already (the edge's host
        check: the data path reads its headers once)."""
        shell = self._open_shell or self._shell()
        if shell is None:
            await self.app(scope, receive, send)
            return
        self._open_shell = shell  # set once, before the first request, for the server's life
        slug = slug_of(host, shell.settings.app_domain)
        if slug is None:
            raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
            if raw_path.startswith(DATA_PREFIX):
                # the hot path: straight to the data proxy, no routing table in between
                await serve_data(shell, raw_path[len(DATA_PREFIX) :], scope, receive, send)
            elif raw_path == EVENTS_PATH:
                await serve_events(shell, scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        await guard(
            lambda sending: self._serve_or_explain(shell, slug, scope, receive, sending),
            scope,
            receive,
            send,
        )

    async def _serve_or_explain(
        self, shell: Shell, slug: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """An app origin opened directly in a browser (a bookmark, a used view URL, a link shared
        on the LAN) has no view cookie: the browser gets a page that says so and links to the
        host page instead of a raw JSON error. These refusals all come before anything is sent;
        a script, the SDK and `/_os/api` still get the error object."""
        try:
            await self._serve(shell, slug, scope, receive, send)
        except (Unauthenticated, NotFound) as err:
            if not wants_page(scope) or (
                isinstance(err, NotFound) and err.fields.get("kind") != "app origin"
            ):
                raise
            await explain_page(shell, err)(scope, receive, send)

    async def _serve(
        self, shell: Shell, slug: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        instance = shell.lifecycle.by_slug(slug) or await self._elsewhere(shell, slug)
        if instance is None:
            raise NotFound("app origin", slug, "no instance is served on this origin")
        request = Request(scope, receive)
        path = request.url.path
        if path == "/_os/enter":
            response = await self._enter(shell, instance, slug, request)
            await response(scope, receive, send)
            return
        view = await self._view(shell, instance, slug, request.cookies.get(VIEW_COOKIE, ""))
        if view is None:
            raise Unauthenticated(
                "this app origin needs a view: open it through the host page or "
                "POST /api/instances/{id}/views"
            )
        looking = await self._looking(shell, instance, view)
        if path in ("/_os/client.js", XHR_AUTH_SRC):
            await FileResponse(
                CLIENT_JS if path == "/_os/client.js" else XHR_AUTH_JS,
                media_type="text/javascript",
                headers={"Cache-Control": "no-cache"},
            )(scope, receive, send)
            return
        if path == "/_os/api" or path.startswith("/_os/api/"):
            self._check_same_origin(request, "/_os/api")
            if looking.role == GrantRole.VIEWER and request.method not in VIEWER_METHODS:
                # the app's API acts for its owner: a viewer only reads through it, whatever
                # the app enforces on its own pages
                raise PermissionDenied(
                    f"{looking.user.id!r} is a viewer of this instance: a {request.method} on "
                    "/_os/api is the owner's or an editor's"
                )
            caller = AppCaller(instance.app_id, instance.id, instance.owner)
            raw_path: bytes = (scope.get("raw_path") or path.encode()).removeprefix(b"/_os")
            if raw_path.startswith(DATA_PREFIX):
                await serve_data(
                    shell, raw_path[len(DATA_PREFIX) :], scope, receive, send, caller=caller
                )
                return
            if raw_path == EVENTS_PATH:
                await serve_events(shell, scope, receive, send, caller=caller)
                return
            inner = dict(scope)
            inner["path"] = path.removeprefix("/_os")
            inner["raw_path"] = raw_path
            inner[CALLER_SCOPE_KEY] = caller
            inner[VIEWER_SCOPE_KEY] = looking.user.id  # whose theme its pages get
            await self.app(inner, receive, send)
            return
        if path.startswith("/_os/"):
            raise NotFound("route", path)
        if shell_route(path):
            # a browser request never reaches the app's provider routes, hooks or health check:
            # a sibling app's page could send one here with this instance's view cookie
            raise NotFound(
                "route",
                path[:200],
                "health, lifecycle hooks and provider data are the shell's to call: "
                "read data through /_os/api/data/<authority>/…",
            )
        self._check_same_origin(request, "this app origin")
        if (
            looking.role == GrantRole.VIEWER
            and request.method not in VIEWER_METHODS
            and not instance.manifest.sharing.enforces_roles
        ):
            raise PermissionDenied(
                f"{looking.user.id!r} is a viewer of this instance: a {request.method} needs the "
                "editor role (or an app whose manifest says sharing.enforcesRoles)"
            )
        response = await self._page(shell, instance, request, looking)
        await response(scope, receive, send)

    @staticmethod
    async def _view(shell: Shell, instance: Served, slug: str, cookie: str) -> View | None:
        """The live view whose cookie this is: this shell's instance's from memory (the hot
        path reads no row), another shell's from the database (a view released on any shell
        is refused here at once)."""
        if not cookie:
            return None
        if isinstance(instance, Instance):
            views = shell.lifecycle.views
            # a cookie another shell made (it redeemed the ticket) is read from the database once
            return views.for_cookie(instance, cookie) or await views.learn(instance, cookie)
        rows = shell.lifecycle.rows
        found = None if rows is None else await rows.view_of(slug, cookie)
        return None if found is None else View(found.id, cookie, found.path, user=found.user)

    @staticmethod
    async def _elsewhere(shell: Shell, slug: str) -> Elsewhere | None:
        """Another shell's instance on this origin (its row, remembered until the slug's
        `instance:routed`), with the manifest of the copy its owner sees."""
        rows = shell.lifecycle.rows
        row = None if rows is None else await rows.by_slug(slug)
        if row is None:
            return None
        copy = shell.registry.get(row.app_id, row.owner)
        if copy is None or copy.manifest is None:
            return None
        return Elsewhere(row, copy.manifest)

    @staticmethod
    async def _looking(shell: Shell, instance: Served, view: View) -> Looking:
        """Who looks through ``view`` and with what role, asked again on every request: a view
        whose user was disabled, removed or lost their grant is dropped here and answers 401
        (the revocation also drops it at once; this is what makes that true for every path).
        With several shells a grant this shell's memory lacks is asked of the database before
        the view is dropped: one made on another shell is known here only once its event is
        heard, and its grantee's view, made there, may come first."""
        user = shell.users.get(view.user or instance.owner)
        role = (
            access_to(user.id, instance, shell.grants)
            if user is not None and not user.disabled
            else None
        )
        if (
            user is not None
            and role is None
            and not user.disabled
            and shell.lifecycle.rows is not None
        ):
            await shell.grants.reread(user.id)
            role = access_to(user.id, instance, shell.grants)
        if user is None or role is None:
            if isinstance(instance, Instance):
                instance.views.pop(view.id, None)
            await shell.lifecycle.views.forget(view.id)
            raise Unauthenticated("this view was closed: its user may no longer see the instance")
        return Looking(user, role)

    @staticmethod
    def _check_same_origin(request: Request, where: str) -> None:
        """A change on an app origin must come from the app's own page: the view cookie is
        `SameSite=None`, and every `*.localhost` origin is same-site with every other, so it
        rides along with a sibling app's cross-origin (even `no-cors`) request."""
        if request.method in SAFE:
            return
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        origin = request.headers.get("origin")
        if origin == own or (
            origin is None and request.headers.get("sec-fetch-site") == "same-origin"
        ):
            return
        raise PermissionDenied(
            f"a {request.method} on {where} must come from {own} itself, not "
            f"{origin or request.headers.get('sec-fetch-site') or 'an unnamed origin'!r}"
        )

    @staticmethod
    async def _enter(shell: Shell, instance: Served, slug: str, request: Request) -> Response:
        ticket = request.query_params.get("ticket", "")
        view: View | None = None
        rows = shell.lifecycle.rows
        if isinstance(instance, Instance) or rows is None:
            view = await shell.lifecycle.views.redeem(slug, ticket) if ticket else None
        elif ticket:
            found = await rows.redeem(slug, ticket)
            if found is not None and found.cookie:
                view = View(found.id, found.cookie, found.path, user=found.user)
        if view is None:
            raise Unauthenticated("the view ticket is unknown, used or expired; ask for a new view")
        await AppOrigins._looking(shell, instance, view)  # its user may still see the instance
        path = request.query_params.get("path") or view.path
        if not is_local_path(path):
            path = "/"
        response = RedirectResponse(path, status_code=303)
        # SameSite=None + Secure: the app origin is another site than the host page, and its
        # iframe must carry the cookie; browsers treat *.localhost as a secure context
        # Partitioned (CHIPS): browsers that block third-party cookies still keep it, keyed to
        # the host page's site (written by hand: Python 3.11's http.cookies lacks the attribute)
        response.headers.append(
            "Set-Cookie",
            f"{VIEW_COOKIE}={view.cookie}; HttpOnly; Path=/; SameSite=None; Secure; Partitioned",
        )
        response.headers["Cache-Control"] = "no-store"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    async def _page(
        self, shell: Shell, instance: Served, request: Request, looking: Looking
    ) -> Response:
        if instance.state not in SERVING:
            return HTMLResponse(
                f"<!doctype html><title>Starting</title><p>{instance.manifest.name} is "
                f"{instance.state}; this page retries.</p><script>setTimeout(() => "
                "location.reload(), 1000)</script>",
                status_code=503,
                headers={"Retry-After": "1"},
            )
        if isinstance(instance, Elsewhere) and not instance.reachable and looking.role != OWNER:
            raise instance.refusal(named=False)  # its owner alone learns the machine
        if isinstance(instance, Elsewhere):
            await instance.checked(shell)
        themed = self._transform_html(instance, looking.user.id) if self._transform_html else None
        return await proxy_page(
            shell, instance, request, request.url.path, with_xhr_auth(themed), looking=looking
        )


def with_xhr_auth(themed: HtmlTransform | None) -> HtmlTransform:
    """An app page's HTML transform: the theme's injection (if any), and before it, in a page
    with a script, the shim that sends an XHR's own user and password as `Authorization: Basic`
    to the page's own origin (`web/xhr-auth.js`): in the host page's iframe, another site,
    Chromium never answers the app's `WWW-Authenticate: Basic` with them, so an app's own
    sign-in could not work."""

    def transform(body: bytes, content_type: str, content_encoding: str | None) -> bytes:
        if themed is not None:
            body = themed(body, content_type, content_encoding)
        # inserted last, so it comes first: before any script of the page; a page without a
        # script opens no XHR, and is passed on as the app sent it
        return transform_html(
            body, content_type, content_encoding, XHR_AUTH_SNIPPET, when=_has_script
        )

    return transform


def _has_script(document: bytes) -> bool:
    return _SCRIPT_TAG.search(document) is not None


async def proxy_page(
    shell: Shell,
    instance: Served,
    request: Request,
    path: str,
    transform: HtmlTransform | None = None,
    kind: str = "page",
    *,
    looking: Looking,
) -> Response:
    """Forward ``request`` to the instance's own server at ``path`` (query kept); ``kind`` is
    `page` for a browser on the app's origin, `user` for the user's bearer `/api/proxy/`;
    ``looking`` is named to the app in `X-Os-User-*`."""
    return await forward_page(
        shell.upstream.pool,
        request,
        instance.address,
        path,
        kind=kind,
        app_id=instance.app_id,
        transform_html=transform,
        looking=user_headers(looking.user.id, looking.user.name, looking.role),
    )
