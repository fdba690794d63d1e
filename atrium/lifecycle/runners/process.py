"""The ``process`` runner: the app as a plain child process in its own session (no sandbox).

Used in development, in tests and where bubblewrap does not work. The child gets a new session
(``start_new_session=True``), so its pid is also the id of a process group holding everything it
spawns; stopping signals that group, not just the child [JupyterHub ``LocalProcessSpawner``].

This module also holds ``ChildProcess``, the RunningApp handle every local runner shares (the
bwrap runner subclasses it), and the two /proc readers it needs. Linux only, like the shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO, Final, NamedTuple

from atrium.errors import SpawnFailed
from atrium.lifecycle.runners import SpawnSpec

_LOGGER = logging.getLogger(__name__)

#: after SIGKILL, how long to wait for the child before signalling again (it cannot ignore it)
_KILL_WAIT: Final = 5.0
#: how long stop() waits for the last members of the group (already SIGKILLed) to disappear
_SURVIVOR_WAIT: Final = 10.0
_POLL: Final = 0.02


class ProcStat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` the handle needs."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    #: clock ticks since boot: with the pid, identifies a process even after its pid is reused
    start: int


def read_stat(pid: int) -> ProcStat | None:
    """One process's stat line, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = raw[raw.rindex(b")") + 2 :].split()
    return ProcStat(pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))


def all_stats() -> Iterator[ProcStat]:
    """Every process this pid namespace shows (a few ms for a few hundred processes)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := read_stat(int(entry.name))) is not None:
            yield stat


def is_alive(stat: ProcStat) -> bool:
    """True while the process recorded in ``stat`` runs (a zombie has finished running)."""
    now = read_stat(stat.pid)
    return now is not None and now.start == stat.start and now.state != "Z"


def group_members(pgid: int) -> list[ProcStat]:
    """Live (non-zombie) members of a process group.

    ``killpg(pgid, 0)`` alone is not enough: it succeeds while a zombie member waits to be reaped,
    and on some hosts (this project's CI containers) pid 1 reaps orphans only now and then.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # exists, owned by someone else: look closer
    return [s for s in all_stats() if s.pgrp == pgid and s.state != "Z"]


class ChildProcess:
    """A started child and its process group: the RunningApp of the local runners.

    One task awaits the child's exit and resolves a future that any number of ``wait()`` calls
    share (cancelling one waiter cancels nothing else). When the child exits on its own, what is
    left of its group is killed: an app's helper must not outlive the app and keep its port.

    ``stop`` signals through two methods a sandbox overrides: ``_terminate`` (the polite signal)
    and ``_kill``; ``_survivors`` says which processes stop() still waits for.
    """

    def __init__(self, process: asyncio.subprocess.Process, *, host: str, port: int, label: str):
        self._process = process
        self._host = host
        self._port = port
        self._label = label
        self._pgid = process.pid  # start_new_session: the child leads its own group
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._watcher = asyncio.create_task(self._watch(), name=f"watch {label} pid {process.pid}")
        self._stopping: asyncio.Task[int] | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._label} pid={self.pid} returncode={self.returncode}>"

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def stop(self, grace: float = 3.0) -> int:
        """SIGTERM, SIGKILL after ``grace`` seconds; concurrent and repeated calls share one stop."""
        if self._stopping is None:
            self._stopping = asyncio.create_task(
                self._stop(grace), name=f"stop {self._label} pid {self.pid}"
            )
        return await asyncio.shield(self._stopping)

    async def _watch(self) -> None:
        code = await self._process.wait()
        _LOGGER.debug("%s (pid %d) exited with %d", self._label, self.pid, code)
        self._signal_group(signal.SIGKILL)  # leftovers of a child that exited on its own
        self._exited.set_result(code)

    async def _stop(self, grace: float) -> int:
        if not self._exited.done():
            self._terminate()
            if not await self._exits_within(grace):
                _LOGGER.warning(
                    "%s (pid %d) still runs %.1f s after SIGTERM: sending SIGKILL",
                    self._label,
                    self.pid,
                    grace,
                )
                self._kill()
                if not await self._exits_within(_KILL_WAIT):
                    self._signal_group(signal.SIGKILL)
            await asyncio.shield(self._exited)
        await self._wait_survivors()
        return self._exited.result()

    async def _exits_within(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await asyncio.shield(self._exited)
        except TimeoutError:
            return False
        return True

    async def _wait_survivors(self) -> None:
        """Return once no process stop() signalled is running (bounded: a process stuck in the
        kernel cannot be waited out)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _SURVIVOR_WAIT
        while survivors := self._survivors():
            if loop.time() > deadline:
                _LOGGER.warning(
                    "%s: processes %s survived SIGKILL", self._label, [s.pid for s in survivors]
                )
                return
            self._signal_group(signal.SIGKILL)
            await asyncio.sleep(_POLL)

    def _terminate(self) -> None:
        self._signal_group(signal.SIGTERM)

    def _kill(self) -> None:
        self._signal_group(signal.SIGKILL)

    def _survivors(self) -> list[ProcStat]:
        return group_members(self._pgid)

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._pgid, sig)


def prepare_dirs(spec: SpawnSpec) -> None:
    """Check the app directory and create the data and log directories, or raise SpawnFailed."""
    if not spec.app_dir.is_dir():
        raise SpawnFailed(
            f"cannot start {spec.app_id!r}: its app directory {spec.app_dir} does not exist",
            app_id=spec.app_id,
            cause="mount",
        )
    for what, path in (("data directory", spec.data_dir), ("log directory", spec.log_path.parent)):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SpawnFailed(
                f"cannot start {spec.app_id!r}: cannot create its {what} {path}: {err.strerror}",
                app_id=spec.app_id,
                cause="mount",
            ) from err


async def start_child(
    spec: SpawnSpec, argv: list[str], env: Mapping[str, str], *, label: str
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session with the app's log as stdout and stderr.

    The shell's copy of the log descriptor is closed as soon as the child holds its own, so
    nothing leaks however the child ends. Must run on the event-loop thread (bwrap's
    ``--die-with-parent`` follows the spawning thread).
    """
    log: BinaryIO = spec.log_path.open("ab")
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=spec.app_dir,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    except OSError as err:
        raise SpawnFailed(
            f"cannot start {label}: command {argv[0]!r} cannot be executed: "
            f"{err.strerror or err} (an absolute path to an executable file, or a script with a "
            "'#!' line, is expected)",
            app_id=spec.app_id,
            cause="exited",
        ) from err
    finally:
        log.close()


class ProcessRunner:
    """Runs the app's command directly on the host, in its own session."""

    name = "process"

    async def spawn(self, spec: SpawnSpec) -> ChildProcess:
        if not spec.argv:
            raise SpawnFailed(
                f"cannot start {spec.app_id!r}: empty command", app_id=spec.app_id, cause="exited"
            )
        prepare_dirs(spec)
        env = dict(spec.env)
        env["OS_DATA_DIR"] = str(spec.data_dir)
        env.setdefault("PATH", os.defpath)
        label = f"{spec.app_id} instance {spec.instance_id}"
        process = await start_child(spec, list(spec.argv), env, label=label)
        _LOGGER.info("started %s: pid %d, %s", label, process.pid, " ".join(spec.argv))
        return ChildProcess(process, host=spec.host, port=spec.port, label=label)


__all__ = ["ChildProcess", "ProcessRunner"]
