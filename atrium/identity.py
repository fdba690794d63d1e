"""Who is calling: the user, an app instance, or nobody (decisions.md "Who is calling").

Holds the user's token and session-cookie check and the per-instance app tokens. Knows nothing of
HTTP; `atrium.api.auth.identify` reads the request and asks this module.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Final

SESSION_COOKIE: Final = "atrium_session"
#: ASGI scope key under which the app-origin dispatcher passes the app it identified by origin
CALLER_SCOPE_KEY: Final = "atrium.caller"
#: the shortest user token accepted (`ATRIUM_TOKEN` is checked against it before the shell starts)
MIN_TOKEN_LENGTH: Final = 16


@dataclass(frozen=True, slots=True)
class UserCaller:
    """The person at the host page (cookie) or the CLI (bearer token)."""

    via_cookie: bool = False


@dataclass(frozen=True, slots=True)
class AppCaller:
    """An app instance, authenticated by its own token or by its origin."""

    app_id: str
    instance_id: str


@dataclass(frozen=True, slots=True)
class Anonymous:
    """No credentials at all."""


Caller = UserCaller | AppCaller | Anonymous


class UserAuth:
    """The user's token; the session cookie is derived from it, so a new token ends old sessions."""

    def __init__(self, token: str) -> None:
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"the user token must be at least {MIN_TOKEN_LENGTH} characters")
        self._token = token
        self._session = hmac.new(
            token.encode(), b"atrium host-page session", hashlib.sha256
        ).hexdigest()

    @property
    def token(self) -> str:
        return self._token

    @property
    def session(self) -> str:
        return self._session

    def is_token(self, candidate: str) -> bool:
        return hmac.compare_digest(candidate.encode(), self._token.encode())

    def is_session(self, candidate: str) -> bool:
        return hmac.compare_digest(candidate.encode(), self._session.encode())


def new_token() -> str:
    return secrets.token_urlsafe(32)


class AppTokens:
    """Per-instance app tokens: issued at spawn, revoked when the instance goes (lifecycle issue)."""

    def __init__(self) -> None:
        self._by_token: dict[str, AppCaller] = {}
        self._by_instance: dict[str, str] = {}

    def issue(self, app_id: str, instance_id: str) -> str:
        self.revoke(instance_id)
        token = new_token()
        self._by_token[token] = AppCaller(app_id, instance_id)
        self._by_instance[instance_id] = token
        return token

    def revoke(self, instance_id: str) -> None:
        token = self._by_instance.pop(instance_id, None)
        if token is not None:
            self._by_token.pop(token, None)

    def lookup(self, token: str) -> AppCaller | None:
        return self._by_token.get(token)
