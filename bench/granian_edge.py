"""The shell's ASGI app served by granian, to measure which edge promises granian keeps.

This is a measuring tool, not a way to run the shell: `atrium serve` stays on its own edge
(docs/decisions.md, "Edge: granian measured against the edge promises").

- `GranianShellServer` stands in for `atrium.api.server.ShellServer` (same attributes the test
  fixtures use): the shell opened by the same `open_shell`, then `create_app`'s ASGI app under
  granian's embedded server (`granian.server.embed.Server`, its public asyncio-loop server) on the
  running loop, with the edge settings granian offers (`HTTP1Settings`).
- As a pytest plugin (``-p bench.granian_edge``) it makes every shell the integration fixtures
  start a granian-served one, so the edge tests run unchanged against granian:

      .venv/bin/pytest -p bench.granian_edge tests/integration/test_edge.py

- ``python -m bench.granian_edge compare`` runs the data-proxy bench with the full path served by
  both edges in the same rounds.

Tests that start `atrium serve` as a process (`serving`) still run the default edge.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.server.embed import Server

from atrium.api.app import create_app
from atrium.settings import Settings
from atrium.shell import Shell, open_shell
from bench.shell import APPS, CALLER_PERMISSIONS

#: the full path served by granian, in the bench's table
ON_GRANIAN = "atrium full path on granian"


def _free_port(host: str) -> int:
    """A port free now (granian binds its own socket and does not say which port 0 became)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


class GranianShellServer:
    """One shell under granian (embedded, on the caller's loop)."""

    def __init__(self, settings: Settings, user_token: str) -> None:
        port = settings.port or _free_port(settings.host)
        self.settings = settings.model_copy(update={"port": port})
        self._user_token = user_token
        self.app = create_app(self.settings)
        self._server = Server(
            self.app,
            address=self.settings.host,
            port=port,
            interface=Interfaces.ASGINL,  # the shell is opened by `serve`, as on the default edge
            http=HTTPModes.http1,
            websockets=False,
            backlog=2048,
            http1_settings=HTTP1Settings(
                header_read_timeout=int(self.settings.header_timeout_seconds * 1000),
                keep_alive=True,
                max_buffer_size=64 << 10,
            ),
            log_enabled=False,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = False

    @property
    def url(self) -> str:
        return f"http://localhost:{self.settings.port}"

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        async with open_shell(self.settings, self._user_token) as shell:
            self.app.state.shell = shell
            task = asyncio.ensure_future(self._server.serve())
            while not await self._listening():
                if task.done():
                    await task
            if ready is not None:
                ready()
            self.started = True
            await task
            shell.bus.close()

    async def _listening(self) -> bool:
        try:
            _, writer = await asyncio.open_connection(self.settings.host, self.settings.port)
        except OSError:
            await asyncio.sleep(0.01)
            return False
        writer.close()
        return True

    def request_exit(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        """End every event stream first (the default edge does the same): granian's shutdown
        waits for every response in flight, and a stream never ends by itself."""
        shell: Shell | None = getattr(self.app.state, "shell", None)
        if shell is not None:
            shell.bus.close()
        stop: Callable[[], None] = self._server.stop  # granian's own, not annotated
        stop()


def main() -> None:
    """`atrium serve` on granian for the bench: settings from the environment, the token and URL
    written once it listens, SIGTERM/SIGINT stop it."""
    import signal

    import uvloop

    from atrium.files import write_atomic
    from atrium.identity import new_token
    from atrium.settings import prepare_home

    settings = Settings.load()
    prepare_home(settings)
    token = new_token()
    server = GranianShellServer(settings, token)

    def ready() -> None:
        write_atomic(server.settings.token_path, token + "\n")
        write_atomic(server.settings.url_path, server.url + "\n")

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_exit)
        await server.serve(ready)

    uvloop.run(run())


def _granian_shell(tmp: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """`bench.shell.start_shell`'s shell (the same system apps), served by `main` above."""
    home = tmp / "home"
    home.parent.mkdir(parents=True, exist_ok=True)
    home.parent.chmod(0o755)
    system = home.parent / "system-apps"
    shutil.copytree(APPS / "bench.upstream", system / "bench.upstream")
    caller = system / "bench.caller"
    shutil.copytree(APPS / "bench.upstream", caller)
    manifest = json.loads((caller / "app.manifest.json").read_text())
    manifest.update({"id": "bench.caller", "permissions": CALLER_PERMISSIONS})
    manifest.pop("dataProvider")
    (caller / "app.manifest.json").write_text(json.dumps(manifest))
    env = {
        **os.environ,
        "ATRIUM_HOME": str(home),
        "ATRIUM_PORT": "0",
        "ATRIUM_SYSTEM_APPS": str(system),
        "ATRIUM_RUNNER": "process",
        "ATRIUM_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.granian_edge"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url_file = home / "run" / "url"
    deadline = time.monotonic() + 30
    while not url_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the shell on granian did not start")
        time.sleep(0.05)
    url = url_file.read_text().strip().replace("localhost", "127.0.0.1")
    return proc, url, (home / "run" / "token").read_text().strip()


def compare() -> None:
    """One `make bench BENCH=dataproxy` run with the full path also served by granian, so both
    edges are measured in the same interleaved rounds (BENCH_CANDIDATES as there)."""
    from bench import dataproxy
    from bench.shell import launch, running_shell, stop

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        procs: list[subprocess.Popen[bytes]] = []
        tmp.chmod(0o755)  # as root the apps run under their own uid: they must reach their folders
        (tmp / "uvicorn").mkdir()
        try:
            with running_shell(tmp / "uvicorn") as shell:
                proc, url, token = _granian_shell(tmp / "granian")
                procs.append(proc)
                launch(url, token, "bench.upstream")
                launch(url, token, "bench.caller")
                (found,) = (tmp / "granian" / "home").glob("scopes/**/bench.caller-1/token")
                targets = dataproxy.collect_targets(tmp, shell, procs)
                targets[ON_GRANIAN] = dataproxy.Target(
                    f"{url}/api/data/bench", found.read_text().strip()
                )
                if not dataproxy.answers(ON_GRANIAN, targets[ON_GRANIAN]):
                    raise RuntimeError(f"{ON_GRANIAN} does not answer correctly")
                dataproxy.run(targets)
        finally:
            stop(procs)


if __name__ == "__main__":
    if sys.argv[1:] == ["compare"]:
        compare()
    else:
        main()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems() -> None:
    """Every shell the fixtures start from now on is served by granian."""
    from tests.integration import conftest

    setattr(conftest, "ShellServer", GranianShellServer)  # noqa: B010 - the fixtures' name
