"""Integration fixtures: the real shell on 127.0.0.1:<ephemeral>, uvicorn in a thread.

- ``system_apps``: a temporary copy of the repository's ``apps/`` (tests may change it).
- ``home``: a fresh ``ATRIUM_HOME``.
- ``start_shell``: a factory starting a shell on given home/system apps (restartable).
- ``shell``: one running shell; ``api``: an httpx client holding the user's token.
- ``echo_shell``: a shell whose system apps also hold the SDK echo app (``ECHO``); instances.py
  has what the tests of several users do with it.
- ``serving``: `atrium serve` as a real process on a home, for as long as a block runs.
- ``small_home`` / ``tmpfs`` / ``fill_disk``: a home on a small tmpfs of its own, and a file that
  takes its free space (the full-disk tests; root only).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvloop
from sqlalchemy.engine import make_url

from atrium.api.server import ShellServer
from atrium.identity import new_token
from atrium.settings import Settings
from atrium.shell import Shell
from atrium.state.migrate import upgrade_now
from atrium.users.model import Role
from tests.conftest import REPO_DIR, TESTS_DIR
from tests.postgres import new_database

DEADLINE = 15.0
MIB = 1024 * 1024
#: the SDK app that answers `/whoami` with what the shell told it of the request
ECHO = "test.sdk.echo"

#: how many shells this process has given a range (`own_range`)
_RANGES = count()
#: pytest-xdist workers of one run take turns through the blocks: at most this many of them
_WORKER_SLOTS = 16


def own_range() -> str:
    """A private /24 of its own for each shell the tests start, in 10.232.0.0/13.

    Shells on the default range (10.213.0.0/16) clash when several are up at once (a module's
    shell and a test's own, or another pytest run on the machine): the later one then finds the
    range routed and quietly puts its contract apps on the host's network. A test that is about
    the range sets ``app_network`` (``ATRIUM_APP_NETWORK``) itself.

    The workers of one pytest-xdist run share a start (the run's id) and each takes every
    sixteenth block from it, so no two of them ever hold the same one; a start from each
    worker's pid instead made one worker reach, a few shells later, the block where the next
    pid's had begun. Another run on the machine starts elsewhere (its id, or its pid)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    seed = zlib.crc32(run.encode()) if run else os.getpid() * 7
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    start = seed % (2048 // _WORKER_SLOTS) * _WORKER_SLOTS
    block = (start + next(_RANGES) * _WORKER_SLOTS + worker % _WORKER_SLOTS) % 2048
    return f"10.{232 + block // 256}.{block % 256}.0/24"


@dataclass
class RunningShell:
    """A shell serving in a background thread."""

    server: ShellServer
    token: str
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)
    loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.settings.port}"

    @property
    def settings(self) -> Settings:
        return self.server.settings

    @property
    def shell(self) -> Shell:
        shell: Shell = self.server.app.state.shell
        return shell

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        kwargs.setdefault("timeout", DEADLINE)
        return httpx.Client(base_url=self.url, headers=headers, **kwargs)

    def anonymous(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("timeout", DEADLINE)
        return httpx.Client(base_url=self.url, **kwargs)

    def on_loop(self, coro: Any) -> Any:
        """Run ``coro`` on the shell's own event loop and wait for its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=DEADLINE)

    def add_user(self, user_id: str, role: str = "member", name: str | None = None) -> str:
        """Add a user straight into the shell's users store; a personal token of theirs."""
        users = self.shell.users

        async def add() -> str:
            await users.add(user_id, name, Role(role))
            secret, _ = await users.create_token(user_id, "test", None)
            return secret

        token: str = self.on_loop(add())
        return token

    @contextmanager
    def stalled(self) -> Iterator[None]:
        """The shell's event loop held still for the block: its event reader reads nothing
        meanwhile (a shell stalled, or behind on the event log)."""
        stalled, release = threading.Event(), threading.Event()

        async def stall() -> None:
            stalled.set()
            release.wait(timeout=60)

        assert self.loop is not None
        resumed = asyncio.run_coroutine_threadsafe(stall(), self.loop)
        try:
            assert stalled.wait(timeout=20)
            yield
        finally:
            release.set()
            resumed.result(timeout=20)

    def flood_events(self) -> None:
        """More rows in the shared event table than are kept (from this shell's database): a
        reader that had not read the older ones finds them gone."""
        from atrium.state import events
        from atrium.state.database import Database

        url = self.settings.database_url
        assert url is not None

        async def flood() -> None:
            async with Database.open(url.get_secret_value()) as db, db.transaction() as tx:
                await events.append_many(tx, [("test:filler", None, {})] * (events.KEEP + 1))

        asyncio.run(flood())

    def stop(self) -> None:
        self.server.request_exit()
        self.thread.join(timeout=DEADLINE)
        assert not self.thread.is_alive(), "the shell did not stop in time"


StartShell = Callable[..., RunningShell]


@pytest.fixture
def system_apps(tmp_path: Path) -> Path:
    target = tmp_path / "system-apps"
    shutil.copytree(REPO_DIR / "apps", target)
    return target


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


#: the bootstrap token of each PostgreSQL database a test started a shell on, by its name
_TOKENS: dict[str, str] = {}


def launch_shell(home: Path, system_apps: Path, **overrides: Any) -> RunningShell:
    """Start a shell on ``home`` with ``system_apps`` in a background thread (stop it yourself)."""
    options: dict[str, Any] = {
        "home": home,
        "system_apps": system_apps,
        "host": "127.0.0.1",
        "port": 0,
        "heartbeat_seconds": 15.0,
        "app_network": own_range(),
    }
    options.update(overrides)
    # the shells of one PostgreSQL database share one bootstrap token (atrium.users.bootstrap):
    # a test's later shell on it starts with the first one's, which it then knows
    url = overrides.get("database_url")
    if "token" in overrides:  # as ATRIUM_TOKEN
        token = str(overrides["token"])
    elif url:
        token = _TOKENS.setdefault(str(make_url(url).database), new_token())
    else:
        token = new_token()
    server = ShellServer(Settings(**options), token)
    errors: list[BaseException] = []
    loops: list[asyncio.AbstractEventLoop] = []

    async def serve() -> None:
        loops.append(asyncio.get_running_loop())
        await server.serve()

    def run() -> None:
        try:
            uvloop.run(serve())
        except BaseException as err:  # noqa: BLE001 - reported by the fixture, not swallowed
            errors.append(err)

    thread = threading.Thread(target=run, name="atrium-shell", daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE
    while not server.started:
        if errors or not thread.is_alive():
            raise RuntimeError(f"the shell failed to start: {errors}")
        if time.monotonic() > deadline:
            raise TimeoutError("the shell did not start in time")
        time.sleep(0.01)
    return RunningShell(server, token, thread, errors, loops[0])


@contextmanager
def shells_on_one_database(
    postgres_server: str, root: Path, system_apps: Path, count: int = 2
) -> Iterator[list[RunningShell]]:
    """``count`` shells, each with its own home under ``root``, on one new PostgreSQL database
    (several shells behind a balancer); stopped at the end."""
    url = new_database(postgres_server)
    upgrade_now(url)
    shells: list[RunningShell] = []
    try:
        for n in range(count):
            home = root / f"shell{n + 1}"
            home.mkdir(mode=0o700)
            shells.append(launch_shell(home, system_apps, database_url=url))
        yield shells
    finally:
        for shell in shells:
            shell.stop()


@pytest.fixture
def start_shell(home: Path, system_apps: Path) -> Iterator[StartShell]:
    running: list[RunningShell] = []

    def start(**overrides: Any) -> RunningShell:
        shell = launch_shell(home, system_apps, **overrides)
        running.append(shell)
        return shell

    yield start
    for shell in running:
        if shell.thread.is_alive():
            shell.stop()


@pytest.fixture
def shell(start_shell: StartShell) -> RunningShell:
    return start_shell()


@pytest.fixture
def api(shell: RunningShell) -> Iterator[httpx.Client]:
    with shell.client() as client:
        yield client


def add_test_apps(system_apps: Path, *app_ids: str) -> None:
    """Copy the test apps ``app_ids`` (tests/apps/) into ``system_apps``."""
    for app_id in app_ids:
        shutil.copytree(TESTS_DIR / "apps" / app_id, system_apps / app_id)


@pytest.fixture
def echo_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    add_test_apps(system_apps, ECHO)
    return start_shell()


@dataclass
class ServeProcess:
    """One `atrium serve` process and what it printed."""

    proc: subprocess.Popen[str]
    home: Path
    url: str
    token: str

    def client(self, timeout: float = 20) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout
        )


def serve_env(home: Path, **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")}
    return {
        **clean,
        "ATRIUM_HOME": str(home),
        "ATRIUM_PORT": "0",
        "ATRIUM_APP_NETWORK": own_range(),
        **extra,
    }


@contextmanager
def serving(
    home: Path, *, stop: signal.Signals = signal.SIGTERM, **extra: str
) -> Iterator[ServeProcess]:
    """`atrium serve` on ``home`` (``extra``: more environment) until the block ends, then
    ``stop`` (SIGTERM, or SIGKILL if it hangs; SIGKILL for a loop that may be stuck)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "atrium", "serve"],
        env=serve_env(home, **extra),
        cwd=REPO_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with running(proc, home, stop) as served:
        with httpx.Client(timeout=5) as probe:
            wait_for(lambda: probe.get(f"{served.url}/api/version").status_code == 200, "serve")
        yield served


@contextmanager
def running(
    proc: subprocess.Popen[str],
    home: Path,
    stop: signal.Signals = signal.SIGTERM,
    *,
    echo: bool = False,
) -> Iterator[ServeProcess]:
    """The `atrium serve` process ``proc`` (its output piped, as text) once it printed its login
    URL, until the block ends, then ``stop`` (SIGKILL if it hangs); ``echo``: the end of its
    later output is printed then (shown in a failure's report)."""
    assert proc.stdout is not None
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while not any("Open the host page:" in line for line in lines):
            assert time.monotonic() < deadline, f"serve printed no login URL: {lines}"
            line = proc.stdout.readline()
            assert line or proc.poll() is None, f"serve ended: {lines}"
            lines.append(line)
        url = re.search(r"Atrium (http://\S+) ", "".join(lines))
        assert url is not None
        # none from a shell that took the bootstrap token of another shell of its database
        login = re.search(r"/login\?token=(\S+)", "".join(lines))
        yield ServeProcess(proc, home, url.group(1), login.group(1) if login else "")
    finally:
        if proc.poll() is None:
            proc.send_signal(stop)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if echo:
            sys.stdout.write(proc.stdout.read()[-4000:])
        proc.stdout.close()


@contextmanager
def tmpfs(folder: Path, mib: int) -> Iterator[Path]:
    """``folder`` on a tmpfs of ``mib`` MiB of its own, mode 0700, until the block ends (needs
    root or CAP_SYS_ADMIN: the test is skipped without)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0700", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def small_home(home: Path) -> Iterator[Path]:
    """``home`` on a 16 MiB tmpfs of its own (root only)."""
    with tmpfs(home, 16) as mounted:
        yield mounted


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill_disk(folder: Path, leave: int = 0) -> Path:
    """``folder/filler``, a file taking all but ``leave`` bytes of the free space of the disk
    ``folder`` is on (0: up to the last byte a write can take)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while (free := free_bytes(folder) - leave) > 0:
                os.write(fd, b"\0" * min(free, MIB))
        for chunk in (65536, 512, 1) if leave == 0 else ():
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return filler


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    """Poll ``predicate`` until it returns a truthy value (generous deadline, no timing asserts)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@dataclass
class SseEvent:
    """One server-sent event as a client sees it."""

    id: str
    event: str
    data: dict[str, Any]


class SseReader:
    """Reads a server-sent event stream in a thread so tests can act while it listens."""

    def __init__(
        self,
        client: httpx.Client,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.events: list[SseEvent] = []
        self.comments: list[str] = []
        self.status: int | None = None
        self.ended = threading.Event()
        self.connected = threading.Event()
        self._client = client
        self._params = params or {}
        self._headers = headers or {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self.connected.wait(DEADLINE), "the event stream did not connect"

    def _run(self) -> None:
        try:
            with self._client.stream(
                "GET",
                "/api/events",
                params=self._params,
                headers=self._headers,
                timeout=httpx.Timeout(DEADLINE, read=None),
            ) as response:
                self.status = response.status_code
                current: dict[str, str] = {}
                for line in response.iter_lines():
                    if line.startswith(":"):
                        self.comments.append(line[1:].strip())
                        self.connected.set()
                    elif line.startswith(("id:", "event:", "data:")):
                        name, _, value = line.partition(":")
                        current[name] = value.strip()
                    elif not line and "data" in current:
                        self.events.append(
                            SseEvent(
                                current.get("id", ""),
                                current.get("event", ""),
                                json.loads(current["data"]),
                            )
                        )
                        current = {}
        except httpx.HTTPError:
            pass
        finally:
            self.connected.set()
            self.ended.set()

    def wait(self, count: int, what: str = "events") -> list[SseEvent]:
        wait_for(lambda: len(self.events) >= count, f"{count} {what}")
        return self.events

    def of(self, topic: str) -> list[SseEvent]:
        return [e for e in self.events if e.event == topic]


def run_async(coro: Any) -> Any:
    return asyncio.run(coro)
