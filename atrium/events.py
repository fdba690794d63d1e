"""Bus topics, their typed payloads, and topic-glob matching (docs/api.md "Topics and payloads").

Every event the shell publishes is one of the payload classes below, built where it happens and
turned into wire JSON in one place (`wire`: field names in camelCase, ``from_`` as ``from``).
Readers on the bus get the same object back (`atrium.bus.Event.data`) and match on its class, so
mypy checks both ends; a test holds the table in docs/api.md to these classes.

Every payload has an ``owner``: the user the event belongs to, or None for the platform's own. It is
a keyword (``KvChanged(namespace, key, owner=user)``) and not part of the wire payload: the event
stream uses it to decide who hears the event (`atrium.api.events.change_filter`), the same rule
for live events and replay.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar, Final

APP_INSTALLED: Final = "app:installed"
APP_REMOVED: Final = "app:removed"
APP_STATE: Final = "app:state"
APP_LIFECYCLE_ERROR: Final = "app:lifecycle.error"
APP_CRASHED: Final = "app:crashed"
ACTIVITY_OPENED: Final = "activity:opened"
KV_CHANGED: Final = "kv:changed"
DATA_CHANGED: Final = "data:changed"
THEME_CHANGED: Final = "theme:changed"
DIST_INSTALL_COMPLETE: Final = "dist:install.complete"
DIST_UPDATE_COMPLETE: Final = "dist:update.complete"
DIST_ROLLBACK_COMPLETE: Final = "dist:rollback.complete"
DIST_UNINSTALL_COMPLETE: Final = "dist:uninstall.complete"
DIST_PUBLISH_COMPLETE: Final = "dist:publish.complete"
DIST_PUBLISH_PROGRESS: Final = "dist:publish.progress"
DIST_PUBLISH_DONE: Final = "dist:publish.done"
GRANT_ADDED: Final = "grant:added"
GRANT_REVOKED: Final = "grant:revoked"
APP_EGRESS: Final = "app:egress"
DEV_RELOADING: Final = "dev:reloading"
DEV_RELOADED: Final = "dev:reloaded"
DEV_FAILED: Final = "dev:failed"
SYSTEM_USAGE: Final = "system:usage"
BACKUP_FAILED: Final = "backup:failed"
USER_CHANGED: Final = "user:changed"
SCOPE_CHANGED: Final = "scope:changed"
INSTANCE_ROUTED: Final = "instance:routed"
INSTANCE_TOKEN: Final = "instance:token"  # noqa: S105 - a topic


def _camel(name: str) -> str:
    head, *rest = name.rstrip("_").split("_")
    return head + "".join(part.title() for part in rest)


@dataclass(frozen=True, slots=True)
class Payload:
    """What one event says; ``TOPIC`` is its topic."""

    TOPIC: ClassVar[str]
    #: whether the bus keeps it for replay (`Last-Event-ID`); a figure that is stale seconds
    #: later is not, so it cannot push what happened out of the history
    REPLAYED: ClassVar[bool] = True
    #: the user this event belongs to (their instance, their KV row, their theme); None: the
    #: platform's, heard by every stream its other rules admit
    owner: str | None = field(default=None, kw_only=True)

    def wire(self) -> dict[str, Any]:
        """The wire JSON of the payload (without ``type``, which the bus adds, and without the
        ``owner``, which decides who hears it)."""
        return {
            _camel(f.name): getattr(self, f.name) for f in dataclasses.fields(self) if not f.kw_only
        }


@dataclass(frozen=True, slots=True)
class AppInstalled(Payload):
    """An id becomes visible, or its visible scope or manifest changes."""

    TOPIC: ClassVar[str] = APP_INSTALLED
    app_id: str
    scope: str


@dataclass(frozen=True, slots=True)
class AppRemoved(Payload):
    """No copy of an id is visible any more, or an uninstall uncovered a lower copy."""

    TOPIC: ClassVar[str] = APP_REMOVED
    app_id: str
    scope: str


@dataclass(frozen=True, slots=True)
class AppState(Payload):
    """Every state change of an instance, bypasses included."""

    TOPIC: ClassVar[str] = APP_STATE
    instance_id: str
    app_id: str
    from_: str
    to: str


@dataclass(frozen=True, slots=True)
class AppLifecycleError(Payload):
    """An illegal move was asked for, or a hook failed."""

    TOPIC: ClassVar[str] = APP_LIFECYCLE_ERROR
    instance_id: str
    app_id: str
    from_: str
    to: str
    message: str


@dataclass(frozen=True, slots=True)
class AppCrashed(Payload):
    """A child exited on its own; ``state`` is the state it was in; ``reason`` is ``oom`` when the
    kernel killed it for want of memory, else ``exited``."""

    TOPIC: ClassVar[str] = APP_CRASHED
    instance_id: str
    app_id: str
    exit_code: int
    state: str
    reason: str = "exited"


@dataclass(frozen=True, slots=True)
class ActivityOpened(Payload):
    """Every activity created."""

    TOPIC: ClassVar[str] = ACTIVITY_OPENED
    instance_id: str
    app_id: str
    activity_id: str
    path: str
    title: str


@dataclass(frozen=True, slots=True)
class DataChanged(Payload):
    """A provider announced that data under its authority changed (`POST /api/data-changes`)."""

    TOPIC: ClassVar[str] = DATA_CHANGED
    authority: str
    path: str


@dataclass(frozen=True, slots=True)
class KvChanged(Payload):
    """A key-value write or delete."""

    TOPIC: ClassVar[str] = KV_CHANGED
    namespace: str
    key: str


@dataclass(frozen=True, slots=True)
class ThemeChanged(Payload):
    """The active theme selection changed (``resolved_mode`` None in ``auto``)."""

    TOPIC: ClassVar[str] = THEME_CHANGED
    theme_id: str
    theme_name: str
    theme_id_light: str
    theme_id_dark: str
    color_mode: str
    resolved_mode: str | None


@dataclass(frozen=True, slots=True)
class DistInstallComplete(Payload):
    """An install finished."""

    TOPIC: ClassVar[str] = DIST_INSTALL_COMPLETE
    id: str
    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class DistRollbackComplete(Payload):
    """A rollback finished (`POST /api/dist/rollback/{appId}`)."""

    TOPIC: ClassVar[str] = DIST_ROLLBACK_COMPLETE
    id: str
    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class DistUpdateComplete(Payload):
    """An update finished; ``record`` None when the source had not changed."""

    TOPIC: ClassVar[str] = DIST_UPDATE_COMPLETE
    id: str
    record: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class DistUninstallComplete(Payload):
    """An uninstall finished; ``unmasked`` is the scope now visible, if any."""

    TOPIC: ClassVar[str] = DIST_UNINSTALL_COMPLETE
    id: str
    scope: str
    unmasked: str | None


@dataclass(frozen=True, slots=True)
class DistPublishProgress(Payload):
    """A publishing step."""

    TOPIC: ClassVar[str] = DIST_PUBLISH_PROGRESS
    message: str
    ref: str


@dataclass(frozen=True, slots=True)
class DistPublishDone(Payload):
    """Publishing finished."""

    TOPIC: ClassVar[str] = DIST_PUBLISH_DONE
    id: str
    version: str
    ref: str
    install_command: str
    digest: str | None
    #: the install command that follows updates (a branch, a moving tag), when there is one
    follow_command: str | None = None


@dataclass(frozen=True, slots=True)
class DistPublishComplete(Payload):
    """Publishing finished (after `DistPublishDone`)."""

    TOPIC: ClassVar[str] = DIST_PUBLISH_COMPLETE
    id: str
    ref: str


@dataclass(frozen=True, slots=True)
class GrantAdded(Payload):
    """An instance was shared with ``user`` (or their role on it changed); heard by that user
    and the instance's owner only."""

    TOPIC: ClassVar[str] = GRANT_ADDED
    grant_id: str
    instance_id: str
    app_id: str
    user: str
    role: str

    def wire(self) -> dict[str, Any]:
        # the instance's owner is part of this payload (the grantee learns whose instance it is)
        return {
            "grantId": self.grant_id,
            "instanceId": self.instance_id,
            "appId": self.app_id,
            "owner": self.owner,
            "user": self.user,
            "role": self.role,
        }


