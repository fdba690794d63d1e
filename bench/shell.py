"""Start-up helpers shared by the benchmarks that go through the shell's data proxy.

`running_shell` starts `python -m atrium serve` (ATRIUM_RUNNER=process) in a fresh ATRIUM_HOME
with two system apps: `bench.upstream` (authority `bench`, bench/apps/bench.upstream) and
`bench.caller`, a copy of it without the provider that holds the `bench.upstream.read` and
`bench.upstream.write` permissions; both are launched and the caller's app token is read back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "apps"
CALLER_PERMISSIONS = ["bench.upstream.read", "bench.upstream.write"]


@dataclass(frozen=True)
class Shell:
    """A running shell with the bench apps launched."""

    proc: subprocess.Popen[bytes]
    url: str
    user_token: str
    #: the bench.caller app's token: what wrk and the streaming client present
    caller_token: str
    #: the bench.upstream instance's port, for direct requests that bypass the shell
    upstream_port: int

    @property
    def data_url(self) -> str:
        """The data proxy's base for the `bench` authority (append `/small`, `/sink`, ...)."""
        return f"{self.url}/api/data/bench"

    @property
    def direct_url(self) -> str:
        return f"http://127.0.0.1:{self.upstream_port}/api/data"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 20, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Return once something accepts on ``port``; raise when ``proc`` exits first or on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


def rss_bytes(pid: int) -> int:
    """The process's resident set size (VmRSS in /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def start_shell(
    home: Path, env: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str, str]:
    """Start the shell with the bench apps installed; (process, base URL, the user's token).
    The system apps sit beside the home (a home holds only what the shell puts there), and the
    folder above is opened for search: as root, the process runner's apps run under their own
    uid and must reach their folders."""
    home.parent.chmod(0o755)
    system = home.parent / "system-apps"
    shutil.copytree(APPS / "bench.upstream", system / "bench.upstream")
    caller = system / "bench.caller"
    shutil.copytree(APPS / "bench.upstream", caller)
    manifest = json.loads((caller / "app.manifest.json").read_text())
    manifest.update({"id": "bench.caller", "permissions": CALLER_PERMISSIONS})
    manifest.pop("dataProvider")
    (caller / "app.manifest.json").write_text(json.dumps(manifest))
    return serve(home, system, env=env)


def serve(
    home: Path, system: Path, runner: str = "process", env: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str, str]:
    """`atrium serve` on ``home`` with ``system`` as its system apps, on a free port; (process,
    base URL, the user's token) once it has written its URL. ``env``: more settings."""
    env = {
        **os.environ,
        **(env or {}),
        "ATRIUM_HOME": str(home),
        "ATRIUM_PORT": "0",
        "ATRIUM_SYSTEM_APPS": str(system),
        "ATRIUM_RUNNER": runner,
        "ATRIUM_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "atrium", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url_file = home / "run" / "url"
    # a start is not what is measured: on a machine shared with other work a shell took over 30 s
    deadline = time.monotonic() + 120
    while not url_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the shell exited with {proc.returncode} while starting")
        if time.monotonic() > deadline:
            raise TimeoutError("the shell did not start")
        time.sleep(0.05)
    url = url_file.read_text().strip().replace("localhost", "127.0.0.1")
    return proc, url, (home / "run" / "token").read_text().strip()


def launch(url: str, token: str, app_id: str) -> dict[str, object]:
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as api:
        created = api.post("/api/instances", json={"appId": app_id})
        if created.status_code != 200:
            raise RuntimeError(f"launching {app_id} failed: {created.text}")
        instance: dict[str, object] = created.json()
        api.post(f"/api/instances/{instance['instanceId']}/resumed").raise_for_status()
        return instance


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process, then wait (kill what has not ended after 10 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


#: the users a shell "with users" holds besides its admin; the bench apps run as the first
USERS = 50
USER_PASSWORD = "bench user password"  # noqa: S105 - the bench users' own


def sign_in(browser: httpx.Client, user: str) -> None:
    """Sign ``user`` in, waiting out the per-address limit of sign-ins (every bench user signs in
    from this one address; the setup is not what is measured)."""
    deadline = time.monotonic() + 300
    while True:
        answer = browser.post("/api/session", json={"user": user, "password": USER_PASSWORD})
        if answer.status_code != 429 or time.monotonic() > deadline:
            answer.raise_for_status()
            return
        time.sleep(float(answer.headers.get("retry-after", "1")))


def add_users(url: str, admin_token: str, count: int) -> str:
    """``count`` members, each signed in once (a session) and holding a personal token; the
    first one's token (their apps are the bench's)."""
    first = ""
    admin = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=url, headers=admin, timeout=60) as api:
        for n in range(count):
            user = f"member{n}"
            api.post(
                "/api/users", json={"id": user, "role": "member", "password": USER_PASSWORD}
            ).raise_for_status()
            origin = {"Origin": url.replace("127.0.0.1", "localhost")}
            with httpx.Client(base_url=url, headers=origin, timeout=60) as browser:
                sign_in(browser, user)
                made = browser.post("/api/tokens", json={"name": "bench"})
                made.raise_for_status()
                if n == 0:
                    first = str(made.json()["token"])
    return first


@contextmanager
def running_shell(
    tmp: Path, *, users: int = 0, env: Mapping[str, str] | None = None
) -> Iterator[Shell]:
    """The shell in ``tmp``/home with bench.upstream and bench.caller launched; stopped on exit.
    With ``users``, that many members are added first and the apps run as the first of them;
    ``env`` holds more of its settings (`ATRIUM_…`)."""
    home = tmp / "home"
    proc, url, user_token = start_shell(home, env)
    try:
        runner = add_users(url, user_token, users) if users else user_token
        upstream = launch(url, runner, "bench.upstream")
        caller = launch(url, runner, "bench.caller")
        folder = "bench.caller-1" if not users else "bench.caller~member0-1"
        found = sorted(home.glob(f"scopes/**/bench.caller/{folder}/token"))
        if not found:
            raise RuntimeError(f"no token file for {caller.get('instanceId')} under {home}")
        token_file = found[0]
        yield Shell(
            proc=proc,
            url=url,
            user_token=user_token,
            caller_token=token_file.read_text().strip(),
            upstream_port=int(str(upstream["port"])),
        )
    finally:
        stop([proc])
