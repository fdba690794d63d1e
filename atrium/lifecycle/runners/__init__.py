"""Runners start one app instance's server and stop it; chosen by name.

The contract (protocol v2: every runner, local or on a cluster; docs/architecture.md "Runners"):

- ``spawn(spec)`` returns a RunningApp as soon as the server is started — not yet healthy; the
  lifecycle manager polls ``/health`` itself. It raises SpawnFailed (cause ``mount``,
  ``exited``, ``image``, ``schedule``, ``api``) only for failures it can see at once. A local
  runner must be called from the event-loop thread (bubblewrap's ``--die-with-parent`` follows
  the spawning *thread*).
- ``spec.port`` is None for a runner with a ``fixed_port`` (a pod listens on its own address at a
  fixed port, no allocator); the shell then tells the app ``fixed_port``.
- ``spec.env`` is what the app may show anyone; ``spec.secrets`` (``OS_APP_TOKEN``,
  ``OS_SHELL_SECRET``) are kept apart: a local runner adds them to the child's environment, a
  cluster runner puts them in a Secret the pod reads as files, never in the pod's own spec.
- ``RunningApp.host`` / ``.port``: where the shell reaches the app's server, re-read on every use
  (a pod's address is known only once it runs, and may change). Never assume loopback.
- ``RunningApp.ref``: JSON that names the running thing to its runner (a pid and its start time;
  a namespace, pod and uid), kept with the instance; ``Runner.adopt(ref)`` turns it back into a
  RunningApp in a new shell when the runner ``survives_shell``.
- ``RunningApp.wait()`` completes with an ExitStatus (code and reason: ``oom``, ``image``,
  ``schedule``, ``exited``, ``killed``) when the server is gone (crash detection); it may be
  awaited by several tasks.
- ``RunningApp.stop(grace)``: the polite signal, the kill after ``grace`` seconds; returns only
  when everything the app started is gone. Idempotent.
- ``RunningApp.logs(lines, after)``: the last ``lines`` of its output, or with ``after`` (a cursor
  an earlier call returned) what came since.
- ``RunningApp.pid``: the child's pid as the shell's host sees it (for `atrium ps`); None for a
  server on another machine.
- ``spec.cgroup`` (local runners): the child enters it before it executes anything (so the app's
  whole process tree is limited), and the handle removes it once the child has exited; the exit
  reason then says ``oom`` when the kernel killed a process of it for want of memory.
- The child's stdout and stderr go to ``spec.log_path`` (appended) on a local runner.
- ``spec.user``: when set (the shell runs as root), the app's processes run under that uid/gid
  with no supplementary groups, never as root; its data directory is made theirs (owner, 0700).
- One instance never runs twice: the runner takes an exclusive ``flock`` on the lock file of
  ``spec.lock_dir`` (the data directory unless a headless provider shares its app's data folder;
  a file in ``run/locks``, never a folder's descriptor, which would lead a sandbox out:
  `process.instance_lock`), held by the child's side for its whole life, and a spawn on a locked
  one raises SpawnFailed (cause ``locked``).
- A local runner (``survives_shell`` False) lets nothing the child starts outlive the shell, even
  one killed with SIGKILL; a cluster runner leaves its pods running for the next shell to adopt.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from atrium.egress import Ask
from atrium.lifecycle.limits import InstanceCgroup, Limits
from atrium.lifecycle.runners.kubernetes import INSTALL_HINT, KubeSettings

_LOGGER = logging.getLogger(__name__)


class RunnerUnavailable(RuntimeError):
    """The runner asked for cannot be loaded here (an optional extra is not installed)."""


@dataclass(frozen=True, slots=True)
class AppUser:
    """The unprivileged identity an app runs as when the shell is root (decisions.md)."""

    uid: int
    gid: int


#: why a server is gone: the kernel's OOM killer (or the cluster's), an image that cannot be
#: pulled or run, a pod that cannot be scheduled, an exit of its own, a signal the shell did not send
ExitReason = Literal["oom", "image", "schedule", "exited", "killed"]
EXIT_REASONS: tuple[ExitReason, ...] = ("oom", "image", "schedule", "exited", "killed")


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a server ended: its exit code (negative: the signal that ended it) and why."""

    code: int
    reason: ExitReason


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Some of an app's output, and the cursor to ask ``after`` for what comes next."""

    text: str
    cursor: str


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
    #: None: the runner's ``fixed_port`` (no allocator)
    port: int | None
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
    #: the user the instance belongs to (labels and names on a cluster)
    owner: str = ""
    #: the instance whose data it runs on when not its own (a headless provider's: its owner's
    #: first instance of the app, whose folder ``data_dir`` is): a cluster mounts that claim
    data_of: str | None = None
    #: its data is thrown away after it (an update's trial, on an empty staging folder): a
    #: cluster gives it an empty volume, not a claim kept for the next one
    scratch_data: bool = False
    #: what only the app may read: ``OS_APP_TOKEN``, ``OS_SHELL_SECRET``
    secrets: Mapping[str, str] = field(default_factory=dict)
    #: the content digest of ``app_dir`` (``sha256:…``): what a cluster runner fetches by
    source_digest: str | None = None
    #: the app and holder an egress grant is kept for (`atrium.state.egress`: "" for a shared
    #: copy, the user for a user scope's), and what the manifest asks to reach (`atrium.egress`);
    #: a runner that gives the instance a network of its own plumbs it with the grant
    egress_key: tuple[str, str] | None = None
    egress: Ask = False


