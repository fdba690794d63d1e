"""What the machine and each running instance use: CPU, memory, disk (docs/api.md "System usage").

Synchronous and small: the parsers take the text of `/proc/stat`, `/proc/meminfo` and
`/proc/<pid>/stat`, the readers read those files, and `figures` turns two samples into
percentages. CPU is a share of time between two samples, so one sample says nothing about it;
the caller keeps the previous one (`atrium.monitor.UsageMonitor`).

An instance's figures are those of its process tree: the pid the runner started (the keeper or
bwrap) and every process below it, which is where every process of a sandboxed or kept app is
seen from the host. Memory is the sum of their resident sets (pages shared between two of them
are counted twice: an upper bound, as `ps` and `top` would add them). An instance's CPU share is
of the whole machine, on the same scale as the machine's (all cores busy is 100).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NamedTuple

PROC: Final = Path("/proc")
PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")


class CpuTimes(NamedTuple):
    """The machine's CPU time since boot, in clock ticks, summed over every core."""

    total: int
    idle: int
    cores: int


class Memory(NamedTuple):
    """The machine's memory in bytes."""

    used: int
    total: int


class Disk(NamedTuple):
    """One filesystem's space in bytes."""

    used: int
    total: int


def parse_proc_stat(text: str) -> CpuTimes:
    """`/proc/stat`: the `cpu` line's user … steal fields (guest time is already in user), idle
    counting iowait; the cores are the `cpuN` lines."""
    total = idle = cores = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            values = [int(v) for v in rest.split()[:8]]
            values += [0] * (8 - len(values))
            total = sum(values)
            idle = values[3] + values[4]
        elif name.startswith("cpu") and name[3:].isdigit():
            cores += 1
    if total == 0:
        raise ValueError("/proc/stat has no cpu line")
    return CpuTimes(total, idle, max(cores, 1))


def parse_meminfo(text: str) -> Memory:
    """`/proc/meminfo`: used is MemTotal less MemAvailable (what could be had without swapping)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    total = values.get("MemTotal")
    if total is None:
        raise ValueError("/proc/meminfo has no MemTotal")
    available = values.get("MemAvailable", values.get("MemFree", 0))
    return Memory(max(total - available, 0), total)


class ProcessFigures(NamedTuple):
    """The fields of `/proc/<pid>/stat` the sampler needs."""

    pid: int
    ppid: int
    #: utime + stime, in clock ticks
    ticks: int


def parse_pid_stat(raw: bytes) -> ProcessFigures:
    """`/proc/<pid>/stat`: the command name (field 2) may hold spaces and parentheses, so the
    fields are counted after its last ')'."""
    head, _, tail = raw.rpartition(b")")
    fields = tail.split()
    return ProcessFigures(
        int(head.split(b" ", 1)[0]), int(fields[1]), int(fields[11]) + int(fields[12])
    )


def parse_statm(raw: bytes) -> int:
    """`/proc/<pid>/statm`: the resident set in bytes (its second field is in pages)."""
    return int(raw.split()[1]) * PAGE_SIZE


def _read(path: str) -> bytes:
    """A small /proc file in one read: a third of the cost of `Path.read_text` per process,
    which is most of a sample's."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def read_cpu() -> CpuTimes:
    return parse_proc_stat((PROC / "stat").read_text())


def read_memory() -> Memory:
    return parse_meminfo((PROC / "meminfo").read_text())


