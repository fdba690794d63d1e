"""The usage figures' parsers on this machine's real /proc, and the shares made of two samples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atrium import usage
from atrium.usage import CpuTimes, Disk, InstanceSample, Memory, ProcessFigures, Running, Sample


def test_proc_stat_gives_busy_and_idle_ticks_and_the_cores() -> None:
    cpu = usage.read_cpu()
    assert cpu.total > cpu.idle > 0
    assert cpu.cores == len(
        [line for line in Path("/proc/stat").read_text().splitlines() if line[3:4].isdigit()]
    )


def test_proc_stat_sums_user_to_steal_and_counts_iowait_as_idle() -> None:
    text = "cpu  10 1 5 100 4 0 2 3 7 0\ncpu0 5 0 2 50 2 0 1 1 3 0\ncpu1 5 1 3 50 2 0 1 2 4 0\n"
    assert usage.parse_proc_stat(text) == CpuTimes(total=125, idle=104, cores=2)
    with pytest.raises(ValueError, match="no cpu line"):
        usage.parse_proc_stat("intr 1 2 3\n")


def test_meminfo_used_is_total_less_available() -> None:
    text = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    600 kB\n"
    assert usage.parse_meminfo(text) == Memory(used=400 * 1024, total=1000 * 1024)
    real = usage.read_memory()
    assert 0 < real.used < real.total


def test_pid_stat_reads_a_name_with_spaces_and_parentheses() -> None:
    text = b"4242 (a (b) c) S 17 4242 4242 0 -1 4194560 1 0 0 0 30 12 0 0 20 0 1 0 99 0 0"
    assert usage.parse_pid_stat(text) == ProcessFigures(pid=4242, ppid=17, ticks=42)


def test_this_process_is_found_with_its_parent_and_its_resident_set() -> None:
    processes = usage.read_processes()
    me = processes[os.getpid()]
    assert me.ppid == os.getppid()
    assert os.getpid() in usage.tree(os.getppid(), processes)
    ballast = b"\x01" * (32 << 20)  # written, so resident
    assert usage.resident([os.getpid()]) >= len(ballast)
    assert usage.resident([os.getpid(), 0]) == usage.resident([os.getpid()])  # no pid 0: nothing


def test_a_tree_is_its_root_and_everything_below_it() -> None:
    processes = {
        p.pid: p
        for p in (
            ProcessFigures(1, 0, 0),
            ProcessFigures(10, 1, 0),
            ProcessFigures(11, 10, 0),
            ProcessFigures(12, 11, 0),
            ProcessFigures(20, 1, 0),
        )
    }
    assert sorted(usage.tree(10, processes)) == [10, 11, 12]
    assert usage.tree(99, processes) == []


def test_the_disk_is_the_filesystem_holding_the_path(tmp_path: Path) -> None:
    disk = usage.read_disk(tmp_path)
    st = os.statvfs(tmp_path)
    assert disk.total == st.f_blocks * st.f_frsize
    assert 0 < disk.used <= disk.total


def _sample(busy: int, idle: int, *instances: tuple[str, str, int, int, int]) -> Sample:
    return Sample(
        at=0.0,
        when="2026-01-01T00:00:00Z",
        cpu=CpuTimes(busy + idle, idle, 4),
        memory=Memory(1, 2),
        disk=Disk(3, 4),
        instances=tuple(
            InstanceSample(Running(iid, "com.example.a", owner, pid), memory, ticks)
            for iid, owner, pid, memory, ticks in instances
        ),
    )


def test_shares_are_of_the_whole_machine_between_two_samples() -> None:
    before = _sample(100, 300, ("i-1", "alice", 5, 10, 50), ("i-2", "bob", 6, 10, 0))
    now = _sample(
        300, 600, ("i-1", "alice", 5, 20, 150), ("i-2", "bob", 7, 30, 40), ("i-3", "bob", 8, 1, 9)
    )
    result = usage.figures(before, now)
    # 200 of 500 ticks busy; alice's instance used 100 of them
    assert result.machine["cpuPercent"] == 40.0
    assert result.wire("alice")["instances"] == [
        {"instanceId": "i-1", "appId": "com.example.a", "memoryBytes": 20, "cpuPercent": 20.0}
    ]
    # i-2 started again (another pid) and i-3 is new: no share yet, never another's ticks
    assert [i["cpuPercent"] for i in result.instances_of("bob")] == [0.0, 0.0]
    assert result.wire("carol")["instances"] == []
    assert result.wire("carol")["machine"] == result.wire("alice")["machine"]


def test_a_tree_whose_ticks_fell_has_no_negative_share_and_one_sample_has_none() -> None:
    before = _sample(100, 100, ("i-1", "alice", 5, 10, 90))
    now = _sample(200, 200, ("i-1", "alice", 5, 10, 40))
    assert usage.figures(before, now).instances_of("alice")[0]["cpuPercent"] == 0.0
    alone = usage.figures(None, now)
    assert alone.machine["cpuPercent"] == 0.0
    assert alone.instances_of("alice")[0]["cpuPercent"] == 0.0
