"""The runner contract, against every runner this machine can run: real processes, real bwrap.

The app is a small stdlib HTTP server written into tmp_path: ``/env`` answers its environment,
``/write`` writes into ``$OS_DATA_DIR``, ``/write-app`` into its own directory, ``/run`` runs a
command, ``/ls`` lists a directory, ``/read`` reads a file. Flags make it exit at once, ignore
SIGTERM or leave a grandchild behind (a Python ``sleep``: the sandbox has no ``sleep`` command).
On SIGTERM it writes ``$OS_DATA_DIR/terminated`` and exits 0.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from atrium.errors import SpawnFailed
from atrium.lifecycle.limits import InstanceCgroup
from atrium.lifecycle.ports import PortAllocator
from atrium.lifecycle.runners import AppUser, ExitStatus, Runner, RunningApp, SpawnSpec
from atrium.lifecycle.runners.bwrap import BwrapRunner, bwrap_works, classify_early_exit
from atrium.lifecycle.runners.process import ProcessRunner, _die_with
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

DEADLINE: Final = 10.0

SERVER: Final = r"""
import http.server, json, os, signal, subprocess, sys, urllib.parse

args = sys.argv[1:]
data = os.environ["OS_DATA_DIR"]
print("server starting, OS_* names:", sorted(k for k in os.environ if k.startswith("OS_")), flush=True)
print("server stderr line", file=sys.stderr, flush=True)
if "--exit" in args:
    sys.exit(int(args[args.index("--exit") + 1]))
if "--ignore-term" in args:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    def on_term(signum, frame):
        with open(os.path.join(data, "terminated"), "w") as f:
            f.write("SIGTERM")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
if "--grandchild" in args:
    marker = args[args.index("--grandchild") + 1]
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", marker])
if "--daemon" in args:  # double fork and setsid: what a daemonising helper does
    marker = args[args.index("--daemon") + 1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)", marker])
        os._exit(0)
    os.wait()


def attempt(action):
    try:
        return action()
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"}


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, timeout=30)
    return {"returncode": done.returncode, "stdout": done.stdout.decode(errors="replace")}


def write(path):
    with open(path, "w") as f:
        f.write("written by the app")
    return {"ok": True}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/health":
            body = {"ok": True}
        elif url.path == "/env":
            body = dict(os.environ)
        elif url.path == "/write":
            body = attempt(lambda: write(os.path.join(data, query["name"])))
        elif url.path == "/write-app":
            body = attempt(lambda: write(os.path.join(os.getcwd(), "written")))
        elif url.path == "/run":
            body = attempt(lambda: run([query["cmd"], *query.get("args", "").split()]))
        elif url.path == "/read":
            body = attempt(lambda: {"text": open(query["path"]).read()})
        elif url.path == "/ls":
            body = attempt(lambda: {"names": sorted(os.listdir(query["path"]))})
        else:
            self.send_error(404)
            return
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format, *args):
        pass


