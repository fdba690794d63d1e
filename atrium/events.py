"""Bus event names and topic-glob matching; their payloads are listed in docs/api.md "Event stream"."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

APP_INSTALLED: Final = "app:installed"
APP_REMOVED: Final = "app:removed"
APP_STATE: Final = "app:state"
APP_LIFECYCLE_ERROR: Final = "app:lifecycle.error"
APP_CRASHED: Final = "app:crashed"
ACTIVITY_OPENED: Final = "activity:opened"
KV_CHANGED: Final = "kv:changed"
THEME_CHANGED: Final = "theme:changed"
DIST_INSTALL_COMPLETE: Final = "dist:install.complete"
DIST_UPDATE_COMPLETE: Final = "dist:update.complete"
DIST_UNINSTALL_COMPLETE: Final = "dist:uninstall.complete"
DIST_PUBLISH_COMPLETE: Final = "dist:publish.complete"
DIST_PUBLISH_PROGRESS: Final = "dist:publish.progress"
DIST_PUBLISH_DONE: Final = "dist:publish.done"

TOPIC_RE: Final = re.compile(r"^[a-z][a-z0-9_.-]*(:[a-z][a-z0-9_.-]*)*\Z")
GLOB_RE: Final = re.compile(r"^[a-z0-9_.*:-]+\Z")
#: bounds of one subscription's filter (`GET /api/events?topics=…`): a glob's length and their number
MAX_GLOB_LENGTH: Final = 128
MAX_GLOBS: Final = 32
#: one glob position: a run of stars or one other character
_TOKENS: Final = re.compile(r"\*+|[^*]")


@dataclass(frozen=True, slots=True)
class TopicGlob:
    """A compiled topic glob, matched by simulating all its positions at once (no backtracking).

    Each glob position is one bit: ``literal[c]`` has the bits of the positions holding character
    ``c``, ``segment`` those of ``*`` (any run of characters but ``:``), ``deep`` those of ``**``
    (any run at all). Reading one topic character moves every live position at once with a few
    integer operations, so a match costs time linear in the topic's length whatever the glob is
    (a glob has at most `MAX_GLOB_LENGTH` positions). A regex built from the glob backtracked:
    ``**…**z`` took hours against a short topic, on the event loop (issue 13, row 4).
    """

    glob: str
    literal: Mapping[str, int]
    segment: int
    deep: int
    accept: int

    def _closure(self, state: int) -> int:
        # a wildcard may match nothing: a live wildcard also makes the next position live (runs of
        # `*` are collapsed, so no two wildcards are adjacent and one step suffices)
        return state | ((state & (self.segment | self.deep)) << 1)

    def match(self, topic: str) -> bool:
        """True when the glob matches the whole of ``topic``."""
        stay_colon = self.deep
        stay_other = self.deep | self.segment
        literal = self.literal
        state = self._closure(1)
        for char in topic:
            stay = state & (stay_colon if char == ":" else stay_other)
            state = self._closure(stay | ((state & literal.get(char, 0)) << 1))
            if not state:
                return False
        return bool(state & self.accept)


@lru_cache(maxsize=256)
def compile_glob(glob: str) -> TopicGlob:
    """A topic glob: ``*`` matches within one ``:``-segment, ``**`` (or more stars) across segments.

    Raises ValueError for a glob with other characters or longer than `MAX_GLOB_LENGTH`.
    """
    if len(glob) > MAX_GLOB_LENGTH:
        raise ValueError(
            f"topic glob {glob[:40]!r}… is {len(glob)} characters long; the limit is "
            f"{MAX_GLOB_LENGTH}"
        )
    if not GLOB_RE.fullmatch(glob):
        raise ValueError(f"{glob!r} is not a topic glob (letters, digits, '.', '_', '-', ':', '*')")
    literal: dict[str, int] = {}
    segment = deep = 0
    position = 0
    for piece in _TOKENS.findall(glob):
        bit = 1 << position
        if piece == "*":
            segment |= bit
        elif piece.startswith("*"):
            deep |= bit
        else:
            literal[piece] = literal.get(piece, 0) | bit
        position += 1
    return TopicGlob(glob, literal, segment, deep, 1 << position)


def matches_any(topic: str, globs: tuple[str, ...] | None) -> bool:
    """True when ``globs`` is None (every topic) or one glob matches ``topic``."""
    return globs is None or any(compile_glob(g).match(topic) for g in globs)


# progress events streamed by the install, update, preview and publish endpoints, with `result` and
# `error` (docs/api.md "Progress events" and "Publishing")
RESOLVE_START: Final = "resolve.start"
RESOLVE_DONE: Final = "resolve.done"
FETCH_START: Final = "fetch.start"
FETCH_PROGRESS: Final = "fetch.progress"
FETCH_DONE: Final = "fetch.done"
VALIDATE_DONE: Final = "validate.done"
PERMISSION_NEEDED: Final = "permission.needed"
PERMISSION_APPROVED: Final = "permission.approved"
PERMISSION_DENIED: Final = "permission.denied"
INSTALL_START: Final = "install.start"
INSTALL_DONE: Final = "install.done"
PUBLISH_PROGRESS: Final = "publish.progress"
PUBLISH_DONE: Final = "publish.done"
RESULT: Final = "result"
ERROR: Final = "error"
