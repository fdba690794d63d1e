"""Resource limits of the local runners: each instance's process tree in a cgroup of its own.

The pure part decides: the limits an instance gets (`effective_limits`: the manifest's
``resources`` capped by the shell's ceilings), the files a cgroup v1 or v2 hierarchy needs written
for them (`v1_writes`, `v2_writes`), the rlimits that stand in where no cgroup is used
(`rlimit_plan`), the OOM kill count a controller file reports (`oom_kills`), and where the shell
itself sits (`own_cgroups`).

The edge does the I/O: `detect_cgroups` finds writable hierarchies at start, `Cgroups` (one per
shell) makes ``<parent>/atrium-<key>/<instance id>`` with the limits written, and `InstanceCgroup`
hands the child a descriptor of ``cgroup.procs`` to enter before it executes the app, counts OOM
kills when it ends, and removes the folder once nothing runs in it.

``<key>`` is a hash of the shell's home: two shells on one machine (a test suite starts many)
share a parent cgroup and their instance ids repeat, so each shell keeps its own folder.
Where no hierarchy is writable (or ``ATRIUM_APP_LIMITS=rlimit``), `Cgroups.problem` says why
once and the local runners set rlimits in the child before it executes instead: memory per
process (``RLIMIT_DATA``), processes per app uid (``RLIMIT_NPROC``, only where the app runs under
a uid of its own), no CPU quota. Each instance says which it got (``limits.enforcement``), as
docs/decisions.md "Resource limits: rlimits where no cgroup is delegated" says.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

_LOGGER = logging.getLogger(__name__)

MIB: Final = 1 << 20
#: the CFS period the CPU quota is a share of (the kernel's default)
CPU_PERIOD_US: Final = 100_000
#: the v1 controllers an instance's cgroup is made in (one folder in each hierarchy)
V1_CONTROLLERS: Final = ("memory", "pids", "cpu")
#: the v2 controllers a parent must hand to its children
V2_CONTROLLERS: Final = ("memory", "pids", "cpu")
CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
#: how long `InstanceCgroup.remove` waits for killed processes to leave (bounded: a process stuck
#: in the kernel cannot be waited out; the folder is then left and said so)
_REMOVE_WAIT: Final = 10.0
_POLL: Final = 0.02
#: how many names (``<instanceId>``, ``~2`` …) `Cgroups.make` tries
_MAX_NAMES: Final = 64


#: how an instance's limits are held: a cgroup of its own, or rlimits set in its child
#: how an instance's limits are held: its own cgroup here, rlimits here, or its pod's resources
#: on a cluster (the cluster's kubelet holds memory and CPU)
Enforcement = Literal["cgroup", "rlimit", "pod"]
#: ``ATRIUM_APP_LIMITS``: a cgroup where the host delegates one, else rlimits; or rlimits only
LimitsMode = Literal["auto", "rlimit"]


@dataclass(frozen=True, slots=True)
class Limits:
    """What one instance may use; None: no limit of that kind. ``enforcement``: how they are
    held (None on the manifest's and the settings' side, where nothing holds them yet)."""

    memory_mib: int | None = None
    cpu_milli: int | None = None
    pids: int | None = None
    enforcement: Enforcement | None = None

    def wire(self) -> dict[str, int | str | None]:
        return {
            "memoryMiB": self.memory_mib,
            "cpuMilli": self.cpu_milli,
            "pids": self.pids,
            "enforcement": self.enforcement,
        }


def _capped(asked: int | None, ceiling: int | None) -> int | None:
    if asked is None:
        return ceiling
    if ceiling is None:
        return asked
    return min(asked, ceiling)


def effective_limits(asked: Limits | None, ceilings: Limits) -> Limits:
    """The manifest's ``resources`` (``asked``), each value capped by the shell's ceiling; a value
    the manifest leaves out takes the ceiling."""
    asked = asked or Limits()
    return Limits(
        memory_mib=_capped(asked.memory_mib, ceilings.memory_mib),
        cpu_milli=_capped(asked.cpu_milli, ceilings.cpu_milli),
        pids=_capped(asked.pids, ceilings.pids),
    )


@dataclass(frozen=True, slots=True)
class Write:
    """One controller file to write; ``optional``: absent on some kernels (no swap accounting)."""

    controller: str
    file: str
    value: str
    optional: bool = False


def v1_writes(limits: Limits) -> list[Write]:
    """The files of the v1 hierarchies, in the order they must be written (``memsw`` after
    ``limit_in_bytes``: it may never be below it). Swap counts against the memory limit."""
    writes: list[Write] = []
    if limits.memory_mib is not None:
        size = str(limits.memory_mib * MIB)
        writes += [
            Write("memory", "memory.limit_in_bytes", size),
            Write("memory", "memory.memsw.limit_in_bytes", size, optional=True),
        ]
    if limits.pids is not None:
        writes.append(Write("pids", "pids.max", str(limits.pids)))
    if limits.cpu_milli is not None:
        writes += [
            Write("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US)),
            Write("cpu", "cpu.cfs_quota_us", str(_quota_us(limits.cpu_milli))),
        ]
    return writes


def v2_writes(limits: Limits) -> list[Write]:
    """The files of the instance's v2 cgroup (controller ``""``: one folder for all). No swap:
    the limit is the memory the instance may hold, not a threshold to spill past."""
    writes: list[Write] = []
    if limits.memory_mib is not None:
        writes += [
            Write("", "memory.max", str(limits.memory_mib * MIB)),
            Write("", "memory.swap.max", "0", optional=True),
        ]
    if limits.pids is not None:
        writes.append(Write("", "pids.max", str(limits.pids)))
    if limits.cpu_milli is not None:
        writes.append(Write("", "cpu.max", f"{_quota_us(limits.cpu_milli)} {CPU_PERIOD_US}"))
    return writes


def _quota_us(cpu_milli: int) -> int:
    """Thousandths of a core → microseconds per period (the kernel's minimum is 1000)."""
    return max(1000, cpu_milli * CPU_PERIOD_US // 1000)


@dataclass(frozen=True, slots=True)
class RlimitPlan:
    """The rlimits a child sets before it executes (``resource`` module numbers → soft and hard
    value), and the limits that holds, as the instance reports them."""

    rlimits: tuple[tuple[int, int], ...]
    holds: Limits


def rlimit_plan(limits: Limits, own_uid: bool) -> RlimitPlan:
    """What rlimits can hold of ``limits``, which are per process, not per process tree:

    - memory: ``RLIMIT_DATA`` (the process's private writable memory: heap, anonymous maps,
      thread stacks), each process of the app up to the limit; not ``RLIMIT_AS``, which counts
      address space merely reserved (64 MiB per malloc arena of each thread) and stops a threaded
      server long before it uses its memory;
    - processes: ``RLIMIT_NPROC``, which the kernel counts per real uid over the whole machine:
      set only when the app runs under a uid of its own (``own_uid``: a root shell), where it
      counts that app's (and owner's) processes and threads; a shell's own uid would count the
      shell and every other app;
    - CPU: nothing (``RLIMIT_CPU`` ends a process after so many CPU seconds, it is no share).
    """
    import resource

    pairs: list[tuple[int, int]] = []
    if limits.memory_mib is not None:
        pairs.append((resource.RLIMIT_DATA, limits.memory_mib * MIB))
    pids = limits.pids if own_uid else None
    if pids is not None:
        pairs.append((resource.RLIMIT_NPROC, pids))
    return RlimitPlan(tuple(pairs), Limits(limits.memory_mib, None, pids, "rlimit"))


def set_rlimits_in_child(rlimits: Iterable[tuple[int, int]]) -> None:
    """In the forked child, before exec: lower soft and hard limits (an app cannot raise them).
    A hard limit already lower (a container's) is kept: raising it would be refused, and the
    child would fail before it executes."""
    import resource

    for which, value in rlimits:
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


def oom_kills(text: str) -> int:
    """The ``oom_kill N`` line of v1 ``memory.oom_control`` or v2 ``memory.events`` (0 if none)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` → controller → path (``""`` for the v2 hierarchy)."""
    found: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, names, path = parts
        if hierarchy == "0" and not names:
            found[""] = path
        for name in names.split(","):
            if name:
                found[name] = path
    return found


def shell_key(home: Path) -> str:
    """The name part that keeps one shell's cgroups apart from another's."""
    return hashlib.sha256(str(home).encode()).hexdigest()[:12]


# --- the edge: reading and writing the cgroup filesystem -------------------------------------


@dataclass(frozen=True, slots=True)
class CgroupHost:
    """Where instance cgroups can go on this machine: ``version`` 1 (``parents`` per controller)
    or 2 (``parents[""]``), or ``problem`` saying why nowhere."""

    version: int | None
    parents: Mapping[str, Path]
    problem: str | None = None


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def _under(mount: Path, path: str) -> Path:
    """The folder of cgroup ``path`` in the hierarchy mounted at ``mount`` (the mount itself when
    a cgroup namespace hides the path)."""
    folder = mount / path.lstrip("/")
    return folder if folder.is_dir() else mount


def detect_cgroups(parent: Path | None = None, root: Path = CGROUP_ROOT) -> CgroupHost:
    """The writable hierarchies for instance cgroups: below ``parent`` when given (a delegated
    v2 folder), else below the shell's own cgroup: v2 when ``root`` is a cgroup2 mount with the
    memory, pids and cpu controllers, else the v1 memory, pids and cpu hierarchies."""
    try:
        mine = own_cgroups(Path("/proc/self/cgroup").read_text())
    except OSError as err:
        return CgroupHost(None, {}, f"cannot read /proc/self/cgroup: {err.strerror}")
    if parent is not None:
        if (parent / "cgroup.controllers").exists():
            return _v2(parent)
        return CgroupHost(None, {}, f"{parent} (ATRIUM_CGROUP_PARENT) is not a cgroup v2 folder")
    if (root / "cgroup.controllers").exists():
        return _v2(_under(root, mine.get("", "/")))
    folders = {name: _under(root / name, mine.get(name, "/")) for name in V1_CONTROLLERS}
    missing = [name for name, folder in folders.items() if not _writable(folder)]
    if missing:
        return CgroupHost(
            None,
            {},
            f"no writable cgroup v2 at {root} and the v1 hierarchies {', '.join(missing)} are "
            "not writable here (the shell is not root, or the cgroup filesystem is read-only)",
        )
    return CgroupHost(1, folders)


def _v2(folder: Path) -> CgroupHost:
    try:
        available = (folder / "cgroup.controllers").read_text().split()
    except OSError as err:
        return CgroupHost(None, {}, f"cannot read {folder}/cgroup.controllers: {err.strerror}")
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        return CgroupHost(
            None, {}, f"the cgroup v2 folder {folder} lacks the {', '.join(missing)} controller"
        )
    if not _writable(folder):
        return CgroupHost(None, {}, f"the cgroup v2 folder {folder} is not writable by the shell")
    return CgroupHost(2, {"": folder})


class InstanceCgroup:
    """One instance's cgroup: a folder per hierarchy (one under v2)."""

    def __init__(self, folders: Sequence[Path], version: int) -> None:
        self.folders = tuple(folders)
        self.version = version

    def open_procs(self) -> list[int]:
        """Descriptors of each folder's ``cgroup.procs`` (close-on-exec): the forked child writes
        ``0`` (itself) to each before it executes anything, so nothing of the app ever runs
        outside (`enter_from_child`). The caller closes them after the spawn."""
        fds: list[int] = []
        try:
            for folder in self.folders:
                fds.append(os.open(folder / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed for want of memory."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for folder in self.folders:
            with contextlib.suppress(OSError):
                return oom_kills((folder / name).read_text())
        return 0

    def pids(self) -> list[int]:
        found: set[int] = set()
        for folder in self.folders:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        return sorted(found)

    def try_remove(self) -> bool:
        """SIGKILL whatever still runs in it and remove its folders once empty; True when gone."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        gone = True
        for folder in self.folders:
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError as err:
                if err.errno != errno.EBUSY:
                    _LOGGER.warning("cannot remove cgroup %s: %s", folder, err.strerror)
                gone = False
        return gone

    async def remove(self) -> None:
        """`try_remove` until the folders are gone (processes take a moment to leave)."""
        import asyncio

        deadline = time.monotonic() + _REMOVE_WAIT
        while not self.try_remove():
            if time.monotonic() > deadline:
                _LOGGER.warning("cgroup %s still holds processes; left", self.folders[0])
                return
            await asyncio.sleep(_POLL)


def enter_from_child(fds: Iterable[int]) -> None:
    """In the forked child, before exec: join the instance's cgroup (``0`` names the writer)."""
    for fd in fds:
        os.write(fd, b"0")


class Cgroups:
    """The shell's side: one folder ``atrium-<key>`` below the parent(s), an instance's below it."""

    def __init__(
        self, host: CgroupHost, home: Path, ceilings: Limits, mode: LimitsMode = "auto"
    ) -> None:
        self.ceilings = ceilings
        self.version = host.version
        self.problem = host.problem
        self._bases: dict[str, Path] = {}
        if mode == "rlimit":
            self.version = None
            self.problem = "cgroups not used: ATRIUM_APP_LIMITS is rlimit"
        elif host.problem is None:
            try:
                self._bases = self._make_bases(host, f"atrium-{shell_key(home)}")
            except OSError as err:
                self.version = None
                self.problem = f"cannot make the shell's cgroup: {err.strerror} ({err.filename})"

    @property
    def enforced(self) -> bool:
        """True when instances get cgroups (False: the local runners set rlimits instead)."""
        return self.problem is None

    @property
    def enforcement(self) -> Enforcement:
        return "cgroup" if self.enforced else "rlimit"

    @property
    def bases(self) -> list[Path]:
        """The shell's own folders (one per hierarchy)."""
        return list(self._bases.values())

    def _make_bases(self, host: CgroupHost, name: str) -> dict[str, Path]:
        bases: dict[str, Path] = {}
        for controller, parent in host.parents.items():
            if host.version == 2:
                _enable_controllers(parent)
            base = parent / name
            base.mkdir(exist_ok=True)
            if host.version == 2:
                _enable_controllers(base)
            for leftover in base.iterdir():  # a shell killed before it removed them
                if leftover.is_dir():
                    InstanceCgroup([leftover], host.version or 1).try_remove()
            bases[controller] = base
        return bases

    def describe(self) -> str:
        if self.problem is not None:
            return (
                "resource limits held with rlimits only (memory per process, processes per app "
                f"uid where apps run under their own, no CPU quota): {self.problem}"
            )
        where = ", ".join(str(b) for b in self._bases.values())
        return f"resource limits enforced with cgroup v{self.version} below {where}"

    def make(self, instance_id: str, limits: Limits) -> InstanceCgroup | None:
        """A fresh cgroup for the instance with ``limits`` written, or None when limits are not
        enforced. Fresh: a folder of that name an earlier run left is removed first (its OOM
        count would name the next crash), and one still holding processes (another run under
        the same id, such as two owners' trials of one app) is never joined nor later killed:
        the new one is ``<instanceId>~2`` (``~3`` …)."""
        if self.problem is not None or self.version is None:
            return None
        for attempt in range(1, _MAX_NAMES + 1):
            name = instance_id if attempt == 1 else f"{instance_id}~{attempt}"
            folders = {controller: base / name for controller, base in self._bases.items()}
            old = InstanceCgroup(list(folders.values()), self.version)
            if any(f.exists() for f in folders.values()) and (old.pids() or not old.try_remove()):
                continue  # busy: another run's
            made = InstanceCgroup([], self.version)
            try:
                for folder in folders.values():
                    folder.mkdir()
                    made = InstanceCgroup([*made.folders, folder], self.version)
                writes = v1_writes(limits) if self.version == 1 else v2_writes(limits)
                _write_all(folders, writes)
            except FileExistsError:  # made by a concurrent spawn a moment ago
                made.try_remove()
                continue
            except OSError:
                made.try_remove()
                raise
            return made
        raise OSError(errno.EEXIST, f"no free cgroup name for {instance_id}", str(self._bases))

    def close(self) -> None:
        """Remove the shell's own folder when no instance is left in it."""
        for base in self._bases.values():
            with contextlib.suppress(OSError):
                base.rmdir()


def _write_all(folders: Mapping[str, Path], writes: Iterable[Write]) -> None:
    for write in writes:
        path = folders[write.controller] / write.file
        try:
            path.write_text(write.value)
        except OSError as err:
            if write.optional and err.errno in (errno.ENOENT, errno.EINVAL, errno.EACCES):
                continue
            raise


def _enable_controllers(folder: Path) -> None:
    """Hand the memory, pids and cpu controllers to ``folder``'s children (v2)."""
    control = folder / "cgroup.subtree_control"
    enabled = control.read_text().split()
    wanted = " ".join(f"+{c}" for c in V2_CONTROLLERS if c not in enabled)
    if wanted:
        control.write_text(wanted)


def in_words(limits: Limits) -> str:
    """``512 MiB of memory, 64 processes, no CPU quota``: limits as people read them."""
    memory = (
        "no memory limit" if limits.memory_mib is None else f"{limits.memory_mib} MiB of memory"
    )
    pids = "no process limit" if limits.pids is None else f"{limits.pids} processes"
    cpu = "no CPU quota" if limits.cpu_milli is None else f"{limits.cpu_milli / 1000:g} CPU cores"
    return f"{memory}, {pids}, {cpu}"


def review_words(limits: Limits, asked: bool) -> str:
    """``may use up to 512 MiB of memory and 64 processes``: the install review's sentence;
    ``asked`` False (the manifest names no ``resources``) adds that the values are the
    administrator's default."""
    parts = []
    if limits.memory_mib is not None:
        parts.append(f"{limits.memory_mib} MiB of memory")
    if limits.pids is not None:
        parts.append(f"{limits.pids} processes")
    if limits.cpu_milli is not None:
        cores = limits.cpu_milli / 1000
        parts.append(f"{cores:g} CPU core{'' if cores == 1 else 's'}")
    if not parts:
        return "may use memory, processes and CPU without limit"
    listed = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    default = "" if asked else " (the administrator's default)"
    return f"may use up to {listed}{default}"


@dataclass(frozen=True, slots=True)
class HeldHere:
    """How a shell on this machine would hold the limits (`atrium doctor`): ``enforcement``,
    the cgroup version (None under rlimits), why, and the ceilings."""

    enforcement: Enforcement
    cgroup: int | None
    why: str
    ceilings: Limits

    def line(self) -> str:
        if self.cgroup is not None:
            way = f"cgroup v{self.cgroup}, one per instance: {self.why}"
        else:
            way = (
                "rlimits (memory per process; processes per app uid, only for a root shell; no "
                f"CPU quota), as {self.why}"
            )
        return f"limits: {way}; ceilings: {in_words(self.ceilings)}"

    def wire(self) -> dict[str, object]:
        return {
            "enforcement": self.enforcement,
            "cgroup": self.cgroup,
            "why": self.why,
            "ceilings": {k: v for k, v in self.ceilings.wire().items() if k != "enforcement"},
        }


def held_here(
    ceilings: Limits, parent: Path | None, mode: LimitsMode, root: Path = CGROUP_ROOT
) -> HeldHere:
    """What `open_cgroups` would choose, read only (no folder made): a v2 whose controllers
    cannot be handed down is found only when the shell makes its folder, and the shell's log
    then says rlimits."""
    if mode == "rlimit":
        return HeldHere("rlimit", None, "ATRIUM_APP_LIMITS is rlimit", ceilings)
    host = detect_cgroups(parent, root)
    if host.problem is not None or host.version is None:
        return HeldHere("rlimit", None, host.problem or "no cgroup", ceilings)
    where = ", ".join(str(p) for p in host.parents.values())
    return HeldHere("cgroup", host.version, f"writable below {where}", ceilings)


def ceilings_of(memory_mib: int, cpu_milli: int, pids: int) -> Limits:
    """The shell's settings (0: no ceiling) as ceilings."""
    return Limits(memory_mib or None, cpu_milli or None, pids or None)


def open_cgroups(
    home: Path, ceilings: Limits, parent: Path | None, mode: LimitsMode = "auto"
) -> Cgroups:
    """The shell's `Cgroups` (blocking: reads and makes a few folders at start); says once, in
    the log, whether limits are held with cgroups or with rlimits only."""
    host = detect_cgroups(parent) if mode == "auto" else CgroupHost(None, {})
    cgroups = Cgroups(host, home, ceilings, mode)
    if cgroups.enforced:
        _LOGGER.info("%s", cgroups.describe())
    else:
        _LOGGER.warning("%s", cgroups.describe())
    return cgroups


__all__ = [
    "CgroupHost",
    "Cgroups",
    "Enforcement",
    "HeldHere",
    "InstanceCgroup",
    "Limits",
    "LimitsMode",
    "RlimitPlan",
    "ceilings_of",
    "detect_cgroups",
    "effective_limits",
    "enter_from_child",
    "held_here",
    "in_words",
    "oom_kills",
    "open_cgroups",
    "own_cgroups",
    "review_words",
    "rlimit_plan",
    "set_rlimits_in_child",
    "v1_writes",
    "v2_writes",
]
