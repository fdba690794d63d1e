"""Testing an app against a real shell: for app authors' own tests (``atrium new`` writes one).

``RunningShell`` starts ``atrium serve`` as a child process on a home of its own (a temporary
folder, a free port, the best sandbox the machine has) and calls it as the user. ``check_contract``
installs an app folder into such a shell and walks what docs/authoring.md "The contract" asks of
every app, check by check, so an author reads which promise broke and why (with the app's log):

    from atrium.testing import check_contract

    def test_the_app_meets_the_contract():
        report = check_contract(Path(__file__).parent.parent)
        assert report.ok, report.text()

Part of the authors' kit, not of the shell: the shell never imports it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from atrium.distribution.check import problems_of
from atrium.manifest import MANIFEST_FILE, Manifest, parse_manifest

#: how long the shell, an install or a move may take before a check fails
DEADLINE = 30.0


class ShellFailed(RuntimeError):
    """The shell did not start, or answered a call with an error it should not have."""


@dataclass(frozen=True, slots=True)
class Check:
    """One promise of the contract, kept or not, and what was seen."""

    name: str
    ok: bool
    detail: str


@dataclass(slots=True)
class ContractReport:
    """Every check in the order made; the app's log when one failed."""

    app_id: str
    checks: list[Check] = field(default_factory=list)
    log: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, ok, detail))
        return ok

    def text(self) -> str:
        lines = [f"{self.app_id}: {'meets' if self.ok else 'does not meet'} the contract"]
        lines += [f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks]
        if self.log and not self.ok:
            lines += ["  the app's log (last lines):", *("    " + x for x in self.log.splitlines())]
        return "\n".join(lines)


