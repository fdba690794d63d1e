"""Intent scoring (docs/api.md "Scoring", decisions.md "Data proxy and intents") as a table, ranking and the index."""

from __future__ import annotations

from typing import Any

import pytest

from atrium.intents import Candidate, Intent, IntentIndex, IntentMatch, rank, score, tied_at_top
from atrium.manifest import IntentFilter
from atrium.scopes import Scope

VIEW = "os.intent.action.VIEW"


def f(**fields: Any) -> IntentFilter:
    return IntentFilter.model_validate({"action": VIEW, **fields})


def intent(**fields: Any) -> Intent:
    return Intent(action=fields.pop("action", VIEW), **fields)


# (filter, intent, expected (mime, scheme, categories, priority) or None when dropped)
SCORING: list[tuple[str, IntentFilter, Intent, tuple[int, int, int, int] | None]] = [
    ("action differs", f(), intent(action="os.intent.action.EDIT"), None),
    ("bare action", f(), intent(), (0, 0, 0, 0)),
    ("exact mime", f(dataMime=["text/plain"]), intent(type="text/plain"), (100, 0, 0, 0)),
    ("major wildcard", f(dataMime=["text/*"]), intent(type="text/plain"), (50, 0, 0, 0)),
    ("full wildcard", f(dataMime=["*/*"]), intent(type="image/png"), (10, 0, 0, 0)),
    (
        "best of several",
        f(dataMime=["*/*", "text/*", "text/plain"]),
        intent(type="text/plain"),
        (100, 0, 0, 0),
    ),
    ("mime mismatch drops", f(dataMime=["image/*"]), intent(type="text/plain"), None),
    (
        "mime params ignored",
        f(dataMime=["text/plain"]),
        intent(type="text/plain; charset=utf-8"),
        (100, 0, 0, 0),
    ),
    (
        "mime case-insensitive",
        f(dataMime=["Text/Plain"]),
        intent(type="TEXT/plain"),
        (100, 0, 0, 0),
    ),
    ("mime declared, intent has no type: dropped", f(dataMime=["text/plain"]), intent(), None),
    ("mime not declared, type given", f(), intent(type="text/plain"), (0, 0, 0, 0)),
    ("scheme match", f(dataScheme=["https"]), intent(uri="https://x.test/a"), (0, 30, 0, 0)),
    (
        "scheme case-insensitive",
        f(dataScheme=["HTTPS"]),
        intent(uri="HtTpS://x.test/"),
        (0, 30, 0, 0),
    ),
    ("scheme mismatch drops", f(dataScheme=["https"]), intent(uri="ftp://x.test/"), None),
    ("scheme declared, no uri: dropped", f(dataScheme=["https"]), intent(), None),
    ("relative uri has no scheme", f(dataScheme=["https"]), intent(uri="/just/a/path"), None),
    (
        "scheme per RFC 3986 (+.-)",
        f(dataScheme=["git+ssh"]),
        intent(uri="git+ssh://h/r"),
        (0, 30, 0, 0),
    ),
    ("one category", f(category=["a", "b"]), intent(category=("a",)), (0, 0, 5, 0)),
    ("two categories", f(category=["a", "b"]), intent(category=("a", "b")), (0, 0, 10, 0)),
    ("unmatched category scores 0", f(category=["a"]), intent(category=("z",)), (0, 0, 0, 0)),
    ("category as string in filter", f(category="a"), intent(category=("a",)), (0, 0, 5, 0)),
    ("positive priority", f(priority=7), intent(), (0, 0, 0, 7)),
    ("negative priority", f(priority=-3), intent(), (0, 0, 0, -3)),
    (
        "everything",
        f(dataMime=["text/*"], dataScheme=["file"], category=["c"], priority=2),
        intent(type="text/markdown", uri="file:///x.md", category=("c",)),
        (50, 30, 5, 2),
    ),
]


@pytest.mark.parametrize(("name", "flt", "it", "expected"), SCORING, ids=[r[0] for r in SCORING])
def test_scoring_table(
    name: str, flt: IntentFilter, it: Intent, expected: tuple[int, int, int, int] | None
) -> None:
    result = score(flt, it)
    if expected is None:
        assert result is None
    else:
        assert result is not None
        assert (result.mime, result.scheme, result.categories, result.priority) == expected
        assert result.total == sum(expected)


def cand(app_id: str, index: int, flt: IntentFilter) -> Candidate:
    return Candidate(app_id, Scope.SYSTEM, index, flt)


def test_rank_keeps_each_apps_best_filter_and_orders_by_score_then_id() -> None:
    candidates = [
        cand("com.b", 0, f(dataMime=["*/*"])),
        cand("com.b", 1, f(dataMime=["text/plain"])),
        cand("com.a", 0, f(dataMime=["text/*"])),
        cand("com.c", 0, f(dataMime=["text/*"])),
        cand("com.d", 0, f(dataMime=["image/*"])),
    ]
    matches = rank(candidates, intent(type="text/plain"))
    assert [(m.app_id, m.filter_index, m.score.total) for m in matches] == [
        ("com.b", 1, 100),
        ("com.a", 0, 50),
        ("com.c", 0, 50),
    ]


def test_a_dropped_filter_is_removed_not_scored_zero() -> None:
    matches = rank([cand("com.a", 0, f(dataMime=["image/*"]))], intent(type="text/plain"))
    assert matches == []


def test_ties_at_the_top_are_reported() -> None:
    matches = rank(
        [cand("com.b", 0, f()), cand("com.a", 0, f()), cand("com.c", 0, f(priority=-1))], intent()
    )
    assert [m.app_id for m in tied_at_top(matches)] == ["com.a", "com.b"]
    assert tied_at_top([]) == []


def test_match_wire_form() -> None:
    (match,) = rank([cand("com.a", 2, f(dataMime=["text/*"], priority=1))], intent(type="text/x"))
    assert isinstance(match, IntentMatch)
    assert match.wire() == {
        "appId": "com.a",
        "scope": "system",
        "filterIndex": 2,
        "score": 51,
        "breakdown": {"mime": 50, "scheme": 0, "categories": 0, "priority": 1},
    }


def test_the_index_updates_one_app_at_a_time() -> None:
    index = IntentIndex()
    index.set_app("com.a", Scope.GLOBAL, [f(), f(action="other")])
    index.set_app("com.b", Scope.USER, [f(priority=1)])
    assert [m.app_id for m in index.resolve(intent())] == ["com.b", "com.a"]
    index.set_app("com.b", None, [])
    assert [m.app_id for m in index.resolve(intent())] == ["com.a"]
    index.set_app("com.a", Scope.GLOBAL, [f(action="other")])
    assert index.resolve(intent()) == []
    assert [c.app_id for c in index.candidates("other")] == ["com.a"]