@dataclass(frozen=True, slots=True)
class Survivor:
    """A server an earlier shell left running (a ``survives_shell`` runner's), already adopted:
    which instance it was, and the secrets it holds (the new shell keeps them)."""

    instance_id: str
    app_id: str
    owner: str
    ref: dict[str, Any]
    token: str
    secret: str
    app: RunningApp


class RunningApp(Protocol):
    """A started server (see the module docstring for the contract)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def ref(self) -> dict[str, Any]: ...

    @property
    def status(self) -> ExitStatus | None:
        """How it ended, once it has (None while it runs)."""
        ...

    async def wait(self) -> ExitStatus: ...

    async def stop(self, grace: float = 3.0) -> ExitStatus: ...

    async def logs(self, lines: int, after: str | None = None) -> LogChunk: ...


class Runner(Protocol):
    """Starts app servers (see the module docstring for the contract)."""

    name: str
    #: True: its servers keep running when the shell stops, and a new shell adopts them
    survives_shell: bool
    #: the port every server listens on (a pod's own address); None: the shell allocates one
    fixed_port: int | None

    async def spawn(self, spec: SpawnSpec) -> RunningApp: ...

    async def adopt(self, ref: dict[str, Any]) -> RunningApp:
        """The running server ``ref`` names, from an earlier shell; SpawnFailed when it is gone
        (or the runner cannot adopt: a local runner's children die with their shell)."""
        ...

    async def survivors(self) -> list[Survivor]:
        """What an earlier shell left running, adopted (empty unless ``survives_shell``)."""
        ...

    async def close(self) -> None:
        """Let go of what the runner holds (a cluster client, its watch); servers keep running."""
        ...

    def early_exit_cause(self, log_path: Path, returncode: int) -> str:
        """The SpawnFailed cause of a child that ended before answering `/health`: ``mount``
        when the runner itself could not build its sandbox (its words end the log), else
        ``exited``."""
        ...


def load_runner(name: str, kube: KubeSettings | None = None) -> Runner:
    """``process``, ``bwrap``, ``kubernetes`` (with ``kube``, its settings), or ``auto``: bwrap
    when it works on this machine, else process. kubernetes-asyncio, the Kubernetes runner's
    client, is an optional extra imported only here: RunnerUnavailable names how to install it."""
    from atrium.lifecycle.runners.bwrap import BwrapRunner, bwrap_works
    from atrium.lifecycle.runners.process import ProcessRunner

    if name == "kubernetes":
        if kube is None:
            raise ValueError("the kubernetes runner needs its settings (ATRIUM_KUBE_*)")
        try:
            from atrium.lifecycle.runners.kubernetes.runner import KubernetesRunner
        except ImportError as err:
            raise RunnerUnavailable(
                f"the kubernetes runner needs kubernetes-asyncio ({INSTALL_HINT}): {err}"
            ) from err
        _LOGGER.info("runner: kubernetes (namespace %s)", kube.namespace)
        return KubernetesRunner(kube)
    if name == "process":
        return ProcessRunner()
    if name == "bwrap":
        return BwrapRunner()
    if name != "auto":
        raise ValueError(f"unknown runner {name!r}: auto, process, bwrap or kubernetes")
    problem = bwrap_works()
    if problem is None:
        _LOGGER.info("runner: bwrap (bubblewrap sandbox)")
        return BwrapRunner()
    _LOGGER.warning("runner: process (no sandbox): bubblewrap does not work here: %s", problem)
    return ProcessRunner()


__all__ = [
    "EXIT_REASONS",
    "AppUser",
    "ExitReason",
    "ExitStatus",
    "LogChunk",
    "Runner",
    "RunnerUnavailable",
    "RunningApp",
    "SpawnSpec",
    "Survivor",
    "load_runner",
]
