"""Chaos: random `kill -9` of a real `atrium serve` during an operation on an app.

The operations are install, update, uninstall, launch, backup, restore, rollback, export, import
and wake (a data request that starts the app's headless provider). Each run picks one the app's
state allows (`OPERATIONS`: what each may leave behind and what else it promises), starts it over
HTTP, SIGKILLs the shell at a random moment within the operation's measured duration (so the kill
lands before, during or just after it), starts a new shell on the same home (the next run's) and
checks what the platform promises:

- the app is absent or at a version the operation allows, and its runtime data (two folders of
  files that all carry the marker of the run that wrote them) is one state the operation allows:
  the old data, or the restored backup's, or the imported archive's; never a mix, a torn file or
  a missing one. The install record, `GET /api/apps`, the manifest on disk and the scope
  repository agree; no journal, nothing in staging, git clean;
- an operation the shell answered 200 for took effect (a backup answered is listed, an update
  answered is installed);
- every backup folder is whole: each file its `backup.json` lists is there with its size (or its
  file count and bytes match when it lists none), its data is one state, and nothing hidden
  (`.partial`, `.deleting-…`) is left in the backups folder; more than five backups accumulate,
  so every backup-taking operation also prunes;
- an export received whole is a readable archive whose files match its `export.json` and whose
  data is the app's; it is what later imports install (until one is, an export made without a
  kill after the checks is); nothing is left in `cache/exports/` or
  `cache/imports/` after the restart;
- every KV write acknowledged before the kill reads back (a writer thread runs during the op);
- nothing the killed shell started (app, keeper, headless provider, git) still runs;
- `atrium doctor` finds nothing to report (beside the new shell: what it checks only without one,
  leftovers and processes, is checked above); the app, when installed, launches to `resumed`.

`make chaos` runs it (`CHAOS_RUNS`, default 200; `CHAOS_SEED` replays the sequence of choices). It
prints one line per failure and a table per operation; the exit status is 1 when anything failed.
The runner is picked at random per shell among those that work here (bwrap when it does, the
process runner); half the runs of an operation that stops the app's instances launch one first.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import typer
import zstandard

from atrium.cli.doctor import doctor as doctor_command

ROOT = Path(__file__).resolve().parent.parent
APP = "bench.chaos.app"
AUTHORITY = "chaos"
TOKEN = "chaos-token-0123456789abcdef0123"  # noqa: S105 (a throw-away home's token)
SERVER = ROOT / "tests" / "apps" / "test.plain.stdlib" / "server.py"
FILES = 200
#: the runtime data: DATA_FILES files in each of the folders `<APP>-1`, `<APP>-2`
DATA_FOLDERS = 2
DATA_FILES = 150
LINES = 64
DATA_NAMES = frozenset(
    f"{APP}-{n}/d{i:02}.txt" for n in range(1, DATA_FOLDERS + 1) for i in range(DATA_FILES)
)
RUNTIME = re.compile(rf"{re.escape(APP)}-[0-9]+")
EXPORT = "atrium-export"
DEADLINE = 30.0

#: (installed version, 0 when absent; the marker its runtime data carries, None without data)
State = tuple[int, str | None]


@dataclass
class Stats:
    runs: int = 0
    failures: int = 0
    applied: int = 0  # runs after which the operation had taken effect
    durations: list[float] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)


def write_app(root: Path, version: int) -> Path:
    """The app's source folder at ``version``: a stdlib server, a woken provider, FILES files."""
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
        "dataProvider": {
            "authority": AUTHORITY,
            "providers": [{"path": "/items", "readPerm": None, "writePerm": f"{APP}.write"}],
            "wake": True,
        },
    }
    (app / "app.manifest.json").write_text(json.dumps(manifest))
    return app


def write_data(app_dir: Path, marker: str) -> None:
    """Every runtime data file, each holding ``marker`` LINES times."""
    for n in range(1, DATA_FOLDERS + 1):
        folder = app_dir / f"{APP}-{n}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(DATA_FILES):
            (folder / f"d{i:02}.txt").write_text(f"{marker}\n" * LINES)


