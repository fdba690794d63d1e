"""The ``process`` runner: the app as a plain child process in its own session (no sandbox).

Used in development, in tests and where bubblewrap does not work. The shell starts a *keeper*
(``keeper.py``) in a new session, and the keeper starts the app: the keeper is the subreaper of
everything the app starts, dies with the shell (``PR_SET_PDEATHSIG``, even after SIGKILL) taking
every descendant with it, and holds the data folder's lock. Stopping signals the processes below
the keeper (a ``setsid`` grandchild included), like the bwrap runner signals those inside bwrap.

As root, the app runs under its own uid (``spec.user``), which reaches only what every user may:
the shell opens the folders from ``$ATRIUM_HOME`` down to the app's folders for search only
(0711, no listing; private files stay 0600 and private folders 0700). The interpreter, the
system apps folder and ``$ATRIUM_HOME``'s own parents must already be searchable by others; if
not, the app's start fails with its log naming the path (decisions.md: use bwrap under root).

This module also holds ``ChildProcess``, the RunningApp handle every local runner shares (the
bwrap runner subclasses it), and the two /proc readers it needs. Linux only, like the shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Final, NamedTuple

from atrium.errors import SpawnFailed
from atrium.lifecycle.limits import (
    InstanceCgroup,
    enter_from_child,
    rlimit_plan,
    set_rlimits_in_child,
)
from atrium.lifecycle.runners import (
    AppUser,
    ExitReason,
    ExitStatus,
    LogChunk,
    SpawnSpec,
    Survivor,
)

_LOGGER = logging.getLogger(__name__)

#: after SIGKILL, how long to wait for the child before signalling again (it cannot ignore it)
_KILL_WAIT: Final = 5.0
#: how long stop() waits for the last members of the group (already SIGKILLed) to disappear
_SURVIVOR_WAIT: Final = 10.0
_POLL: Final = 0.02
#: where a bare command is looked for first (before the shell's PATH)
SYSTEM_PATH: Final = "/usr/bin:/bin"
KEEPER: Final = Path(__file__).with_name("keeper.py")


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


#: the most of a log one call reads (its end): a log that grew huge is not read whole
MAX_LOG_READ: Final = 256 * 1024


def read_log_file(path: Path | None, lines: int, after: str | None = None) -> LogChunk:
    """The last ``lines`` of a local log file, or with ``after`` (a byte offset an earlier call
    returned as its cursor) everything written since; the cursor is the file's end. An offset
    beyond the end means a new log: read from its start."""
    text, end = "", 0
    if path is not None and path.exists():
        with path.open("rb") as log:
            end = log.seek(0, 2)
            start = max(0, end - MAX_LOG_READ)
            offset = int(after) if after is not None and after.isdigit() else None
            if offset is not None and offset <= end:
                start = max(start, offset)
            log.seek(start)
            data = log.read(end - start)
        if offset is not None and start > 0 and start != offset:
            data = data.partition(b"\n")[2]  # a cut line is not shown
        text = data.decode(errors="replace")
    if after is None:
        kept = text.splitlines()[-lines:]
        text = "\n".join(kept) + ("\n" if kept else "")
    return LogChunk(text, str(end))


class ChildProcess:
    """A started child and its process group: the RunningApp of the local runners.

    One task awaits the child's exit and resolves a future that any number of ``wait()`` calls
    share (cancelling one waiter cancels nothing else). When the child exits on its own, what is
    left of its group is killed: an app's helper must not outlive the app and keep its port.

    ``stop`` signals through two methods a sandbox overrides: ``_terminate`` (the polite signal)
    and ``_kill``; ``_survivors`` says which processes stop() still waits for.
    """

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        *,
        host: str,
        port: int,
        label: str,
        cgroup: InstanceCgroup | None = None,
        log_path: Path | None = None,
    ):
        self._process = process
        self._cgroup = cgroup
        self._host = host
        self._port = port
        self._label = label
        self._log_path = log_path
        self._pgid = process.pid  # start_new_session: the child leads its own group
        started = read_stat(process.pid)
        self._ref = {"pid": process.pid, "start": started.start if started else None}
        self._signalled = False
        self._exited: asyncio.Future[ExitStatus] = asyncio.get_running_loop().create_future()
        self._watcher = asyncio.create_task(self._watch(), name=f"watch {label} pid {process.pid}")
        self._stopping: asyncio.Task[ExitStatus] | None = None

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
    def ref(self) -> dict[str, Any]:
        """The child's pid and its start time (clock ticks since boot: a reused pid differs)."""
        return dict(self._ref)

    @property
    def status(self) -> ExitStatus | None:
        return self._exited.result() if self._exited.done() else None

    @property
    def returncode(self) -> int | None:
        return self._exited.result().code if self._exited.done() else None

    async def wait(self) -> ExitStatus:
        return await asyncio.shield(self._exited)

    async def logs(self, lines: int, after: str | None = None) -> LogChunk:
        return read_log_file(self._log_path, lines, after)

    async def stop(self, grace: float = 3.0) -> ExitStatus:
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
        # a signal the shell did not send (a kill from outside) is ``killed``; one it sent to
        # stop the app is the app's exit
        reason: ExitReason = "killed" if self._by_signal(code) and not self._signalled else "exited"
        if self._cgroup is not None:
            if self._cgroup.oom_kills() > 0:
                reason = "oom"
            await self._cgroup.remove()  # kills what is left in it (a setsid escapee too)
        self._exited.set_result(ExitStatus(code, reason))

    @staticmethod
    def _by_signal(code: int) -> bool:
        """Whether exit status ``code`` says a signal ended the child (asyncio: minus it)."""
        return code < 0

    async def _stop(self, grace: float) -> ExitStatus:
        self._signalled = True
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
        # the watch's end too: what the child held beyond its processes (a sandbox's address)
        # is free once a stop returns
        await asyncio.wait([self._watcher])  # its failure is its own to log, not the stop's
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