server = http.server.HTTPServer((os.environ["OS_HOST"], int(os.environ["OS_PORT"])), Handler)
print("serving on", server.server_address, flush=True)
server.serve_forever()
"""


def runner_ids() -> list[Any]:
    problem = bwrap_works()
    return [
        pytest.param("process"),
        pytest.param(
            "bwrap",
            marks=pytest.mark.skipif(
                problem is not None, reason=f"bubblewrap does not work here: {problem}"
            ),
        ),
    ]


def make_runner(name: str) -> Runner:
    return BwrapRunner() if name == "bwrap" else ProcessRunner()


only_bwrap = pytest.mark.skipif(
    bwrap_works() is not None, reason=f"bubblewrap does not work here: {bwrap_works()}"
)

SpecFactory = Callable[..., SpawnSpec]


@pytest.fixture(params=runner_ids())
def runner_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def runner(runner_name: str) -> Runner:
    return make_runner(runner_name)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    path = tmp_path / "apps" / "com.example.probe"
    path.mkdir(parents=True)
    (path / "server.py").write_text(SERVER)
    return path


@pytest.fixture
def ports() -> PortAllocator:
    return PortAllocator()


@pytest.fixture
def make_spec(tmp_path: Path, app_dir: Path, ports: PortAllocator) -> SpecFactory:
    def make(*flags: str, **changes: Any) -> SpawnSpec:
        port = ports.reserve()
        options: dict[str, Any] = {
            "app_id": "com.example.probe",
            "instance_id": "inst-1",
            "app_dir": app_dir,
            "argv": [sys.executable, str(app_dir / "server.py"), *flags],
            "env": {
                "OS_APP_ID": "com.example.probe",
                "OS_INSTANCE_ID": "inst-1",
                "OS_HOST": "127.0.0.1",
                "OS_PORT": str(port),
                "PORT": str(port),
                "OS_APP_TOKEN": "token-for-the-test",
            },
            "data_dir": tmp_path / "runtime" / "inst-1",
            "host": "127.0.0.1",
            "port": port,
            "log_path": tmp_path / "logs" / "inst-1.log",
            "ro_paths": (Path(sys.prefix), Path(sys.base_prefix)),
        }
        options.update(changes)
        return SpawnSpec(**options)

    return make


@pytest.fixture
async def started() -> AsyncIterator[list[RunningApp]]:
    """Every app a test starts; stopped at teardown whatever the test did."""
    apps: list[RunningApp] = []
    yield apps
    for app in apps:
        await app.stop(grace=0.5)


Spawn = Callable[[Runner, SpawnSpec], Any]


@pytest.fixture
def spawn(started: list[RunningApp]) -> Spawn:
    async def spawn(runner: Runner, spec: SpawnSpec) -> RunningApp:
        app = await runner.spawn(spec)
        started.append(app)
        return app

    return spawn


async def until_answering(app: RunningApp, spec: SpawnSpec, client: httpx.AsyncClient) -> None:
    """Poll ``/health`` until the app answers (fails with the log if it exits first)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while True:
        if app.status is not None:
            log = spec.log_path.read_text(errors="replace")
            raise AssertionError(f"the app exited with {app.status}; its log:\n{log}")
        try:
            if (await client.get("/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if loop.time() > deadline:
            raise AssertionError(f"the app did not answer within {DEADLINE} s")
        await asyncio.sleep(0.02)


async def get_json(app: RunningApp, spec: SpawnSpec, path: str, /, **params: str) -> Any:
    """GET ``path`` once the app answers; the decoded JSON body."""
    base_url = f"http://{app.host}:{app.port}"
    async with httpx.AsyncClient(base_url=base_url, timeout=DEADLINE, trust_env=False) as client:
        await until_answering(app, spec, client)
        response = await client.get(path, params=params)
        response.raise_for_status()
        return response.json()


def processes_with(marker: str) -> list[int]:
    """Pids of running processes whose command line holds ``marker`` (a zombie has none)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry.name))
    return found


async def eventually(predicate: Callable[[], object], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def data_dir_seen_by(runner_name: str, spec: SpawnSpec) -> str:
    return "/data" if runner_name == "bwrap" else str(spec.data_dir)


KILLED_BY_SIGKILL: Final[Mapping[str, int]] = {
    "process": -signal.SIGKILL,  # asyncio's convention for a signal
    "bwrap": 128 + signal.SIGKILL,  # bwrap exits with the shell's convention
}


# --- the contract, every runner ---------------------------------------------------------------


async def test_app_answers_with_the_given_environment_and_nothing_of_the_shell(
    runner_name: str,
    runner: Runner,
    make_spec: SpecFactory,
    spawn: Spawn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ATRIUM_TEST_SHELL_ONLY", "must not leak")
    spec = make_spec()
    app = await spawn(runner, spec)
    assert (app.host, app.port) == (spec.host, spec.port)
    assert app.pid > 0
    assert app.status is None

    env = await get_json(app, spec, "/env")

    for name, value in spec.env.items():
        assert env[name] == value
    assert env["OS_DATA_DIR"] == data_dir_seen_by(runner_name, spec)
    assert "ATRIUM_TEST_SHELL_ONLY" not in env
    if runner_name == "bwrap":
        assert env["HOME"] == "/data"
        assert env["PATH"] == "/usr/bin"


async def test_a_file_written_into_the_data_dir_appears_on_the_host(
    runner: Runner, make_spec: SpecFactory, spawn: Spawn
) -> None:
    spec = make_spec()
    app = await spawn(runner, spec)

    assert await get_json(app, spec, "/write", name="x") == {"ok": True}

    assert (spec.data_dir / "x").read_text() == "written by the app"


async def test_stop_sends_sigterm_first_and_returns_the_exit_code(
    runner: Runner, make_spec: SpecFactory, spawn: Spawn
) -> None:
    spec = make_spec()
    app = await spawn(runner, spec)
    await get_json(app, spec, "/health")

    status = await app.stop(grace=DEADLINE)

    assert status == ExitStatus(0, "exited")  # the app's SIGTERM handler exits 0
    assert (spec.data_dir / "terminated").read_text() == "SIGTERM"
    assert app.status == status
    assert await app.wait() == status


async def test_stop_kills_every_process_of_the_app(
    runner: Runner, make_spec: SpecFactory, spawn: Spawn
) -> None:
    marker = f"atrium-grandchild-{uuid.uuid4().hex}"
    spec = make_spec("--grandchild", marker)
    app = await spawn(runner, spec)
    await get_json(app, spec, "/health")
    await eventually(lambda: processes_with(marker), "the grandchild to start")

    await app.stop(grace=DEADLINE)

    assert processes_with(marker) == []


async def test_stop_kills_a_double_forked_setsid_grandchild(
    runner: Runner, make_spec: SpecFactory, spawn: Spawn
) -> None:
    marker = f"atrium-daemon-{uuid.uuid4().hex}"
    spec = make_spec("--daemon", marker)
    app = await spawn(runner, spec)
    await get_json(app, spec, "/health")
    await eventually(lambda: processes_with(marker), "the daemon to start")

    await app.stop(grace=DEADLINE)

    assert processes_with(marker) == []


async def test_a_second_spawn_on_a_data_dir_in_use_fails_as_locked(
    runner: Runner, make_spec: SpecFactory, spawn: Spawn
) -> None:
    spec = make_spec()
    first = await spawn(runner, spec)
    await get_json(first, spec, "/health")

    with pytest.raises(SpawnFailed) as caught:
        await runner.spawn(make_spec(data_dir=spec.data_dir))

    assert caught.value.fields["cause"] == "locked"
    assert str(spec.data_dir) in caught.value.message
    await first.stop(grace=DEADLINE)
    again = await spawn(runner, make_spec(data_dir=spec.data_dir))
    await get_json(again, spec, "/health")


async def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(
    runner_name: str, runner: Runner, make_spec: SpecFactory, spawn: Spawn
) -> None:
    spec = make_spec("--ignore-term")
    app = await spawn(runner, spec)
    await get_json(app, spec, "/health")

    status = await app.stop(grace=0.5)

    # the shell's own kill is how a stop ends, not a kill from outside
    assert status == ExitStatus(KILLED_BY_SIGKILL[runner_name], "exited")
    assert not (spec.data_dir / "terminated").exists()


async def test_stop_is_idempotent_and_shared_by_concurrent_callers(
    runner: Runner, make_spec: SpecFactory, spawn: Spawn
) -> None:
    spec = make_spec()
    app = await spawn(runner, spec)
    await get_json(app, spec, "/health")

    codes = [
        status.code
        for status in await asyncio.gather(app.stop(grace=DEADLINE), app.stop(grace=DEADLINE))
    ]

    assert codes == [0, 0]
    assert await app.stop() == ExitStatus(0, "exited")


async def test_wait_returns_the_exit_code_to_every_waiter(
    runner: Runner, make_spec: SpecFactory, spawn: Spawn
) -> None:
    spec = make_spec("--exit", "3")
    app = await spawn(runner, spec)

    async with asyncio.timeout(DEADLINE):
        statuses = list(await asyncio.gather(app.wait(), app.wait()))

    assert statuses == [ExitStatus(3, "exited")] * 2
    assert app.status == ExitStatus(3, "exited")
    assert await app.stop() == ExitStatus(3, "exited")


async def test_a_cancelled_waiter_does_not_disturb_the_others(
    runner: Runner, make_spec: SpecFactory, spawn: Spawn
) -> None:
    spec = make_spec()
    app = await spawn(runner, spec)
    cancelled = asyncio.create_task(app.wait())
    await asyncio.sleep(0)
    cancelled.cancel()

    await get_json(app, spec, "/health")
    assert (await app.stop(grace=DEADLINE)).code == 0
    assert (await app.wait()).code == 0


async def test_the_log_gets_stdout_and_stderr_appended(
    runner: Runner, make_spec: SpecFactory, spawn: Spawn
) -> None:
    spec = make_spec("--exit", "0")
    spec.log_path.parent.mkdir(parents=True)
    spec.log_path.write_text("an earlier run\n")
    app = await spawn(runner, spec)
    async with asyncio.timeout(DEADLINE):
        await app.wait()

    log = spec.log_path.read_text()
    assert log.startswith("an earlier run\n")
    assert "server starting" in log
    assert "server stderr line" in log


@pytest.mark.parametrize(
    "shebang", ["#!/bin/sh", "#!/usr/bin/env python3", "#!/usr/bin/python3"], ids=str
)
async def test_a_script_with_a_shebang_starts(
    runner_name: str,
    runner: Runner,
    make_spec: SpecFactory,
    spawn: Spawn,
    app_dir: Path,
    shebang: str,
) -> None:
    script = app_dir / "entrypoint"
    if shebang == "#!/bin/sh":
        body = f'exec "$PROBE_PYTHON" {app_dir / "server.py"}\n'
    else:
        body = (app_dir / "server.py").read_text()
    script.write_text(f"{shebang}\n{body}")
    script.chmod(0o755)
    base = make_spec()
    spec = replace(base, argv=[str(script)], env={**base.env, "PROBE_PYTHON": sys.executable})
    app = await spawn(runner, spec)

    env = await get_json(app, spec, "/env")

    assert env["OS_DATA_DIR"] == data_dir_seen_by(runner_name, spec)


async def test_a_missing_app_dir_fails_at_once_as_mount(
    runner: Runner, make_spec: SpecFactory, tmp_path: Path
) -> None:
    spec = make_spec(app_dir=tmp_path / "gone")

    with pytest.raises(SpawnFailed) as caught:
        await runner.spawn(spec)

    assert caught.value.fields["cause"] == "mount"
    assert str(tmp_path / "gone") in caught.value.message


@pytest.mark.parametrize("problem", ["not executable", "missing", "not on PATH"])
async def test_a_command_that_cannot_be_executed_fails_at_once(
    runner: Runner, make_spec: SpecFactory, app_dir: Path, problem: str
) -> None:
    command = str(app_dir / "entrypoint.sh")
    if problem == "not executable":
        Path(command).write_text("#!/bin/sh\nexit 0\n")
        Path(command).chmod(0o644)
    elif problem == "not on PATH":
        command = "atrium-no-such-command"

    with pytest.raises(SpawnFailed) as caught:
        await runner.spawn(make_spec(argv=[command]))

    assert caught.value.fields == {"appId": "com.example.probe", "cause": "exited"}
    assert repr(command) in caught.value.message


# --- the sandbox ------------------------------------------------------------------------------


@pytest.fixture
def toolchain(tmp_path: Path) -> Path:
    path = tmp_path / "toolchain" / "bin"
    path.mkdir(parents=True)
    (path / "git").symlink_to("/usr/bin/git")
    return path


@only_bwrap
async def test_the_sandbox_shows_only_what_is_bound(
    make_spec: SpecFactory, spawn: Spawn, tmp_path: Path
) -> None:
    (tmp_path / "host-only").write_text("not for apps")
    spec = make_spec()
    app = await spawn(BwrapRunner(), spec)

    usr_bin = await get_json(app, spec, "/ls", path="/usr/bin")
    tmp = await get_json(app, spec, "/ls", path=str(tmp_path))

    assert usr_bin == {"names": [Path(sys.executable).name]}  # the interpreter, no tools
    assert tmp == {"names": ["apps"]}  # the app dir's parents, not the logs, data or host files


@only_bwrap
async def test_the_sandboxed_app_has_no_capabilities_and_its_own_pids(
    make_spec: SpecFactory, spawn: Spawn
) -> None:
    spec = make_spec()
    app = await spawn(BwrapRunner(), spec)

    status = (await get_json(app, spec, "/read", path="/proc/self/status"))["text"]
    pids = [n for n in (await get_json(app, spec, "/ls", path="/proc"))["names"] if n.isdigit()]

    assert "CapEff:\t0000000000000000" in status
    assert sorted(pids, key=int) == ["1", "2"]  # bwrap's reaper and the app, nothing of the host


@only_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run an app under another uid")
async def test_as_root_the_sandboxed_app_runs_under_its_own_uid(
    make_spec: SpecFactory, spawn: Spawn, app_dir: Path
) -> None:
    user = AppUser(uid=0x70000000 + 4242, gid=0x70000000 + 4242)
    spec = make_spec(user=user)
    (spec.data_dir / "old").mkdir(parents=True)  # left by a run as root
    (spec.data_dir / "old" / "notes.txt").write_text("mine too")
    (spec.data_dir / "old" / "passwd").symlink_to("/etc/passwd")
    (app_dir / "server.py").chmod(0o600)  # installed by a shell with a strict umask
    app_dir.chmod(0o700)
    app = await spawn(BwrapRunner(), spec)

    status = (await get_json(app, spec, "/read", path="/proc/self/status"))["text"]
    shadow = await get_json(app, spec, "/read", path="/etc/shadow")
    written = await get_json(app, spec, "/write", name="mine")
    tmp = await get_json(app, spec, "/run", cmd=sys.executable, args="-c open('/tmp/x','w')")

    assert f"Uid:\t{user.uid}\t{user.uid}\t{user.uid}\t{user.uid}" in status
    assert f"Gid:\t{user.gid}\t{user.gid}\t{user.gid}\t{user.gid}" in status
    assert re.search(r"^Groups:\s*$", status, re.MULTILINE), status
    assert "CapEff:\t0000000000000000" in status
    assert shadow["error"].startswith("PermissionError"), shadow
    assert written == {"ok": True}
    assert tmp["returncode"] == 0, tmp
    assert (spec.data_dir / "mine").stat().st_uid == user.uid
    assert (spec.data_dir / "old" / "notes.txt").stat().st_uid == user.uid
    assert (spec.data_dir / "old" / "passwd").lstat().st_uid == user.uid
    assert Path("/etc/passwd").stat().st_uid == 0  # the link was not followed
    assert (app_dir / "server.py").stat().st_mode & 0o777 == 0o604
    assert spec.data_dir.stat().st_mode & 0o777 == 0o700


@only_bwrap
async def test_the_app_dir_is_read_only_in_the_sandbox(
    make_spec: SpecFactory, spawn: Spawn, app_dir: Path
) -> None:
    spec = make_spec()
    app = await spawn(BwrapRunner(), spec)

    answer = await get_json(app, spec, "/write-app")

    assert "Read-only file system" in answer["error"]
    assert not (app_dir / "written").exists()


@only_bwrap
@pytest.mark.parametrize("command", ["git", "/usr/bin/git", "/bin/git"])
async def test_a_declared_tool_runs_in_the_sandbox(
    make_spec: SpecFactory, spawn: Spawn, toolchain: Path, command: str
) -> None:
    spec = make_spec(tools=["git"], toolchain_dir=toolchain)
    app = await spawn(BwrapRunner(), spec)

    answer = await get_json(app, spec, "/run", cmd=command, args="--version")

    assert answer["returncode"] == 0, answer
    assert answer["stdout"].startswith("git version")


@only_bwrap
@pytest.mark.parametrize("command", ["git", "/usr/bin/git"])
async def test_an_undeclared_tool_cannot_run_in_the_sandbox(
    make_spec: SpecFactory, spawn: Spawn, toolchain: Path, command: str
) -> None:
    spec = make_spec(tools=[], toolchain_dir=toolchain)
    app = await spawn(BwrapRunner(), spec)

    answer = await get_json(app, spec, "/run", cmd=command, args="--version")

    assert answer.get("error", "").startswith("FileNotFoundError"), answer


@only_bwrap
async def test_every_tool_of_the_toolchain_with_a_star_and_missing_ones_skipped(
    make_spec: SpecFactory,
    spawn: Spawn,
    toolchain: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (toolchain / "true").symlink_to("/usr/bin/true")
    spec = make_spec(tools=["*", "not-in-the-toolchain"], toolchain_dir=toolchain)
    app = await spawn(BwrapRunner(), spec)

    listing = await get_json(app, spec, "/ls", path="/usr/bin")

    assert listing == {"names": sorted(["git", "true", Path(sys.executable).name])}
    assert "not-in-the-toolchain" in caplog.text


@only_bwrap
async def test_a_missing_bind_source_is_an_early_exit_classified_mount(
    make_spec: SpecFactory, spawn: Spawn, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-prefix"
    spec = make_spec(ro_paths=(Path(sys.prefix), Path(sys.base_prefix), missing))
    app = await spawn(BwrapRunner(), spec)

    async with asyncio.timeout(DEADLINE):
        code = (await app.wait()).code

    assert code != 0
    assert classify_early_exit(spec.log_path, code) == "mount"
    assert str(missing) in spec.log_path.read_text()


@only_bwrap
async def test_an_app_that_exits_is_classified_exited(make_spec: SpecFactory, spawn: Spawn) -> None:
    spec = make_spec("--exit", "3")
    app = await spawn(BwrapRunner(), spec)

    async with asyncio.timeout(DEADLINE):
        code = (await app.wait()).code

    assert classify_early_exit(spec.log_path, code) == "exited"


def test_classify_early_exit_reads_only_the_end_of_the_log(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    log.write_text("bwrap: Can't find source path /gone: No such file or directory\n")
    assert classify_early_exit(log, 1) == "mount"
    log.write_text(
        "bwrap: Can't find source path /gone: No such file or directory\n" + "app output\n" * 20
    )
    assert classify_early_exit(log, 1) == "exited"
    assert classify_early_exit(tmp_path / "no-log", 1) == "exited"


def test_a_sandbox_whose_shell_died_before_it_was_armed_never_runs() -> None:
    """A kill -9 of the shell between the fork and bwrap's own --die-with-parent left bwrap and
    the app running under init, holding the data folder's lock (`make chaos`: every later start
    of that instance was `spawn_failed (locked)`). The child now asks for SIGKILL at the shell's
    death before it executes, and leaves when its parent is no longer the shell."""

    orphan = subprocess.run(
        ["/bin/sh", "-c", "echo ran"],
        preexec_fn=_die_with(os.getpid() + 1_000_000),  # a shell that is gone: another parent
        capture_output=True,
        check=False,
        timeout=30,
    )
    assert (orphan.returncode, orphan.stdout) == (1, b"")
    armed = subprocess.run(
        ["/bin/sh", "-c", "grep -q '^PPid' /proc/self/status && echo ran"],
        preexec_fn=_die_with(os.getpid()),
        capture_output=True,
        check=False,
        timeout=30,
    )
    assert (armed.returncode, armed.stdout) == (0, b"ran\n")


def test_a_sandbox_dies_with_the_thread_that_started_it(tmp_path: Path) -> None:
    """The parent-death signal asked before exec: a process started with it dies when its
    starter is SIGKILLed, whatever the command does with its own signals."""
    pid_file = tmp_path / "pid"
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os, subprocess, time
                from atrium.lifecycle.runners.process import _die_with
                child = subprocess.Popen(["sleep", "300"], preexec_fn=_die_with(os.getpid()))
                open({str(pid_file)!r}, "w").write(str(child.pid))
                time.sleep(300)
                """
            ),
        ]
    )
    try:
        wait_for(lambda: pid_file.is_file() and pid_file.read_text(), "the child's pid")
        child = int(pid_file.read_text())
        starter.kill()
        starter.wait(timeout=30)
        wait_for(lambda: not _alive(child), "the child's death with its starter")
    finally:
        starter.kill()
        starter.wait(timeout=30)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


async def test_a_cgroup_gone_before_the_spawn_leaves_the_log_closed(
    make_spec: SpecFactory, tmp_path: Path
) -> None:
    """The instance's cgroup was removed before its spawn opened it (a warm-pool spawn racing
    an uninstall, met in a full run): the spawn failed, and the app's log file it had opened
    stayed open until the garbage collector closed it, a ResourceWarning in whatever test ran
    then. The failure is kept here, traceback and all, as a caller keeps it."""
    gone = tmp_path / "cgroup-gone"
    spec = make_spec(cgroup=InstanceCgroup([gone], 2))
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    with pytest.raises((OSError, SpawnFailed)) as failed:
        await ProcessRunner().spawn(spec)
    assert failed.value is not None
    fds = Path("/proc/self/fd")
    open_logs = [fd for fd in fds.iterdir() if _target(fd) == str(spec.log_path)]
    assert open_logs == [], "the app's log file was left open"


def _target(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except OSError:
        return ""
