"""Who is calling: a user, an app instance, or nobody (decisions.md "Who is calling").

Holds the bootstrap admin's token and the per-instance app tokens; sessions and personal tokens
are `atrium.users.store`'s. Knows nothing of
HTTP; `atrium.api.auth.identify` reads the request and asks this module.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Final

from atrium.errors import PermissionDenied
from atrium.users.model import Role

SESSION_COOKIE: Final = "atrium_session"
#: ASGI scope key under which the app-origin dispatcher passes the app it identified by origin
CALLER_SCOPE_KEY: Final = "atrium.caller"
#: the shortest user token accepted (`ATRIUM_TOKEN` is checked against it before the shell starts)
MIN_TOKEN_LENGTH: Final = 16


@dataclass(frozen=True, slots=True)
class UserCaller:
    """A signed-in user: at the host page (cookie, ``session_id``) or a client with the bootstrap
    token or a personal token (``token_id``; None for the bootstrap token)."""

    user_id: str
    role: Role
    via_cookie: bool = False
    session_id: str | None = None
    token_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


@dataclass(frozen=True, slots=True)
class AppCaller:
    """An app instance, authenticated by its own token or by its origin; ``owner`` is the user
    the instance belongs to (an app acts for its owner only)."""

    app_id: str
    instance_id: str
    owner: str


@dataclass(frozen=True, slots=True)
class Anonymous:
    """No credentials at all."""


Caller = UserCaller | AppCaller | Anonymous


class UserAuth:
    """The bootstrap admin's token (``run/token``): its sha256, its ``link_key`` (which marks the
    sessions the login link made with it, so a new token ends the old link's sign-ins) and the
    token itself when this shell knows it. A shell that took the token another shell of its
    database keeps there knows only the hash and the link key (`known_only`): it accepts the
    token and its login link, and cannot print them (`atrium.users.bootstrap`)."""

    def __init__(self, token: str) -> None:
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"the user token must be at least {MIN_TOKEN_LENGTH} characters")
        self._token: str | None = token
        self._hash = token_hash(token)
        self._link_key = hmac.new(
            token.encode(), b"atrium host-page session", hashlib.sha256
        ).hexdigest()

    @classmethod
    def known_only(cls, hashed: str, link_key: str) -> UserAuth:
        auth = cls.__new__(cls)
        auth._token, auth._hash, auth._link_key = None, hashed, link_key
        return auth

    @property
    def token(self) -> str | None:
        """The token, when this shell knows it (see the class)."""
        return self._token

    @property
    def hash(self) -> str:
        return self._hash

    @property
    def link_key(self) -> str:
        return self._link_key

    def is_token(self, candidate: str) -> bool:
        return hmac.compare_digest(token_hash(candidate).encode(), self._hash.encode())

    def become(self, other: UserAuth) -> None:
        """Take ``other``'s token (another shell replaced the shared one): the old one is
        refused from the next request on."""
        self._token, self._hash, self._link_key = other._token, other._hash, other._link_key


def token_hash(token: str) -> str:
    """The sha256 a token is kept as in the database (hex): the bootstrap token, app tokens."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


class AppTokens:
    """Per-instance app tokens: issued at spawn, revoked when the instance goes (lifecycle issue).

    This shell's own, in memory: all there is with one shell. Shells sharing a PostgreSQL
    database keep them in the database too (`atrium.state.apptokens.SharedAppTokens`), so a
    pod's calls are its app's on every shell."""

    def __init__(self) -> None:
        self._by_token: dict[str, AppCaller] = {}
        self._by_instance: dict[str, str] = {}

    def issue(self, app_id: str, instance_id: str, owner: str, *, shared: bool = True) -> str:
        """``shared``: valid on every shell of the database (a pod's, whose calls reach any);
        else this shell's alone (a local server's, which calls its own shell and dies with it)."""
        self.revoke(instance_id)
        token = new_token()
        self._by_token[token] = AppCaller(app_id, instance_id, owner)
        self._by_instance[instance_id] = token
        return token

    def register(self, app_id: str, instance_id: str, owner: str, token: str) -> None:
        """Keep a token an earlier shell issued (an adopted pod holds it in its Secret)."""
        self.revoke(instance_id)
        self._by_token[token] = AppCaller(app_id, instance_id, owner)
        self._by_instance[instance_id] = token

    def revoke(self, instance_id: str) -> None:
        token = self._by_instance.pop(instance_id, None)
        if token is not None:
            self._by_token.pop(token, None)

    def forget(self, instance_id: str) -> None:
        """Let go of an instance whose server runs on without this shell (a pod left for the
        next shell, or taken over by another): here, the same as `revoke`."""
        self.revoke(instance_id)

    def revoke_rows(self, instance_id: str) -> None:
        """An instance this shell holds with a token it never had (taken over once its pod
        ended): whatever is kept of that token anywhere goes (here: its memory)."""
        self.revoke(instance_id)

    def lookup(self, token: str) -> AppCaller | None:
        return self._by_token.get(token)

    async def find(self, token: str) -> AppCaller | None:
        """The instance ``token`` is the token of (None: none)."""
        return self._by_token.get(token)

    async def stored(self, token: str) -> None:
        """Until a token just issued is valid wherever it will be presented (here: at once)."""

    async def sweep(self) -> int:
        """At start: remove what an earlier run left of its tokens (here: nothing). How many."""
        return 0


def user_id_of(caller: Caller) -> str | None:
    """The user a caller acts for: a user themself, an app its instance's owner, else None."""
    if isinstance(caller, UserCaller):
        return caller.user_id
    if isinstance(caller, AppCaller):
        return caller.owner
    return None


def require_admin(caller: Caller, what: str) -> None:
    """Only an admin user may ``what`` (the shared scopes, platform defaults): anyone else gets
    ``403 permission_denied``."""
    if not (isinstance(caller, UserCaller) and caller.is_admin):
        raise PermissionDenied(f"only an admin may {what}")
