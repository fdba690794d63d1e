"""What an app can reach and how long it lives, through the real shell (issue 13 row 5, issue 14
row 4): real `atrium serve` processes killed with SIGKILL, real bwrap, real uid changes.

The fixture app ``test.probe.box`` (stdlib only) is written here: on start it records what it could do (its
uid, reading ``/etc/shadow`` and the shell's token, listing ``$ATRIUM_HOME``, the project
checkout and the shell's virtualenv, writing its data folder) into ``$OS_DATA_DIR/probe.json``;
with ``fork.json`` in its directory it double-forks a ``setsid`` grandchild that listens on a
port (what a daemonising helper does) and records both pids in ``$OS_DATA_DIR/pids.json``.

Under the process runner as root the app's uid must reach its interpreter and folders: the
tests put ``$ATRIUM_HOME`` and the system apps in a folder every user may search, and name a
system interpreter when the shell's own lives under a private folder (``/root/.pyenv`` here).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.lifecycle.runners.bwrap import bwrap_works
from atrium.lifecycle.runners.process import instance_lock
from atrium.lifecycle.spawning import app_user, python_command
from tests.conftest import REPO_DIR
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

APP = "test.probe.box"
DEADLINE = 20.0

SERVER = r"""
import http.server, json, os, socket, sys, time
from pathlib import Path

here = Path(__file__).resolve().parent
data = Path(os.environ["OS_DATA_DIR"])
paths = json.loads((here / "paths.json").read_text())


def attempt(action):
    try:
        action()
    except Exception as err:
        return type(err).__name__
    return "ok"


report = {
    "uid": os.getuid(),
    "euid": os.geteuid(),
    "gid": os.getgid(),
    "groups": os.getgroups(),
    "status": [l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(("Uid", "CapEff"))],
    "shadow": attempt(lambda: open("/etc/shadow").read()),
    "list": {p: attempt(lambda p=p: os.listdir(p)) for p in paths["list"]},
    "read": {p: attempt(lambda p=p: open(p).read()) for p in paths["read"]},
    "writeData": attempt(lambda: (data / "mine").write_text("x")),
    "sdk": attempt(lambda: __import__("atrium.sdk")) == "ok" and sys.modules["atrium.sdk"].__file__,
    "sysPath": sys.path,
}
(data / "probe.json").write_text(json.dumps(report))

if (here / "fork.json").exists():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            (data / "grandchild.json").write_text(
                json.dumps({"pid": os.getpid(), "port": listener.getsockname()[1]})
            )
            while True:
                time.sleep(60)
        os._exit(0)
    os.wait()
    (data / "app.json").write_text(json.dumps({"pid": os.getpid()}))



class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, body):
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self.answer({"appId": os.environ["OS_APP_ID"], "instanceId": os.environ["OS_INSTANCE_ID"]})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer({"ok": True})

    def log_message(self, format, *args):
        pass


