"""Chaos: random `kill -9` of a real `atrium serve` during install, update, uninstall and launch.

Each run picks an operation the app's current state allows, starts it over HTTP, SIGKILLs the shell
at a random moment within the operation's measured duration (so the kill lands before, during or
just after it), starts a new shell on the same home and checks what the platform promises:

- the app is absent, or at the old or the new version, and its install record, `GET /api/apps`,
  the manifest on disk and the scope repository agree; no journal, nothing in staging, git clean;
- the instance's runtime data is intact unless the app was uninstalled;
- every KV write acknowledged before the kill reads back (a writer thread runs during the op);
- nothing the killed shell started still runs (its children die with it);
- `atrium doctor` finds nothing to report; the app, when installed, launches to `resumed`.

`make chaos` runs it (`CHAOS_RUNS`, default 100; `CHAOS_SEED` replays a run). It prints one line per
failure and a table per operation; the exit status is 1 when anything failed. The runner is picked
at random per run among those that work here (bwrap when it does, the process runner).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
APP = "bench.chaos.app"
TOKEN = "chaos-token-0123456789abcdef0123"  # noqa: S105 (a throw-away home's token)
SERVER = ROOT / "tests" / "apps" / "test.plain.stdlib" / "server.py"
FILES = 200
DEADLINE = 30.0
OPS = ("install", "update", "uninstall", "launch")


@dataclass
class Stats:
    runs: int = 0
    failures: int = 0
    applied: int = 0  # runs after which the operation's new state was in place
    durations: list[float] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)


def write_app(root: Path, version: int) -> Path:
    """The app's source folder at ``version``: a stdlib server and FILES small files."""
    app = root / "src" / APP
    shutil.rmtree(app, ignore_errors=True)
    (app / "static").mkdir(parents=True)
    shutil.copy(SERVER, app / "server.py")
    for n in range(FILES):
        (app / "static" / f"f{n:03d}.txt").write_text(f"file {n} of version {version}\n" * 8)
    manifest = {
        "id": APP,
        "name": "Chaos",
        "version": f"1.0.{version}",
        "entrypoint": ["/usr/bin/python3", "server.py"],
        "startTimeoutMs": 5000,
    }
    (app / "app.manifest.json").write_text(json.dumps(manifest))
    return app


def bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--unshare-user", "true"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


class Shell:
    """`atrium serve` as a child process, found through `$ATRIUM_HOME/run/url`."""

    def __init__(self, home: Path, system_apps: Path, runner: str, log: Path) -> None:
        (home / "run" / "url").unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")}
        env.update(
            ATRIUM_HOME=str(home),
            ATRIUM_SYSTEM_APPS=str(system_apps),
            ATRIUM_RUNNER=runner,
            ATRIUM_TOKEN=TOKEN,
        )
        self._log = log.open("ab")
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atrium", "serve", "--port", "0"],
            env=env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        url_file = home / "run" / "url"
        end = time.monotonic() + DEADLINE
        while not url_file.exists() or not url_file.read_text().strip():
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode} (log: {log})")
            if time.monotonic() > end:
                raise RuntimeError(f"serve wrote no URL within {DEADLINE} s (log: {log})")
            time.sleep(0.01)
        self.url = url_file.read_text().strip()
        self.start_seconds = time.perf_counter() - started

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=DEADLINE)

    def descendants(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
        found: list[int] = []
        pending = [self.proc.pid]
        while pending:
            for child in children.get(pending.pop(), []):
                found.append(child)
                pending.append(child)
        return found

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE)
        self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return state[state.rindex(b")") + 2 : state.rindex(b")") + 3] != b"Z"


def git(scope: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=scope, capture_output=True, text=True, check=False
    ).stdout


class KvWriter(threading.Thread):
    """Writes numbered keys until stopped; remembers which the shell acknowledged."""

    def __init__(self, url: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self._url, self._prefix = url, prefix
        self.acknowledged: dict[str, str] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=self._url, headers=headers, timeout=5) as api:
            n = 0
            while not self._halt.is_set():
                key, value = f"{self._prefix}-{n}", f"value {n}"
                try:
                    answer = api.put(f"/api/kv/os/{key}", json={"value": value})
                except httpx.HTTPError:
                    return
                if answer.status_code == 200:
                    self.acknowledged[key] = value
                n += 1
                time.sleep(0.005)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