def descendants(pid: int) -> list[ProcStat]:
    """Every process below ``pid`` (children, their children …), read from /proc."""
    children: dict[int, list[ProcStat]] = {}
    for stat_ in all_stats():
        children.setdefault(stat_.ppid, []).append(stat_)
    found: list[ProcStat] = []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child.pid)
    return found


class KeptChild(ChildProcess):
    """A parent process that stays (the keeper, or bwrap) and the app's processes below it.

    The polite signal and the kill go to the processes below the parent pid, whatever their
    session or group (a double-forked ``setsid`` grandchild was re-parented below it); the parent
    stays to report the app's exit status and exits after it. stop() waits for every process it
    ever signalled.
    """

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        *,
        host: str,
        port: int,
        label: str,
        cgroup: InstanceCgroup | None = None,
        log_path: Path | None = None,
    ):
        super().__init__(
            process, host=host, port=port, label=label, cgroup=cgroup, log_path=log_path
        )
        #: every process ever signalled inside, by (pid, start time): stop() waits for them all
        self._inside: dict[tuple[int, int], ProcStat] = {}

    def _terminate(self) -> None:
        self._signal_inside(signal.SIGTERM)

    def _kill(self) -> None:
        self._signal_inside(signal.SIGKILL)

    def _survivors(self) -> list[ProcStat]:
        return [*super()._survivors(), *(s for s in self._inside.values() if is_alive(s))]

    def _signal_inside(self, sig: signal.Signals) -> None:
        for found in descendants(self.pid):
            self._inside[found.pid, found.start] = found
        targets = [s for s in self._inside.values() if is_alive(s)]
        if not targets:
            self._signal_group(sig)  # the app has not started yet: nothing inside to spare
        for target in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target.pid, sig)


def absolute(path: Path) -> Path:
    """Absolute and normalised, symlinks kept: a bind's destination is the path the app is told."""
    return Path(os.path.normpath(path.absolute()))


def host_command(spec: SpawnSpec) -> Path:
    """The host file ``argv[0]`` names, checked executable (what exec would fail on)."""
    command = spec.argv[0]
    if "/" in command:
        path = Path(command) if command.startswith("/") else spec.app_dir / command
    elif found := shutil.which(command, path=f"{SYSTEM_PATH}:{os.environ.get('PATH', '')}"):
        path = Path(found)
    else:
        raise _not_executable(spec, "is not on the host's PATH")
    if not path.exists():
        raise _not_executable(spec, f"{path} does not exist")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise _not_executable(spec, f"{path} is not an executable file")
    return absolute(path)


