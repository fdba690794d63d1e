"""Bus event names and topic-glob matching; their payloads are listed in docs/api.md "Event stream"."""

from __future__ import annotations

import re
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


@lru_cache(maxsize=256)
def compile_glob(glob: str) -> re.Pattern[str]:
    """A topic glob: ``*`` matches within one ``:``-segment, ``**`` across segments."""
    if not GLOB_RE.fullmatch(glob):
        raise ValueError(f"{glob!r} is not a topic glob (letters, digits, '.', '_', '-', ':', '*')")
    parts = re.split(r"(\*\*|\*)", glob)
    body = "".join(".*" if p == "**" else "[^:]*" if p == "*" else re.escape(p) for p in parts)
    return re.compile(f"^{body}\\Z")


def matches_any(topic: str, globs: tuple[str, ...] | None) -> bool:
    """True when ``globs`` is None (every topic) or one glob matches ``topic``."""
    return globs is None or any(compile_glob(g).fullmatch(topic) for g in globs)


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
