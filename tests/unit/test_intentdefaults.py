"""Which remembered default applies to an intent (docs/api.md "Default handlers")."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from atrium.intentdefaults import IntentDefault, dump, lookup, normal_type, parse, remember

SINCE = datetime(2026, 1, 1, tzinfo=UTC)


def default(mime: str | None, app_id: str, action: str = "a.VIEW") -> IntentDefault:
    return IntentDefault(action, mime, app_id, SINCE)


STORED = [
    default("*/*", "x.any"),
    default("text/*", "x.text"),
    default("text/plain", "x.plain"),
    default(None, "x.untyped"),
    default("text/plain", "x.other", action="a.EDIT"),
]


@pytest.mark.parametrize(
    ("mime", "app_id"),
    [
        ("text/plain", "x.plain"),
        ("text/markdown", "x.text"),
        ("image/png", "x.any"),
        (None, "x.untyped"),
    ],
)
def test_the_most_specific_stored_type_wins(mime: str | None, app_id: str) -> None:
    found = lookup(STORED, "a.VIEW", mime)
    assert found is not None
    assert found.app_id == app_id


def test_an_untyped_intent_uses_only_an_untyped_default() -> None:
    assert lookup([default("*/*", "x.any")], "a.VIEW", None) is None
    assert lookup(STORED, "a.SEND", "text/plain") is None


def test_remember_replaces_the_same_action_and_type_only() -> None:
    after = remember(STORED, default("text/plain", "x.new"))
    assert [d.app_id for d in after if d.action == "a.VIEW" and d.type == "text/plain"] == ["x.new"]
    assert len(after) == len(STORED)


def test_a_stored_list_round_trips_normalized() -> None:
    raw = [
        {
            "action": "a.VIEW",
            "type": "Text/Plain; q=1",
            "appId": "x.app",
            "since": "2026-01-01T00:00:00Z",
        }
    ]
    parsed = parse(raw)
    assert parsed == [IntentDefault("a.VIEW", "text/plain", "x.app", SINCE)]
    assert dump(parsed) == [
        {
            "action": "a.VIEW",
            "type": "text/plain",
            "appId": "x.app",
            "since": "2026-01-01T00:00:00Z",
        }
    ]
    assert normal_type(None) is None


@pytest.mark.parametrize(
    "raw",
    [
        "nope",
        [{"action": "a"}],
        [{"action": "", "type": None, "appId": "x.app", "since": "2026-01-01T00:00:00Z"}],
        [{"action": "a", "type": "plain", "appId": "x.app", "since": "2026-01-01T00:00:00Z"}],
        [{"action": "a", "type": None, "appId": "X", "since": "2026-01-01T00:00:00Z"}],
        [{"action": "a", "type": None, "appId": "x.app", "since": "2026-01-01T00:00:00"}],
    ],
)
def test_bad_stored_values_name_the_problem(raw: object) -> None:
    with pytest.raises(ValueError, match=r"intent\.defaults"):
        parse(raw)
