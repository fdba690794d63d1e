"""Who a request comes from, decided in one function, and routes that declare who may call them.

`identify` trusts only what the shell issued: the user's bearer token or session cookie, an app
instance's bearer token. Never the caller's own headers (decisions.md "Who is calling").
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from enum import Enum
from typing import Any, Final

from pydantic import BaseModel
from starlette.requests import Request, cookie_parser
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Scope

from atrium.api.actions import audit_action
from atrium.errors import AtriumError, PermissionDenied, Unauthenticated
from atrium.identity import (
    CALLER_SCOPE_KEY,
    SESSION_COOKIE,
    Anonymous,
    AppCaller,
    Caller,
    UserCaller,
)
from atrium.shell import Shell
from atrium.users.audit import ANONYMOUS, app_actor

SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
#: where a sign-in route names the account it concerns, for the audit record (`audit_subject`)
AUDIT_SUBJECT_KEY: Final = "atrium.audit.subject"
#: ids a route adds to its audit record's target (`audit_target`)
AUDIT_TARGET_KEY: Final = "atrium.audit.target"

Handler = Callable[[Request, Caller], Awaitable[Response]]


class Access(Enum):
    """Who may call a route."""

    ANYONE = "anyone"
    USER = "user"
    ADMIN = "admin"
    USER_OR_APP = "user or app"
    APP = "app"


def shell_of(request: Request) -> Shell:
    shell: Shell = request.app.state.shell
    return shell


async def identify(request: Request, shell: Shell) -> Caller:
    """The caller of ``request``. A presented but unknown bearer token is 401, never anonymous.

    A request that came through an app origin's `/_os/api/` is that app, whatever it carries.
    """
    headers = request.headers
    return await identify_raw(
        request.scope, headers.get("authorization"), headers.get("cookie"), shell
    )


async def identify_raw(
    scope: Scope, header: str | None, cookie_header: str | None, shell: Shell
) -> Caller:
    """`identify` from the two headers it reads, for the data proxy's single pass over them."""
    by_origin = scope.get(CALLER_SCOPE_KEY)
    if isinstance(by_origin, AppCaller):
        return by_origin
    if header is not None:
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
        if shell.user_auth.is_token(token):
            admin = shell.users.get(shell.settings.user)
            if admin is None or admin.disabled:
                raise Unauthenticated(f"user {shell.settings.user!r} is disabled")
            return UserCaller(admin.id, admin.role)
        personal = await shell.users.find_token(token)
        if personal is not None:
            user, record = personal
            return UserCaller(user.id, user.role, token_id=record.id)
        app = await shell.app_tokens.find(token)
        if app is None:
            raise Unauthenticated("the bearer token is not valid (expired instance or wrong token)")
        return app
    cookie = cookie_parser(cookie_header).get(SESSION_COOKIE) if cookie_header else None
    if cookie is not None:
        signed_in = await shell.users.find_session(cookie)
        if signed_in is not None:
            user, session = signed_in
            client = scope.get("client")
            shell.users.seen(session, client[0] if client else "")
            return UserCaller(user.id, user.role, via_cookie=True, session_id=session.id)
    return Anonymous()


def still_signed_in(shell: Shell, caller: UserCaller) -> bool:
    """Whether the credential ``caller`` was identified by would still identify them: their
    account is enabled and their session or personal token has not ended (a long request, an
    event stream, asks when the user's sign-ins change)."""
    user = shell.users.get(caller.user_id)
    if user is None or user.disabled:
        return False
    if caller.session_id is not None:
        return shell.users.has_session(user.id, caller.session_id)
    if caller.token_id is not None:
        return shell.users.has_token(user.id, caller.token_id)
    return True


def check_cookie_origin(request: Request, shell: Shell) -> None:
    """A cookie-authenticated change must come from the host page's own origin."""
    if request.method in SAFE_METHODS:
        return
    origin = request.headers.get("origin")
    if origin is not None:
        if origin in shell.host_origins:
            return
        raise PermissionDenied(
            f"a change made with the session cookie must come from the host page; origin {origin!r} "
            "is not it"
        )
    if request.headers.get("sec-fetch-site") == "same-origin":
        return
    raise PermissionDenied(
        "a change made with the session cookie must carry the host page's Origin or "
        "Sec-Fetch-Site: same-origin; other clients use the bearer token"
    )


def authorize(caller: Caller, access: Access) -> None:
    if access is Access.ANYONE:
        return
    if isinstance(caller, Anonymous):
        raise Unauthenticated(
            "this endpoint needs the user's token (Authorization: Bearer …, see $ATRIUM_HOME/run/token) "
            "or the host page's session"
        )
    if access in (Access.USER, Access.ADMIN) and isinstance(caller, AppCaller):
        raise PermissionDenied(
            f"only the user may call this endpoint, not app {caller.app_id!r}",
            caller_app_id=caller.app_id,
        )
    if access is Access.ADMIN and not (isinstance(caller, UserCaller) and caller.is_admin):
        raise PermissionDenied("only an admin may call this endpoint")
    if access is Access.APP and not isinstance(caller, AppCaller):
        raise PermissionDenied("only an app may call this endpoint, with its own token")


