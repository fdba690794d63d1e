"""Accounts, password sign-in, one's sign-ins and personal tokens (docs/api.md "Users").

Admins manage accounts (`/api/users…`); everyone signed in reads `/api/me`, changes their own
password, lists and ends their own sessions and tokens. Another user's session or token id answers
exactly like a missing one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, audit_subject, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.api.meta import set_session_cookie
from atrium.errors import (
    BadCredentials,
    BootstrapAdmin,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    TooManyAttempts,
    TooManyTokens,
)
from atrium.identity import SESSION_COOKIE, AppCaller, Caller, UserCaller
from atrium.shell import Shell
from atrium.state.database import Database
from atrium.users.accounts import set_aside_scope, stop_instances_of
from atrium.users.model import USER_ID_RULE, Role, SessionKind, User, valid_user_id
from atrium.users.passwords import MAX_LENGTH, Passwords, password_problem
from atrium.users.throttle import SignInThrottle, address_key
from atrium.wire import WireModel

#: the longest personal token lifetime one may ask for
MAX_TOKEN_DAYS: Final = 3650
#: the most personal tokens one user holds: each is a row and a lookup entry kept in memory
MAX_TOKENS: Final = 100
#: password sign-ins of one client address being checked at once
MAX_IN_FLIGHT: Final = 4


class SignIn:
    """One shell's password checks (a bound on concurrent hashes) and the sign-in limits."""

    def __init__(self, db: Database) -> None:
        self.passwords = Passwords()
        #: per (account, address) and per address, in the database: shared by every shell
        self.throttle = SignInThrottle(db)
        self._in_flight: dict[str, int] = {}
        self._dummy: asyncio.Future[bool] | None = None
        #: one account added or deleted at a time: each moves a scope folder aside, and an add
        #: racing a delete of the same id must not move the other's folder
        self.accounts = asyncio.Lock()

    async def ready(self) -> None:
        """Make the dummy hash (`Passwords.verify(None, …)`) before the first check of any name:
        made on demand by the first unknown name, it would make that answer one hash slower
        than a known name's."""
        if self._dummy is None:
            self._dummy = asyncio.ensure_future(self.passwords.verify(None, "warm-up"))
        await asyncio.shield(self._dummy)

    async def check(self, account: str, address: str) -> None:
        """429 when the address or the pair is over its limit; else count this attempt as
        failed until it succeeds, so that concurrent guesses are counted before any of them is
        verified. Every name gets the same answer: nothing here looks at who exists."""
        async with self.throttle.attempt(account, address, time.time()) as refused:
            if refused is not None:
                raise TooManyAttempts(refused.seconds, limit=refused.limit)

    @contextmanager
    def checking(self, address: str) -> Iterator[None]:
        """One of an address's `MAX_IN_FLIGHT` password checks at once. A check waits for one of
        a few hashing slots; one address firing many at once would queue them all ahead of
        everyone else's sign-in, so past a few it is told to come back in a second."""
        key = address_key(address)
        if self._in_flight.get(key, 0) >= MAX_IN_FLIGHT:
            raise TooManyAttempts(1, limit="at_once")
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        try:
            yield
        finally:
            left = self._in_flight[key] - 1
            if left:
                self._in_flight[key] = left
            else:
                del self._in_flight[key]


def sign_in_of(request: Request) -> SignIn:
    state = request.app.state
    found: SignIn | None = getattr(state, "sign_in", None)
    if found is None:
        found = SignIn(shell_of(request).db)
        state.sign_in = found
    return found


def address_of(request: Request) -> str:
    client = request.client
    return client.host if client else ""


def _user(caller: Caller) -> UserCaller:
    if not isinstance(caller, UserCaller):  # Access.USER / ADMIN let no one else in
        raise PermissionDenied("only a user may call this endpoint")
    return caller


def _bad_field(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message}", problems=[{"field": field, "message": message}])


def _check_password(password: str, field: str = "password") -> None:
    problem = password_problem(password)
    if problem is not None:
        raise _bad_field(field, problem)


# ---- bodies ---------------------------------------------------------------------------------


class NewUser(WireModel):
    """`POST /api/users`."""

    id: str = Field(max_length=32)
    name: str | None = Field(default=None, max_length=100)
    role: Role = Role.MEMBER
    password: str | None = Field(default=None, max_length=MAX_LENGTH)


class UserChange(WireModel):
    """`PATCH /api/users/{id}`."""

    name: str | None = Field(default=None, max_length=100)
    role: Role | None = None
    disabled: bool | None = None


