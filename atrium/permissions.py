"""Permission shapes (docs/api.md "Permission strings") and the grant check.

Pure: a grant is a permission string listed verbatim in the caller's manifest ``permissions``.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from enum import StrEnum
from typing import Final

KV_KEY_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


class Verb(StrEnum):
    """The two verbs of a permission: GET/HEAD read, everything else writes."""

    READ = "read"
    WRITE = "write"


def provider_permission(provider_app_id: str, verb: Verb) -> str:
    """``<provider_app_id>.read`` / ``.write``."""
    return f"{provider_app_id}.{verb}"


def kv_os_permission(key: str, verb: Verb) -> str:
    """``system.kv.os.<key>.<verb>``."""
    return f"system.kv.os.{key}.{verb}"


def kv_app_permission(app_id: str, key: str, verb: Verb) -> str:
    """``system.kv.app.<app_id>.<key>.<verb>``."""
    return f"system.kv.app.{app_id}.{key}.{verb}"


def holds(granted: Collection[str], permission: str | None) -> bool:
    """True when ``permission`` is null (open) or listed verbatim in ``granted``."""
    return permission is None or permission in granted


def kv_permission_needed(caller_app_id: str, namespace: str, key: str, verb: Verb) -> str | None:
    """The permission an app needs for a KV operation; None when it owns the namespace."""
    if namespace == "os":
        return kv_os_permission(key, verb)
    owner = namespace.removeprefix("app/")
    if owner == caller_app_id:
        return None
    return kv_app_permission(owner, key, verb)
