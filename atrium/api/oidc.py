"""Sign-in through OpenID Connect providers (docs/api.md "Sign-in with OIDC").

authlib's Starlette client does discovery, the authorization code flow with PKCE S256, the state
and nonce checks and the ID token's verification. It keeps a flow's state, nonce and PKCE verifier
in ``request.session``; here that "session" is a dict held in the shell's memory under a random
256-bit cookie (`PendingSignIns`), not Starlette's signed cookie, which would hand the verifier to
the browser. The flow's data is used once: authlib removes it before it trades the code.

An identity is linked to a user by (issuer, subject) only. Every failed callback is an HTML page
with the reason and a 4xx (or 502 when the provider cannot be reached), never a 500.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import logging
import math
import secrets
import time
import warnings
from collections import OrderedDict
from typing import Any, Final

import httpx
from authlib.common.errors import AuthlibBaseError
from authlib.deprecate import AuthlibDeprecationWarning
from joserfc.errors import JoseError

with warnings.catch_warnings():  # authlib 1.9 would rather its clients ran on httpx2
    warnings.simplefilter("ignore", AuthlibDeprecationWarning)
    from authlib.integrations.starlette_client import OAuth, OAuthError
from pydantic import Field
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from atrium.api.auth import Access, audit_request, audit_subject, endpoint, identify, shell_of
from atrium.api.bodies import read_model
from atrium.api.meta import set_session_cookie
from atrium.api.users import sign_in_of
from atrium.errors import AtriumError, InvalidRequest, NotFound
from atrium.identity import Anonymous, Caller, UserCaller
from atrium.shell import Shell
from atrium.users.accounts import set_aside_scope
from atrium.users.model import Identity, Role, SessionKind
from atrium.users.oidc import OidcProvider, email_problem, new_user_id
from atrium.users.throttle import RateLimit, address_key
from atrium.wire import WireModel

_LOGGER = logging.getLogger(__name__)
#: the cookie naming a browser's sign-in in progress (only on /auth/oidc/)
PENDING_COOKIE: Final = "atrium_oidc"
#: how long a started sign-in may take at the provider
PENDING_SECONDS: Final = 600
#: sign-ins in progress kept at most (the oldest go first): anyone may start one
MAX_PENDING: Final = 10_000
#: scopes asked of every provider: the ID token, and the claims sign-up and the domain rule read
SCOPES: Final = "openid email profile"
#: how long one request to a provider may take
PROVIDER_TIMEOUT: Final = 10.0
#: sign-ins one client address may start within `START_WINDOW` seconds
START_LIMIT: Final = 30
START_WINDOW: Final = 60.0
#: how long a provider whose discovery failed is answered as down without being asked again
DISCOVERY_RETRY_SECONDS: Final = 30


class PendingSignIns:
    """Sign-ins started and not yet finished: the dict authlib keeps as ``request.session``, by
    the sha256 of a random cookie. In memory: a restart only means starting the sign-in again."""

    def __init__(self, cap: int = MAX_PENDING) -> None:
        self._cap = cap
        self._flows: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._flows)

    def get(self, cookie: str | None) -> dict[str, Any] | None:
        if not cookie:
            return None
        found = self._flows.get(_hash(cookie))
        if found is None or found[0] < time.monotonic():
            return None
        return found[1]

    def put(self, cookie: str, data: dict[str, Any]) -> None:
        key = _hash(cookie)
        self._flows.pop(key, None)
        self._flows[key] = (time.monotonic() + PENDING_SECONDS, data)
        now = time.monotonic()
        while self._flows and (
            len(self._flows) > self._cap or next(iter(self._flows.values()))[0] < now
        ):
            self._flows.popitem(last=False)

    def drop(self, cookie: str) -> None:
        self._flows.pop(_hash(cookie), None)


def _hash(cookie: str) -> str:
    return hashlib.sha256(cookie.encode()).hexdigest()


class OidcClients:
    """The configured providers and one authlib client for each, and the bounds on what anyone
    may make the shell do through them: sign-ins started per address, and one discovery fetch
    at a time per provider, not repeated for a while after it failed."""

    def __init__(self, providers: tuple[OidcProvider, ...]) -> None:
        self.providers = {p.id: p for p in providers}
        self.oauth = OAuth()
        self.pending = PendingSignIns()
        self.starts = RateLimit(START_LIMIT, START_WINDOW)
        self._discovery: dict[str, asyncio.Lock] = {}
        #: provider id -> when (monotonic) its failed discovery may be tried again
        self._down: dict[str, float] = {}
        for p in providers:
            self.oauth.register(
                name=p.id,
                client_id=p.client_id,
                client_secret=p.client_secret.get_secret_value(),
                server_metadata_url=p.metadata_url,
                client_kwargs={
                    "scope": SCOPES,
                    "code_challenge_method": "S256",
                    "timeout": PROVIDER_TIMEOUT,
                },
            )

    def client(self, provider_id: str) -> Any:
        return self.oauth.create_client(provider_id)

    async def metadata(self, provider_id: str) -> dict[str, Any]:
        """The provider's discovery document (authlib keeps it once fetched). One fetch at a
        time per provider; after a failure, `DISCOVERY_RETRY_SECONDS` of 502 pages without
        asking it, so starts from every browser do not each wait out a provider that is down."""
        lock = self._discovery.setdefault(provider_id, asyncio.Lock())
        async with lock:
            left = self._down.get(provider_id, 0.0) - time.monotonic()
            if left > 0:
                raise Refused(
                    502,
                    "the sign-in provider could not be reached; try again later",
                    retry_after=max(1, math.ceil(left)),
                )
            try:
                metadata: dict[str, Any] = await self.client(provider_id).load_server_metadata()
            except Exception as err:  # every failure of the provider is a page, never a 500
                _LOGGER.warning("OIDC discovery of %s failed: %r", provider_id, err)
                self._down[provider_id] = time.monotonic() + DISCOVERY_RETRY_SECONDS
                refused = _provider_failure(err)
                refused.retry_after = DISCOVERY_RETRY_SECONDS
                raise refused from err
            self._down.pop(provider_id, None)
            return metadata


def clients_of(request: Request) -> OidcClients:
    state = request.app.state
    found: OidcClients | None = getattr(state, "oidc", None)
    if found is None:
        found = OidcClients(shell_of(request).settings.oidc_providers)
        state.oidc = found
    return found


class Refused(Exception):
    """A sign-in that ends on a page: the HTTP status and the reason shown."""

    def __init__(self, status: int, reason: str, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


def page(status: int, title: str, reason: str, retry_after: int | None = None) -> HTMLResponse:
    """The page a failed sign-in ends on (no script, nothing loaded from elsewhere)."""
    body = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title></head><body>"
        f"<main><h1>{html.escape(title)}</h1><p id=reason>{html.escape(reason)}</p>"
        '<p><a href="/">Back to the sign-in page</a></p></main></body></html>'
    )
    headers = {
        "Cache-Control": "no-store",
        "Content-Security-Policy": "default-src 'none'; form-action 'none'",
        "Referrer-Policy": "no-referrer",
    }
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return HTMLResponse(body, status_code=status, headers=headers)


def _provider(request: Request) -> OidcProvider:
    provider = clients_of(request).providers.get(request.path_params["provider"])
    if provider is None:
        raise Refused(404, f"there is no sign-in provider {request.path_params['provider']!r}")
    return provider


def _provider_failure(err: Exception) -> Refused:
    """What a failure of the dialogue with the provider shows (the details go to the log)."""
    if isinstance(err, httpx.HTTPStatusError | httpx.TransportError):
        return Refused(502, "the sign-in provider could not be reached; try again later")
    if isinstance(err, OAuthError):
        if err.error == "mismatching_state":
            return Refused(
                400,
                "this sign-in was not started in this browser, was already used, or has "
                "expired; start it again",
            )
        if err.error == "invalid_grant":
            return Refused(
                400, "the provider refused the sign-in code (used already, or not this sign-in's)"
            )
        return Refused(400, f"the provider refused the sign-in: {err.error}")
    if isinstance(err, JoseError | AuthlibBaseError):
        return Refused(400, "the provider's ID token is not valid for this sign-in")
    return Refused(502, "the sign-in provider answered something that is not OpenID Connect")


async def start(request: Request) -> Response:
    """`GET /auth/oidc/{provider}/login`: to the provider, with a new state, nonce and verifier."""
    try:
        provider = _provider(request)
        clients = clients_of(request)
        address = request.client.host if request.client else ""
        wait = clients.starts.take(address_key(address), time.monotonic())
        if wait is not None:
            raise Refused(
                429,
                f"too many sign-ins started from this address; try again in {wait} s",
                retry_after=wait,
            )
        client = clients.client(provider.id)
        metadata = await clients.metadata(provider.id)
        try:
            if metadata.get("issuer") != provider.issuer:
                raise Refused(
                    502,
                    "the sign-in provider's discovery document names another issuer than the "
                    "one configured",
                )
            cookie = secrets.token_urlsafe(32)
            session: dict[str, Any] = {}
            request.scope["session"] = session
            redirect_uri = str(request.url_for("oidc_callback", provider=provider.id))
            response: Response = await client.authorize_redirect(request, redirect_uri)
        except Refused:
            raise
        except Exception as err:  # every failure of the provider is a page, never a 500
            _LOGGER.warning("OIDC sign-in with %s could not start: %r", provider.id, err)
            raise _provider_failure(err) from err
    except Refused as refused:
        return page(refused.status, "Sign-in failed", refused.reason, refused.retry_after)
    clients.pending.put(cookie, session)
    response.set_cookie(
        PENDING_COOKIE,
        cookie,
        max_age=PENDING_SECONDS,
        path="/auth/oidc/",
        httponly=True,
        # Lax, not Strict: the provider sends the browser back with a top-level GET from its site
        samesite="lax",
        secure=request.url.scheme == "https",
    )
    response.headers["Cache-Control"] = "no-store"
    return response


async def finish(request: Request) -> Response:
    """`GET /auth/oidc/{provider}/callback`: check the answer, find (or make) the user, sign in."""
    cookie = request.cookies.get(PENDING_COOKIE)
    error = None
    try:
        response = await _finish(request, cookie)
    except Refused as refused:
        _LOGGER.info("OIDC sign-in refused (%s): %s", refused.status, refused.reason)
        response = page(refused.status, "Sign-in failed", refused.reason)
        error = "refused"
    audit_request(
        request, shell_of(request), Anonymous(), "oidc_callback", response.status_code, error
    )
    if cookie:
        response.delete_cookie(PENDING_COOKIE, path="/auth/oidc/", httponly=True, samesite="lax")
    return response


async def _finish(request: Request, cookie: str | None) -> Response:
    provider = _provider(request)
    clients = clients_of(request)
    session = clients.pending.get(cookie)
    if cookie is not None:
        clients.pending.drop(cookie)  # one use, whatever happens next
    error = request.query_params.get("error")
    if error:
        described = request.query_params.get("error_description")
        said = error[:100] + (f" ({described[:200]})" if described else "")
        raise Refused(400, f"the provider did not sign you in: {said}")
    if cookie is None or session is None:
        raise Refused(
            400,
            "this sign-in was not started in this browser, or it has expired; start it again",
        )
    request.scope["session"] = session
    client = clients.client(provider.id)
    try:
        token = await client.authorize_access_token(request)
    except Exception as err:  # every failure of the provider is a page, never a 500
        _LOGGER.warning("OIDC callback from %s failed: %r", provider.id, err)
        raise _provider_failure(err) from err
    claims = token.get("userinfo") if isinstance(token, dict) else None
    if not claims or not isinstance(claims.get("sub"), str) or not claims.get("sub"):
        raise Refused(502, "the provider sent no ID token")
    return await _sign_in(request, provider, dict(claims))


async def _sign_in(request: Request, provider: OidcProvider, claims: dict[str, Any]) -> Response:
    shell = shell_of(request)
    issuer, subject = str(claims["iss"]), str(claims["sub"])
    problem = email_problem(provider, claims)
    if problem is not None:
        raise Refused(403, problem)
    email = claims.get("email") if isinstance(claims.get("email"), str) else None
    identity = shell.users.identity(issuer, subject)
    if identity is None and provider.allow_signup:
        # one account made at a time, sign-ups and an admin's adds and deletes alike: two
        # callbacks of the same new person (two tabs, a double click) would otherwise both find
        # no identity and both make a member. Under the lock the second finds the first's link.
        async with sign_in_of(request).accounts:
            identity = shell.users.identity(issuer, subject)
            if identity is None:
                identity = await _sign_up(shell, provider, claims, email)
    if identity is None:
        raise Refused(
            403,
            f"you have no account here yet: an admin must add you first, linking your "
            f"{provider.display_name} identity (issuer {issuer}, subject {subject}) to a user",
        )
    user = shell.users.get(identity.user_id)
    if user is None or user.disabled:
        raise Refused(403, "this account is disabled; ask an admin")
    audit_subject(request, user.id)
    secret, _ = await shell.users.create_session(
        user.id,
        SessionKind.OIDC,
        address=request.client.host if request.client else "",
        device=request.headers.get("user-agent", ""),
    )
    try:
        before = await identify(request, shell)
    except AtriumError:
        before = None
    if isinstance(before, UserCaller) and before.session_id is not None:
        # the browser's cookie is replaced: the sign-in it held ends rather than lingering
        await shell.users.end_session(before.user_id, before.session_id)
    response = RedirectResponse("/", status_code=303)
    set_session_cookie(response, request, secret)
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


async def _sign_up(
    shell: Shell, provider: OidcProvider, claims: dict[str, Any], email: str | None
) -> Identity:
    """Make a member for a new identity and link it, in one transaction (the caller holds the
    accounts lock)."""
    issuer, subject = str(claims["iss"]), str(claims["sub"])
    user_id = new_user_id(claims, lambda uid: shell.users.get(uid) is not None)
    given = claims.get("name")
    name = "".join(ch for ch in given if ch.isprintable()) if isinstance(given, str) else ""
    try:
        await set_aside_scope(shell.settings.home, user_id, shell.settings.scopes_dir)
        _, linked = await shell.users.add_linked(
            user_id, name.strip()[:100] or None, Role.MEMBER, (issuer, subject), email
        )
    except AtriumError as err:  # made by another process's writer first; nothing half made
        raise Refused(409, f"the account could not be made: {err}") from err
    _LOGGER.info("OIDC sign-up via %s made member %r", provider.id, user_id)
    return linked


# ---- the API --------------------------------------------------------------------------------


async def list_providers(request: Request, caller: Caller) -> Response:
    """The sign-in page's buttons: each provider's id, name and where its button leads."""
    return JSONResponse(
        [
            {"id": p.id, "displayName": p.display_name, "loginUrl": f"/auth/oidc/{p.id}/login"}
            for p in clients_of(request).providers.values()
        ]
    )


class IdentityLink(WireModel):
    """`POST /api/users/{id}/identities`: the provider's issuer URL and the subject's id there."""

    issuer: str = Field(min_length=1, max_length=500)
    subject: str = Field(min_length=1, max_length=500)
    email: str | None = Field(default=None, max_length=320)


async def list_identities(request: Request, caller: Caller) -> Response:
    users = shell_of(request).users
    user = users.require(request.path_params["user_id"])
    return JSONResponse([i.wire() for i in users.identities_of(user.id)])


async def link_identity(request: Request, caller: Caller) -> Response:
    """Link an identity to an existing user (409 identity_linked when another user has it)."""
    users = shell_of(request).users
    user = users.require(request.path_params["user_id"])
    body = await read_model(request, IdentityLink)
    identity = await users.link(body.issuer, body.subject, user.id, body.email)
    return JSONResponse(identity.wire(), status_code=201)


async def unlink_identity(request: Request, caller: Caller) -> Response:
    users = shell_of(request).users
    user = users.require(request.path_params["user_id"])
    issuer = request.query_params.get("issuer", "")
    subject = request.query_params.get("subject", "")
    if not issuer or not subject:
        raise InvalidRequest("name the identity with ?issuer=…&subject=…")
    if not await users.unlink(issuer, subject, user.id):
        raise NotFound("identity", subject)
    return JSONResponse({"ok": True, "issuer": issuer, "subject": subject})


routes: list[BaseRoute] = [
    Route("/auth/oidc/{provider}/login", start, methods=["GET"], name="oidc_login"),
    Route("/auth/oidc/{provider}/callback", finish, methods=["GET"], name="oidc_callback"),
    endpoint("/api/auth/providers", list_providers, methods=["GET"], access=Access.ANYONE),
    endpoint(
        "/api/users/{user_id}/identities", list_identities, methods=["GET"], access=Access.ADMIN
    ),
    endpoint(
        "/api/users/{user_id}/identities",
        link_identity,
        methods=["POST"],
        access=Access.ADMIN,
        body=IdentityLink,
    ),
    endpoint(
        "/api/users/{user_id}/identities",
        unlink_identity,
        methods=["DELETE"],
        access=Access.ADMIN,
        query={"issuer": "the identity's issuer", "subject": "the identity's subject"},
    ),
]
