"""Permission shapes (docs/api.md "Permission strings") and the grant check.

Pure: a grant is a permission string listed verbatim in the caller's manifest ``permissions``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
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


#: labels the shell gives its own permissions, by pattern (docs/api.md "Permission strings")
SYSTEM_LABELS: Final = (
    (re.compile(r"^system\.kv\.os\.(?P<key>.+)\.read\Z"), "Read the shell setting “{key}”"),
    (re.compile(r"^system\.kv\.os\.(?P<key>.+)\.write\Z"), "Change the shell setting “{key}”"),
    (
        re.compile(r"^system\.kv\.app\.(?P<app>[a-z0-9.-]+)\.(?P<key>[^.]+)\.read\Z"),
        "Read “{key}” stored by {app}",
    ),
    (
        re.compile(r"^system\.kv\.app\.(?P<app>[a-z0-9.-]+)\.(?P<key>[^.]+)\.write\Z"),
        "Change “{key}” stored by {app}",
    ),
)


def describe(name: str, declared: Mapping[str, tuple[str, str, str]]) -> dict[str, str | None]:
    """A permission for a person: ``{name, label, description, declaredBy}``. ``declared`` maps
    permission names to (label, description, app id) from the visible apps' `permissionInfo`;
    the shell's own permissions have built-in labels; anything else falls back to its name."""
    if name in declared:
        label, description, app_id = declared[name]
        return {"name": name, "label": label, "description": description, "declaredBy": app_id}
    for pattern, template in SYSTEM_LABELS:
        found = pattern.match(name)
        if found:
            return {
                "name": name,
                "label": template.format(**found.groupdict()),
                "description": "",
                "declaredBy": "system",
            }
    return {"name": name, "label": name, "description": "", "declaredBy": None}