class PasswordReset(WireModel):
    """`PUT /api/users/{id}/password`."""

    password: str = Field(max_length=MAX_LENGTH)


class PasswordChange(WireModel):
    """`PUT /api/me/password`: ``current`` is needed once the user has a password."""

    current: str | None = Field(default=None, max_length=MAX_LENGTH)
    password: str = Field(max_length=MAX_LENGTH)


class SignInBody(WireModel):
    """`POST /api/session`."""

    user: str = Field(max_length=200)
    password: str = Field(max_length=MAX_LENGTH)


class NewToken(WireModel):
    """`POST /api/tokens`."""

    name: str = Field(min_length=1, max_length=100)
    #: strict: a string, a boolean or a float is refused, not read as a number of days
    expires_in_days: int | None = Field(default=None, ge=1, le=MAX_TOKEN_DAYS, strict=True)


# ---- me -------------------------------------------------------------------------------------


async def me(request: Request, caller: Caller) -> Response:
    user = shell_of(request).users.require(_user(caller).user_id)
    return JSONResponse(user.me())


async def change_own_password(request: Request, caller: Caller) -> Response:
    """A user's own new password. Once they have one, the current one is needed (checked and
    limited as a sign-in is); their other sign-ins end, this one stays."""
    shell = shell_of(request)
    you = _user(caller)
    body = await read_model(request, PasswordChange)
    _check_password(body.password)
    stored = shell.users.password_hash(you.user_id)
    if stored is None and you.token_id is not None:
        raise PermissionDenied(
            "a personal token cannot give its user a first password (that would outlive the "
            "token); set it from a sign-in, or ask an admin"
        )
    if stored is not None:
        sign_in = sign_in_of(request)
        address = address_of(request)
        await sign_in.check(you.user_id, address)
        if not await sign_in.passwords.verify(stored, body.current or ""):
            raise PermissionDenied("the current password is not right")
        await sign_in.throttle.succeeded(you.user_id, address)
    hashed = await sign_in_of(request).passwords.hash(body.password)
    await shell.users.set_password(you.user_id, hashed, end_sessions=False)
    ended = 0
    for session in shell.users.sessions_of(you.user_id):
        if session.id != you.session_id:
            ended += await shell.users.end_session(you.user_id, session.id)
    return JSONResponse({"ok": True, "endedSessions": ended})


# ---- accounts (admin) -----------------------------------------------------------------------


def _wire(user: User) -> dict[str, Any]:
    return user.wire()


async def list_users(request: Request, caller: Caller) -> Response:
    return JSONResponse([_wire(u) for u in shell_of(request).users.all()])


async def add_user(request: Request, caller: Caller) -> Response:
    """A new account. A scope folder left under the id (a user deleted while the shell was down,
    or by hand) is set aside in lost+found first: a new account never inherits data."""
    shell = shell_of(request)
    body = await read_model(request, NewUser)
    if not valid_user_id(body.id):
        raise _bad_field("id", USER_ID_RULE)
    if body.name is not None and not body.name.strip():
        raise _bad_field("name", "a display name has 1-100 printable characters")
    if body.password is not None:
        _check_password(body.password)
    hashed = (
        None if body.password is None else await sign_in_of(request).passwords.hash(body.password)
    )
    async with sign_in_of(request).accounts:
        if shell.users.get(body.id) is None:
            await set_aside_scope(shell.settings.home, body.id, shell.settings.scopes_dir)
        user = await shell.users.add(body.id, body.name, body.role)
        if hashed is not None:
            await shell.users.set_password(user.id, hashed, end_sessions=False)
    return JSONResponse(_wire(shell.users.require(user.id)), status_code=201)


async def get_user(request: Request, caller: Caller) -> Response:
    return JSONResponse(_wire(shell_of(request).users.require(request.path_params["user_id"])))


async def change_user(request: Request, caller: Caller) -> Response:
    """Rename, change the role, disable or enable. Disabling ends the user's sign-ins and tokens
    at once and stops their instances."""
    shell = shell_of(request)
    user_id = request.path_params["user_id"]
    shell.users.require(user_id)
    body = await read_model(request, UserChange)
    before = shell.users.require(user_id)
    user = await shell.users.update(user_id, name=body.name, role=body.role, disabled=body.disabled)
    stopped: list[str] = []
    if user.disabled and not before.disabled:
        stopped = await stop_instances_of(shell.lifecycle, user_id)
    return JSONResponse({**_wire(user), "stoppedInstances": stopped})


