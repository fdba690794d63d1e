"""Integration fixtures: the real shell on 127.0.0.1:<ephemeral>, uvicorn in a thread.

- ``system_apps``: a temporary copy of the repository's ``apps/`` (tests may change it).
- ``home``: a fresh ``ATRIUM_HOME``.
- ``start_shell``: a factory starting a shell on given home/system apps (restartable).
- ``shell``: one running shell; ``api``: an httpx client holding the user's token.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvloop

from atrium.api.server import ShellServer
from atrium.identity import new_token
from atrium.settings import Settings
from atrium.shell import Shell
from tests.conftest import REPO_DIR

DEADLINE = 15.0


@dataclass
class RunningShell:
    """A shell serving in a background thread."""

    server: ShellServer
    token: str
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)

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


def launch_shell(home: Path, system_apps: Path, **overrides: Any) -> RunningShell:
    """Start a shell on ``home`` with ``system_apps`` in a background thread (stop it yourself)."""
    options: dict[str, Any] = {
        "home": home,
        "system_apps": system_apps,
        "host": "127.0.0.1",
        "port": 0,
        "heartbeat_seconds": 15.0,
    }
    options.update(overrides)
    token = new_token()
    server = ShellServer(Settings(**options), token)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            uvloop.run(server.serve())
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
    return RunningShell(server, token, thread, errors)


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