def data_files(root: Path) -> dict[str, bytes]:
    """The runtime data files under ``root`` (an app folder, a backup's `data/`) by
    `<folder>/<name>`."""
    if not root.is_dir():
        return {}
    return {
        f"{folder.name}/{path.name}": path.read_bytes()
        for folder in root.iterdir()
        if RUNTIME.fullmatch(folder.name) and folder.is_dir()
        for path in folder.iterdir()
    }


class Torn(Exception):
    """Runtime data that is not one state."""


def marker(files: dict[str, bytes]) -> str | None:
    """The one marker every data file carries (None: no data at all); Torn names a missing or
    extra file, a torn one, or a mix of states."""
    if not files:
        return None
    missing, extra = sorted(DATA_NAMES - set(files)), sorted(set(files) - DATA_NAMES)
    if missing or extra:
        raise Torn(f"{len(missing)} files missing {missing[:2]}, {len(extra)} extra {extra[:2]}")
    seen: dict[str, int] = {}
    for content in files.values():
        line = content.split(b"\n", 1)[0]
        key = line.decode() if content == (line + b"\n") * LINES else "<torn file>"
        seen[key] = seen.get(key, 0) + 1
    if len(seen) != 1 or "<torn file>" in seen:
        raise Torn("a mix: " + ", ".join(f"{n} files of {key!r}" for key, n in seen.items()))
    return next(iter(seen))


def version_of(text: str | None) -> int:
    return int(text.rsplit(".", 1)[1]) if text else 0


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
        self.runner = runner
        self.children: list[int] = []  # its descendants when it was killed
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
            self.children = self.descendants()
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


def doctor(home: Path) -> tuple[int, str]:
    """`atrium doctor` on ``home``: its exit status and what it printed. The command runs in a
    thread of this process (the same report without an interpreter start per run, about 2 s
    here; a thread, because the report runs an event loop of its own)."""

    def report() -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                doctor_command(home=home)
            except typer.Exit as done:
                return done.exit_code, out.getvalue()
        return 0, out.getvalue()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(report).result()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return state[state.rindex(b")") + 2 : state.rindex(b")") + 3] != b"Z"


def running_from(home: Path) -> list[int]:
    """Processes (other than this one) working in ``home`` or started with a path inside it: an
    app, its keeper or sandbox, git."""
    inside = f"{home.resolve()}/".encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = (entry / "cwd").readlink()
        except OSError:
            continue
        started_inside = any(arg.startswith(inside) for arg in argv)
        if argv != [b""] and (cwd.is_relative_to(home.resolve()) or started_inside):
            found.append(int(entry.name))
    return found


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


# -- what the backups folder and an export must be ---------------------------------------------


def backup_problem(path: Path) -> str | None:
    """What makes the folder ``path`` no whole backup of one state, or None."""
    try:
        manifest = json.loads((path / "backup.json").read_text())
    except (OSError, ValueError) as err:
        return f"a folder without a readable backup.json ({type(err).__name__})"
    data = path / "data"
    found = {
        p.relative_to(data).as_posix(): p.stat().st_size
        for p in (data.rglob("*") if data.is_dir() else [])
        if p.is_file() and not p.is_symlink()
    }
    sizes = manifest.get("sizes")  # every file under data/ and its size (format 2)
    if isinstance(sizes, dict):
        wrong = sorted({item[0] for item in sizes.items() ^ found.items()})
        if wrong:
            return f"{len(wrong)} files absent, resized or unlisted (of {len(sizes)}): {wrong[:2]}"
    elif (len(found), sum(found.values())) != (manifest.get("files"), manifest.get("bytes")):
        return (
            f"{len(found)} files, {sum(found.values())} bytes; backup.json says "
            f"{manifest.get('files')} files, {manifest.get('bytes')} bytes"
        )
    try:
        marker(data_files(data))
    except Torn as err:
        return f"its data is not one state: {err}"
    return None


