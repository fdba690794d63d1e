"""A local OpenID Connect provider for sign-in tests: oidc-provider-mock 0.3.4 with PKCE enforced.

The mock registers no PKCE extension, so a wrong ``code_verifier`` would still get tokens. Here its
authorization code grant is replaced (before any app is built) by one that stores each code's
``code_challenge`` and refuses a code whose request had none, or whose verifier does not match.
``issuer`` is ``http://localhost:<port>`` (werkzeug binds localhost).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from authlib.deprecate import AuthlibDeprecationWarning
from authlib.oauth2.rfc6749.errors import InvalidRequestError
from authlib.oauth2.rfc7636 import CodeChallenge

with warnings.catch_warnings():  # the mock imports authlib.jose, which authlib 1.9 deprecates
    warnings.simplefilter("ignore", AuthlibDeprecationWarning)
    import oidc_provider_mock
    from oidc_provider_mock import _app

#: the mock's own use of authlib's deprecated API, warned in its thread during a test
MOCK_WARNINGS = pytest.mark.filterwarnings("ignore:get_jwt_config:DeprecationWarning")
#: code -> (code_challenge, code_challenge_method), as the authorization request sent them
CHALLENGES: dict[str, tuple[str | None, str | None]] = {}


class RequirePkce(CodeChallenge):  # type: ignore[misc]
    """authlib's PKCE check, with the challenge kept beside the mock's code, and required."""

    def get_authorization_code_challenge(self, authorization_code: Any) -> str | None:
        return CHALLENGES.get(authorization_code.code, (None, None))[0]

    def get_authorization_code_challenge_method(self, authorization_code: Any) -> str | None:
        return CHALLENGES.get(authorization_code.code, (None, None))[1]

    def validate_code_verifier(self, grant: Any, result: Any) -> None:
        if self.get_authorization_code_challenge(grant.request.authorization_code) is None:
            raise InvalidRequestError("the authorization request had no code_challenge")
        super().validate_code_verifier(grant, result)


class PkceGrant(_app.AuthorizationCodeGrant):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        RequirePkce(required=True)(self)

    def save_authorization_code(self, code: str, request: Any) -> None:
        super().save_authorization_code(code, request)
        data = request.payload.data
        CHALLENGES[code] = (data.get("code_challenge"), data.get("code_challenge_method"))


_app.AuthorizationCodeGrant = PkceGrant


@dataclass
class MockProvider:
    issuer: str

    def set_user(self, sub: str, **claims: object) -> None:
        """The claims the provider gives ``sub`` (in the ID token and at userinfo)."""
        httpx.put(f"{self.issuer}/users/{sub}", json=claims, timeout=10).raise_for_status()

    def config(self, provider_id: str = "mock", **extra: object) -> dict[str, object]:
        """One entry of ATRIUM_OIDC_PROVIDERS for this provider."""
        return {
            "id": provider_id,
            "issuer": self.issuer,
            "clientId": f"atrium-{provider_id}",
            "clientSecret": "mock-secret-not-checked-by-the-mock",
            "displayName": f"Mock {provider_id}",
            **extra,
        }

    def env(self, *configs: dict[str, object]) -> str:
        return json.dumps(list(configs) or [self.config()])


@contextmanager
def mock_provider() -> Iterator[MockProvider]:
    with oidc_provider_mock.run_server_in_thread(require_nonce=True) as server:
        yield MockProvider(f"http://localhost:{server.server_port}")