def actor_of(caller: Caller) -> str:
    """How the audit log names a caller."""
    if isinstance(caller, UserCaller):
        return caller.user_id
    if isinstance(caller, AppCaller):
        return app_actor(caller.app_id, caller.instance_id)
    return ANONYMOUS


def audit_subject(request: Request, user_id: str) -> None:
    """Name the existing account a sign-in concerns: the record's target, and its actor once the
    sign-in succeeds. Only an existing user id is ever named, so a password typed into the user
    field never reaches the log."""
    request.scope[AUDIT_SUBJECT_KEY] = user_id


def audit_target(request: Request, **ids: str) -> None:
    """Add ids that are not in the path (an instance a launch made) to the audit record's target.
    Only ids: never a body's other fields."""
    added = request.scope.setdefault(AUDIT_TARGET_KEY, {})
    added.update(ids)


def audit_request(
    request: Request, shell: Shell, caller: Caller, route_name: str, status: int, error: str | None
) -> None:
    """Append the record of one request (docs/api.md "Audit log"): who, which action (the route's
    name in `AUDIT_ACTIONS`), the ids in its path, how it ended, from where. Never a body, a query
    string, a header or a cookie."""
    subject = request.scope.get(AUDIT_SUBJECT_KEY)
    ids = {**request.path_params, **request.scope.get(AUDIT_TARGET_KEY, {})}
    target = ",".join(f"{k}={v}" for k, v in ids.items())
    actor = actor_of(caller)
    if isinstance(subject, str):
        target = ",".join(t for t in (f"user={subject}", target) if t)
        if status < 400:  # whoever held the browser before, they are now this account
            actor = subject
    client = request.client
    shell.audit.append(
        actor=actor,
        action=audit_action(route_name),
        target=target,
        status=status,
        address=client.host if client else "",
        error=error,
    )


async def _recorded_after(
    body: AsyncIterable[Any],
    request: Request,
    shell: Shell,
    caller: Caller,
    route_name: str,
    status: int,
) -> AsyncIterator[Any]:
    """A streamed answer's body, its call's audit record appended once it ends (or is cut off:
    then as ``disconnected``)."""
    ended = 499  # unless the stream comes to its end
    error: str | None = "disconnected"
    try:
        async for chunk in body:
            yield chunk
        ended, error = status, None
    finally:
        audit_request(request, shell, caller, route_name, ended, error)


class Endpoint(Route):
    """A route of the JSON API with what the OpenAPI document says of it (`atrium.api.openapi`):
    who may call, the body model the handler parses, and the query parameters it reads."""

    access: Access
    body: type[BaseModel] | None
    body_required: bool
    query: Mapping[str, str]
    handler: Handler
    #: whether its calls are recorded in the audit log (under `audit_action` of its name)
    audited: bool


def endpoint(
    path: str,
    handler: Handler,
    *,
    methods: Sequence[str],
    access: Access,
    name: str | None = None,
    body: type[BaseModel] | None = None,
    body_required: bool = True,
    query: Mapping[str, str] | None = None,
    audit_safe: bool = False,
) -> Endpoint:
    """A route whose handler receives the identified, authorized caller.

    ``body`` names the model the handler reads with `read_model` (``body_required=False`` when
    an empty body means the defaults); ``query`` maps each query parameter the handler reads to
    its description. Both only feed the OpenAPI document.

    Every call that may change state (any method but GET, HEAD and OPTIONS, and a safe one when
    ``audit_safe``, such as the sign-in link) is recorded in the audit log under its route's action,
    whoever calls and however it ends; the safe calls cost nothing more.
    """
    route_name = name or handler.__name__

    async def guarded(request: Request) -> Response:
        shell = shell_of(request)
        if request.method in SAFE_METHODS and not audit_safe:
            known = await identify(request, shell)
            authorize(known, access)
            return await handler(request, known)
        caller: Caller = Anonymous()
        status = 499  # unless the handler ends some other way
        error: str | None = "disconnected"
        streamed = False
        try:
            caller = await identify(request, shell)
            authorize(caller, access)
            if isinstance(caller, UserCaller) and caller.via_cookie:
                check_cookie_origin(request, shell)
            response = await handler(request, caller)
            status, error = response.status_code, None
            if isinstance(response, StreamingResponse):
                # its work happens while the body streams: record it (with the ids it names
                # on the way) once the stream has ended
                response.body_iterator = _recorded_after(
                    response.body_iterator, request, shell, caller, route_name, status
                )
                streamed = True
            return response
        except AtriumError as err:
            status, error = err.http_status, err.code
            raise
        except Exception:
            status, error = 500, "internal"
            raise
        finally:
            if not streamed:
                audit_request(request, shell, caller, route_name, status, error)

    route = Endpoint(path, guarded, methods=list(methods), name=route_name)
    route.access = access
    route.body = body
    route.body_required = body_required
    route.query = dict(query or {})
    route.handler = handler
    route.audited = audit_safe or any(m.upper() not in SAFE_METHODS for m in methods)
    return route