def _not_executable(spec: SpawnSpec, why: str) -> SpawnFailed:
    return SpawnFailed(
        f"cannot start {spec.app_id!r}: command {spec.argv[0]!r} cannot be executed: {why} (an "
        "absolute path to an executable file, or a script with a '#!' line, is expected)",
        app_id=spec.app_id,
        cause="exited",
    )


def give_data_dir(path: Path, user: AppUser) -> None:
    """Make the data folder the app's own: owner uid/gid, mode 0700; files an earlier run left
    under another owner (a shell that ran apps as root) are handed over too, never following a
    link (an app's data may hold links to anywhere)."""
    info = path.lstat()
    if (info.st_uid, info.st_gid) != (user.uid, user.gid):
        # fwalk holds each folder open and never follows a link: a folder swapped for a link
        # while we walk cannot point the chown anywhere else
        for _, dirs, files, folder in os.fwalk(path, follow_symlinks=False):
            for name in (*dirs, *files):
                os.chown(name, user.uid, user.gid, dir_fd=folder, follow_symlinks=False)
        os.chown(path, user.uid, user.gid, follow_symlinks=False)
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)


def share_app_tree(app_dir: Path, app_id: str) -> None:
    """Let others read the app tree when its folder is closed to them (a shell running with a
    strict umask installed it): folders ``r-x``, files ``r--`` (``r-x`` when executable), never
    following a link, leaving the instances' data folders (``<appId>-<n>``) alone.

    Checked on the app folder's own mode only, so a spawn costs one ``stat`` when all is well.
    """
    mode = app_dir.stat().st_mode
    if mode & 0o005 == 0o005:
        return
    app_dir.chmod(stat.S_IMODE(mode) | 0o005)
    for folder, dirs, files, fd in os.fwalk(app_dir, follow_symlinks=False):
        if Path(folder) == app_dir:
            dirs[:] = [d for d in dirs if not d.startswith(f"{app_id}-")]
        for name in (*dirs, *files):
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                continue
            extra = 0o005 if stat.S_ISDIR(info.st_mode) or info.st_mode & stat.S_IXUSR else 0o004
            if info.st_mode & extra != extra:
                os.chmod(name, stat.S_IMODE(info.st_mode) | extra, dir_fd=fd)


def open_for_search(paths: Iterable[Path], home: Path | None) -> None:
    """Let others search, never list, every folder from ``home`` down to the parent of each of
    ``paths`` (others' bits become ``--x``): the app's uid then reaches its folders by name, lists
    none of the folders above them, and reads nothing private (0600/0700) on the way."""
    if home is None:
        return
    home = absolute(home)
    for path in paths:
        for folder in reversed(absolute(path).parents):
            if folder != home and not folder.is_relative_to(home):
                continue
            mode = folder.lstat().st_mode
            wanted = (stat.S_IMODE(mode) & ~0o006) | stat.S_IXOTH
            if stat.S_ISDIR(mode) and stat.S_IMODE(mode) != wanted:
                folder.chmod(wanted)


def locks_dir(home: Path) -> Path:
    """The home's folder of instance lock files (`instance_lock`)."""
    return home / "run" / "locks"


def instance_lock(folder: Path, home: Path | None) -> Path:
    """The file whose ``flock`` proves that the instance of ``folder`` runs once: in the home's
    ``run/locks``, named after the folder's path (beside the folder when no home is given).

    A file, never the folder: the descriptor is held open inside the sandbox (bwrap's
    ``--sync-fd``, by its pid 1, which runs under the app's own host uid, so the app may open
    ``/proc/1/fd/<n>``), and a folder's descriptor leads on to its parent folders on the host
    (``..``), past every mount of the sandbox: an image listed its app's other instances and read
    the files beside its data folder, and a non-root shell's app reaches ``$ATRIUM_HOME`` itself.
    A file leads nowhere; the shell's own (0600) is not even opened by a root shell's apps.
    """
    absolute = folder.absolute()
    if home is None:
        return absolute.with_name(f".{absolute.name}.lock")
    digest = hashlib.sha256(os.fsencode(absolute)).hexdigest()[:32]
    return locks_dir(home) / digest


