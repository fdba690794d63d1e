"""One app instance and the one door through which every state change passes.

`Instance.enter` checks the table, records, logs once and publishes `app:state` once; nothing else
assigns the state. The two sanctioned bypasses have their own names: `mark_crashed` (docs/api.md "States")
and `force_installed` (`DELETE /api/instances/{id}?force=1`, decisions.md "Lifecycle").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from atrium.bus import EventBus
from atrium.errors import LifecycleTransitionError
from atrium.events import AppCrashed, AppLifecycleError, AppState
from atrium.lifecycle.calls import AppAddress
from atrium.lifecycle.limits import Limits
from atrium.lifecycle.runners import RunningApp
from atrium.lifecycle.states import InstanceState, is_allowed
from atrium.manifest import Manifest
from atrium.registry import AppCopy
from atrium.scopes import Scope
from atrium.state.locks import InstanceLock

_LOGGER = logging.getLogger(__name__)
S = InstanceState


@dataclass(slots=True)
class Activity:
    """An activity created by `onActivityCreate` (never changes the instance's state)."""

    id: str
    path: str
    title: str


@dataclass(slots=True)
class View:
    """A view of the instance in a host page's iframe, entered through a one-time ticket."""

    id: str
    cookie: str
    path: str
    #: the host-page client that holds the view (its views go when it has been gone 30 s)
    client: str | None = None
    #: the user who opened it: the one looking, named to the app on every page request
    user: str | None = None
    #: the sha256 of the cookie, for a view taken over from another shell (``cookie`` is then
    #: empty until a request carries the cookie)
    digest: str | None = None


@dataclass(eq=False, slots=True)
class Instance:
    """An instance's record. Its state changes only through `enter` and the two named bypasses."""

    id: str
    app_id: str
    scope: Scope
    app_dir: Path
    data_dir: Path
    manifest: Manifest
    slug: str
    bus: EventBus
    #: the user the instance belongs to (its runtime data, its views and its app token are theirs)
    owner: str
    #: set when ``data_dir`` is another instance's (a headless provider's): what it locks instead
    lock_dir: Path | None = None
    #: the instance whose data that is (``data_dir``'s, when it is another's)
    data_of: str | None = None
    #: the app copy it runs from when that is not the registry's (a staged version on trial)
    source: AppCopy | None = None
    _state: InstanceState = S.INSTALLED
    secret: str = ""
    token: str | None = None
    child: RunningApp | None = None
    port: int | None = None
    host: str | None = None
    log_path: Path | None = None
    #: the resource limits its child runs under (None: none enforced on this machine)
    limits: Limits | None = None
    views: dict[str, View] = field(default_factory=dict)
    activities: dict[str, Activity] = field(default_factory=dict)
    started_at: datetime | None = None
    error: str | None = None
    #: held around every move: in-process, and on PostgreSQL an advisory lock every shell
    #: honours (`atrium.state.locks`); the index gives each instance its shell's
    lock: InstanceLock = field(default_factory=InstanceLock)
    watcher: asyncio.Task[None] | None = None
    #: told of every state change after its event (the index's: its row in a shared database)
    on_change: Callable[[Instance], None] | None = field(default=None, repr=False)
    _address: AppAddress | None = field(default=None, repr=False)

    @property
    def state(self) -> InstanceState:
        return self._state

    @property
    def address(self) -> AppAddress:
        """Built once per server (the data proxy asks for it on every request)."""
        cached = self._address
        child = self.child
        # the runner's handle is asked each time: a server's address may change (a pod's)
        host, port, pid = (
            (child.host, child.port, child.pid)
            if child is not None
            else (self.host, self.port, None)
        )
        if (
            cached is not None
            and cached.port == port
            and cached.host == host
            and cached.secret == self.secret
            and cached.pid == pid
        ):
            return cached
        if host is None or port is None:
            raise RuntimeError(f"instance {self.id} has no running server")
        cached = self._address = AppAddress(self.app_id, self.id, host, port, self.secret, pid)
        return cached

    def enter(self, target: InstanceState) -> None:
        """Move to ``target`` if the table allows it; else LifecycleTransitionError (and the
        `app:lifecycle.error` event). DatabaseLost when this shell lost the instance's lock (or
        its link to the shared database): another shell may be acting on it."""
        self.lock.check()
        current = self._state
        if not is_allowed(current, target):
            err = LifecycleTransitionError(self.id, current, target, app_id=self.app_id)
            self.report_error(current, target, err.message)
            raise err
        self._set(target)

    def report_error(self, current: InstanceState, target: InstanceState, message: str) -> None:
        """Announce a failed move: `app:lifecycle.error {instanceId, appId, from, to, message}`."""
        _LOGGER.warning("%s %s: %s → %s failed: %s", self.app_id, self.id, current, target, message)
        self.bus.emit(
            AppLifecycleError(
                self.id, self.app_id, current.value, target.value, message, owner=self.owner
            )
        )

    def mark_crashed(self, exit_code: int, reason: str = "exited") -> None:
        """A running child died: go to `error` without the table check (docs/api.md "States").
        ``reason``: ``oom`` when the kernel killed it for want of memory, else ``exited``."""
        previous = self._state
        self.error = f"crashed with exit status {exit_code} in state {previous}"
        if reason == "oom":
            memory = self.limits.memory_mib if self.limits is not None else None
            self.error += f": out of memory (its limit is {memory} MiB)"
        self._set(S.ERROR)
        self.bus.emit(
            AppCrashed(self.id, self.app_id, exit_code, previous.value, reason, owner=self.owner)
        )

    def force_installed(self) -> None:
        """Kill without hooks: any state → `installed` (decisions.md "Lifecycle")."""
        self._set(S.INSTALLED)

    def _set(self, target: InstanceState) -> None:
        previous, self._state = self._state, target
        _LOGGER.info("%s %s: %s → %s", self.app_id, self.id, previous, target)
        self.bus.emit(
            AppState(self.id, self.app_id, previous.value, target.value, owner=self.owner)
        )
        if self.on_change is not None:
            self.on_change(self)

    def wire(
        self, *, for_app: bool = False, pooled: bool = False, wake: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The instance as docs/api.md reports it; apps never see another's port or pid.
        ``wake``: how a headless provider instance woke and how much it served."""
        theme = self.manifest.theme_strategy.value
        return {
            "instanceId": self.id,
            "appId": self.app_id,
            "owner": self.owner,
            "name": self.manifest.name,
            "scope": self.scope.value,
            "state": self._state.value,
            "port": None if for_app else self.port,
            "pid": None if for_app or self.child is None else self.child.pid,
            "views": len(self.views),
            "activities": sorted(self.activities),
            "startedAt": self.started_at.isoformat().replace("+00:00", "Z")
            if self.started_at
            else None,
            "error": self.error,
            "themeStrategy": theme,
            "backgroundService": self.manifest.background_service,
            "pooled": pooled,
            "headless": wake is not None,
            "wake": wake,
            "limits": None if self.limits is None else self.limits.wire(),
            "network": self.network,
        }

    @property
    def network(self) -> str | None:
        """The network its server runs in (docs/api.md "Network"): ``own`` (a namespace on the
        shell's bridge, reaching only the shell), ``loopback`` (an image's loopback-only
        namespace behind the shell's forwarder, reaching nothing), ``slirp4netns`` (an image's
        namespace under a shell that is not root, its port forwarded by slirp4netns, reaching
        nothing), ``host`` (the host's network), ``cluster`` (a pod); None with no server."""
        child = self.child
        if child is None:
            return None
        if getattr(child, "lease", None) is not None:
            return "own"
        if getattr(child, "slirp", None) is not None:
            return "slirp4netns"
        if getattr(child, "forwarder", None) is not None:
            return "loopback"
        return "host" if child.pid is not None else "cluster"

    def stamp_started(self) -> None:
        self.started_at = datetime.now(UTC)