def export_problem(content: bytes, version: int, expected: str | None) -> str | None:
    """What makes ``content`` no complete export of ``version`` with the data ``expected``."""
    members: dict[str, bytes] = {}
    order: list[str] = []
    try:
        with (
            zstandard.ZstdDecompressor().stream_reader(io.BytesIO(content)) as raw,
            tarfile.open(fileobj=raw, mode="r|") as tar,
        ):
            for member in tar:
                order.append(member.name)
                read = tar.extractfile(member) if member.isfile() else None
                if read is not None:
                    members[member.name] = read.read()
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as err:
        return f"not a readable zstd tar: {err}"
    last = f"{EXPORT}/export.json"
    if not order or order[-1] != last:
        return f"its last member is {order[-1:]!r}, not {last}"
    manifest = json.loads(members.pop(last))
    digests = {
        name.removeprefix(f"{EXPORT}/"): hashlib.sha256(body).hexdigest()
        for name, body in members.items()
    }
    if manifest.get("files") != digests:
        return "its files do not match export.json's list"
    if manifest.get("version") != f"1.0.{version}":
        return f"it holds version {manifest.get('version')}, the app is at 1.0.{version}"
    prefix = f"{EXPORT}/data/"
    data = {n.removeprefix(prefix): b for n, b in members.items() if n.startswith(prefix)}
    try:
        found = marker(data)
    except Torn as err:
        return f"its data is not one state: {err}"
    return None if found == expected else f"its data is {found!r}, the app's was {expected!r}"


# -- the operations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Archive:
    """An export received whole and checked: what an import sends."""

    content: bytes
    version: int
    marker: str | None


@dataclass(frozen=True)
class Now:
    """The state a run starts from, read before the operation."""

    number: int
    version: int
    marker: str | None
    backups: list[dict[str, Any]]  # GET /api/dist/backups, newest first
    earlier: list[int]  # versions in the app's history other than the installed one
    archive: Archive | None

    @property
    def state(self) -> State:
        return (self.version, self.marker)


@dataclass(frozen=True)
class Plan:
    """One operation's request and the states it may leave the app in."""

    method: str
    path: str
    outcomes: frozenset[State]
    new: State | None = None  # the state it leaves when it took effect
    json: Any = None
    content: bytes | None = None
    params: dict[str, str] | None = None


@dataclass(frozen=True)
class Ending:
    """What a check of one run sees after the restart."""

    now: Now
    answer: httpx.Response | None  # None when the kill cut the request
    backups: list[dict[str, Any]]  # listed after the restart
    fail: Callable[[str], None]


@dataclass(frozen=True)
class Operation:
    """A row of the table: when it may run, its request, and what else it promises (the check
    says whether it took effect; by default, whether the state is the plan's new one)."""

    weight: int
    possible: Callable[[Now], bool]
    plan: Callable[[Chaos, Now], Plan]
    check: Callable[[Chaos, Ending], bool] | None = None
    stops: bool = False  # stops the app's instances: half its runs launch one first


def plan_install(chaos: Chaos, now: Now) -> Plan:
    chaos.latest += 1
    source = write_app(chaos.work, chaos.latest)
    new = (chaos.latest, None)
    body = {"ref": f"local:{source}", "autoApprove": True}
    return Plan("POST", "/api/dist/install", frozenset({now.state, new}), new, json=body)


def plan_update(chaos: Chaos, now: Now) -> Plan:
    chaos.latest += 1
    write_app(chaos.work, chaos.latest)
    new = (chaos.latest, now.marker)
    path = f"/api/dist/update/{APP}"
    return Plan("POST", path, frozenset({now.state, new}), new, json={"autoApprove": True})


def plan_uninstall(chaos: Chaos, now: Now) -> Plan:
    return Plan(
        "DELETE", f"/api/dist/uninstall/{APP}", frozenset({now.state, (0, None)}), (0, None)
    )


