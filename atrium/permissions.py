"""Permission shapes (docs/api.md "Permission strings"), the grant check, and permissions in a
person's words.

Pure: a grant is a permission string listed verbatim in the caller's manifest ``permissions``.
A KV permission names exactly one namespace, key and verb: ``system.kv.app/<appId>/<key>.<verb>``
holds a '/' that neither an app id nor a key can, so no two (app, key, verb) give one name. The form
an older shell wrote, ``system.kv.app.<appId>.<key>.<verb>``, could be read several ways (key
``secret`` of ``t4.bank.acct``, or key ``acct.secret`` of ``t4.bank``); `migrate_grant` reads it
once, as its review showed it, when a manifest is read.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from atrium.ids import APP_ID_RE, KV_KEY_RE, MAX_APP_ID, MAX_KV_KEY, is_reserved

__all__ = [
    "KV_APP_PREFIX",
    "KV_KEY_RE",
    "KV_OS_PREFIX",
    "LEGACY_KV_APP_PREFIX",
    "GrantChange",
    "KvPermission",
    "PermissionWords",
    "Verb",
    "describe",
    "holds",
    "kv_app_permission",
    "kv_os_permission",
    "kv_permission_needed",
    "legacy_kv_readings",
    "migrate_grant",
    "migrate_grants",
    "parse_kv_permission",
    "permission_owner",
    "provider_permission",
]

KV_OS_PREFIX: Final = "system.kv.os."
KV_APP_PREFIX: Final = "system.kv.app/"
#: the ambiguous form an older shell wrote for another app's key; it grants nothing as it stands
LEGACY_KV_APP_PREFIX: Final = "system.kv.app."


class Verb(StrEnum):
    """The two verbs of a permission: GET/HEAD read, everything else writes."""

    READ = "read"
    WRITE = "write"


@dataclass(frozen=True, slots=True)
class KvPermission:
    """What a KV permission opens: one key of one namespace (``os`` or ``app/<appId>``)."""

    namespace: str
    key: str
    verb: Verb

    @property
    def app_id(self) -> str | None:
        """The app whose namespace it is; None for the OS namespace."""
        return self.namespace.removeprefix("app/") if self.namespace != "os" else None

    @property
    def name(self) -> str:
        app_id = self.app_id
        if app_id is None:
            return kv_os_permission(self.key, self.verb)
        return kv_app_permission(app_id, self.key, self.verb)


def provider_permission(provider_app_id: str, verb: Verb) -> str:
    """``<provider_app_id>.read`` / ``.write``."""
    return f"{provider_app_id}.{verb}"


def kv_os_permission(key: str, verb: Verb) -> str:
    """``system.kv.os.<key>.<verb>``: one prefix, then the key, then the verb after the last dot."""
    return f"{KV_OS_PREFIX}{key}.{verb}"


def kv_app_permission(app_id: str, key: str, verb: Verb) -> str:
    """``system.kv.app/<app_id>/<key>.<verb>``: the '/' ends the id, the last dot starts the verb."""
    return f"{KV_APP_PREFIX}{app_id}/{key}.{verb}"


def parse_kv_permission(name: str) -> KvPermission | None:
    """The one key a KV permission opens, or None for any other string (an older shell's
    ``system.kv.app.…`` form included: it is read by `migrate_grant`, never here)."""
    body, dot, verb = name.rpartition(".")
    if not dot or verb not in Verb.__members__.values():
        return None
    if body.startswith(KV_OS_PREFIX):
        key = body.removeprefix(KV_OS_PREFIX)
        return KvPermission("os", key, Verb(verb)) if KV_KEY_RE.fullmatch(key) else None
    if body.startswith(KV_APP_PREFIX):
        app_id, slash, key = body.removeprefix(KV_APP_PREFIX).partition("/")
        if slash and APP_ID_RE.fullmatch(app_id) and KV_KEY_RE.fullmatch(key):
            return KvPermission(f"app/{app_id}", key, Verb(verb))
    return None


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


# --- names an older shell wrote ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GrantChange:
    """What reading a manifest did to one permission in the older KV form: ``new`` is the name it
    now holds, None when it was dropped; ``readings`` is every key the old name opened."""

    old: str
    new: str | None
    readings: tuple[KvPermission, ...]

    def why(self) -> str:
        opened = ", ".join(f"{r.key!r} of {r.app_id}" for r in self.readings) or "no key"
        old = self.old if len(self.old) <= 300 else f"{self.old[:300]}…"
        if self.new is None:
            return (
                f"dropped {old!r}: it opened {opened}, and none of these is the reading its "
                "review showed (the last word is the key); the app must ask again in the form "
                "system.kv.app/<appId>/<key>.<verb>"
            )
        return f"read {old!r} (which opened {opened}) as {self.new!r}, as its review showed it"


def legacy_kv_readings(name: str) -> tuple[KvPermission, ...]:
    """Every (app, key, verb) an older ``system.kv.app.<appId>.<key>.<verb>`` name opened, the
    longest app id first: each split of the middle at a dot into a valid id and a valid key."""
    if not name.startswith(LEGACY_KV_APP_PREFIX):
        return ()
    body, dot, verb = name.removeprefix(LEGACY_KV_APP_PREFIX).rpartition(".")
    if not dot or verb not in Verb.__members__.values() or len(body) > MAX_APP_ID + MAX_KV_KEY + 1:
        return ()  # no installed app has an id that long: its folder name could not hold it
    readings = []
    cut = len(body)
    while (cut := body.rfind(".", 0, cut)) > 0:
        app_id, key = body[:cut], body[cut + 1 :]
        if APP_ID_RE.fullmatch(app_id) and KV_KEY_RE.fullmatch(key):
            readings.append(KvPermission(f"app/{app_id}", key, Verb(verb)))
    return tuple(readings)


def migrate_grant(name: str) -> GrantChange | None:
    """An older shell's ``system.kv.app.…`` name read as one grant; None for any other name.

    The review showed such a name as key = its last word, app = the words before
    (``Read “secret” stored by t4.bank.acct``): that reading, when it is a valid id and key, is
    the grant the person approved and one the name already opened, so the new name never opens
    more than the old one did. Any other name of that form is dropped (it grants nothing)."""
    if not name.startswith(LEGACY_KV_APP_PREFIX):
        return None
    readings = legacy_kv_readings(name)
    shown = next((r for r in readings if "." not in r.key), None)
    return GrantChange(name, None if shown is None else shown.name, readings)


def migrate_grants(names: Iterable[str]) -> tuple[list[str], list[GrantChange]]:
    """``names`` with every older KV name migrated (or dropped), duplicates after the first
    removed, and what changed."""
    kept: dict[str, None] = {}
    changes: list[GrantChange] = []
    for name in names:
        change = migrate_grant(name)
        if change is not None:
            changes.append(change)
        new = name if change is None else change.new
        if new is not None:
            kept.setdefault(new)
    return list(kept), changes


# --- in a person's words -----------------------------------------------------------------------


def permission_owner(name: str) -> str | None:
    """The app that defines a permission: the name up to its last dot, when that is an app id
    outside the shell's ``system.`` (``com.atrium.notes.read`` is com.atrium.notes's and never
    com.atrium's); None when no app can define it."""
    owner, dot, word = name.rpartition(".")
    if any(c.isspace() for c in name):
        return None
    if dot and word and APP_ID_RE.fullmatch(owner) and not is_reserved(owner):
        return owner
    return None


