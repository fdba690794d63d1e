"""What a killed shell's runs left is ended by the next shell's start on the same home.

A run holds the flock of its instance's lock file (``run/locks``) for as long as anything of it
runs; a sandbox whose bwrap was killed in its first milliseconds (before it asked to die with its
parent), or one whose shell was killed at that moment, keeps holding it, with its network. The
stragglers here are simulated as such a sandbox would be: detached (not below the shell), in a pid
and network namespace of their own, holding the lock file the instance's run would hold.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from atrium.lifecycle.runners.process import instance_lock
from tests.integration.conftest import StartShell, add_test_apps, wait_for

PLAIN = "test.plain.stdlib"

Hold = Callable[[Path], int]

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()
time.sleep(600)
"""


def holder_of(ready: Path) -> int:
    """The pid (on the host) of the python that wrote ``ready``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0] == os.fsencode(sys.executable) and os.fsencode(str(ready)) in argv:
            return int(entry.name)
    raise AssertionError(f"no process holds the lock for {ready}")


@pytest.fixture
def hold(tmp_path: Path) -> Iterator[Hold]:
    held: list[int] = []

    def start(path: Path) -> int:
        """A detached process holding ``path``'s flock, in namespaces of its own when root."""
        path.parent.mkdir(parents=True, exist_ok=True)
        ready = tmp_path / f"ready-{len(held)}"
        unshare = (
            ["unshare", "--net", "--pid", "--fork", "--kill-child"] if os.geteuid() == 0 else []
        )
        # setsid -f forks: the holder is re-parented away from this process (and its shells)
        subprocess.run(
            ["setsid", "-f", *unshare, sys.executable, "-I", "-c", HOLD, str(path), str(ready)],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(ready.exists, "the holder to lock its file")
        pid = holder_of(ready)
        held.append(pid)
        return pid

    yield start
    for pid in held:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_straggler_holding_an_instance_lock_is_ended_at_start(
    start_shell: StartShell, home: Path, system_apps: Path, hold: Hold
) -> None:
    add_test_apps(system_apps, PLAIN)
    data = home / "scopes" / "system" / "apps" / PLAIN / f"{PLAIN}-1"
    straggler = hold(instance_lock(data, home))
    # as root, its veth, named as a live shell's would be (pid 1), so no sweep by name removes
    # it: only the end of the straggler's namespace does
    veth = f"atv1x{secrets.token_hex(3)}"
    if os.geteuid() == 0:
        peer = ["peer", "name", "eth0", "netns", str(straggler)]
        subprocess.run(["ip", "link", "add", veth, "type", "veth", *peer], check=True)
    try:
        shell = start_shell()

        assert not running(straggler)
        gone = lambda: not Path(f"/sys/class/net/{veth}").exists()  # noqa: E731
        wait_for(gone, "the straggler's veth to go with its namespace")
    finally:
        subprocess.run(["ip", "link", "delete", veth], check=False, capture_output=True)
    with shell.client() as api:
        response = api.post("/api/instances", json={"appId": PLAIN})
        assert response.status_code == 200, response.text
        # its own instance, not one beside it
        assert (response.json()["instanceId"], response.json()["state"]) == (
            f"{PLAIN}-1",
            "started",
        )


def test_a_process_holding_another_file_is_never_touched(
    start_shell: StartShell, home: Path, tmp_path: Path, hold: Hold
) -> None:
    elsewhere = hold(tmp_path / "other-home" / "run" / "locks" / "0123456789abcdef")
    beside = hold(home / "run" / "not-a-run.lock")

    start_shell()

    assert running(elsewhere)
    assert running(beside)


def test_nothing_is_ended_while_another_process_holds_the_home(
    start_shell: StartShell, home: Path, system_apps: Path, hold: Hold
) -> None:
    # another shell serves this home (`atrium serve` holds run/serve.lock): the runs are its own
    other_shell = hold(home / "run" / "serve.lock")
    add_test_apps(system_apps, PLAIN)
    run = hold(instance_lock(home / "scopes" / "system" / "apps" / PLAIN / f"{PLAIN}-1", home))

    start_shell()

    assert running(other_shell)
    assert running(run)
