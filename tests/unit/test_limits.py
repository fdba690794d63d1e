"""The pure parts of resource limits: the limits an instance gets, the cgroup files they mean
for v1 and v2, the OOM count and the shell's own cgroup as the kernel reports them."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from atrium.errors import ManifestInvalid
from atrium.lifecycle.limits import (
    CgroupHost,
    Cgroups,
    Limits,
    Write,
    ceilings_of,
    detect_cgroups,
    effective_limits,
    oom_kills,
    own_cgroups,
    rlimit_plan,
    shell_key,
    v1_writes,
    v2_writes,
)
from atrium.manifest import parse_manifest

REPO = Path(__file__).resolve().parents[2]
CEILINGS = Limits(memory_mib=1024, cpu_milli=None, pids=256)


def test_a_manifest_value_is_capped_by_the_shells_ceiling() -> None:
    asked = Limits(memory_mib=4096, cpu_milli=500, pids=16)
    assert effective_limits(asked, CEILINGS) == Limits(1024, 500, 16)


def test_a_value_the_manifest_leaves_out_takes_the_ceiling() -> None:
    assert effective_limits(None, CEILINGS) == CEILINGS
    assert effective_limits(Limits(pids=10), CEILINGS) == Limits(1024, None, 10)


def test_zero_in_the_settings_means_no_ceiling() -> None:
    assert ceilings_of(0, 0, 0) == Limits(None, None, None)
    assert ceilings_of(512, 250, 64) == Limits(512, 250, 64)


def test_v1_writes_memory_with_swap_pids_and_the_cpu_quota() -> None:
    assert v1_writes(Limits(64, 500, 16)) == [
        Write("memory", "memory.limit_in_bytes", str(64 << 20)),
        Write("memory", "memory.memsw.limit_in_bytes", str(64 << 20), optional=True),
        Write("pids", "pids.max", "16"),
        Write("cpu", "cpu.cfs_period_us", "100000"),
        Write("cpu", "cpu.cfs_quota_us", "50000"),
    ]


def test_v2_writes_one_folder_without_swap() -> None:
    assert v2_writes(Limits(64, 2000, 16)) == [
        Write("", "memory.max", str(64 << 20)),
        Write("", "memory.swap.max", "0", optional=True),
        Write("", "pids.max", "16"),
        Write("", "cpu.max", "200000 100000"),
    ]


def test_no_limits_write_nothing_and_a_tiny_quota_is_the_kernels_minimum() -> None:
    assert v1_writes(Limits()) == v2_writes(Limits()) == []
    assert v2_writes(Limits(cpu_milli=1)) == [Write("", "cpu.max", "1000 100000")]


def test_the_oom_kill_count_of_v1_and_v2() -> None:
    assert oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n") == 2
    assert oom_kills("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n") == 1
    assert oom_kills("oom_kill_disable 0\nunder_oom 0\n") == 0


def test_the_shells_own_cgroups_v1_and_v2() -> None:
    text = "9:name=systemd:/\n8:pids:/a\n4:memory:/process_api/x\n1:cpu,cpuacct:/c\n0::/u\n"
    assert own_cgroups(text) == {
        "name=systemd": "/",
        "pids": "/a",
        "memory": "/process_api/x",
        "cpu": "/c",
        "cpuacct": "/c",
        "": "/u",
    }


def test_each_home_gets_its_own_key() -> None:
    assert shell_key(Path("/a")) != shell_key(Path("/b"))
    assert len(shell_key(Path("/a"))) == 12


MANIFEST = {"id": "test.x", "version": "1.0.0", "name": "X"}


def test_resources_are_read_from_the_manifest() -> None:
    manifest = parse_manifest({**MANIFEST, "resources": {"memoryMiB": 64, "pids": 16}}, None)
    assert manifest.resources is not None
    assert (manifest.resources.memory_mib, manifest.resources.pids) == (64, 16)
    assert manifest.resources.cpu_milli is None


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"memoryMiB": 0}, "resources.memoryMiB"),
        ({"memoryMiB": 10_000_000}, "resources.memoryMiB"),
        ({"pids": "many"}, "resources.pids"),
        ({"pids": True}, "resources.pids"),
        ({"cpuMilli": 1.5}, "resources.cpuMilli"),
        ({"cpuMilli": -1}, "resources.cpuMilli"),
    ],
)
def test_a_bad_resources_value_is_a_problem_naming_it(
    resources: dict[str, object], field: str
) -> None:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest({**MANIFEST, "resources": resources}, None)
    problems = caught.value.fields["problems"]
    assert [p["field"] for p in problems] == [field]


def test_v2_is_chosen_only_with_the_memory_pids_and_cpu_controllers(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io pids\n")
    lacking = detect_cgroups(root=tmp_path)
    assert lacking.version is None
    assert lacking.problem is not None
    assert "memory" in lacking.problem
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert detect_cgroups(root=tmp_path) == CgroupHost(2, {"": tmp_path})


def test_limits_not_enforced_make_no_cgroup_and_say_why(tmp_path: Path) -> None:
    cgroups = Cgroups(CgroupHost(None, {}, "no cgroup here"), tmp_path, Limits(64))
    assert not cgroups.enforced
    assert cgroups.enforcement == "rlimit"
    assert cgroups.make("x-1", Limits(64)) is None
    assert cgroups.describe() == (
        "resource limits held with rlimits only (memory per process, processes per app uid "
        "where apps run under their own, no CPU quota): no cgroup here"
    )


def test_the_rlimit_mode_makes_no_cgroup_even_where_one_could_be(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    host = CgroupHost(1, {"memory": tmp_path / "memory"})
    cgroups = Cgroups(host, tmp_path, Limits(64), mode="rlimit")
    assert cgroups.enforcement == "rlimit"
    assert cgroups.bases == []
    assert list((tmp_path / "memory").iterdir()) == []
    assert cgroups.problem is not None
    assert "ATRIUM_APP_LIMITS" in cgroups.problem


def test_rlimits_hold_memory_per_process_and_processes_only_under_an_own_uid() -> None:
    own = rlimit_plan(Limits(64, 500, 32), own_uid=True)
    assert own.rlimits == ((resource.RLIMIT_DATA, 64 << 20), (resource.RLIMIT_NPROC, 32))
    assert own.holds == Limits(64, None, 32, "rlimit")
    shared = rlimit_plan(Limits(64, 500, 32), own_uid=False)
    assert shared.rlimits == ((resource.RLIMIT_DATA, 64 << 20),)
    assert shared.holds == Limits(64, None, None, "rlimit")
    assert rlimit_plan(Limits(None, None, None), own_uid=True).rlimits == ()


def test_the_wire_says_how_the_limits_are_held() -> None:
    assert Limits(64, None, 16, "rlimit").wire() == {
        "memoryMiB": 64,
        "cpuMilli": None,
        "pids": 16,
        "enforcement": "rlimit",
    }


def test_an_rlimit_above_the_hard_limit_already_set_keeps_the_lower_one() -> None:
    """A shell started under a lower hard limit (a container's): the child keeps that one, never
    fails before exec (raising a hard limit is refused to an unprivileged process)."""
    script = (
        "import resource\n"
        "from atrium.lifecycle.limits import set_rlimits_in_child\n"
        "resource.setrlimit(resource.RLIMIT_DATA, (100 << 20, 100 << 20))\n"
        "import os\n"
        "if os.geteuid() == 0:\n"
        "    os.setgid(65534); os.setuid(65534)\n"
        "set_rlimits_in_child([(resource.RLIMIT_DATA, 200 << 20)])\n"
        "print(resource.getrlimit(resource.RLIMIT_DATA))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"({100 << 20}, {100 << 20})"