http.server.ThreadingHTTPServer((os.environ["OS_HOST"], int(os.environ["OS_PORT"])), Handler).serve_forever()
"""


def searchable_by_others(path: Path) -> bool:
    """Can a user that is not root reach ``path`` (every folder above it searchable by others)?"""
    return all(p.stat().st_mode & stat.S_IXOTH for p in Path(path).parents)


def app_python(runner: str) -> str:
    """``python3`` (the shell's base interpreter) unless the process runner's app uid cannot
    reach it: then the system's own, which every user may run."""
    if (
        runner == "process"
        and os.geteuid() == 0
        and not searchable_by_others(Path(python_command()))
    ):
        return "/usr/bin/python3"
    return "python3"


def runners() -> list[Any]:
    problem = bwrap_works()
    return [
        pytest.param("process"),
        pytest.param(
            "bwrap",
            marks=pytest.mark.skipif(problem is not None, reason=f"no bubblewrap: {problem}"),
        ),
    ]


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A folder every user may search (not list): pytest's own tmp folders are 0700."""
    base = Path(tempfile.mkdtemp(prefix="atrium-confinement-"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def write_app(system_apps: Path, runner: str, *, fork: bool) -> Path:
    app_dir = system_apps / APP
    app_dir.mkdir(parents=True)
    manifest = {
        "id": APP,
        "name": "Probe",
        "version": "1.0.0",
        "entrypoint": [app_python(runner), "server.py"],
        "startTimeoutMs": 10000,
    }
    (app_dir / "app.manifest.json").write_text(json.dumps(manifest))
    (app_dir / "server.py").write_text(SERVER)
    if fork:
        (app_dir / "fork.json").write_text("{}")
    for folder in (system_apps, app_dir):
        folder.chmod(0o755)
    return app_dir


@dataclass
class Served:
    """`atrium serve` as a real process."""

    proc: subprocess.Popen[str]
    home: Path
    url: str
    token: str

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=DEADLINE)

    def data_dir(self, instance: str = f"{APP}-1") -> Path:
        return self.home / "scopes" / "system" / "apps" / APP / instance


ServeFactory = Callable[..., Served]


@pytest.fixture
def serve(open_base: Path) -> Iterator[ServeFactory]:
    started: list[subprocess.Popen[str]] = []

    def start(runner: str, *, fork: bool = False) -> Served:
        home = open_base / "home"
        system_apps = open_base / "system-apps"
        if not system_apps.exists():
            write_app(system_apps, runner, fork=fork)
            paths = {
                "list": [str(home), str(REPO_DIR), sys.prefix, str(home / "run")],
                "read": [str(home / "run" / "token")],
            }
            (system_apps / APP / "paths.json").write_text(json.dumps(paths))
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")},
            "ATRIUM_HOME": str(home),
            "ATRIUM_PORT": "0",
            "ATRIUM_HOST": "127.0.0.1",
            "ATRIUM_RUNNER": runner,
            "ATRIUM_SYSTEM_APPS": str(system_apps),
            # the app on the host's network: its processes are found by the loopback
            # OS_SHELL_URL in their environment and its port on 127.0.0.1 (what a kill -9 of
            # the shell leaves of a network of its own: test_app_network)
            "ATRIUM_APP_NETWORK_APPS": "images",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "atrium", "serve"],
            env=env,
            cwd=REPO_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started.append(proc)
        assert proc.stdout is not None
        deadline = time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < deadline, "serve printed no login URL"
            line = proc.stdout.readline()
            assert line, f"serve ended with {proc.wait()}"
            if "login?token=" in line:
                break
        url = (home / "run" / "url").read_text().strip()
        token = (home / "run" / "token").read_text().strip()
        return Served(proc, home, url, token)

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def launch(served: Served) -> dict[str, Any]:
    with served.client() as api:
        response = api.post("/api/instances", json={"appId": APP})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def read_json(path: Path) -> Any:
    return wait_for(lambda: path.exists() and json.loads(path.read_text()), f"{path.name}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def started_by(served: Served) -> set[int]:
    """Host pids of every live process holding this shell's URL in its environment: the app,
    its grandchild, and the keeper or bwrap (pids inside a sandbox are not the host's)."""
    marker = f"OS_SHELL_URL=http://127.0.0.1:{httpx.URL(served.url).port}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0") and alive(int(entry.name)):
                found.add(int(entry.name))
    return found


def app_processes(served: Served) -> tuple[set[int], int]:
    """The host pids of the app's processes and the port its setsid grandchild listens on."""
    grandchild = read_json(served.data_dir() / "grandchild.json")
    read_json(served.data_dir() / "app.json")
    assert listening(grandchild["port"])
    pids = started_by(served)
    assert len(pids) >= 2, pids  # the app and its grandchild (and the keeper or bwrap)
    return pids, grandchild["port"]


def all_gone(served: Served, port: int) -> bool:
    return not started_by(served) and not listening(port)


# --- issue 13 row 5: no root, nothing of the host -----------------------------------------------


@pytest.mark.parametrize("runner", runners())
def test_an_app_is_not_root_and_reads_nothing_private(runner: str, serve: ServeFactory) -> None:
    served = serve(runner)
    launch(served)

    probe = read_json(served.data_dir() / "probe.json")

    assert probe["shadow"] != "ok", probe
    assert all(result != "ok" for result in probe["read"].values()), probe
    home = str(served.home)
    assert probe["list"][home] != "ok", probe
    assert probe["list"][str(served.home / "run")] != "ok", probe
    assert probe["writeData"] == "ok", probe
    if os.geteuid() == 0:
        user = app_user(APP)
        assert user is not None
        assert probe["uid"] == probe["euid"] == user.uid != 0, probe
        assert probe["gid"] == user.gid
        assert probe["groups"] in ([], [user.gid]), probe
        mine = served.data_dir() / "mine"
        assert (mine.stat().st_uid, mine.stat().st_gid) == (user.uid, user.gid)
        assert stat.S_IMODE(served.data_dir().stat().st_mode) == 0o700


@pytest.mark.skipif(bwrap_works() is not None, reason=f"no bubblewrap: {bwrap_works()}")
def test_the_sandbox_holds_the_sdk_but_not_the_checkout_or_the_shells_virtualenv(
    serve: ServeFactory,
) -> None:
    served = serve("bwrap")
    launch(served)

    probe = read_json(served.data_dir() / "probe.json")

    assert probe["list"][str(REPO_DIR)] != "ok", probe
    assert probe["list"][sys.prefix] != "ok", probe
    assert probe["sdk"] == "/run/atrium/python/atrium/sdk.py"
    assert "CapEff:\t0000000000000000" in probe["status"], probe


# --- issue 14 row 4: nothing outlives the shell, one run per data folder ------------------------


@pytest.mark.parametrize("runner", runners())
def test_after_kill_9_of_the_shell_nothing_of_its_apps_survives(
    runner: str, serve: ServeFactory
) -> None:
    served = serve(runner, fork=True)
    launch(served)
    _, port = app_processes(served)

    served.proc.kill()
    served.proc.wait()

    wait_for(lambda: all_gone(served, port), "the app and its setsid grandchild to go")


@pytest.mark.parametrize("runner", runners())
def test_after_sigterm_of_the_shell_nothing_of_its_apps_survives(
    runner: str, serve: ServeFactory
) -> None:
    served = serve(runner, fork=True)
    launch(served)
    _, port = app_processes(served)

    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(timeout=DEADLINE) == 0

    wait_for(lambda: all_gone(served, port), "the app and its setsid grandchild to go")


@pytest.mark.parametrize("runner", runners())
def test_destroy_ends_a_setsid_grandchild_too(runner: str, serve: ServeFactory) -> None:
    served = serve(runner, fork=True)
    instance = launch(served)
    _, port = app_processes(served)

    with served.client() as api:
        response = api.delete(f"/api/instances/{instance['instanceId']}")
    assert response.status_code == 200, response.text

    wait_for(lambda: all_gone(served, port), "the app and its setsid grandchild to go")


@pytest.mark.parametrize("runner", runners())
def test_a_restart_after_kill_9_runs_the_instance_again_once(
    runner: str, serve: ServeFactory
) -> None:
    served = serve(runner, fork=True)
    launch(served)
    first, port = app_processes(served)
    served.proc.kill()
    served.proc.wait()
    wait_for(lambda: all_gone(served, port), "the first run to go")
    (served.data_dir() / "app.json").unlink()
    (served.data_dir() / "grandchild.json").unlink()

    again = serve(runner, fork=True)
    instance = launch(again)

    assert instance["instanceId"] == f"{APP}-1"
    pids, _ = app_processes(again)
    assert pids.isdisjoint(first)


@pytest.mark.parametrize("runner", runners())
def test_a_data_folder_in_use_is_not_given_to_a_second_run(
    runner: str, serve: ServeFactory
) -> None:
    served = serve(runner)
    data = served.data_dir()
    data.mkdir(parents=True)
    # a straggler of an earlier run, holding the instance's lock
    lock = instance_lock(data, served.home)
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = os.open(lock, os.O_RDONLY | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with served.client() as api:
            response = api.post("/api/instances", json={"appId": APP})
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert (error["code"], error["cause"]) == ("spawn_failed", "locked")
        assert str(data) in error["message"]
        assert "in use" in error["message"]
    finally:
        os.close(holder)

    with served.client() as api:
        retried = api.post(f"/api/instances/{APP}-1/retry")
    assert retried.status_code == 200, retried.text
    assert re.fullmatch(r"started", retried.json()["state"])
