"""Install speed: a small app from a local directory, from git over `git daemon` (loopback) and
from a `git+file://` bare repository, each timed from ref to `install.done` (resolve, fetch,
validate, journal, swap, record, commit, registry rescan), next to the bare fetch
`git clone --depth 1` of the same repository.

Target (distribution issue): each install ≤ 800 ms median. Every round installs into a fresh
place: the app is uninstalled between rounds (not timed).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import aclosing
from pathlib import Path

from atrium.dist.pipeline import Approval
from atrium.dist.refs import parse_ref
from atrium.identity import new_token
from atrium.scopes import Scope
from atrium.settings import Settings
from atrium.shell import Shell, open_shell
from bench.report import table

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 10
APP = "bench.small.app"
CLONE = ("git", "-c", "advice.detachedHead=false", "clone", "--quiet", "--depth", "1")
SERVER = ROOT / "tests" / "apps" / "test.plain.stdlib" / "server.py"


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=Bench", "-c", "user.email=bench@localhost", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def small_app(root: Path) -> Path:
    app = root / "src" / APP
    (app / "static").mkdir(parents=True)
    shutil.copy(SERVER, app / "server.py")
    manifest = {
        "id": APP,
        "name": "Bench",
        "version": "1.0.0",
        "entrypoint": ["python3", "server.py"],
    }
    (app / "app.manifest.json").write_text(json.dumps(manifest))
    for n in range(20):
        (app / "static" / f"page{n}.html").write_text(f"<p>page {n}</p>\n" * 50)
    return app


def bare_repo(app: Path, repos: Path) -> Path:
    bare = repos / f"{APP}.git"
    subprocess.run(
        ["git", "init", "--quiet", "--bare", "--initial-branch=main", str(bare)], check=True
    )
    git(app, "init", "--quiet", "--initial-branch=main")
    git(app, "add", "--all")
    git(app, "commit", "--quiet", "-m", "bench")
    git(app, "tag", "v1")
    git(app, "push", "--quiet", str(bare), "main", "v1")
    return bare


def git_daemon(base: Path) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    proc = subprocess.Popen(
        ["git", "daemon", "--export-all", f"--base-path={base}", "--listen=127.0.0.1",
         f"--port={port}", "--reuseaddr", str(base)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


async def installs(shell: Shell, ref: str) -> list[float]:
    samples = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        events = shell.dist.install(parse_ref(ref), Scope.GLOBAL, Approval(auto_approve=True))
        async with aclosing(events):
            kinds = [item["type"] async for item in events]
        samples.append(time.perf_counter() - started)
        assert kinds[-2:] == ["install.done", "result"], kinds
        await shell.dist.uninstall(APP, Scope.GLOBAL)
    return samples


def clones(url: str, root: Path) -> list[float]:
    samples = []
    for n in range(ROUNDS):
        started = time.perf_counter()
        target = str(root / f"c{n}")
        subprocess.run([*CLONE, "--branch", "v1", url, target], check=True)
        samples.append(time.perf_counter() - started)
    return samples


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        app = small_app(root)
        bare = bare_repo(app, root / "repos")
        daemon, port = git_daemon(root / "repos")
        try:
            daemon_url = f"git://127.0.0.1:{port}/{APP}.git"
            baseline = clones(daemon_url, root / "clones")
            settings = Settings(
                home=root / "home", system_apps=root / "no-system-apps", port=0, runner="process"
            )
            async with open_shell(settings, new_token()) as shell:
                await installs(shell, f"local:{app}")  # warm caches and imports first
                local = await installs(shell, f"local:{app}")
                over_daemon = await installs(shell, f"{daemon_url}#v1")
                over_file = await installs(shell, f"git+file://{bare}#v1")
        finally:
            daemon.terminate()
            daemon.wait()
    table(
        f"Install of a small app (22 files), ref → install.done, {ROUNDS} rounds",
        [
            ("git clone --depth 1 git:// (baseline)", baseline),
            ("install local:", local),
            ("install git:// (git daemon, loopback)", over_daemon),
            ("install git+file://", over_file),
        ],
        baseline="git clone --depth 1 git:// (baseline)",
        target_ms=800,
    )


if __name__ == "__main__":
    asyncio.run(main())
