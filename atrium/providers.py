"""The provider table: (authority, path) → the app and provider entry that serve it.

Pure. Built from the visible apps' manifests (decisions.md "Data proxy"): an entry matches when the
request path equals its `path` or is a sub-path of it (`/notes` matches `/notes` and `/notes/5`,
never `/notesx`); the longest matching entry wins; no match is None (docs/api.md "Data proxy").
Two apps declaring one authority: the lowest app id serves it and the clash is reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from atrium.manifest import DataProvider, ProviderEntry
from atrium.permissions import Verb

READ_METHODS: Final = frozenset({"GET", "HEAD"})


def canonical_path(value: str) -> str:
    """A data path as the table sees it: `/`-rooted, no `.`/`..` segment, `\\` or NUL, no
    trailing `/`; ValueError naming the problem otherwise."""
    if not value.startswith("/"):
        raise ValueError(f"path {value[:80]!r} must start with '/'")
    segments = value.rstrip("/").split("/")[1:]
    if any(s in {".", "..", ""} for s in segments) or "\x00" in value or "\\" in value:
        raise ValueError(
            f"path {value[:80]!r} must be canonical (no '.', '..' or empty segment, '\\' or NUL)"
        )
    return value.rstrip("/") or "/"


def related(watched: str, changed: str) -> bool:
    """Whether a watcher of ``watched`` hears of a change at ``changed``: the same path, one
    below it, or one above it (a change announced for a collection covers its items)."""
    return (
        watched == changed
        or watched == "/"
        or changed == "/"
        or changed.startswith(watched + "/")
        or watched.startswith(changed + "/")
    )


@dataclass(frozen=True, slots=True)
class ProviderMatch:
    """The app and entry serving a request path."""

    app_id: str
    entry: ProviderEntry
    #: the entry's path in lower case: what a request path is matched against
    key: str = ""

    def permission(self, method: str) -> str | None:
        """`readPerm` for GET and HEAD, `writePerm` for every other verb (None: open)."""
        return self.entry.read_perm if method in READ_METHODS else self.entry.write_perm

    @staticmethod
    def verb(method: str) -> Verb:
        return Verb.READ if method in READ_METHODS else Verb.WRITE


@dataclass(frozen=True, slots=True)
class AuthorityClash:
    """A second visible app declaring an authority that another app already serves."""

    authority: str
    app_id: str
    served_by: str


@dataclass(frozen=True, slots=True)
class ProviderTable:
    """authority → (app id, its matches longest entry path first).

    The matches are built once per table, so matching a request allocates nothing (the data
    proxy's hot path)."""

    _by_authority: Mapping[str, tuple[str, tuple[ProviderMatch, ...]]] = field(default_factory=dict)
    clashes: tuple[AuthorityClash, ...] = ()

    @classmethod
    def build(cls, providers: Iterable[tuple[str, DataProvider]]) -> ProviderTable:
        table: dict[str, tuple[str, tuple[ProviderMatch, ...]]] = {}
        clashes: list[AuthorityClash] = []
        for app_id, provider in sorted(providers, key=lambda p: p[0]):
            served = table.get(provider.authority)
            if served is not None:
                clashes.append(AuthorityClash(provider.authority, app_id, served[0]))
                continue
            entries = sorted(provider.providers, key=lambda e: len(e.path), reverse=True)
            matches = tuple(ProviderMatch(app_id, e, e.path.lower()) for e in entries)
            table[provider.authority] = (app_id, matches)
        return cls(table, tuple(clashes))

    def app_for(self, authority: str) -> str | None:
        served = self._by_authority.get(authority)
        return served[0] if served else None

    def match(self, authority: str, path: str) -> ProviderMatch | None:
        """The longest entry equal to or a parent of ``path`` (which starts with `/`), compared
        without case: a provider whose server reads `/Deeper` as `/deeper` (many do) must not
        be reached through the laxer parent entry."""
        served = self._by_authority.get(authority)
        if served is None:
            return None
        path = path.lower()
        for match in served[1]:
            base = match.key
            if path == base or base == "/" or path.startswith(base + "/"):
                return match
        return None

    def authorities(self) -> dict[str, str]:
        return {authority: served[0] for authority, served in self._by_authority.items()}