def lock_data_dir(spec: SpawnSpec) -> int:
    """An exclusive ``flock`` on the instance's lock file (`instance_lock`), or SpawnFailed
    (cause ``locked``) naming its data folder.

    The descriptor is handed to the child's side (the keeper, or bwrap's ``--sync-fd``), which
    holds it as long as anything of the app runs; the shell closes its copy after the spawn.
    """
    locked = spec.lock_dir or spec.data_dir
    path = instance_lock(locked, spec.home)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as err:
        os.close(fd)
        raise SpawnFailed(
            f"cannot start {spec.app_id!r} instance {spec.instance_id!r}: its data folder "
            f"{locked} is in use by another process (an earlier run of this instance "
            "still alive?); stop it, or see `atrium ps`",
            app_id=spec.app_id,
            cause="locked",
        ) from err
    return fd


def prepare_dirs(spec: SpawnSpec) -> None:
    """Check the app directory and create the data and log directories, or raise SpawnFailed."""
    if not spec.app_dir.is_dir():
        raise SpawnFailed(
            f"cannot start {spec.app_id!r}: its app directory {spec.app_dir} does not exist",
            app_id=spec.app_id,
            cause="mount",
        )
    folders = [("data directory", spec.data_dir), ("log directory", spec.log_path.parent)]
    if spec.lock_dir is not None:
        folders.append(("lock directory", spec.lock_dir))
    for what, path in folders:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SpawnFailed(
                f"cannot start {spec.app_id!r}: cannot create its {what} {path}: {err.strerror}",
                app_id=spec.app_id,
                cause="mount",
            ) from err
    if spec.user is not None:
        try:
            share_app_tree(spec.app_dir, spec.app_id)
            give_data_dir(spec.data_dir, spec.user)
        except OSError as err:
            raise SpawnFailed(
                f"cannot start {spec.app_id!r}: cannot open its app tree {spec.app_dir} or hand "
                f"its data directory {spec.data_dir} to uid {spec.user.uid}: "
                f"{err.strerror or err} ({err.filename})",
                app_id=spec.app_id,
                cause="mount",
            ) from err


#: `PR_SET_PDEATHSIG` from linux/prctl.h
PR_SET_PDEATHSIG: Final = 1


def _before_exec(
    die_with: int | None,
    cgroup_fds: Sequence[int],
    rlimits: Sequence[tuple[int, int]] = (),
    then: Callable[[], None] | None = None,
) -> Callable[[], None] | None:
    """What the forked child does before it executes the command: join the instance's cgroup
    (`enter_from_child`: a plain write on descriptors opened by the shell), or set the rlimits
    that stand in for one (inherited by the keeper or bwrap and everything the app starts), and
    arm `_die_with`."""
    arm = _die_with(die_with) if die_with is not None else None
    if arm is None and not cgroup_fds and not rlimits and then is None:
        return None

    def before() -> None:
        enter_from_child(cgroup_fds)
        set_rlimits_in_child(rlimits)
        if arm is not None:
            arm()
        if then is not None:
            then()

    return before


def child_rlimits(spec: SpawnSpec) -> tuple[tuple[int, int], ...]:
    """The rlimits the child sets: those of `rlimit_plan` when the instance's limits are held
    with rlimits (no cgroup), none otherwise."""
    limits = spec.limits
    if spec.cgroup is not None or limits is None or limits.enforcement != "rlimit":
        return ()
    return rlimit_plan(limits, own_uid=spec.user is not None).rlimits