@dataclass(frozen=True, slots=True)
class PermissionWords:
    """What words a permission: the visible apps' `permissionInfo` (name → label, description,
    app id) and their names (app id → name), for the KV permissions that open their keys."""

    declared: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    app_names: Mapping[str, str] = field(default_factory=dict)


def _kv_label(kv: KvPermission, app_names: Mapping[str, str]) -> str:
    action = "Read" if kv.verb is Verb.READ else "Change"
    app_id = kv.app_id
    if app_id is None:
        return f"{action} the shell setting “{kv.key}”"
    name = app_names.get(app_id)
    # a name with control or bidi-format characters could reorder the id shown after it
    app = f"{name} ({app_id})" if name and name.isprintable() else app_id
    return f"{action} key “{kv.key}” of app {app}"


def describe(name: str, words: PermissionWords) -> dict[str, str | None]:
    """A permission for a person: ``{name, label, description, declaredBy}``.

    A KV permission is worded by the shell from the one app and key it opens; a permission is
    worded by an app's `permissionInfo` only when that app is its owner (`permission_owner`);
    anything else, the shell's other names included, shows its name."""
    kv = parse_kv_permission(name)
    if kv is not None:
        label = _kv_label(kv, words.app_names)
        return {"name": name, "label": label, "description": "", "declaredBy": "system"}
    found = words.declared.get(name)
    if found is not None and found[2] == permission_owner(name):
        label, description, app_id = found
        return {"name": name, "label": label, "description": description, "declaredBy": app_id}
    return {"name": name, "label": name, "description": "", "declaredBy": None}
