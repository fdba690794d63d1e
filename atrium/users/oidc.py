"""OpenID Connect providers as settings, and the rules a verified ID token is judged by. Pure.

A provider is configured by ``ATRIUM_OIDC_PROVIDERS`` (a JSON list, see docs/api.md "Sign-in with
OIDC"). What the shell asks of an ID token beyond its signature, issuer, audience, expiry and nonce
(which the client library checks) lives here: the e-mail domain rule and how a new member's id is
made from the claims.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic.alias_generators import to_camel

from atrium.users.model import valid_user_id

PROVIDER_ID: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
#: what ATRIUM_OIDC_PROVIDERS accepts, said in the one-line report of a value it refused
PROVIDERS_ACCEPTED: Final = (
    "a JSON list of {id, issuer, clientId, clientSecret, displayName, allowSignup?, emailDomains?}"
)


class OidcProvider(BaseModel):
    """One provider. ``client_secret`` is a `SecretStr`: never printed, logged or reported."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    id: Annotated[str, Field(max_length=32)]
    issuer: Annotated[str, Field(min_length=8, max_length=500)]
    client_id: Annotated[str, Field(min_length=1, max_length=500)]
    client_secret: SecretStr
    display_name: Annotated[str, Field(min_length=1, max_length=100)]
    allow_signup: bool = False
    #: when set, only these e-mail domains sign in, and only with ``email_verified`` true
    email_domains: tuple[str, ...] = ()

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if PROVIDER_ID.fullmatch(value) is None:
            raise ValueError("a provider id has 1-32 of a-z, 0-9, '_' and '-'")
        return value

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str) -> str:
        if not value.startswith(("https://", "http://")) or "?" in value or "#" in value:
            raise ValueError("an issuer is an https:// URL without query or fragment")
        return value

    @field_validator("email_domains")
    @classmethod
    def _domains(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        domains = tuple(d.strip().lower().lstrip("@") for d in value)
        if any(not d or "@" in d or " " in d for d in domains):
            raise ValueError("an e-mail domain is a domain name such as example.org")
        return domains

    @property
    def metadata_url(self) -> str:
        """OpenID Connect Discovery's document, under the issuer."""
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"


def check_unique(providers: tuple[OidcProvider, ...]) -> tuple[OidcProvider, ...]:
    seen: set[str] = set()
    for provider in providers:
        if provider.id in seen:
            raise ValueError(f"provider id {provider.id!r} is given twice")
        seen.add(provider.id)
    return providers


def email_problem(provider: OidcProvider, claims: Mapping[str, object]) -> str | None:
    """Why the provider's e-mail rule refuses these claims, or None. Without a domain list any
    e-mail (or none) passes: the e-mail is never what links an identity."""
    if not provider.email_domains:
        return None
    email = claims.get("email")
    if not isinstance(email, str) or "@" not in email:
        return "the provider gave no e-mail address, and this sign-in needs one"
    if claims.get("email_verified") is not True:
        return f"the provider has not verified the e-mail address {email}"
    domain = email.rsplit("@", 1)[1].lower()
    if domain not in provider.email_domains:
        return f"e-mail addresses of {domain} may not sign in here"
    return None


def new_user_id(claims: Mapping[str, object], taken: Callable[[str], bool]) -> str:
    """A valid, unused id for a member made by sign-up: from ``preferred_username``, else the
    e-mail's local part, else ``user``; lower-cased, other characters made ``-``, and ``-2``,
    ``-3``… added while the id is taken."""
    base = ""
    for raw in (claims.get("preferred_username"), _local_part(claims.get("email"))):
        if isinstance(raw, str):
            base = re.sub(r"[^a-z0-9._-]+", "-", raw.lower()).lstrip("._-")[:28].rstrip("._-")
            if base:
                break
    base = base or "user"
    candidate, n = base, 1
    while taken(candidate) or not valid_user_id(candidate):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _local_part(email: object) -> str | None:
    return email.split("@", 1)[0] if isinstance(email, str) else None
