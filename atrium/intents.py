"""Intent scoring and ranking (docs/api.md "Scoring"; decisions.md "Data proxy and intents").

Pure: `score` takes one filter and one intent and returns its breakdown, or None when the filter
is dropped; `rank` keeps each app's best filter and orders the matches. The weights are a table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from atrium.manifest import IntentFilter
from atrium.scopes import Scope

#: docs/api.md "Scoring" as data
MIME_EXACT: Final = 100
MIME_MAJOR_WILDCARD: Final = 50
MIME_ANY: Final = 10
SCHEME_MATCH: Final = 30
CATEGORY_MATCH: Final = 5

SCHEME_RE: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


@dataclass(frozen=True, slots=True)
class Intent:
    """What a caller asks for: an action plus optional type, uri, categories and extras."""

    action: str
    type: str | None = None
    uri: str | None = None
    category: tuple[str, ...] = ()
    extras: Mapping[str, Any] = field(default_factory=dict)
    #: the type without parameters, lowercased (`text/plain; charset=utf-8` → `text/plain`)
    mime: str | None = field(init=False, compare=False)
    #: the uri's scheme per RFC 3986, lowercased; None for a relative reference
    scheme: str | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        mime = self.type.split(";", 1)[0].strip().lower() if self.type else None
        found = SCHEME_RE.match(self.uri) if self.uri else None
        object.__setattr__(self, "mime", mime)
        object.__setattr__(self, "scheme", found.group(1).lower() if found else None)


@dataclass(frozen=True, slots=True)
class Score:
    """A filter's score and where it came from."""

    mime: int = 0
    scheme: int = 0
    categories: int = 0
    priority: int = 0

    @property
    def total(self) -> int:
        return self.mime + self.scheme + self.categories + self.priority

    def wire(self) -> dict[str, int]:
        return {
            "mime": self.mime,
            "scheme": self.scheme,
            "categories": self.categories,
            "priority": self.priority,
        }


@dataclass(frozen=True, slots=True)
class FilterRule:
    """An intent filter with its MIME types and schemes normalised once, for scoring."""

    action: str
    mimes: tuple[str, ...] | None
    schemes: frozenset[str] | None
    categories: frozenset[str]
    priority: int

    @classmethod
    def of(cls, f: IntentFilter) -> FilterRule:
        return cls(
            f.action,
            None
            if f.data_mime is None
            else tuple(m.split(";", 1)[0].strip().lower() for m in f.data_mime),
            None if f.data_scheme is None else frozenset(s.lower() for s in f.data_scheme),
            frozenset(f.category),
            f.priority,
        )


def mime_points(declared: Iterable[str], mime: str) -> int:
    """The best of the filter's (normalised) MIME types against the intent's (0: none)."""
    major = mime.split("/", 1)[0]
    best = 0
    for candidate in declared:
        if candidate == mime:
            return MIME_EXACT
        if candidate == "*/*":
            best = max(best, MIME_ANY)
        elif candidate.endswith("/*") and candidate[:-2] == major:
            best = max(best, MIME_MAJOR_WILDCARD)
    return best


def score(f: IntentFilter | FilterRule, intent: Intent) -> Score | None:
    """Score one filter; None means dropped (docs/api.md "Scoring")."""
    rule = f if isinstance(f, FilterRule) else FilterRule.of(f)
    if rule.action != intent.action:
        return None
    mime = 0
    if rule.mimes is not None:
        wanted_mime = intent.mime
        if wanted_mime is None:
            return None
        mime = mime_points(rule.mimes, wanted_mime)
        if mime == 0:
            return None
    scheme = 0
    if rule.schemes is not None:
        wanted = intent.scheme
        if wanted is None or wanted not in rule.schemes:
            return None
        scheme = SCHEME_MATCH
    categories = CATEGORY_MATCH * sum(1 for c in intent.category if c in rule.categories)
    return Score(mime, scheme, categories, rule.priority)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One filter of one visible app."""

    app_id: str
    scope: Scope
    filter_index: int
    filter: IntentFilter
    rule: FilterRule = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rule", FilterRule.of(self.filter))


@dataclass(frozen=True, slots=True)
class IntentMatch:
    """An app's best filter for an intent, with its score breakdown."""

    app_id: str
    scope: Scope
    filter_index: int
    score: Score
    #: what an app must hold to start it (the filter's `permission`); None: anyone
    permission: str | None = None

    def wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "appId": self.app_id,
            "scope": self.scope.value,
            "filterIndex": self.filter_index,
            "score": self.score.total,
            "breakdown": self.score.wire(),
        }
        if self.permission is not None:
            wire["permission"] = self.permission
        return wire


def rank(candidates: Iterable[Candidate], intent: Intent) -> list[IntentMatch]:
    """One match per app (its best filter; the first on a tie), highest score first, ties in app
    id order (a tie at the top opens the chooser: docs/api.md "Intents")."""
    best: dict[str, IntentMatch] = {}
    for c in candidates:
        s = score(c.rule, intent)
        if s is None:
            continue
        current = best.get(c.app_id)
        if current is None or s.total > current.score.total:
            best[c.app_id] = IntentMatch(c.app_id, c.scope, c.filter_index, s, c.filter.permission)
    return sorted(best.values(), key=lambda m: (-m.score.total, m.app_id))


def tied_at_top(matches: list[IntentMatch]) -> list[IntentMatch]:
    """The matches sharing the top score (more than one opens a chooser)."""
    if not matches:
        return []
    top = matches[0].score.total
    return [m for m in matches if m.score.total == top]


class IntentIndex:
    """Filters by action, kept per app so an install or removal updates only that app."""

    def __init__(self) -> None:
        self._by_app: dict[str, list[Candidate]] = {}
        self._by_action: dict[str, list[Candidate]] = {}

    def set_app(self, app_id: str, scope: Scope | None, filters: Iterable[IntentFilter]) -> None:
        """Replace ``app_id``'s filters (scope None or no filters: remove the app)."""
        old = self._by_app.pop(app_id, [])
        for c in old:
            bucket = self._by_action.get(c.filter.action, [])
            self._by_action[c.filter.action] = [x for x in bucket if x.app_id != app_id]
        if scope is None:
            return
        new = [Candidate(app_id, scope, i, f) for i, f in enumerate(filters)]
        if new:
            self._by_app[app_id] = new
        for c in new:
            self._by_action.setdefault(c.filter.action, []).append(c)

    def candidates(self, action: str) -> list[Candidate]:
        return self._by_action.get(action, [])

    def resolve(self, intent: Intent) -> list[IntentMatch]:
        return rank(self.candidates(intent.action), intent)