class RunningShell:
    """``atrium serve`` on a temporary home (removed on exit), called as the user.

    ``home`` uses a given home instead (left in place; an existing one must be an Atrium home). ``runner`` is ``auto``,
    ``bwrap`` or ``process``. The shell's own output goes to ``serve.log`` beside the home.
    """

    def __init__(self, home: Path | None = None, runner: str = "auto") -> None:
        #: a temporary folder for the shell's output and, unless ``home`` is given, its home
        self.root = Path(tempfile.mkdtemp(prefix="atrium-test-"))
        self.home = home or self.root / "home"
        self.runner = runner
        self.url = ""
        self.token = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._http: httpx.Client | None = None

    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _start(self) -> None:
        # searchable by others: an app under its own uid (a root shell's process runner) must
        # reach its installed copy below this folder; the shell makes its home private itself
        self.root.chmod(0o755)
        env = {**os.environ, "ATRIUM_HOME": str(self.home), "ATRIUM_PORT": "0"}
        env["ATRIUM_RUNNER"] = self.runner
        # the app on the host's network, as a shell that is not root runs it: the contract's
        # secret check connects to its port as any other process would, which a network of
        # its own (a root shell's default) would not let it reach at all
        env["ATRIUM_APP_NETWORK_APPS"] = "images"
        env.pop("ATRIUM_URL", None)
        env.pop("ATRIUM_TOKEN", None)
        with (self.root / "serve.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "atrium", "serve", "--log-level", "warning"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        run = self.home / "run"
        deadline = time.monotonic() + DEADLINE
        while not ((run / "url").is_file() and (run / "token").is_file()):
            if self._proc.poll() is not None:
                raise ShellFailed(f"atrium serve exited with {self._proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                raise ShellFailed(f"atrium serve did not start within {DEADLINE:.0f} s")
            time.sleep(0.05)
        self.url = (run / "url").read_text().strip()
        self.token = (run / "token").read_text().strip()
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=DEADLINE,
        )
        while self._http.get("/api/version").status_code != 200:  # pragma: no cover - a race only
            time.sleep(0.05)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        """The shell's own output so far."""
        try:
            return (self.root / "serve.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    # -- calls as the user ----------------------------------------------------------------------

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            raise ShellFailed("the shell is not running")
        return self._http

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.request(method, path, **kwargs)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of a call that must succeed (else ``ShellFailed`` with the error)."""
        answer = self.http.request(method, path, **kwargs)
        if answer.status_code >= 400:
            try:
                error = answer.json()["error"]
                said = f"{error['code']}: {error['message']}"
            except (ValueError, KeyError, TypeError):
                said = answer.text[:500]
            raise ShellFailed(f"{method} {path}: {answer.status_code} {said}")
        return answer.json()

    def install(self, folder: Path, scope: str = "user") -> dict[str, Any]:
        """Install (or update to) the app in ``folder``, approving its permissions."""
        body = {"ref": f"local:{folder.resolve()}", "scope": scope, "autoApprove": True}
        result: dict[str, Any] = self.call("POST", "/api/dist/install", json=body)
        return result

    def launch(self, app_id: str) -> dict[str, Any]:
        """The app's live instance, started if need be (``POST /api/instances``)."""
        instance: dict[str, Any] = self.call("POST", "/api/instances", json={"appId": app_id})
        return instance

    def act(self, instance_id: str, action: str) -> dict[str, Any]:
        """One lifecycle action (``resume``, ``pause``, ``stop``, ``start`` …): the instance after."""
        instance: dict[str, Any] = self.call("POST", f"/api/instances/{instance_id}/{action}")
        return instance

    def logs(self, instance_id: str, lines: int = 40) -> str:
        answer = self.http.get(f"/api/instances/{instance_id}/logs", params={"lines": lines})
        return answer.text if answer.status_code == 200 else ""

    @contextlib.contextmanager
    def watch(self, topics: str, **params: str) -> Iterator[EventWatch]:
        """Listen on ``/api/events`` (connected before the block runs) while the block acts."""
        watch = EventWatch(self.url, self.token, {"topics": topics, **params})
        try:
            yield watch
        finally:
            watch.close()


class EventWatch:
    """A server-sent event stream read in a thread; ``wait`` for the event a test expects.

    Plain ``http.client`` on a socket of its own, so that ``close`` can shut the socket under
    the reading thread at once (a stream is otherwise quiet until the next heartbeat)."""

    def __init__(self, url: str, token: str, params: dict[str, str]) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._arrived = threading.Condition()
        self._connected = threading.Event()
        parts = urllib.parse.urlsplit(url)
        self._conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
        self._target = "/api/events?" + urllib.parse.urlencode(params)
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if not self._connected.wait(DEADLINE):
            self.close()
            raise ShellFailed("the event stream did not connect")

    def _read(self) -> None:
        with contextlib.suppress(OSError, http.client.HTTPException):
            self._conn.request("GET", self._target, headers=self._headers)
            answer = self._conn.getresponse()
            if answer.status != 200:
                return
            topic = data = ""
            for raw in answer:
                line = raw.decode().rstrip("\r\n")
                if line.startswith(":"):
                    self._connected.set()
                elif line.startswith("event:"):
                    topic = line[6:].strip()
                elif line.startswith("data:"):
                    data = line[5:].strip()
                elif not line and data:
                    with self._arrived:
                        self.events.append((topic, json.loads(data)))
                        self._arrived.notify_all()
                    topic = data = ""

    def wait(
        self, topic: str, match: Callable[[dict[str, Any]], bool] = lambda _: True
    ) -> dict[str, Any] | None:
        """The first event of ``topic`` whose payload ``match``es, or None after the deadline."""
        deadline = time.monotonic() + DEADLINE
        with self._arrived:
            while True:
                for seen, payload in self.events:
                    if seen == topic and match(payload):
                        return payload
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._arrived.wait(left)

    def close(self) -> None:
        """End the stream: shut its socket under the reading thread, then wait for it."""
        if self._conn.sock is not None:
            with contextlib.suppress(OSError):
                self._conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(DEADLINE)
        self._conn.close()


def check_contract(folder: Path, shell: RunningShell | None = None) -> ContractReport:
    """Install ``folder`` into ``shell`` (a new one when None) and check the contract.

    Stops at the first check that leaves nothing further to check (an invalid folder, a failed
    install or start); otherwise every check runs and reports. The app stays installed in a
    given shell, its instance destroyed.
    """
    folder = folder.resolve()
    report = ContractReport(app_id=folder.name)
    problems = problems_of(folder)
    detail = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
    if not report.add("valid", not problems, detail or "nothing an install would refuse"):
        return report
    if shell is None:
        with RunningShell() as own:
            return _walk(folder, own, report)
    return _walk(folder, shell, report)


def _walk(folder: Path, shell: RunningShell, report: ContractReport) -> ContractReport:
    manifest = parse_manifest(json.loads((folder / MANIFEST_FILE).read_bytes()), folder.name)
    try:
        shell.install(folder)
    except ShellFailed as err:
        report.add("installs", False, str(err))
        return report
    report.add("installs", True, f"into the user scope of a shell at {shell.url}")
    try:
        instance = shell.launch(manifest.id)
    except ShellFailed as err:
        report.add("starts", False, f"{err} (health identity, onCreate, onStart)")
        report.log = _last_log(shell, manifest.id)
        return report
    iid = instance["instanceId"]
    report.add(
        "starts",
        instance["state"] == "started",
        f"{iid} listened on OS_PORT, /health named it, onCreate and onStart answered "
        f"(state {instance['state']})",
    )
    steps: list[Callable[[], None]] = [
        lambda: _secret(report, instance),
        lambda: _moves(report, shell, iid, ["resume", "resumed"], "resumed", "onResume answered"),
        lambda: _page(report, shell, iid, manifest.theme_strategy),
        lambda: _providers(report, shell, manifest),
        lambda: _activity(report, shell, iid),
        lambda: _moves(report, shell, iid, ["stop"], "stopped", "onPause and onStop answered"),
        lambda: _moves(report, shell, iid, ["start"], "started", "started on the same data again"),
        lambda: _destroy(report, shell, iid),
    ]
    for step in steps:
        try:
            step()
        except (ShellFailed, httpx.HTTPError) as err:
            report.add("answers the shell", False, str(err))
        if not report.ok and not report.log:
            report.log = shell.logs(iid)  # now: a destroyed instance has no log to show
    return report


def _destroy(report: ContractReport, shell: RunningShell, iid: str) -> None:
    answer = shell.request("DELETE", f"/api/instances/{iid}")
    clean = answer.status_code == 200 and "problem" not in answer.json()
    report.add("destroys", clean, "onStop and onDestroy answered" if clean else answer.text[:300])


def _last_log(shell: RunningShell, app_id: str) -> str:
    ids = [i["instanceId"] for i in shell.call("GET", "/api/instances") if i["appId"] == app_id]
    return shell.logs(ids[-1]) if ids else ""


def _secret(report: ContractReport, instance: dict[str, Any]) -> None:
    """Straight to the app's port, as any other process of the machine could: refused."""
    base = f"http://127.0.0.1:{instance['port']}"
    seen: list[int | str] = []
    for headers in ({}, {"X-Os-Shell-Secret": "not-the-secret"}):
        for path in ("/health", "/"):
            try:
                seen.append(httpx.get(base + path, headers=headers, timeout=DEADLINE).status_code)
            except httpx.HTTPError as err:
                seen.append(type(err).__name__)
    report.add(
        "checks the secret",
        all(status == 403 for status in seen),
        f"requests without the shell's secret answered {sorted(set(map(str, seen)))} "
        "(403 expected)",
    )


def _moves(
    report: ContractReport, shell: RunningShell, iid: str, actions: list[str], state: str, what: str
) -> None:
    name = f"{'/'.join(actions)} → {state}"
    try:
        for action in actions:
            instance = shell.act(iid, action)
    except ShellFailed as err:
        report.add(name, False, str(err))
        return
    report.add(name, instance["state"] == state, f"{what} (state {instance['state']})")


def _page(report: ContractReport, shell: RunningShell, iid: str, strategy: str) -> None:
    answer = shell.request("GET", f"/api/proxy/{iid}/")
    kind = answer.headers.get("content-type", "")
    if answer.status_code == 404:
        report.add("page", True, "no page at / (an app without a page)")
        return
    ok = answer.status_code < 400
    detail = f"/ answered {answer.status_code} {kind}"
    if ok and kind.startswith("text/html") and strategy == "inherit":
        ok = "--os-color-" in answer.text
        detail += ", with the theme's --os-* variables injected" if ok else ", no theme injected"
    report.add("page", ok, detail)


def _providers(report: ContractReport, shell: RunningShell, manifest: Manifest) -> None:
    provider = manifest.data_provider
    if provider is None:
        return
    for entry in provider.providers:
        url = f"/api/data/{provider.authority}{entry.path}"
        answer = shell.request("GET", url)
        code = _error_code(answer)
        report.add(
            f"provides {provider.authority}{entry.path}",
            answer.status_code < 500 and code not in {"upstream_failed", "upstream_timeout"},
            f"GET {url} as the user answered {answer.status_code}" + (f" ({code})" if code else ""),
        )


def _activity(report: ContractReport, shell: RunningShell, iid: str) -> None:
    answer = shell.request("POST", f"/api/instances/{iid}/activities", json={"extras": {}})
    body = answer.json() if answer.status_code == 200 else {}
    ok = answer.status_code == 200 and str(body.get("path", "")).startswith("/")
    report.add(
        "opens an activity",
        ok,
        f"onActivityCreate answered path {body.get('path')!r}" if ok else answer.text[:300],
    )


def _error_code(answer: httpx.Response) -> str | None:
    try:
        code = answer.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(code)
