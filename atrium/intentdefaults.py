"""Remembered default handlers: the user's "always use this" per (action, type) (docs/api.md
"Default handlers").

Pure: the stored list (the KV value `os/intent.defaults`), its validation, and which default
applies to an intent. A default stored for `text/*` or `*/*` applies to the intent types that
pattern covers, as in filter matching; the most specific stored pattern wins (`text/plain`, then
`text/*`, then `*/*`). An intent without a type uses only a default stored without one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from atrium.manifest import APP_ID_RE

KEY: Final = "intent.defaults"
MAX_DEFAULTS: Final = 1000


def normal_type(mime: str | None) -> str | None:
    """A MIME type as intents compare it: parameters dropped, lowercase."""
    return mime.split(";", 1)[0].strip().lower() if mime else None


def patterns(mime: str | None) -> tuple[str | None, ...]:
    """The stored types that apply to an intent's type, most specific first."""
    if mime is None:
        return (None,)
    major = mime.split("/", 1)[0]
    return (mime, f"{major}/*", "*/*")


@dataclass(frozen=True, slots=True)
class IntentDefault:
    """One remembered choice."""

    action: str
    type: str | None
    app_id: str
    since: datetime

    def wire(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "type": self.type,
            "appId": self.app_id,
            "since": self.since.isoformat().replace("+00:00", "Z"),
        }


def parse(value: Any) -> list[IntentDefault]:
    """The stored value as defaults; ValueError naming the first problem (a raw KV write)."""
    if not isinstance(value, list):
        raise ValueError("intent.defaults must be a list of {action, type, appId, since}")
    if len(value) > MAX_DEFAULTS:
        raise ValueError(f"intent.defaults holds at most {MAX_DEFAULTS} entries")
    parsed: dict[tuple[str, str | None], IntentDefault] = {}
    for n, item in enumerate(value):
        where = f"intent.defaults[{n}]"
        if not isinstance(item, dict) or set(item) != {"action", "type", "appId", "since"}:
            raise ValueError(f"{where} must be exactly {{action, type, appId, since}}")
        action, mime, app_id, since = item["action"], item["type"], item["appId"], item["since"]
        if not isinstance(action, str) or not 1 <= len(action) <= 200:
            raise ValueError(f"{where}.action must be a string of 1-200 characters")
        if mime is not None and (not isinstance(mime, str) or "/" not in mime):
            raise ValueError(f"{where}.type must be null or a MIME type (type/subtype)")
        if not isinstance(app_id, str) or not APP_ID_RE.fullmatch(app_id):
            raise ValueError(f"{where}.appId must be an app id")
        try:
            when = datetime.fromisoformat(str(since).replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{where}.since must be an ISO 8601 time") from None
        if when.tzinfo is None:
            raise ValueError(f"{where}.since must carry its time zone (Z)")
        entry = IntentDefault(action, normal_type(mime), app_id, when.astimezone(UTC))
        parsed[(entry.action, entry.type)] = entry
    return list(parsed.values())


def dump(defaults: Iterable[IntentDefault]) -> list[dict[str, Any]]:
    ordered = sorted(defaults, key=lambda d: (d.action, d.type or ""))
    return [d.wire() for d in ordered]


def lookup(
    defaults: Sequence[IntentDefault], action: str, mime: str | None
) -> IntentDefault | None:
    """The default that applies to an intent with ``action`` and (normalized) type ``mime``."""
    by_key = {(d.action, d.type): d for d in defaults if d.action == action}
    for pattern in patterns(mime):
        found = by_key.get((action, pattern))
        if found is not None:
            return found
    return None


def remember(defaults: Sequence[IntentDefault], choice: IntentDefault) -> list[IntentDefault]:
    """``defaults`` with ``choice`` replacing any default for the same (action, type)."""
    kept = [d for d in defaults if (d.action, d.type) != (choice.action, choice.type)]
    return [*kept, choice]


def forget_app(defaults: Sequence[IntentDefault], app_id: str) -> list[IntentDefault]:
    return [d for d in defaults if d.app_id != app_id]
