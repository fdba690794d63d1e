"""Instance lifecycle states and the only legal moves between them.

Every rule about which state may follow which, and which hook runs before a move, lives here as
data (docs/api.md "States"; decisions.md "Lifecycle"). This module knows nothing of
processes, HTTP or the bus; lifecycle.instance applies the moves and announces them.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final


class InstanceState(StrEnum):
    """The 14 states of an instance; `installed` is the implicit zero state."""

    INSTALLED = "installed"
    CREATING = "creating"
    CREATED = "created"
    STARTING = "starting"
    STARTED = "started"
    RESUMING = "resuming"
    RESUMED = "resumed"
    PAUSING = "pausing"
    PAUSED = "paused"
    STOPPING = "stopping"
    STOPPED = "stopped"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"
    ERROR = "error"


class Hook(StrEnum):
    """App-side lifecycle hooks (docs/api.md "What the shell calls on an app")."""

    ON_CREATE = "onCreate"
    ON_START = "onStart"
    ON_RESUME = "onResume"
    ON_PAUSE = "onPause"
    ON_STOP = "onStop"
    ON_DESTROY = "onDestroy"
    ON_ACTIVITY_CREATE = "onActivityCreate"
    ON_ACTIVITY_DESTROY = "onActivityDestroy"


S = InstanceState

#: the table of docs/api.md "States", `resuming → resumed` included
TRANSITIONS: Final[Mapping[InstanceState, frozenset[InstanceState]]] = {
    S.INSTALLED: frozenset({S.CREATING}),
    S.CREATING: frozenset({S.CREATED, S.ERROR}),
    S.CREATED: frozenset({S.STARTING}),
    S.STARTING: frozenset({S.STARTED}),
    S.STARTED: frozenset({S.RESUMING, S.STOPPING}),
    S.RESUMING: frozenset({S.RESUMED}),
    S.RESUMED: frozenset({S.PAUSING}),
    S.PAUSING: frozenset({S.PAUSED}),
    S.PAUSED: frozenset({S.RESUMING, S.STOPPING}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.STOPPED: frozenset({S.STARTING, S.DESTROYING}),
    S.DESTROYING: frozenset({S.DESTROYED}),
    S.DESTROYED: frozenset({S.INSTALLED}),
    S.ERROR: frozenset({S.CREATING, S.DESTROYING, S.INSTALLED}),
}

#: the hook that runs before a move into the key state is committed (decisions.md "Lifecycle");
#: `paused` is reached only from `pausing`, `created` only from `creating`
HOOK_BEFORE: Final[Mapping[InstanceState, Hook]] = {
    S.CREATED: Hook.ON_CREATE,
    S.STARTING: Hook.ON_START,
    S.RESUMING: Hook.ON_RESUME,
    S.PAUSED: Hook.ON_PAUSE,
    S.STOPPING: Hook.ON_STOP,
    S.DESTROYING: Hook.ON_DESTROY,
}

#: states in which the child runs and its server can answer
RUNNING: Final = frozenset(
    {
        S.CREATED,
        S.STARTING,
        S.STARTED,
        S.RESUMING,
        S.RESUMED,
        S.PAUSING,
        S.PAUSED,
        S.STOPPING,
        S.STOPPED,
        S.DESTROYING,
    }
)
#: states from which a page may be served to a view (the app's server is up and started)
SERVING: Final = frozenset({S.STARTED, S.RESUMING, S.RESUMED, S.PAUSING, S.PAUSED})


def is_allowed(current: InstanceState, target: InstanceState) -> bool:
    return target in TRANSITIONS[current]


def hook_before(current: InstanceState, target: InstanceState) -> Hook | None:
    """The hook to call before ``current → target`` (None: a marker move without a hook)."""
    return HOOK_BEFORE.get(target) if is_allowed(current, target) else None