async def reset_password(request: Request, caller: Caller) -> Response:
    """An admin sets a user's password; every sign-in of that user ends (tokens stay)."""
    shell = shell_of(request)
    user_id = request.path_params["user_id"]
    shell.users.require(user_id)
    body = await read_model(request, PasswordReset)
    _check_password(body.password)
    hashed = await sign_in_of(request).passwords.hash(body.password)
    await shell.users.set_password(user_id, hashed, end_sessions=True)
    return JSONResponse(_wire(shell.users.require(user_id)))


async def delete_user(request: Request, caller: Caller) -> Response:
    """Remove the account (its sign-ins, tokens, identities and grants), end its instances and
    move its scope to ``lost+found/users/<id>-<stamp>/``: nothing is deleted from disk."""
    shell = shell_of(request)
    user_id = request.path_params["user_id"]
    shell.users.require(user_id)
    if user_id == shell.settings.user:
        raise BootstrapAdmin(
            f"{user_id!r} is the bootstrap admin (ATRIUM_USER, the owner of run/token): "
            "disable them instead",
            user=user_id,
        )
    async with sign_in_of(request).accounts:
        await shell.users.remove(user_id)
        stopped = await stop_instances_of(shell.lifecycle, user_id)
        moved = await set_aside_scope(shell.settings.home, user_id, shell.settings.scopes_dir)
        # done before answering (the store's change callback also starts it): an account made
        # next under this id must find nothing built from the old one's scope
        await shell.user_scopes.forget(user_id)
    return JSONResponse(
        {
            "ok": True,
            "user": user_id,
            "stoppedInstances": stopped,
            "lostAndFound": None if moved is None else str(moved.relative_to(shell.settings.home)),
        }
    )


# ---- sign-in --------------------------------------------------------------------------------


def check_sign_in_origin(request: Request, shell: Shell) -> None:
    """Login CSRF: a browser page of another origin must not sign the browser in to an account
    of its choosing. A request that names its origin must name the host page's; one without
    `Origin` (a script, the CLI) passes unless the browser says it is cross-origin."""
    origin = request.headers.get("origin")
    if origin is not None:
        if origin in shell.host_origins:
            return
        raise PermissionDenied(
            f"a sign-in must come from the host page; origin {origin!r} is not it"
        )
    if request.headers.get("sec-fetch-site") in {"cross-site", "same-site"}:
        raise PermissionDenied("a sign-in must come from the host page, not another site")


async def sign_in(request: Request, caller: Caller) -> Response:
    """Password sign-in: the session cookie on success; one answer for every failure."""
    shell = shell_of(request)
    if isinstance(caller, AppCaller):
        raise PermissionDenied(
            f"an app cannot sign anyone in (app {caller.app_id!r})", caller_app_id=caller.app_id
        )
    check_sign_in_origin(request, shell)
    body = await read_model(request, SignInBody)
    address = address_of(request)
    limiter = sign_in_of(request)
    with limiter.checking(address):
        await limiter.ready()
        await limiter.check(body.user, address)
        user = shell.users.get(body.user)
        if user is not None:
            audit_subject(request, user.id)
        stored = None if user is None or user.disabled else shell.users.password_hash(user.id)
        if not await limiter.passwords.verify(stored, body.password) or user is None:
            raise BadCredentials()
    await limiter.throttle.succeeded(body.user, address)
    if stored is not None and Passwords.needs_rehash(stored):
        rehashed = await limiter.passwords.hash(body.password)
        await shell.users.set_password(user.id, rehashed, end_sessions=False)
    secret, session = await shell.users.create_session(
        user.id,
        SessionKind.PASSWORD,
        address=address,
        device=request.headers.get("user-agent", ""),
    )
    if isinstance(caller, UserCaller) and caller.session_id is not None:
        # the browser's cookie is replaced: the sign-in it held ends rather than lingering
        await shell.users.end_session(caller.user_id, caller.session_id)
    response = JSONResponse({**user.me(), "session": session.id})
    set_session_cookie(response, request, secret)
    response.headers["Cache-Control"] = "no-store"
    return response


async def sign_out(request: Request, caller: Caller) -> Response:
    """End the sign-in the request's cookie belongs to and clear the cookie."""
    you = _user(caller)
    if you.session_id is None:
        raise InvalidRequest(
            "this request carries no sign-in cookie; a personal token ends with DELETE /api/tokens/{id}"
        )
    await shell_of(request).users.end_session(you.user_id, you.session_id)
    response = JSONResponse({"ok": True, "session": you.session_id})
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