def read_disk(path: Path) -> Disk:
    """The filesystem holding ``path``: used is what is not free (root's reserve counts as used)."""
    st = os.statvfs(path)
    return Disk((st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize)


def read_processes() -> dict[int, ProcessFigures]:
    """Every process this pid namespace shows, by pid (one that ends while read is left out)."""
    found: dict[int, ProcessFigures] = {}
    for entry in os.scandir(PROC):
        if (name := entry.name).isdigit():
            try:
                found[int(name)] = parse_pid_stat(_read(f"/proc/{name}/stat"))
            except (OSError, ValueError, IndexError):
                continue
    return found


def tree(pid: int, processes: Mapping[int, ProcessFigures]) -> list[int]:
    """``pid`` and every process below it among ``processes`` (``pid`` first, if it is there)."""
    children: dict[int, list[int]] = {}
    for figures in processes.values():
        children.setdefault(figures.ppid, []).append(figures.pid)
    found = [pid] if pid in processes else []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def resident(pids: Iterable[int]) -> int:
    """The summed resident sets of ``pids`` (one that has ended counts nothing)."""
    total = 0
    for pid in pids:
        try:
            total += parse_statm(_read(f"/proc/{pid}/statm"))
        except (OSError, ValueError, IndexError):
            continue
    return total


@dataclass(frozen=True, slots=True)
class Running:
    """One running instance as the sampler is told of it: whose, which app, the runner's pid."""

    instance_id: str
    app_id: str
    owner: str
    pid: int


@dataclass(frozen=True, slots=True)
class InstanceSample:
    """One instance's process tree at one moment: resident bytes and CPU ticks so far."""

    running: Running
    memory: int
    ticks: int


@dataclass(frozen=True, slots=True)
class Sample:
    """Everything read at one moment; ``at`` is a monotonic clock in seconds, ``when`` the wall
    clock (ISO 8601) the answer reports."""

    at: float
    when: str
    cpu: CpuTimes
    memory: Memory
    disk: Disk
    instances: tuple[InstanceSample, ...] = field(default=())


def take(running: Iterable[Running], home: Path, *, at: float, when: str) -> Sample:
    """Read the machine and each running instance's process tree (a few ms: one /proc walk)."""
    processes = read_processes()
    instances: list[InstanceSample] = []
    for item in running:
        pids = tree(item.pid, processes)
        if not pids:
            continue  # ended between being listed and being read
        ticks = sum(processes[p].ticks for p in pids)
        instances.append(InstanceSample(item, resident(pids), ticks))
    return Sample(at, when, read_cpu(), read_memory(), read_disk(home), tuple(instances))


def _percent(part: float, whole: float) -> float:
    if whole <= 0:
        return 0.0
    return round(min(max(part / whole * 100, 0.0), 100.0), 1)


@dataclass(frozen=True, slots=True)
class Usage:
    """The figures between two samples, every instance's; `wire` is what one user may see."""

    machine: Mapping[str, float | int]
    #: (owner, wire form) of each running instance
    instances: tuple[tuple[str, Mapping[str, object]], ...]
    at: str

    def instances_of(self, user: str) -> list[dict[str, object]]:
        """The wire forms of ``user``'s own running instances."""
        return [dict(i) for owner, i in self.instances if owner == user]

    def wire(self, user: str) -> dict[str, object]:
        """The machine's figures and ``user``'s own instances (docs/api.md "System usage")."""
        return {"machine": dict(self.machine), "instances": self.instances_of(user), "at": self.at}


def figures(before: Sample | None, now: Sample) -> Usage:
    """The figures of every instance in ``now``; CPU shares over ``before`` → ``now`` (0 without
    ``before``, or for an instance ``before`` did not see).

    A process tree's ticks can fall between samples (a child ended and was reaped: its ticks
    leave the sum), so a share is never below 0.
    """
    cpu = 0.0
    # every core's ticks between the samples: the machine's whole, the same clock as a process's
    elapsed_ticks = 0 if before is None else now.cpu.total - before.cpu.total
    if before is not None:
        cpu = _percent(
            (now.cpu.total - now.cpu.idle) - (before.cpu.total - before.cpu.idle), elapsed_ticks
        )
    earlier = {} if before is None else {i.running.instance_id: i for i in before.instances}
    instances: list[tuple[str, Mapping[str, object]]] = []
    for item in now.instances:
        prev = earlier.get(item.running.instance_id)
        share = 0.0
        if prev is not None and prev.running.pid == item.running.pid:
            share = _percent(item.ticks - prev.ticks, elapsed_ticks)
        wire = {
            "instanceId": item.running.instance_id,
            "appId": item.running.app_id,
            "memoryBytes": item.memory,
            "cpuPercent": share,
        }
        instances.append((item.running.owner, wire))
    machine = {
        "cpuPercent": cpu,
        "cores": now.cpu.cores,
        "memoryUsedBytes": now.memory.used,
        "memoryTotalBytes": now.memory.total,
        "diskUsedBytes": now.disk.used,
        "diskTotalBytes": now.disk.total,
    }
    return Usage(machine, tuple(instances), now.when)