class Chaos:
    def __init__(self, work: Path, seed: int) -> None:
        self.work = work
        self.home = work / "home"
        self.system_apps = work / "system-apps"
        self.system_apps.mkdir(parents=True)
        self.log = work / "serve.log"
        self.rng = random.Random(seed)
        self.runners = ["process", "bwrap"] if bwrap_works() else ["process"]
        self.version = 0  # the installed version, 0 when not installed
        self.latest = 0
        self.kv: dict[str, str] = {}
        self.kv_checked = 0
        self.estimate = dict.fromkeys(OPS, 1.0)
        self.stats = {op: Stats() for op in OPS}
        self.failures: list[str] = []
        self.scope = self.home / "scopes" / "global"

    # -- one run ---------------------------------------------------------------------------------

    def choose(self) -> str:
        if not self.version:
            return "install"
        return self.rng.choice(("update", "update", "uninstall", "launch", "launch"))

    def request(self, op: str) -> tuple[str, str, dict[str, Any] | None]:
        if op == "install":
            self.latest += 1
            source = write_app(self.work, self.latest)
            return "POST", "/api/dist/install", {"ref": f"local:{source}", "autoApprove": True}
        if op == "update":
            self.latest += 1
            write_app(self.work, self.latest)
            return "POST", f"/api/dist/update/{APP}", {"autoApprove": True}
        if op == "uninstall":
            return "DELETE", f"/api/dist/uninstall/{APP}", None
        return "POST", "/api/instances", {"appId": APP, "new": True}

    def run(self, number: int) -> None:
        op = self.choose()
        stats = self.stats[op]
        stats.runs += 1
        runner = self.rng.choice(self.runners)
        before = self.version
        data = self.scope / "apps" / APP / f"{APP}-1" / "data.txt"
        if before:
            data.parent.mkdir(parents=True, exist_ok=True)
            data.write_text(f"run {number}")
        shell = Shell(self.home, self.system_apps, runner, self.log)
        method, path, body = self.request(op)
        new = self.latest
        delay = self.rng.uniform(0, self.estimate[op] * 1.2)
        writer = KvWriter(shell.url, f"chaos-{number}")
        writer.start()
        answer: list[httpx.Response | BaseException] = []

        def call() -> None:
            try:
                with shell.client() as api:
                    answer.append(api.request(method, path, json=body))
            except BaseException as err:  # noqa: BLE001 (the kill cuts the connection)
                answer.append(err)

        started = time.perf_counter()
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(timeout=delay)
        children = shell.descendants()
        shell.kill()
        caller.join(timeout=DEADLINE)
        writer.stop()
        self.kv.update(writer.acknowledged)
        done = answer[0] if answer else None
        if isinstance(done, httpx.Response):
            took = time.perf_counter() - started
            stats.durations.append(took)
            self.estimate[op] = statistics.median(stats.durations)
        where = f"run {number} {op} ({runner}, kill at {delay * 1000:.0f} ms)"

        def fail(what: str) -> None:
            stats.failures += 1
            self.failures.append(f"{where}: {what}")

        time.sleep(0.2)
        left = [pid for pid in children if alive(pid)]
        if left:
            fail(f"processes of the killed shell still run: {left}")
        try:
            restarted = Shell(self.home, self.system_apps, runner, self.log)
        except RuntimeError as err:
            fail(f"the shell did not start again: {err}")
            return
        stats.recoveries.append(restarted.start_seconds)
        try:
            self.check(restarted, op, before, new, data, f"run {number}", fail)
        finally:
            restarted.stop()

    def check(
        self,
        shell: Shell,
        op: str,
        before: int,
        new: int,
        data: Path,
        expected: str,
        fail: Callable[[str], None],
    ) -> None:
        allowed = {
            "install": {0, new},
            "update": {before, new},
            "uninstall": {before, 0},
            "launch": {before},
        }[op]
        with shell.client() as api:
            listed = {a["id"]: a for a in api.get("/api/apps").json()}
            app = listed.get(APP)
            now = int(app["version"].rsplit(".", 1)[1]) if app else 0
            if now not in allowed:
                fail(f"version {now} after the kill; expected one of {sorted(allowed)}")
            elif op != "launch" and now == {"install": new, "update": new, "uninstall": 0}[op]:
                self.stats[op].applied += 1
            record_path = self.scope / "records" / f"{APP}.json"
            manifest_path = self.scope / "apps" / APP / "app.manifest.json"
            if app:
                record = json.loads(record_path.read_text()) if record_path.exists() else None
                manifest = json.loads(manifest_path.read_text())
                if record is None or record["version"] != manifest["version"]:
                    fail(f"record {record and record['version']} vs manifest {manifest['version']}")
                if app.get("record") != record:
                    fail("GET /api/apps shows another record than the file")
                if before and now and not data.exists():
                    fail("runtime data lost")
                elif before and now and data.read_text() != expected:
                    fail(f"runtime data changed: {data.read_text()!r}")
            elif record_path.exists() or manifest_path.exists():
                fail("the app is not listed but its record or folder is there")
            self.version = now
            self.check_leftovers(fail)
            self.check_kv(api, fail)
            if app:
                self.launch(api, fail)
        doctor = subprocess.run(
            [sys.executable, "-m", "atrium", "doctor"],
            env={**os.environ, "ATRIUM_HOME": str(self.home)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if doctor.returncode != 0:
            said = (doctor.stdout.strip() or doctor.stderr.strip())[:300]
            fail(f"atrium doctor exited {doctor.returncode}: {said}")

    def check_leftovers(self, fail: Callable[[str], None]) -> None:
        if list((self.scope / ".journal").glob("*.json")):
            fail("a journal is left")
        if any((self.scope / ".staging").iterdir()):
            fail(f"staging not empty: {list((self.scope / '.staging').iterdir())}")
        status = git(self.scope, "status", "--porcelain")
        if status:
            lines = status.splitlines()
            fail(f"the scope repository is not clean ({len(lines)} changes): {lines[:3]}")

    def check_kv(self, api: httpx.Client, fail: Callable[[str], None]) -> None:
        missing = [
            key
            for key, value in self.kv.items()
            if api.get(f"/api/kv/os/{key}").json().get("value") != value
        ]
        if missing:
            fail(f"{len(missing)} of {len(self.kv)} acknowledged KV writes lost: {missing[:3]}")
        self.kv_checked += len(self.kv)
        self.kv.clear()  # checked once: the next runs add their own

    def launch(self, api: httpx.Client, fail: Callable[[str], None]) -> None:
        created = api.post("/api/instances", json={"appId": APP, "new": True})
        if created.status_code != 200:
            fail(f"launch after recovery: {created.status_code} {created.text[:200]}")
            return
        iid = created.json()["instanceId"]
        resumed = api.post(f"/api/instances/{iid}/resumed")
        if resumed.status_code != 200 or resumed.json()["state"] != "resumed":
            fail(f"launch after recovery did not resume: {resumed.text[:200]}")
        api.delete(f"/api/instances/{iid}")

    # -- report ----------------------------------------------------------------------------------

    def report(self, seed: int, runs: int, seconds: float) -> None:
        print(f"\nChaos: {runs} runs of kill -9 during an operation, seed {seed}")
        print(f"runners: {', '.join(self.runners)}; {seconds:.0f} s in all")
        print(
            f"{'operation':<12} {'runs':>5} {'failures':>9} {'new state':>10} {'op median ms':>13} "
            f"{'restart ms':>11}"
        )
        for op, stats in self.stats.items():
            op_ms = statistics.median(stats.durations) * 1000 if stats.durations else float("nan")
            restart = statistics.median(stats.recoveries) * 1000 if stats.recoveries else 0.0
            applied = "-" if op == "launch" else str(stats.applied)
            print(
                f"{op:<12} {stats.runs:>5} {stats.failures:>9} {applied:>10} {op_ms:>13.0f} "
                f"{restart:>11.0f}"
            )
        print(f"{'all':<12} {runs:>5} {len(self.failures):>9}")
        print(f"acknowledged KV writes checked after the kills: {self.kv_checked}")
        print("new state: runs after which the operation had taken effect (else the old state)")
        for line in self.failures:
            print(f"FAILED {line}")


def run(runs: int, seed: int) -> int:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="atrium-chaos-") as tmp:
        # as root the process runner starts apps under their own uid, which must reach the home
        Path(tmp).chmod(0o755)
        chaos = Chaos(Path(tmp), seed)
        for number in range(1, runs + 1):
            try:
                chaos.run(number)
            except Exception as err:  # noqa: BLE001 (one broken run is a failure, not the end)
                chaos.failures.append(f"run {number}: {type(err).__name__}: {err}")
            if number % 10 == 0:
                print(f"  {number}/{runs} runs, {len(chaos.failures)} failures", flush=True)
        chaos.report(seed, runs, time.perf_counter() - started)
        if chaos.failures:
            kept = Path(tempfile.gettempdir()) / f"atrium-chaos-{seed}.log"
            shutil.copy(chaos.log, kept)
            print(f"the shells' log: {kept}")
    return 1 if chaos.failures else 0


async def main() -> None:
    runs = int(os.environ.get("CHAOS_RUNS", "100"))
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
    status = run(runs, seed)
    if status:
        raise SystemExit(status)