async def list_sessions(request: Request, caller: Caller) -> Response:
    you = _user(caller)
    sessions = shell_of(request).users.sessions_of(you.user_id)
    return JSONResponse([s.wire(current=s.id == you.session_id) for s in sessions])


async def end_session(request: Request, caller: Caller) -> Response:
    you = _user(caller)
    session_id = request.path_params["session_id"]
    if not await shell_of(request).users.end_session(you.user_id, session_id):
        raise NotFound("session", session_id)
    return JSONResponse(
        {"ok": True, "session": session_id, "current": session_id == you.session_id}
    )


# ---- personal tokens ------------------------------------------------------------------------


def _no_longer_than_the_caller(request: Request, you: UserCaller, days: int | None) -> None:
    """A token made with a personal token expires no later than that token: a leaked token that
    expires in a week cannot mint itself a successor that never does."""
    if you.token_id is None:
        return
    users = shell_of(request).users
    limit = next((t.expires_at for t in users.tokens_of(you.user_id) if t.id == you.token_id), None)
    if limit is None:
        return
    until = datetime.fromisoformat(limit.replace("Z", "+00:00"))
    asked = None if days is None else datetime.now(UTC) + timedelta(days=days)
    if asked is None or asked > until:
        raise _bad_field(
            "expiresInDays",
            f"a token made with a personal token expires no later than it does ({limit})",
        )


async def create_token(request: Request, caller: Caller) -> Response:
    """A personal API token of the caller, shown this once (only its sha256 is kept)."""
    you = _user(caller)
    body = await read_model(request, NewToken)
    _no_longer_than_the_caller(request, you, body.expires_in_days)
    if len(shell_of(request).users.tokens_of(you.user_id)) >= MAX_TOKENS:
        raise TooManyTokens(MAX_TOKENS)
    secret, token = await shell_of(request).users.create_token(
        you.user_id, body.name, body.expires_in_days
    )
    response = JSONResponse({**token.wire(), "token": secret}, status_code=201)
    response.headers["Cache-Control"] = "no-store"
    return response


async def list_tokens(request: Request, caller: Caller) -> Response:
    you = _user(caller)
    return JSONResponse([t.wire() for t in shell_of(request).users.tokens_of(you.user_id)])


async def delete_token(request: Request, caller: Caller) -> Response:
    you = _user(caller)
    token_id = request.path_params["token_id"]
    if not await shell_of(request).users.delete_token(you.user_id, token_id):
        raise NotFound("token", token_id)
    return JSONResponse({"ok": True, "id": token_id})


routes: list[BaseRoute] = [
    endpoint("/api/me", me, methods=["GET"], access=Access.USER),
    endpoint(
        "/api/me/password",
        change_own_password,
        methods=["PUT"],
        access=Access.USER,
        body=PasswordChange,
    ),
    endpoint("/api/users", list_users, methods=["GET"], access=Access.ADMIN),
    endpoint("/api/users", add_user, methods=["POST"], access=Access.ADMIN, body=NewUser),
    endpoint("/api/users/{user_id}", get_user, methods=["GET"], access=Access.ADMIN),
    endpoint(
        "/api/users/{user_id}",
        change_user,
        methods=["PATCH"],
        access=Access.ADMIN,
        body=UserChange,
    ),
    endpoint("/api/users/{user_id}", delete_user, methods=["DELETE"], access=Access.ADMIN),
    endpoint(
        "/api/users/{user_id}/password",
        reset_password,
        methods=["PUT"],
        access=Access.ADMIN,
        body=PasswordReset,
    ),
    endpoint("/api/session", sign_in, methods=["POST"], access=Access.ANYONE, body=SignInBody),
    endpoint("/api/session", sign_out, methods=["DELETE"], access=Access.USER),
    endpoint("/api/sessions", list_sessions, methods=["GET"], access=Access.USER),
    endpoint("/api/sessions/{session_id}", end_session, methods=["DELETE"], access=Access.USER),
    endpoint("/api/tokens", list_tokens, methods=["GET"], access=Access.USER),
    endpoint("/api/tokens", create_token, methods=["POST"], access=Access.USER, body=NewToken),
    endpoint("/api/tokens/{token_id}", delete_token, methods=["DELETE"], access=Access.USER),
]
