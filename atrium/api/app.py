"""`create_app(settings)`: the Starlette application (`ShellServer.serve` opens the shell)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.types import Receive, Scope, Send

from atrium.api import (
    apps,
    audit,
    changes,
    dist,
    grants,
    instances,
    intents,
    kv,
    meta,
    oidc,
    openapi,
    publish,
    runner,
    scopes,
    store,
    system,
    theme,
    tools,
    users,
)
from atrium.api.errors import (
    InternalErrorMiddleware,
    atrium_error_handler,
    error_response,
    http_error_handler,
)
from atrium.api.forwarded import ClientAddress
from atrium.api.origins import SLUG_RE, AppOrigins, Served
from atrium.errors import AtriumError, InvalidRequest, MisdirectedRequest
from atrium.settings import IPNetwork, Settings
from atrium.shell import Shell
from atrium.state.fence import request_began
from atrium.theme.inject import HtmlTransform
from atrium.theme.prefs import html_transform_for

#: bind addresses that name no host: a request never carries them as its Host
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104


class HostNames:
    """The ``Host`` values the shell answers to (decisions.md "HTTP edge and bus").

    `localhost`, `127.0.0.1`, `[::1]`, the bind host, the app domain and `<slug>.<app domain>`, each bare or with
    the shell's own port. A DNS-rebinding page (a name of the attacker's that now resolves to
    127.0.0.1) sends its own name and is refused, before any route, open or not, sees it.
    """

    def __init__(self, settings: Settings) -> None:
        port = settings.port
        host = settings.host.lower()
        names = {"localhost", "127.0.0.1", "[::1]"}
        if host not in _WILDCARDS:
            names.add(f"[{host}]" if ":" in host else host)
        if settings.app_network != "off":
            # the shell's address on its bridge, where an instance reaches the API
            names.add(str(ipaddress.ip_network(settings.app_network).network_address + 1))
        domain = settings.app_domain
        # the app domain itself names the host page: on a LAN, `atrium.lan` is the host page and
        # `<slug>.atrium.lan` its apps (one wildcard DNS record); the operator chose the name
        names.add(domain.lower())
        exact = names | {f"{name}:{port}" for name in names}
        if settings.runner == "kubernetes" and settings.kube_shell_url:
            # the name pods reach the shell by (a Service's, or the node's address), which the
            # operator chose as they chose the app domain; with the port the URL names
            pods = urlsplit(settings.kube_shell_url)
            if pods.hostname:
                exact |= {pods.netloc.lower().rpartition("@")[2], pods.hostname.lower()}
        self._exact = frozenset(exact)
        self._app_suffixes = (f".{domain}:{port}", f".{domain}")

    def allows(self, host: str) -> bool:
        if host.lower() in self._exact:
            return True
        for suffix in self._app_suffixes:
            if host.endswith(suffix):
                return SLUG_RE.fullmatch(host[: -len(suffix)]) is not None
        return False


def host_of(scope: Scope) -> str | None:
    """The request's one ``Host``, without the spaces and tabs around it (RFC 9110 5.5: not part
    of the value; the parser keeps trailing ones); None without one. More than one is a bad
    request (RFC 9112 3.2): something beside the shell could read the other."""
    found: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"host":
            if found is not None:
                raise InvalidRequest("the request has more than one Host header")
            found = value
    return None if found is None else found.strip(b" \t").decode("latin-1")


class AtriumApp:
    """The ASGI entry point: the Host check first, then app origins and the data proxy (the hot
    path) are dispatched here, before Starlette's middleware stack; everything else is the
    Starlette application."""

    def __init__(
        self,
        starlette: Starlette,
        dispatch: AppOrigins,
        hosts: HostNames,
        clients: ClientAddress | None = None,
    ) -> None:
        self.starlette = starlette
        self._dispatch = dispatch
        self._hosts = hosts
        self._clients = clients or ClientAddress(())

    @property
    def state(self) -> State:
        return self.starlette.state

    def distrust(self, network: IPNetwork) -> None:
        """Never read X-Forwarded-For from a peer in ``network`` (`ClientAddress.distrust`)."""
        self._clients.distrust(network)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                host = host_of(scope)
            except InvalidRequest as err:
                await error_response(err)(scope, receive, send)
                return
            if host is None or not self._hosts.allows(host):
                await error_response(misdirected(host))(scope, receive, send)
                return
            self._client_address(scope)
            request_began()
            await self._dispatch.dispatch(scope, receive, send, host)
            return
        await self.starlette(scope, receive, send)  # lifespan: nothing to dispatch

    def _client_address(self, scope: Scope) -> None:
        """The one place the client's address is decided: the peer's, or the one a trusted proxy
        forwarded (forwarded.py); every reader of ``scope["client"]`` reads this."""
        peer = scope.get("client")
        if peer is None or not self._clients.trusted:
            return
        forwarded = [v for n, v in scope["headers"] if n == b"x-forwarded-for"]
        client = self._clients.of(peer[0], forwarded)
        if client != peer[0]:
            scope["client"] = (client, 0)  # the port a proxy saw is not known: none


def misdirected(host: str | None) -> MisdirectedRequest:
    if host is None:
        return MisdirectedRequest("the request has no Host header; this shell needs one")
    return MisdirectedRequest(
        f"Host {host[:100]!r} is not one of this shell's names (localhost, 127.0.0.1, [::1], the "
        "listening address, the app domain, or an app origin, with the shell's port)",
        host=host[:100],
    )


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
            *changes.routes,
            *runner.routes,
            *grants.routes,  # before instances': its POST /{id}/{action} would take /grants
            *instances.routes,
            *tools.routes,
            *intents.routes,
            *theme.routes,
            *publish.routes,
            *dist.routes,
            *store.routes,
            *users.routes,
            *audit.routes,
            *system.routes,
            *oidc.routes,
            *openapi.routes,
        ],
        middleware=[Middleware(InternalErrorMiddleware)],
        exception_handlers={AtriumError: atrium_error_handler, HTTPException: http_error_handler},
    )

    # app origins are dispatched before any host-page route can see the request
    def transform_for(instance: Served, viewer: str) -> HtmlTransform | None:
        shell = current_shell()
        return None if shell is None else html_transform_for(instance, shell.theme, viewer)

    return AtriumApp(
        app,
        AppOrigins(app, shell=current_shell, transform_html=transform_for),
        HostNames(settings),
        ClientAddress(settings.trusted_networks),
    )