def _die_with(shell: int) -> Callable[[], None]:
    """In the forked child, before exec: SIGKILL when the spawning thread dies, and an exit now
    when the shell died before that was asked (a kill -9 of the shell between the fork and the
    sandbox's own ``--die-with-parent`` left bwrap and the app running, holding the data folder's
    lock: found by `make chaos`)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != shell:
            os._exit(1)

    return arm


async def start_child(
    spec: SpawnSpec,
    argv: list[str],
    env: Mapping[str, str],
    *,
    label: str,
    pass_fds: Sequence[int] = (),
    die_with_shell: bool = False,
    before_exec: Callable[[], None] | None = None,
    cwd: Path | None = None,
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session with the app's log as stdout and stderr.

    The shell's copy of the log descriptor is closed as soon as the child holds its own, so
    nothing leaks however the child ends. Must run on the event-loop thread (bwrap's
    ``--die-with-parent`` follows the spawning thread). ``die_with_shell``: the child asks for
    SIGKILL at the shell's death before it executes ``argv`` and leaves when the shell is already
    gone (`_die_with`), closing the window between the fork and the command's own
    ``--die-with-parent``. ``before_exec``: what else the forked child does last before it
    executes ``argv`` (system calls only: the child of a threaded process); ``cwd``: where it
    starts (the app directory by default).
    """
    log: BinaryIO = spec.log_path.open("ab")
    try:
        # a cgroup removed meanwhile (an uninstall racing a warm-pool spawn) fails here: the log
        # is closed all the same
        cgroup_fds = spec.cgroup.open_procs() if spec.cgroup is not None else []
    except BaseException:
        log.close()
        raise
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd or spec.app_dir,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
            preexec_fn=_before_exec(
                os.getpid() if die_with_shell else None,
                cgroup_fds,
                child_rlimits(spec),
                before_exec,
            ),
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
        for fd in cgroup_fds:
            os.close(fd)


def local_port(spec: SpawnSpec) -> int:
    """The port a local runner's child listens on: the shell always allocates one."""
    if spec.port is None:
        raise SpawnFailed(
            f"cannot start {spec.app_id!r}: a local runner needs the port the shell allocated",
            app_id=spec.app_id,
            cause="setup",
        )
    return spec.port


def child_environment(spec: SpawnSpec) -> dict[str, str]:
    """What a local child's environment holds: its environment and its secrets (a local child has
    no other way to read them) and ``OS_DATA_DIR``."""
    return {**spec.env, **spec.secrets, "OS_DATA_DIR": str(spec.data_dir)}


class LocalRunner:
    """What the local runners share: the shell allocates ports, nothing outlives the shell, and
    so nothing is left to adopt."""

    survives_shell = False
    fixed_port: int | None = None

    async def adopt(self, ref: dict[str, Any]) -> ChildProcess:
        raise SpawnFailed(
            f"a {type(self).__name__} server does not outlive its shell: nothing to adopt at {ref}",
            app_id="",
            cause="exited",
        )

    async def survivors(self) -> list[Survivor]:
        return []

    async def close(self) -> None:
        return None


class ProcessRunner(LocalRunner):
    """Runs the app's command directly on the host, below a keeper in its own session."""

    name = "process"

    def early_exit_cause(self, log_path: Path, returncode: int) -> str:
        return "exited"  # no sandbox to fail to build

    async def spawn(self, spec: SpawnSpec) -> KeptChild:
        if not spec.argv:
            raise SpawnFailed(
                f"cannot start {spec.app_id!r}: empty command", app_id=spec.app_id, cause="exited"
            )
        prepare_dirs(spec)
        host_command(spec)
        user = spec.user
        if user is not None:
            open_for_search([spec.app_dir, spec.data_dir], spec.home)
        env = child_environment(spec)
        env.setdefault("PATH", os.defpath)
        label = f"{spec.app_id} instance {spec.instance_id}"
        lock = lock_data_dir(spec)
        keeper = [sys.executable, "-I", "-S", "-B", str(KEEPER), str(os.getpid()), str(lock)]
        keeper += [str(user.uid), str(user.gid)] if user is not None else ["-1", "-1"]
        try:
            process = await start_child(
                spec, [*keeper, "--", *spec.argv], env, label=label, pass_fds=(lock,)
            )
        finally:
            os.close(lock)
        _LOGGER.info("started %s: keeper pid %d, %s", label, process.pid, " ".join(spec.argv))
        return KeptChild(
            process,
            host=spec.host,
            port=local_port(spec),
            label=label,
            cgroup=spec.cgroup,
            log_path=spec.log_path,
        )


__all__ = ["ChildProcess", "KeptChild", "ProcessRunner"]
