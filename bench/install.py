"""Install speed: a small app from a local directory, from git over `git daemon` (loopback), from
a `git+file://` bare repository and from an OCI registry (Debian's docker-registry on 127.0.0.1,
started the way the tests start it), each timed from ref to `install.done` (resolve, fetch,
validate, journal, swap, record, commit, registry rescan), next to the bare fetch: `git clone
--depth 1` of the same repository, and for OCI the registry pull alone (resolve the tag, pull the
manifest and the layer with its digest checked, unpack into a fresh directory: no install).

Target (distribution issue): each install ≤ 800 ms median. Every round installs into a fresh
place: the app is uninstalled between rounds (not timed), so every round really fetches.
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

from atrium.distribution.fetchers import ResolvedRef
from atrium.distribution.fetchers.oci import OciFetcher
from atrium.distribution.oci import push_app, resolve_oci
from atrium.distribution.pipeline import Approval
from atrium.distribution.refs import OciRef, parse_ref
from atrium.identity import new_token
from atrium.scopes import Scope
from atrium.settings import Settings
from atrium.shell import Shell, open_shell
from bench.report import table
from tests.integration.registry import running_registry

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


async def installs(shell: Shell, ref: str, rounds: int = ROUNDS) -> list[float]:
    samples = []
    for _ in range(rounds):
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


async def registry_pulls(ref: OciRef, root: Path, rounds: int = ROUNDS) -> list[float]:
    """The registry pull alone: resolve the tag, fetch and unpack into a fresh directory."""
    samples = []
    for n in range(rounds):
        staging = root / f"pull{n}"
        staging.mkdir(parents=True)
        started = time.perf_counter()
        digest, _ = await resolve_oci(ref)
        pinned = OciRef(ref.registry, ref.repository, None, digest)
        resolved = ResolvedRef("oci", str(pinned), digest, ref, APP)
        async for _ in OciFetcher().fetch(resolved, staging):
            pass
        samples.append(time.perf_counter() - started)
        assert (staging / APP / "app.manifest.json").is_file()
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
            with running_registry(root / "registry") as registry:
                oci = OciRef(registry.host, f"apps/{APP}", "1.0.0")
                await push_app(app, oci)
                await registry_pulls(oci, root / "warm", rounds=1)
                pulls = await registry_pulls(oci, root / "pulls")
                async with open_shell(settings, new_token()) as shell:
                    await installs(shell, f"local:{app}")  # warm caches and imports first
                    local = await installs(shell, f"local:{app}")
                    over_daemon = await installs(shell, f"{daemon_url}#v1")
                    over_file = await installs(shell, f"git+file://{bare}#v1")
                    await installs(shell, str(oci), rounds=1)
                    over_oci = await installs(shell, str(oci))
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
    table(
        f"Install of the same app from OCI (docker-registry, loopback), {ROUNDS} rounds",
        [
            ("registry pull alone: resolve+fetch+unpack", pulls),
            ("install oci:// (docker-registry, loopback)", over_oci),
        ],
        baseline="registry pull alone: resolve+fetch+unpack",
        target_ms=800,
    )


if __name__ == "__main__":
    asyncio.run(main())
