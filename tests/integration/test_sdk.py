"""The app SDK (`atrium.sdk`) and the fixture apps, run as real child processes without a shell.

Each app is started the way a runner starts it: `python server.py` in its directory with the
`OS_*` environment, here with the venv's interpreter so `atrium.sdk` imports.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from atrium.sdk import HOOKS
from tests.conftest import REPO_DIR, TESTS_DIR
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

DEADLINE = 15.0
SECRET = "the-shell-secret"
FIXTURES = TESTS_DIR / "apps"
SYSTEM_APPS = REPO_DIR / "apps"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RunningApp:
    """An app's server started as a child process, and a client that holds the shell secret."""

    app_id: str
    instance_id: str
    proc: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    log: Path

    def client(self, secret: str | None = SECRET) -> httpx.Client:
        headers = {} if secret is None else {"X-Os-Shell-Secret": secret}
        return httpx.Client(base_url=self.url, headers=headers, timeout=DEADLINE)

    def is_healthy(self) -> bool:
        try:
            with self.client() as client:
                return client.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    def is_listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                return True
        except OSError:
            return False

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def wait_exit(self, timeout: float = DEADLINE) -> int:
        return self.proc.wait(timeout=timeout)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


class Launcher:
    """Starts apps as children under ``root`` and kills what is left at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[RunningApp] = []

    def start(self, app_dir: Path, *, wait_healthy: bool = True) -> RunningApp:
        app_id = app_dir.name
        instance_id = f"{app_id}-{len(self.started) + 1}"
        data_dir = self.root / "data" / app_id
        data_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        log = self.root / f"{instance_id}.log"
        env = {
            **os.environ,
            "OS_APP_ID": app_id,
            "OS_INSTANCE_ID": instance_id,
            "OS_HOST": "127.0.0.1",
            "OS_PORT": str(port),
            "PORT": str(port),
            "OS_SHELL_URL": "http://127.0.0.1:9",
            "OS_APP_TOKEN": "the-app-token",
            "OS_SHELL_SECRET": SECRET,
            "OS_DATA_DIR": str(data_dir),
        }
        with log.open("wb") as output:
            proc = subprocess.Popen(
                [sys.executable, "server.py"],
                cwd=app_dir,
                env=env,
                stdout=output,
                stderr=output,
                start_new_session=True,
            )
        app = RunningApp(app_id, instance_id, proc, f"http://127.0.0.1:{port}", data_dir, log)
        self.started.append(app)
        if wait_healthy:
            wait_for(lambda: proc.poll() is not None or app.is_healthy(), f"{app_id} to serve")
            assert proc.poll() is None, f"{app_id} exited early:\n{app.stderr()}"
        return app

    def stop_all(self) -> None:
        for app in self.started:
            if app.proc.poll() is None:
                os.killpg(app.proc.pid, signal.SIGKILL)
            app.proc.wait(timeout=DEADLINE)


StartApp = Callable[..., RunningApp]


@pytest.fixture
def start_app(tmp_path: Path) -> Iterator[StartApp]:
    launcher = Launcher(tmp_path)
    yield launcher.start
    launcher.stop_all()


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApp]:
    """One echo app for the module: the tests that use it leave it as they found it."""
    launcher = Launcher(tmp_path_factory.mktemp("echo"))
    yield launcher.start(FIXTURES / "test.sdk.echo")
    launcher.stop_all()


@pytest.fixture
def echo_client(echo: RunningApp) -> Iterator[httpx.Client]:
    with echo.client() as client:
        yield client


@pytest.fixture
def notes(start_app: StartApp) -> RunningApp:
    return start_app(SYSTEM_APPS / "com.atrium.notes")


@pytest.fixture
def notes_client(notes: RunningApp) -> Iterator[httpx.Client]:
    with notes.client() as client:
        yield client


# -- the shell secret ---------------------------------------------------------------------------


@pytest.mark.parametrize("secret", [None, "", "wrong", SECRET + "x", SECRET.upper()])
@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/health"), ("POST", "/api/lifecycle/onCreate"), ("GET", "/api/data/open/x")],
)
def test_requests_without_the_exact_shell_secret_are_refused(
    echo: RunningApp, secret: str | None, method: str, path: str
) -> None:
    with echo.client(secret) as client:
        response = client.request(method, path)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert response.headers["X-Os-App-Id"] == "test.sdk.echo"


def test_a_repeated_shell_secret_header_is_refused(echo: RunningApp) -> None:
    with echo.client(None) as client:
        response = client.get(
            "/health", headers=[("X-Os-Shell-Secret", SECRET), ("X-Os-Shell-Secret", SECRET)]
        )
    assert response.status_code == 403


def test_the_stdlib_app_refuses_requests_without_the_shell_secret(start_app: StartApp) -> None:
    plain = start_app(FIXTURES / "test.plain.stdlib")
    with plain.client(None) as anonymous, plain.client("wrong") as wrong:
        assert anonymous.get("/health").status_code == 403
        assert wrong.get("/api/data/items").status_code == 403
    with plain.client() as client:
        response = client.post("/api/data/items/1?a=b", content=b"hi")
    assert response.status_code == 200
    assert response.json()["body"] == "hi"
    assert response.headers["set-cookie"].startswith("provider=secret")


# -- what the shell calls ------------------------------------------------------------------------


def test_health_answers_the_instance_identity(echo_client: httpx.Client) -> None:
    response = echo_client.get("/health")
    assert response.status_code == 200
    assert response.json() == {
        "appId": "test.sdk.echo",
        "instanceId": "test.sdk.echo-1",
        "ok": True,
    }


@pytest.mark.parametrize(
    "hook", [h for h in HOOKS if h not in {"onActivityCreate", "onActivityDestroy"}]
)
def test_every_hook_answers_ok_by_default(echo_client: httpx.Client, hook: str) -> None:
    body = {"instanceId": "test.sdk.echo-1", "appId": "test.sdk.echo"}
    response = echo_client.post(f"/api/lifecycle/{hook}", json=body)
    assert response.status_code == 200
    assert response.json() == {"ok": True}


def test_an_activity_opens_at_the_root_and_is_destroyed(echo_client: httpx.Client) -> None:
    body = {"instanceId": "test.sdk.echo-1", "appId": "test.sdk.echo", "activityId": "a1"}
    created = echo_client.post("/api/lifecycle/onActivityCreate", json={**body, "extras": {}})
    destroyed = echo_client.post("/api/lifecycle/onActivityDestroy/a1", json=body)
    assert created.json() == {"path": "/", "title": "SDK echo"}
    assert destroyed.json() == {"ok": True}


def test_an_unknown_hook_is_404(echo_client: httpx.Client) -> None:
    assert echo_client.post("/api/lifecycle/onExplode", json={}).status_code == 404
    assert echo_client.post("/api/lifecycle/onActivityDestroy", json={}).status_code == 404


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/health"),
        ("POST", "/api/lifecycle/onStart"),
        ("GET", "/api/data/open"),
        ("GET", "/nowhere"),
        ("POST", "/health"),
        ("GET", "/raise"),
        ("HEAD", "/health"),
    ],
)
def test_every_response_names_the_app(echo_client: httpx.Client, method: str, path: str) -> None:
    response = echo_client.request(method, path)
    assert response.headers["X-Os-App-Id"] == "test.sdk.echo"


# -- routes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_a_provider_gets_every_verb_with_subpath_query_body_and_caller(
    echo_client: httpx.Client, method: str
) -> None:
    response = echo_client.request(
        method,
        "/api/data/closed/deeper/x",
        params={"q": "1", "empty": ""},
        content=b"12345" if method != "GET" else None,
        headers={
            "X-Os-Caller-App-Id": "com.example.caller",
            "X-Os-Permission": "test.sdk.echo.deep",
        },
    )
    assert response.status_code == 200
    assert response.json() == {
        "method": method,
        "path": "/api/data/closed/deeper/x",
        "subpath": "deeper/x",
        "query": {"q": "1", "empty": ""},
        "bodySize": 5 if method != "GET" else 0,
        "bodySha256": hashlib.sha256(b"12345" if method != "GET" else b"").hexdigest(),
        "callerAppId": "com.example.caller",
        "permission": "test.sdk.echo.deep",
        "headers": {
            "X-Os-Caller-App-Id": "com.example.caller",
            "X-Os-Permission": "test.sdk.echo.deep",
        },
    }


def test_a_provider_path_itself_has_an_empty_subpath(echo_client: httpx.Client) -> None:
    assert echo_client.get("/api/data/open").json()["subpath"] == ""
    assert echo_client.get("/api/data/open/").json()["subpath"] == ""


def test_a_provider_path_does_not_match_a_longer_name(echo_client: httpx.Client) -> None:
    assert echo_client.get("/api/data/openx").status_code == 404


def test_a_chunked_request_body_is_read_whole(echo_client: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"a" * 1000
        yield b"b" * 24

    response = echo_client.post("/api/data/open", content=chunks())
    assert response.json()["bodySize"] == 1024


@pytest.mark.parametrize("chunked", ["0", "1"])
def test_a_big_body_streams_whole(echo_client: httpx.Client, chunked: str) -> None:
    size = 3 * 1024 * 1024 + 7
    response = echo_client.get("/big", params={"size": str(size), "chunked": chunked})
    assert response.status_code == 200
    assert len(response.content) == size
    assert ("content-length" in response.headers) is (chunked == "0")


@pytest.mark.parametrize("path", ["/health", "/api/data/open/x", "/big?size=1000"])
def test_head_answers_headers_without_a_body(echo: RunningApp, path: str) -> None:
    # a raw socket: a client library would hide a body sent after a HEAD answer
    with socket.create_connection(("127.0.0.1", echo.port), DEADLINE) as sock:
        request = f"HEAD {path} HTTP/1.1\r\nHost: x\r\nX-Os-Shell-Secret: {SECRET}\r\n\r\n"
        sock.sendall(request.encode())
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, "the connection closed before the headers ended"
            received += chunk
        sock.settimeout(0.3)  # anything after the headers would be a body
        with contextlib.suppress(TimeoutError):
            received += sock.recv(65536)
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert rest == b""


def test_an_unknown_path_is_a_json_404(echo_client: httpx.Client) -> None:
    response = echo_client.get("/nowhere")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_known_path_with_another_method_is_405_with_allow(echo_client: httpx.Client) -> None:
    response = echo_client.delete("/health")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"


def test_a_handler_exception_is_a_json_500_and_a_traceback(
    echo: RunningApp, echo_client: httpx.Client
) -> None:
    response = echo_client.get("/raise")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal"
    assert "raised on purpose" not in response.text
    assert echo_client.get("/health").status_code == 200
    log = wait_for(lambda: "raised on purpose" in echo.stderr() and echo.stderr(), "traceback")
    assert "Traceback" in log


def test_one_connection_serves_many_requests(echo: RunningApp) -> None:
    with httpx.Client(
        base_url=echo.url,
        headers={"X-Os-Shell-Secret": SECRET},
        limits=httpx.Limits(max_connections=1),
        timeout=DEADLINE,
    ) as client:
        statuses = [client.get("/health").status_code for _ in range(20)]
        statuses += [client.post("/api/data/open", content=b"x" * 100).status_code]
        statuses += [client.get("/nowhere").status_code]
    assert statuses == [200] * 21 + [404]


# -- process ---------------------------------------------------------------------------------------


def test_sigterm_ends_the_app_promptly(start_app: StartApp) -> None:
    echo = start_app(FIXTURES / "test.sdk.echo")
    with echo.client() as client:  # an idle keep-alive connection must not hold it up
        client.get("/health")
        echo.proc.send_signal(signal.SIGTERM)
        code = echo.wait_exit(timeout=5.0)
    assert code in {0, -signal.SIGTERM}


# -- the notes app ---------------------------------------------------------------------------------


def test_notes_crud_is_kept_in_notes_json(notes: RunningApp, notes_client: httpx.Client) -> None:
    created = notes_client.post("/api/data/notes", json={"text": "first"})
    assert created.status_code == 201
    note_id = created.json()["id"]
    assert notes_client.get(f"/api/data/notes/{note_id}").json()["text"] == "first"
    updated = notes_client.put(f"/api/data/notes/{note_id}", json={"text": "second"})
    assert updated.json() == {"id": note_id, "text": "second"}
    stored = json.loads((notes.data_dir / "notes.json").read_text())
    assert stored == {note_id: {"id": note_id, "text": "second"}}
    assert notes_client.get("/api/data/notes").json() == [{"id": note_id, "text": "second"}]
    assert notes_client.delete(f"/api/data/notes/{note_id}").json() == {"ok": True}
    assert json.loads((notes.data_dir / "notes.json").read_text()) == {}
    assert notes_client.get(f"/api/data/notes/{note_id}").status_code == 404


def test_notes_survive_a_restart(start_app: StartApp) -> None:
    first = start_app(SYSTEM_APPS / "com.atrium.notes")
    with first.client() as client:
        client.post("/api/data/notes", json={"text": "kept"})
    first.proc.send_signal(signal.SIGTERM)
    first.wait_exit()
    again = start_app(SYSTEM_APPS / "com.atrium.notes")
    with again.client() as client:
        assert [n["text"] for n in client.get("/api/data/notes").json()] == ["kept"]


def test_notes_refuses_a_body_without_text(notes_client: httpx.Client) -> None:
    response = notes_client.post("/api/data/notes", json={"title": "no text"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


def test_a_notes_activity_with_text_creates_and_opens_a_note(notes_client: httpx.Client) -> None:
    body = {"instanceId": "com.atrium.notes-1", "appId": "com.atrium.notes", "activityId": "a1"}
    answer = notes_client.post(
        "/api/lifecycle/onActivityCreate", json={**body, "extras": {"text": "from an intent"}}
    ).json()
    [note] = notes_client.get("/api/data/notes").json()
    assert note["text"] == "from an intent"
    assert answer["path"] == f"/?note={note['id']}"
    assert answer["title"]


def test_notes_serves_its_page(notes_client: httpx.Client) -> None:
    response = notes_client.get("/")
    assert response.headers["content-type"].startswith("text/html")
    assert "/_os/api/data/notes/notes" in response.text


# -- the viewer app --------------------------------------------------------------------------------


def test_the_viewer_opens_one_activity_per_intent_and_forgets_it(start_app: StartApp) -> None:
    viewer = start_app(SYSTEM_APPS / "com.atrium.viewer")
    base = {"instanceId": viewer.instance_id, "appId": "com.atrium.viewer"}
    intent = {"action": "os.intent.action.VIEW", "type": "text/plain", "extras": {"text": "<b>"}}
    with viewer.client() as client:
        text = client.post(
            "/api/lifecycle/onActivityCreate",
            json={**base, "activityId": "t1", "extras": intent["extras"], "intent": intent},
        ).json()
        image = client.post(
            "/api/lifecycle/onActivityCreate",
            json={
                **base,
                "activityId": "i1",
                "extras": {},
                "intent": {"action": "os.intent.action.VIEW", "uri": "https://x.test/cat.png"},
            },
        ).json()
        text_page = client.get(text["path"]).text
        image_page = client.get(image["path"]).text
        client.post("/api/lifecycle/onActivityDestroy/t1", json={**base, "activityId": "t1"})
        gone = client.get(text["path"])
    assert text["path"] == "/activity/t1"
    assert image == {"path": "/activity/i1", "title": "View cat.png"}
    assert "&lt;b&gt;" in text_page
    assert "<b>" not in text_page.split("<body>", 1)[1]
    assert '<img src="https://x.test/cat.png"' in image_page
    assert gone.status_code == 404


# -- the fixture apps behave as their manifests say --------------------------------------------------


def hook(client: httpx.Client, name: str) -> httpx.Response:
    return client.post(f"/api/lifecycle/{name}", json={"instanceId": "x", "appId": "y"})


def test_hookfails_fails_the_hooks_its_files_name(start_app: StartApp) -> None:
    app = start_app(FIXTURES / "test.fault.hookfails")
    (app.data_dir / "fail-onPause").touch()
    (app.data_dir / "fail-onStop").write_text("404")
    (app.data_dir / "fail-onResume").write_text("not-ok")
    with app.client() as client:
        assert hook(client, "onCreate").json() == {"ok": True}
        assert hook(client, "onPause").status_code == 500
        assert hook(client, "onStop").status_code == 404
        not_ok = hook(client, "onResume")
        (app.data_dir / "fail-onPause").unlink()
        assert hook(client, "onPause").json() == {"ok": True}
    assert not_ok.status_code == 200
    assert not_ok.json()["ok"] is False


def test_hookblocks_holds_a_hook_while_its_file_exists(start_app: StartApp) -> None:
    app = start_app(FIXTURES / "test.fault.hookblocks")
    gate = app.data_dir / "block-onPause"
    gate.touch()
    with app.client() as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/api/lifecycle/onPause", json={}, timeout=0.5)
        gate.unlink()
        assert hook(client, "onPause").json() == {"ok": True}


def test_crashes_exits_with_code_7_after_post_crash(start_app: StartApp) -> None:
    app = start_app(FIXTURES / "test.fault.crashes")
    with app.client() as client:
        assert hook(client, "onStart").json() == {"ok": True}
        assert client.post("/crash").json() == {"exitCode": 7}
    assert app.wait_exit() == 7


def test_crashes_exits_through_its_provider_too(start_app: StartApp) -> None:
    app = start_app(FIXTURES / "test.fault.crashes")
    with app.client() as client:
        assert client.post("/api/data/crash", params={"code": "9"}).status_code == 200
    assert app.wait_exit() == 9


def test_exitsearly_exits_with_code_3_before_serving(start_app: StartApp) -> None:
    app = start_app(FIXTURES / "test.fault.exitsearly", wait_healthy=False)
    assert app.wait_exit() == 3
    assert not app.is_healthy()


def test_neverhealthy_answers_503(start_app: StartApp) -> None:
    app = start_app(FIXTURES / "test.fault.neverhealthy", wait_healthy=False)
    with app.client() as client:
        response = wait_for(lambda: app.is_listening() and client.get("/health"), "a listener")
    assert response.status_code == 503


def test_wrongidentity_names_another_instance_then_another_app(start_app: StartApp) -> None:
    app = start_app(FIXTURES / "test.fault.wrongidentity")
    with app.client() as client:
        first = client.get("/health").json()
        (app.data_dir / "wrong-appid").touch()
        second = client.get("/health").json()
    assert (first["appId"], first["instanceId"]) == (app.app_id, f"{app.instance_id}-impostor")
    assert (second["appId"], second["instanceId"]) == ("test.fault.impostor", app.instance_id)


def test_slowstart_serves_after_its_delay(start_app: StartApp) -> None:
    started = time.monotonic()
    app = start_app(FIXTURES / "test.fault.slowstart")
    assert time.monotonic() - started >= 1.0
    assert app.is_healthy()


def test_datawriter_writes_into_its_data_dir_only(start_app: StartApp) -> None:
    app = start_app(FIXTURES / "test.sdk.datawriter")
    with app.client() as client:
        written = client.post("/write", params={"name": "a.txt"}, content=b"hello")
        read = client.get("/read", params={"name": "a.txt"})
        escape = client.post("/write", params={"name": "../x"}, content=b"no")
        hidden = client.post("/write", params={"name": ".hidden"}, content=b"no")
    assert written.json()["size"] == 5
    assert (app.data_dir / "a.txt").read_bytes() == b"hello"
    assert read.content == b"hello"
    assert (escape.status_code, hidden.status_code) == (400, 400)


@pytest.mark.parametrize("app_id", ["test.sdk.tools", "test.sdk.notools"])
def test_the_tools_apps_report_each_command(start_app: StartApp, app_id: str) -> None:
    app = start_app(FIXTURES / app_id)
    with app.client() as client:
        answer = client.get("/run", params={"cmd": "no-such-tool-here"}).json()
        bad = client.get("/run", params={"cmd": "../bin/sh"})
    assert set(answer) == {"no-such-tool-here", "/usr/bin/no-such-tool-here"}
    assert all(isinstance(v, str) and "FileNotFoundError" in v for v in answer.values())
    assert bad.status_code == 400


def test_the_background_service_app_serves(start_app: StartApp) -> None:
    app = start_app(FIXTURES / "test.bg.service")
    with app.client() as client:
        assert hook(client, "onStop").json() == {"ok": True}


def test_the_console_serves_a_page_on_the_event_stream(start_app: StartApp) -> None:
    app = start_app(SYSTEM_APPS / "com.atrium.console")
    with app.client() as client:
        page = client.get("/")
    assert page.headers["content-type"].startswith("text/html")
    assert 'new EventSource("/_os/api/events")' in page.text


@pytest.mark.parametrize(
    "path", ["/health", "/api/lifecycle/onPause", "/api/data/open/x", "/api/data/closed"]
)
def test_a_page_request_never_reaches_the_shells_routes_in_the_sdk(
    echo_client: httpx.Client, path: str
) -> None:
    """Defence in depth behind the shell's own refusal (docs/api.md "Page requests")."""
    method = "POST" if "lifecycle" in path else "GET"
    page = echo_client.request(method, path, headers={"X-Os-Request-Kind": "page"}, json={})
    assert page.status_code == 403
    assert "not for a page request" in page.json()["error"]["message"]
    for kind in ("data", "hook", "health", "user"):
        answer = echo_client.request(method, path, headers={"X-Os-Request-Kind": kind}, json={})
        assert answer.status_code == 200, (kind, answer.text)