@dataclass(frozen=True, slots=True)
class AppEgress(Payload):
    """An app's network egress was revoked or granted again by whoever manages it; ``holder``
    is "" for a shared copy, the user's id for their own scope's (docs/api.md "Network")."""

    TOPIC: ClassVar[str] = APP_EGRESS
    app_id: str
    holder: str
    granted: bool | list[str]
    by: str


@dataclass(frozen=True, slots=True)
class GrantRevoked(Payload):
    """A grant to ``user`` was revoked; ``view_ids`` are the views of theirs it closed. Heard by
    that user and the instance's owner only."""

    TOPIC: ClassVar[str] = GRANT_REVOKED
    grant_id: str
    instance_id: str
    app_id: str
    user: str
    view_ids: list[str]

    def wire(self) -> dict[str, Any]:
        return {
            "grantId": self.grant_id,
            "instanceId": self.instance_id,
            "appId": self.app_id,
            "owner": self.owner,
            "user": self.user,
            "viewIds": self.view_ids,
        }


@dataclass(frozen=True, slots=True)
class DevReloading(Payload):
    """A dev copy's new files are going in: its instances stop and start again on them. A
    page keeps their views (their tabs) open until `DevReloaded` or `DevFailed`."""

    TOPIC: ClassVar[str] = DEV_RELOADING
    app_id: str


