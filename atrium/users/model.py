"""Accounts and their roles, sessions and tokens as values; the id rule. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

#: a user id: lower-case, starts with a letter or digit, at most 32 characters
USER_ID: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
USER_ID_RULE: Final = "1-32 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
MAX_NAME: Final = 100


class Role(StrEnum):
    """What a user may do beyond their own apps and data: an admin runs the platform."""

    ADMIN = "admin"
    MEMBER = "member"


def valid_user_id(value: str) -> bool:
    return USER_ID.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class User:
    """An account; ``has_password`` says whether password sign-in is possible."""

    id: str
    name: str
    role: Role
    disabled: bool
    created_at: str
    has_password: bool = False

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "role": self.role.value,
            "disabled": self.disabled,
            "createdAt": self.created_at,
            "hasPassword": self.has_password,
        }

    def me(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "role": self.role.value}


class SessionKind(StrEnum):
    """How a sign-in was made: the bootstrap login link, a password, an OIDC provider."""

    LINK = "link"
    PASSWORD = "password"  # noqa: S105 - a kind of sign-in, not a secret
    OIDC = "oidc"


@dataclass(slots=True)
class Session:
    """A sign-in of the host page; the cookie's secret is kept only as its sha256."""

    id: str
    user_id: str
    kind: SessionKind
    created_at: str
    last_seen: str
    address: str
    device: str

    def wire(self, *, current: bool = False) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "createdAt": self.created_at,
            "lastSeen": self.last_seen,
            "address": self.address,
            "device": self.device,
            "current": current,
        }


@dataclass(frozen=True, slots=True)
class Token:
    """A personal API token; the secret is shown once and kept only as its sha256."""

    id: str
    user_id: str
    name: str
    created_at: str
    expires_at: str | None

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "createdAt": self.created_at,
            "expiresAt": self.expires_at,
        }


@dataclass(frozen=True, slots=True)
class Identity:
    """An OIDC identity linked to a user: by (issuer, subject) only, never by e-mail."""

    issuer: str
    subject: str
    user_id: str
    email: str | None
    linked_at: str

    def wire(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "subject": self.subject,
            "email": self.email,
            "linkedAt": self.linked_at,
        }
