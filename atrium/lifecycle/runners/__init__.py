"""Runners start one app instance's server as a child and stop it; chosen by name.

The contract (every runner, every future back-end: container, Kubernetes):

- ``spawn(spec)`` returns a RunningApp as soon as the child is started — not yet healthy; the
  lifecycle manager polls ``/health`` itself. It raises SpawnFailed (cause ``mount`` or ``exited``)
  only for failures it can see at once (a missing bind source, an interpreter that cannot start).
  It must be called from the event-loop thread (bubblewrap's ``--die-with-parent`` follows the
  spawning *thread*).
- ``RunningApp.host`` / ``.port``: where the shell reaches the app's server. Never assume loopback.
- ``RunningApp.wait()`` completes with the exit code when the child is gone (crash detection);
  it may be awaited by several tasks.
- ``RunningApp.stop(grace)``: SIGTERM to the whole process group, SIGKILL after ``grace`` seconds;
  returns only when every process of the group is gone. Idempotent.
- ``spec.cgroup``: the child enters it before it executes anything (so the app's whole process
  tree is limited), and the handle removes it once the child has exited; ``exit_reason`` then
  says ``oom`` when the kernel killed a process of it for want of memory.
- ``RunningApp.pid``: the child's pid as the shell's host sees it (for `atrium ps`).
- The child's stdout and stderr go to ``spec.log_path`` (appended).
- ``spec.user``: when set (the shell runs as root), the app's processes run under that uid/gid
  with no supplementary groups, never as root; its data directory is made theirs (owner, 0700).
- One instance never runs twice: the runner takes an exclusive ``flock`` on ``spec.lock_dir``
  (the data directory itself unless a headless provider shares its app's data folder), held by
  the child's side for its whole life, and a spawn on a locked directory raises SpawnFailed
  (cause ``locked``).
- Nothing the child starts outlives the shell, even one killed with SIGKILL.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from atrium.lifecycle.limits import InstanceCgroup, Limits

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AppUser:
    """The unprivileged identity an app runs as when the shell is root (decisions.md)."""

    uid: int
    gid: int


@dataclass(frozen=True, slots=True)
class SpawnSpec:
    """Everything a runner needs to start one instance."""

    app_id: str
    instance_id: str
    app_dir: Path
    #: the command, argv[0] already resolved to an absolute executable where possible
    argv: Sequence[str]
    #: the environment of decisions.md "Manifest" (OS_*, PORT); OS_DATA_DIR is set by the runner
    env: Mapping[str, str]
    #: the instance's runtime data directory (bind-mounted at /data inside a sandbox)
    data_dir: Path
    host: str
    port: int
    log_path: Path
    #: tools the manifest declares ('*' = all), resolved against the toolchain directory
    tools: Sequence[str] = ()
    toolchain_dir: Path | None = None
    #: extra directories the interpreter needs, bound read-only inside a sandbox
    ro_paths: Sequence[Path] = field(default_factory=tuple)
    #: run as this uid/gid (the shell is root); None: as the shell's own user
    user: AppUser | None = None
    #: the folder whose ``flock`` proves this instance runs once (None: ``data_dir``); a headless
    #: provider shares its app's data folder but locks a folder of its own
    lock_dir: Path | None = None
    #: the shell's home: with ``user``, the process runner opens the folders between it and the
    #: app's folders for search (0711) so that uid reaches them
    home: Path | None = None
    #: the limits the instance runs under (None: not enforced), and the cgroup holding them,
    #: which the child joins before it executes anything (`atrium.lifecycle.limits`)
    limits: Limits | None = None
    cgroup: InstanceCgroup | None = None


class RunningApp(Protocol):
    """A started child (see the module docstring for the contract)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def exit_reason(self) -> str | None:
        """Once exited: ``oom`` when the kernel killed a process of it for want of memory (its
        cgroup counted an OOM kill), else ``exited``."""
        ...

    async def wait(self) -> int: ...

    async def stop(self, grace: float = 3.0) -> int: ...


class Runner(Protocol):
    """Starts app servers (see the module docstring for the contract)."""

    name: str

    async def spawn(self, spec: SpawnSpec) -> RunningApp: ...

    def early_exit_cause(self, log_path: Path, returncode: int) -> str:
        """The SpawnFailed cause of a child that ended before answering `/health`: ``mount``
        when the runner itself could not build its sandbox (its words end the log), else
        ``exited``."""
        ...


def load_runner(name: str) -> Runner:
    """``process``, ``bwrap``, or ``auto``: bwrap when it works on this machine, else process."""
    from atrium.lifecycle.runners.bwrap import BwrapRunner, bwrap_works
    from atrium.lifecycle.runners.process import ProcessRunner

    if name == "process":
        return ProcessRunner()
    if name == "bwrap":
        return BwrapRunner()
    if name != "auto":
        raise ValueError(f"unknown runner {name!r}: auto, process or bwrap")
    problem = bwrap_works()
    if problem is None:
        _LOGGER.info("runner: bwrap (bubblewrap sandbox)")
        return BwrapRunner()
    _LOGGER.warning("runner: process (no sandbox): bubblewrap does not work here: %s", problem)
    return ProcessRunner()


__all__ = ["AppUser", "Runner", "RunningApp", "SpawnSpec", "load_runner"]