def plan_launch(chaos: Chaos, now: Now) -> Plan:
    body = {"appId": APP, "new": True}
    return Plan("POST", "/api/instances", frozenset({now.state}), json=body)


def plan_backup(chaos: Chaos, now: Now) -> Plan:
    return Plan("POST", f"/api/dist/backups/{APP}", frozenset({now.state}))


def plan_restore(chaos: Chaos, now: Now) -> Plan:
    chosen = chaos.rng.choice(now.backups)
    new = (now.version, chaos.backup_marker(chosen["id"]))
    body = {"backup": chosen["id"]}
    return Plan("POST", f"/api/dist/restore/{APP}", frozenset({now.state, new}), new, json=body)


def plan_rollback(chaos: Chaos, now: Now) -> Plan:
    """Back to an earlier version; its data is the newest backup taken at that version, unless
    the plan keeps the data (or there is no such backup)."""
    to = chaos.rng.choice(now.earlier)
    keep = chaos.rng.random() < 0.25
    saved = next((b for b in now.backups if b["version"] == f"1.0.{to}"), None)
    data = now.marker if keep or saved is None else chaos.backup_marker(saved["id"])
    new = (to, data)
    body = {"to": f"1.0.{to}", "keepData": keep}
    return Plan("POST", f"/api/dist/rollback/{APP}", frozenset({now.state, new}), new, json=body)


def plan_export(chaos: Chaos, now: Now) -> Plan:
    return Plan("GET", f"/api/dist/export/{APP}", frozenset({now.state}))


def plan_import(chaos: Chaos, now: Now) -> Plan:
    archive = now.archive
    assert archive is not None
    new = (archive.version, archive.marker)
    return Plan(
        "POST",
        "/api/dist/import",
        frozenset({now.state, new}),
        new,
        content=archive.content,
        params={"autoApprove": "1"},
    )


def plan_wake(chaos: Chaos, now: Now) -> Plan:
    return Plan("GET", f"/api/data/{AUTHORITY}/items/{now.number}", frozenset({now.state}))


def answered(chaos: Chaos, end: Ending) -> bool:
    """Launch and wake take effect when they are answered (their answer is checked apart)."""
    return end.answer is not None


def check_backup(chaos: Chaos, end: Ending) -> bool:
    """A backup answered is listed after the kill; it took effect when any new one is."""
    ids = {b["id"] for b in end.backups}
    taken = end.answer.json()["id"] if end.answer and end.answer.status_code == 200 else None
    if taken is not None and taken not in ids:
        end.fail(f"backup {taken} was answered but is not listed after the kill")
    return bool(ids - {b["id"] for b in end.now.backups})


def check_export(chaos: Chaos, end: Ending) -> bool:
    """An export received whole is the app's complete archive; it becomes the next import's."""
    if end.answer is None or end.answer.status_code != 200:
        return False
    content = end.answer.content
    problem = export_problem(content, end.now.version, end.now.marker)
    if problem:
        end.fail(f"the export received whole ({len(content)} bytes): {problem}")
        return False
    chaos.archive = Archive(content, end.now.version, end.now.marker)
    return True


def installed(now: Now) -> bool:
    return now.version > 0


