"""The runner contract (tests/runner_contract.py) on the local runners, process and bwrap: one
real shell per runner for the module."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atrium.lifecycle.runners.bwrap import bwrap_works
from atrium.lifecycle.runners.process import descendants, is_alive, read_stat
from atrium.lifecycle.spawning import python_command
from tests.conftest import REPO_DIR
from tests.integration.conftest import RunningShell, add_test_apps, launch_shell
from tests.runner_contract import (
    PROBE,
    Harness,
    RunnerContract,
    Traces,
    cgroups_usable_here,
)

pytestmark = pytest.mark.integration

#: the interpreter an app runs where the apps' uid cannot reach the shell's own
SYSTEM_PYTHON = "/usr/bin/python3"


def cgroup_folders(pid: int) -> list[Path]:
    """The cgroup folders (every hierarchy) a running process is in, below /sys/fs/cgroup."""
    folders: list[Path] = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hid, names, path = line.split(":", 2)
        if hid == "0":
            folders.append(Path("/sys/fs/cgroup" + path))
        else:
            for name in names.split(","):
                if (Path("/sys/fs/cgroup") / name).is_dir():
                    folders.append(Path("/sys/fs/cgroup") / name / path.lstrip("/"))
    return [f for f in folders if f.is_dir()]


def interpreter_out_of_reach() -> str | None:
    """Why an app's uid cannot run the apps' interpreter on the process runner (no sandbox binds
    it in; as root the app runs under a uid of its own), or None."""
    if os.geteuid() != 0:
        return None
    command = Path(python_command())
    for folder in command.parents:
        if not folder.stat().st_mode & stat.S_IXOTH:
            return f"the apps' interpreter {command} is below {folder}, which other users cannot search"
    return None


def port_held(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class LocalHarness(Harness):
    """A shell on a local runner: processes, cgroups and ports of this machine."""

    def __init__(self, runner: str, home: Path, system_apps: Path, **settings: Any) -> None:
        self.runner = runner
        self.settings = settings
        self.home = home
        self.system_apps = system_apps
        self.limits_missing = cgroups_usable_here()
        self._client: Any = None
        self._start()

    def _start(self) -> None:
        self.shell: RunningShell = launch_shell(
            self.home, self.system_apps, runner=self.runner, **self.settings
        )
        self._client = self.shell.client(timeout=30)
        self.api = self._client

    def close(self) -> None:
        self._client.close()
        if self.shell.thread.is_alive():
            self.shell.stop()

    def kill_from_outside(self, instance: dict[str, Any]) -> None:
        os.kill(
            ([instance["pid"]] + [s.pid for s in descendants(instance["pid"])])[-1], signal.SIGKILL
        )

    def output(self, instance_id: str) -> str:
        log = self.home / "run" / "logs" / f"{instance_id}.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def traces(self, instance: dict[str, Any]) -> Traces:
        pid = instance["pid"]
        tree = [read_stat(pid), *descendants(pid)]
        processes = [(s.pid, s.start) for s in tree if s is not None]
        # the deepest process is the app's own server: its cgroup is the instance's
        cgroups = [] if self.limits_missing else cgroup_folders(processes[-1][0])
        if not self.limits_missing:
            assert any(f.name == instance["instanceId"] for f in cgroups), cgroups
        found = {"processes": processes, "port": instance["port"], "cgroups": cgroups}
        return Traces(instance["instanceId"], found)

    def leftovers(self, traces: Traces) -> list[str]:
        left: list[str] = []
        for pid, start in traces.found["processes"]:
            now = read_stat(pid)
            if now is not None and now.start == start and is_alive(now):
                left.append(f"process {pid}")
        left += [
            f"cgroup {f}"
            for f in traces.found["cgroups"]
            if f.name == traces.instance_id and f.exists()
        ]
        if port_held(traces.found["port"]):
            left.append(f"port {traces.found['port']}")
        return left

    def kept(self, traces: Traces) -> list[str]:
        return []  # a local instance's data folder is the lifecycle's business, not the runner's

    def restart(self) -> None:
        self._client.close()
        self.shell.stop()
        self._start()


@pytest.fixture(scope="module", params=["process", "bwrap", "bwrap-own-network"])
def harness(request: pytest.FixtureRequest) -> Iterator[LocalHarness]:
    runner: str = request.param
    settings: dict[str, str] = {}
    if runner == "bwrap-own-network":
        # each instance in a namespace of its own (atrium.lifecycle.network), on a range of the
        # tests' own: another shell on this machine may hold the default one
        if os.geteuid() != 0:
            pytest.skip("the instances' own network needs a root shell")
        runner, settings = "bwrap", {"app_network": "10.216.0.0/16", "app_network_apps": "all"}
    if runner == "bwrap" and (problem := bwrap_works()) is not None:
        pytest.skip(f"bubblewrap does not work here: {problem}")
    out_of_reach = interpreter_out_of_reach() if runner == "process" else None
    if out_of_reach is not None and not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"the process runner cannot run an app here as root: {out_of_reach}")
    # a folder of its own, not pytest's: another pytest session makes /tmp/pytest-of-<user>
    # 0700 again when it starts, and the process runner's app uid must search its way in (as
    # root it runs under a uid of its own; the runner opens the folders below the home itself)
    base = Path(tempfile.mkdtemp(prefix=f"atrium-contract-{runner}-"))
    base.chmod(0o711)
    system_apps = base / "system-apps"
    shutil.copytree(REPO_DIR / "apps", system_apps)
    add_test_apps(system_apps, PROBE)
    if out_of_reach is not None:
        # as root the app runs under a uid of its own: the system's python3 then, as the
        # lifecycle bench does (the process runner binds nothing in, unlike bwrap)
        manifest = system_apps / PROBE / "app.manifest.json"
        data = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**data, "entrypoint": [SYSTEM_PYTHON, "server.py"]}))
    made = LocalHarness(runner, base / "home", system_apps, **settings)
    try:
        yield made
    finally:
        with contextlib.suppress(Exception):
            made.close()
        shutil.rmtree(base, ignore_errors=True)


class TestLocalRunnerContract(RunnerContract):
    """process and bwrap keep the runner contract."""