@dataclass(frozen=True, slots=True)
class DevReloaded(Payload):
    """A dev copy's new version runs: ``instance_ids`` are its instances started again (same
    ids), whose views a page opens anew in place."""

    TOPIC: ClassVar[str] = DEV_RELOADED
    app_id: str
    version: str
    instance_ids: list[str]


@dataclass(frozen=True, slots=True)
class DevFailed(Payload):
    """A dev copy's save did not make a running version: its folder has problems (reported by
    `atrium dev`, the last good version keeps running) or the new version did not start."""

    TOPIC: ClassVar[str] = DEV_FAILED
    app_id: str
    message: str


@dataclass(frozen=True, slots=True)
class BackupFailed(Payload):
    """A snapshot of an app's runtime data could not be written (``reason``: `manual`, or the
    operation that takes one first, such as `update`); nothing was changed."""

    TOPIC: ClassVar[str] = BACKUP_FAILED
    app_id: str
    scope: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class SystemUsage(Payload):
    """The machine's figures and one user's running instances' (`GET /api/system/usage`'s
    answer), every few seconds while that user has a stream open; owned by that user, never
    heard by an app, never replayed."""

    TOPIC: ClassVar[str] = SYSTEM_USAGE
    REPLAYED: ClassVar[bool] = False
    machine: Mapping[str, Any]
    instances: Sequence[Mapping[str, Any]]
    at: str


@dataclass(frozen=True, slots=True)
class UserChanged(Payload):
    """A user's account, sign-ins, tokens or linked identities changed (made, ended, disabled,
    removed): written in the change's transaction, so every shell on the same database drops
    what it remembers of that user and reads it again. Owned by that user: heard by their
    streams only (and their apps'), and it says no more than the id and ``ended``."""

    TOPIC: ClassVar[str] = USER_CHANGED
    user_id: str
    #: the change removed or disabled the account: every shell ends its instances of that id,
    #: whatever it reads of the user later (the id may be a new account's by then)
    ended: bool = False


@dataclass(frozen=True, slots=True)
class ScopeChanged(Payload):
    """A scope's repository was written (an install, update, rollback, uninstall, its trust
    store or remote, a recovery) by the shell that held its writer lock, with a PostgreSQL
    database: every other shell sharing the scope folder reads the scope again. A user scope's
    is owned by that user; the global scope's by nobody."""

    TOPIC: ClassVar[str] = SCOPE_CHANGED
    scope: str


@dataclass(frozen=True, slots=True)
class InstanceRouted(Payload):
    """With a PostgreSQL database only: an instance's row (where it runs, its state) or a view
    another shell made of it was written or deleted, in the transaction of that write: every shell forgets what it
    remembered of the slug's app origin and reads the row again at its next request. No
    stream hears it (the shells' own)."""

    TOPIC: ClassVar[str] = INSTANCE_ROUTED
    instance_id: str
    app_id: str
    slug: str
    #: a view another shell made (or, ``view_gone``, released) of the instance: its own shell
    #: learns it (or drops it) in memory, where its views drive stop-when-unviewed
    view_id: str | None = None
    view_gone: bool = False
    #: an action asked of the instance's shell (`atrium.lifecycle.asked`); ``answered``: that
    #: shell's answer is in the request's row
    request_id: str | None = None
    answered: bool = False


@dataclass(frozen=True, slots=True)
class InstanceToken(Payload):
    """With a PostgreSQL database only: an instance's app token was written (a pod adopted or
    taken over) or deleted (its server ended: destroyed, crashed), in the transaction of that write:
    every shell forgets what it remembered of that instance's token. No stream hears it (the
    shells' own)."""

    TOPIC: ClassVar[str] = INSTANCE_TOKEN
    instance_id: str
    app_id: str
    gone: bool = False


#: every topic the shell publishes, with its payload class (docs/api.md "Topics and payloads")
PAYLOADS: Final[Mapping[str, type[Payload]]] = {
    cls.TOPIC: cls
    for cls in (
        AppInstalled,
        AppRemoved,
        AppState,
        AppLifecycleError,
        AppCrashed,
        ActivityOpened,
        KvChanged,
        DataChanged,
        ThemeChanged,
        DistInstallComplete,
        DistUpdateComplete,
        DistRollbackComplete,
        DistUninstallComplete,
        DistPublishProgress,
        DistPublishDone,
        DistPublishComplete,
        GrantAdded,
        AppEgress,
        GrantRevoked,
        DevReloading,
        DevReloaded,
        DevFailed,
        SystemUsage,
        BackupFailed,
        UserChanged,
        ScopeChanged,
        InstanceRouted,
        InstanceToken,
    )
}

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
ROLLBACK_START: Final = "rollback.start"
CHECK_START: Final = "check.start"
CHECK_DONE: Final = "check.done"
IMPORT_CHECKED: Final = "import.checked"
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