OPERATIONS: dict[str, Operation] = {
    "install": Operation(3, lambda now: not installed(now), plan_install),
    "update": Operation(3, installed, plan_update, stops=True),
    "uninstall": Operation(1, installed, plan_uninstall),
    "launch": Operation(1, installed, plan_launch, answered),
    "backup": Operation(3, installed, plan_backup, check_backup, stops=True),
    "restore": Operation(2, lambda now: bool(now.backups), plan_restore, stops=True),
    "rollback": Operation(2, lambda now: bool(now.earlier), plan_rollback, stops=True),
    "export": Operation(2, installed, plan_export, check_export, stops=True),
    "import": Operation(2, lambda now: now.archive is not None, plan_import, stops=True),
    "wake": Operation(2, installed, plan_wake, answered),
}


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
        self.archive: Archive | None = None
        self.shell: Shell | None = None  # left running by the last run's checks
        self.kv: dict[str, str] = {}
        self.kv_checked = 0
        self.estimate = dict.fromkeys(OPERATIONS, 2.0)  # seconds, until answers are measured
        self.stats = {name: Stats() for name in OPERATIONS}
        self.failures: list[str] = []
        self.scope = self.home / "scopes" / "global"
        self.app_dir = self.scope / "apps" / APP
        self.backups = self.home / "backups" / "global" / APP

    # -- one run ---------------------------------------------------------------------------------

    def now(self, api: httpx.Client, number: int, data: str | None) -> Now:
        backups = api.get(f"/api/dist/backups/{APP}", params={"scope": "global"}).json()
        versions: set[int] = set()
        if self.version:
            history = api.get(f"/api/dist/history/{APP}", params={"scope": "global"}).json()
            versions = {version_of(e["version"]) for e in history["entries"] if e["version"]}
        earlier = sorted(versions - {self.version})
        listed = backups if self.version else []
        return Now(number, self.version, data, listed, earlier, self.archive)

    def backup_marker(self, backup_id: str) -> str | None:
        """The data a backup holds (None when it is not one state: the backup check says so)."""
        try:
            return marker(data_files(self.backups / backup_id / "data"))
        except Torn:
            return None

    def choose(self, now: Now) -> str:
        names = [name for name, op in OPERATIONS.items() if op.possible(now)]
        weights = [OPERATIONS[name].weight for name in names]
        return self.rng.choices(names, weights)[0]

    def run(self, number: int) -> None:
        """One operation, killed; then the checks on a new shell, which the next run uses."""
        shell = self.shell or self.start()
        self.shell = None
        try:
            name, plan, now, answer, delay = self.strike(shell, number)
        finally:
            shell.kill()
        stats = self.stats[name]
        where = f"run {number} {name} ({shell.runner}, kill at {delay * 1000:.0f} ms)"

        def fail(what: str) -> None:
            stats.failures += 1
            self.failures.append(f"{where}: {what}")

        left = self.survivors(shell)
        if left:
            fail(f"processes of the killed shell still run: {left}")
            for pid in left:  # so that they hold no app's data folder in the next runs
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        try:
            restarted = self.start()
        except RuntimeError as err:
            fail(f"the shell did not start again: {err}")
            return
        stats.recoveries.append(restarted.start_seconds)
        try:
            self.check(restarted, name, plan, now, answer, fail)
            if self.archive is None and self.version:
                self.first_archive(restarted, fail)
        except BaseException:
            restarted.stop()
            raise
        self.shell = restarted

    def first_archive(self, shell: Shell, fail: Callable[[str], None]) -> None:
        """Until a killed export happens to be received whole, one export without a kill gives
        the imports their archive."""
        try:
            expected = marker(data_files(self.app_dir))
        except Torn:
            return  # (reported by the check)
        if expected is None:
            return  # just installed: the next run writes its data first
        with shell.client() as api:
            answer = api.get(f"/api/dist/export/{APP}")
        problem = (
            export_problem(answer.content, self.version, expected)
            if answer.status_code == 200
            else f"answered {answer.status_code}: {answer.text[:200]}"
        )
        if problem:
            fail(f"an export after the checks: {problem}")
        else:
            self.archive = Archive(answer.content, self.version, expected)

    def survivors(self, shell: Shell) -> list[int]:
        """What still runs of the killed shell after a moment: its descendants when it was
        killed, and any process working in the home or started with a path inside it (a child
        forked while the descendants were read is in no list)."""
        end = time.monotonic() + 0.5
        while True:
            left = sorted({*(p for p in shell.children if alive(p)), *running_from(self.home)})
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.02)

    def start(self) -> Shell:
        return Shell(self.home, self.system_apps, self.rng.choice(self.runners), self.log)

    def strike(
        self, shell: Shell, number: int
    ) -> tuple[str, Plan, Now, httpx.Response | None, float]:
        """Write the run's data, start an operation the state allows, SIGKILL the shell at a
        random moment: the operation's name, plan, starting state, answer (if any) and the
        kill's delay."""
        data = f"run {number}" if self.version else None
        if data:
            write_data(self.app_dir, data)  # no instance of the app runs between runs
        with shell.client() as api:
            now = self.now(api, number, data)
            name = self.choose(now)
            operation = OPERATIONS[name]
            plan = operation.plan(self, now)
            if operation.stops and self.rng.random() < 0.5:
                api.post("/api/instances", json={"appId": APP, "new": True})
        stats = self.stats[name]
        stats.runs += 1
        delay = self.rng.uniform(0, self.estimate[name] * 1.2)
        writer = KvWriter(shell.url, f"chaos-{number}")
        writer.start()
        answer: list[httpx.Response | BaseException] = []

        def call() -> None:
            try:
                with shell.client() as api:
                    answer.append(
                        api.request(
                            plan.method,
                            plan.path,
                            json=plan.json,
                            content=plan.content,
                            params=plan.params,
                        )
                    )
            except BaseException as err:  # noqa: BLE001 (the kill cuts the connection)
                answer.append(err)

        started = time.perf_counter()
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(timeout=delay)
        shell.kill()
        caller.join(timeout=DEADLINE)
        writer.stop()
        self.kv.update(writer.acknowledged)
        done = answer[0] if answer and isinstance(answer[0], httpx.Response) else None
        if done is not None:
            stats.durations.append(time.perf_counter() - started)
            self.estimate[name] = statistics.median(stats.durations)
        elif delay > self.estimate[name] * 0.8:  # no answer near the estimate: widen the window
            self.estimate[name] *= 1.5
        return name, plan, now, done, delay

    def check(
        self,
        shell: Shell,
        name: str,
        plan: Plan,
        now: Now,
        answer: httpx.Response | None,
        fail: Callable[[str], None],
    ) -> None:
        operation = OPERATIONS[name]
        with shell.client() as api:
            state = self.check_app(api, plan, fail)
            end = Ending(now, answer, self.check_backups(api, fail), fail)
            self.check_answer(plan, end, state)
            took = operation.check(self, end) if operation.check else state == plan.new
            self.stats[name].applied += took
            self.check_leftovers(fail)
            self.check_kv(api, fail)
            if self.version:
                self.launch(api, fail)
        status, said = doctor(self.home)
        if status != 0:
            fail(f"atrium doctor exited {status}: {said.strip()[:300]}")

    def check_app(self, api: httpx.Client, plan: Plan, fail: Callable[[str], None]) -> State | None:
        """The app's version and data are a state the plan allows, and agree with its record."""
        listed = {a["id"]: a for a in api.get("/api/apps").json()}
        app = listed.get(APP)
        self.version = version_of(app["version"]) if app else 0
        try:
            state: State | None = (self.version, marker(data_files(self.app_dir)))
        except Torn as err:
            fail(f"the runtime data at 1.0.{self.version} is not one state: {err}")
            state = None
        if state is not None and state not in plan.outcomes:
            fail(
                f"{show(state)} after the kill; expected one of {sorted(map(show, plan.outcomes))}"
            )
        record_path = self.scope / "records" / f"{APP}.json"
        manifest_path = self.app_dir / "app.manifest.json"
        if app:
            record = json.loads(record_path.read_text()) if record_path.exists() else None
            manifest = json.loads(manifest_path.read_text())
            if record is None or record["version"] != manifest["version"]:
                fail(f"record {record and record['version']} vs manifest {manifest['version']}")
            if app.get("record") != record:
                fail("GET /api/apps shows another record than the file")
        elif record_path.exists() or manifest_path.exists():
            fail("the app is not listed but its record or folder is there")
        return state

    def check_answer(self, plan: Plan, end: Ending, state: State | None) -> None:
        """An answer is a success, and a success answered has taken effect."""
        if end.answer is None:
            return
        ok = end.answer.status_code == 200
        if ok and end.answer.headers.get("content-type", "").startswith("application/json"):
            body = end.answer.json()
            ok = not (isinstance(body, dict) and body.get("ok") is False)
        if not ok:
            end.fail(f"answered {end.answer.status_code}: {end.answer.text[:200]}")
        elif plan.new is not None and state != plan.new:
            end.fail(f"answered 200, but {show(state)} after the kill, not {show(plan.new)}")

    def check_backups(self, api: httpx.Client, fail: Callable[[str], None]) -> list[dict[str, Any]]:
        """Every backup folder is whole and one state; nothing hidden is left; the listing is
        newest first by sequence (when backup.json has one). Returns the listing."""
        entries = sorted(self.backups.iterdir()) if self.backups.is_dir() else []
        hidden = [e.name for e in entries if e.name.startswith(".")]
        if hidden:
            fail(f"left in the backups folder after the restart: {hidden[:3]}")
        for entry in entries:
            problem = None if entry.name.startswith(".") else backup_problem(entry)
            if problem:
                fail(f"backup folder {entry.name}: {problem}")
        listed: list[dict[str, Any]] = api.get(
            f"/api/dist/backups/{APP}", params={"scope": "global"}
        ).json()
        sequence = [b.get("sequence", 0) for b in listed]
        if sequence != sorted(sequence, reverse=True):
            fail(f"backups not listed newest first by sequence: {sequence}")
        return listed

    def check_leftovers(self, fail: Callable[[str], None]) -> None:
        if list((self.scope / ".journal").glob("*.json")):
            fail("a journal is left")
        if any((self.scope / ".staging").iterdir()):
            fail(f"staging not empty: {list((self.scope / '.staging').iterdir())}")
        for cache in ("imports", "exports"):
            folder = self.home / "cache" / cache
            left = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
            if left:
                fail(f"left in cache/{cache}/ after the restart: {left[:3]}")
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
            f"{'operation':<12} {'runs':>5} {'failures':>9} {'took effect':>12} "
            f"{'op median ms':>13} {'restart ms':>11}"
        )
        for name, stats in self.stats.items():
            op_ms = statistics.median(stats.durations) * 1000 if stats.durations else float("nan")
            restart = statistics.median(stats.recoveries) * 1000 if stats.recoveries else 0.0
            print(
                f"{name:<12} {stats.runs:>5} {stats.failures:>9} {stats.applied:>12} "
                f"{op_ms:>13.0f} {restart:>11.0f}"
            )
        print(f"{'all':<12} {runs:>5} {len(self.failures):>9}")
        print(f"acknowledged KV writes checked after the kills: {self.kv_checked}")
        print(
            "took effect: runs after which the operation's new state was in place (a new backup "
            "listed, an export received whole, a launch or data request answered); the other "
            "runs ended in the old state"
        )
        for line in self.failures:
            print(f"FAILED {line}")


def show(state: State | None) -> str:
    if state is None:
        return "no one state"
    version, data = state
    return f"{f'1.0.{version}' if version else 'absent'} with {data or 'no data'}"


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
        if chaos.shell is not None:
            chaos.shell.stop()
        chaos.report(seed, runs, time.perf_counter() - started)
        if chaos.failures:
            kept = Path(tempfile.gettempdir()) / f"atrium-chaos-{seed}.log"
            shutil.copy(chaos.log, kept)
            print(f"the shells' log: {kept}")
    return 1 if chaos.failures else 0


async def main() -> None:
    runs = int(os.environ.get("CHAOS_RUNS", "200"))
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
    status = run(runs, seed)
    if status:
        raise SystemExit(status)
