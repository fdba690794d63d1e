"""Fixtures for the distribution tests: small app sources, real git repositories and `git daemon`.

- ``make_app``: writes an app directory (a manifest and the stdlib fixture server) and returns it.
- ``git_repo``: turns an app directory into a bare repository ``<id>.git`` with tags.
- ``git_daemon``: `git daemon` on 127.0.0.1 serving a base path over ``git://`` (torn down after).
- ``dist_shell`` / ``api``: a running shell and a user client with a generous timeout.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell

SERVER = TESTS_DIR / "apps" / "test.plain.stdlib" / "server.py"
MakeApp = Callable[..., Path]


def write_manifest(app_dir: Path, **fields: Any) -> None:
    manifest = {
        "id": app_dir.name,
        "name": app_dir.name,
        "version": "1.0.0",
        "entrypoint": ["python3", "server.py"],
        "startTimeoutMs": 5000,
        "hookTimeoutMs": 5000,
        **fields,
    }
    (app_dir / "app.manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.fixture
def make_app(tmp_path: Path) -> MakeApp:
    def make(app_id: str, *, root: Path | None = None, **fields: Any) -> Path:
        app_dir = (root or tmp_path / "src") / app_id
        app_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(SERVER, app_dir / "server.py")
        write_manifest(app_dir, **fields)
        return app_dir

    return make


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=Test", "-c", "user.email=test@localhost", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@dataclass
class GitRepo:
    """A work tree and the bare repository it pushes to."""

    work: Path
    bare: Path

    def commit_and_tag(self, *tags: str, message: str = "change") -> str:
        git(self.work, "add", "--all")
        git(self.work, "commit", "--quiet", "--allow-empty", "-m", message)
        for tag in tags:
            git(self.work, "tag", "--force", "-a", tag, "-m", tag)
        git(self.work, "push", "--quiet", "--force", "origin", "HEAD", *tags)
        return git(self.work, "rev-parse", "HEAD")

    def commit_of(self, ref: str) -> str:
        return git(self.work, "rev-parse", f"{ref}^{{commit}}")

    @property
    def url(self) -> str:
        return f"git+file://{self.bare}"


@pytest.fixture
def git_repo(tmp_path: Path) -> Callable[..., GitRepo]:
    def make(app_dir: Path, *tags: str, base: Path | None = None) -> GitRepo:
        bare = (base or tmp_path / "repos") / f"{app_dir.name}.git"
        bare.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "init", "--quiet", "--bare", "--initial-branch=main", str(bare)], check=True
        )
        git(app_dir, "init", "--quiet", "--initial-branch=main")
        git(app_dir, "remote", "add", "origin", str(bare))
        repo = GitRepo(app_dir, bare)
        repo.commit_and_tag(*tags, message="first")
        return repo

    return make


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class GitDaemon:
    """`git daemon` serving ``base`` at ``git://127.0.0.1:<port>/``."""

    base: Path
    port: int

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"


@pytest.fixture
def git_daemon(tmp_path: Path) -> Iterator[GitDaemon]:
    base = tmp_path / "repos"
    base.mkdir(exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        [
            "git",
            "daemon",
            "--export-all",
            f"--base-path={base}",
            "--listen=127.0.0.1",
            f"--port={port}",
            "--reuseaddr",
            str(base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, "git daemon exited"
            assert time.monotonic() < deadline, "git daemon did not listen in time"
            time.sleep(0.02)
    yield GitDaemon(base, port)
    proc.terminate()
    proc.wait(timeout=15)


@pytest.fixture
def dist_shell(start_shell: StartShell) -> RunningShell:
    return start_shell()


@pytest.fixture
def api(dist_shell: RunningShell) -> Iterator[httpx.Client]:
    with dist_shell.client(timeout=60) as client:
        yield client


def install(api: httpx.Client, ref: str, **body: Any) -> httpx.Response:
    return api.post("/api/dist/install", json={"ref": ref, **body})


def installed_ok(api: httpx.Client, ref: str, **body: Any) -> dict[str, Any]:
    response = install(api, ref, autoApprove=True, **body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["ok"] is True, answer
    return answer


def sse(api: httpx.Client, method: str, path: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Every server-sent event of one request, in order, as ``{"type": …, …}``."""
    events: list[dict[str, Any]] = []
    headers = {"Accept": "text/event-stream"}
    with api.stream(method, path, headers=headers, **kwargs) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        kind = ""
        for line in response.iter_lines():
            if line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                data = json.loads(line[5:])
                assert data["type"] == kind
                events.append(data)
    return events


def app_listing(api: httpx.Client, app_id: str) -> dict[str, Any] | None:
    for item in api.get("/api/apps").json():
        if item["id"] == app_id and not item["problems"]:
            found: dict[str, Any] = item
            return found
    return None


@contextmanager
def operation_held(shell: RunningShell, app_id: str, *, here: bool = False) -> Iterator[None]:
    """``app_id``'s operation lock held on ``shell``'s loop (as an operation holds it) for the
    body; ``here``: that shell's own lock only, not the one among shells."""
    assert shell.loop is not None
    held, over = threading.Event(), threading.Event()

    async def holding() -> None:
        async with shell.shell.dist.locks.hold(app_id, "a test", here=here):
            held.set()
            await asyncio.to_thread(over.wait, 60)

    running = asyncio.run_coroutine_threadsafe(holding(), shell.loop)
    assert held.wait(60), "the operation lock was not taken"
    try:
        yield
    finally:
        over.set()
        running.result(timeout=60)
