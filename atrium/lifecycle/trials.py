"""Trials: the staged version of an update booted on its own before the switch (docs/api.md
"Health-gated update").

A trial instance is `<appId>-check` (on several shells, numbered past the other shells' rows:
`<appId>-check2`, … while another shell tries the app too), on an empty data folder of the
staging area, walked to `started` (health identity, `onCreate`, `onStart`) and then removed,
whatever happened. While it runs it is not the app's live instance: `create` never hands it
out. It reaches the manager through the narrow `TrialHost`.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from atrium.errors import (
    HookFailed,
    InstallFailed,
    LifecycleTransitionError,
    SpawnFailed,
)
from atrium.lifecycle.instance import Instance
from atrium.lifecycle.spawning import log_tail
from atrium.registry import AppCopy

_LOGGER = logging.getLogger(__name__)


class TrialHost(Protocol):
    """What a trial needs of the lifecycle manager."""

    def find(self, instance_id: str) -> Instance | None: ...

    def holds(self, instance: Instance) -> bool: ...

    def adopt(self, instance: Instance) -> None:
        """Put a built instance into the index."""

    async def boot(self, instance: Instance) -> None:
        """`installed → … → started`, under the instance's lock."""

    async def force(self, instance: Instance) -> None: ...

    async def remove(self, instance_id: str) -> str | None: ...


class Trials:
    """Which instances are on trial (a set of ids, not a flag on the instance), and the run."""

    def __init__(self, host: TrialHost) -> None:
        self._host = host
        self._running: set[str] = set()

    def holds(self, instance: Instance) -> bool:
        return instance.id in self._running

    def forget(self, instance: Instance) -> None:
        self._running.discard(instance.id)

    def enter(self, instance: Instance) -> Instance:
        """``instance`` (built by the manager, numbered past every shell's ids) into the index,
        on trial from now: never handed out by a launch while its row is claimed."""
        self._host.adopt(instance)
        self._running.add(instance.id)
        return instance

    async def run(self, copy: AppCopy, instance: Instance) -> float:
        """Boot ``instance`` (built by the manager for ``copy``, on its own data folder, and
        `enter`ed) to `started`, then remove it; returns how long the boot took (s).
        InstallFailed with the reason and the app's last log lines when it does not start."""
        started = time.monotonic()
        try:
            await self._host.boot(instance)
            return time.monotonic() - started
        except (SpawnFailed, HookFailed, LifecycleTransitionError) as err:
            raise InstallFailed(
                copy.id,
                f"version {instance.manifest.version} did not start, the old version stays: "
                f"{err.message} ({log_tail(instance.log_path, 10)})",
            ) from err
        finally:
            self._running.discard(instance.id)
            if self._host.holds(instance):
                reason = await self._host.remove(instance.id)
                if reason is not None:
                    _LOGGER.info("%s: the trial instance was forced out: %s", copy.id, reason)
