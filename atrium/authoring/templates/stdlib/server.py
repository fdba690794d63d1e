"""{{APP_NAME}}: an Atrium app in plain Python, no Atrium import (`atrium new --template stdlib`).

It meets the whole contract of docs/authoring.md by hand, to show that the contract is all an app
needs: refuse any request without the shell's secret, answer `/health` with the instance's
identity, answer every lifecycle hook, name the app on every answer, keep data in `OS_DATA_DIR`.

The page at `/` lists items. The content provider `{{APP_ID}}` serves them to other apps:
`GET /api/data/{{APP_ID}}/items` needs `{{APP_ID}}.read`, `POST` with `{"text": "..."}` needs
`{{APP_ID}}.write` (the shell checks both before the request arrives here). The intent
`{{APP_ID}}.action.ADD_ITEM` with extras `{"text": ...}` adds an item and opens the page; since
adding is a write, its filter in the manifest names `{{APP_ID}}.write` too, and the shell starts
it only for the user and apps holding that.
"""

from __future__ import annotations

import fcntl
import hmac
import html
import json
import os
import sys
import threading
import urllib.parse
import urllib.request
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

APP_ID = os.environ.get("OS_APP_ID", "{{APP_ID}}")
INSTANCE_ID = os.environ.get("OS_INSTANCE_ID", "")


def app_secret(name: str) -> str:
    """OS_APP_TOKEN / OS_SHELL_SECRET: the environment, else the file $OS_SECRETS_DIR/<name>
    (on Kubernetes the secrets are files of the pod, never its environment)."""
    value = os.environ.get(name, "")
    folder = os.environ.get("OS_SECRETS_DIR", "")
    if not value and folder:
        try:
            value = Path(folder, name).read_text().strip()
        except OSError:
            value = ""
    return value


SECRET = app_secret("OS_SHELL_SECRET").encode()
DATA_DIR = Path(os.environ.get("OS_DATA_DIR") or ".")
PAGE = Path(__file__).with_name("index.html").read_bytes()
PROVIDER = "/api/data/items"
#: answered by the shell's calls only, never by a browser's page request
SHELL_ROUTES = ("/health", "/api/lifecycle", "/api/data")
HOOKS = ("onCreate", "onStart", "onResume", "onPause", "onStop", "onDestroy", "onActivityCreate")
THREADS = threading.Lock()


def load() -> list[dict[str, str]]:
    try:
        items = json.loads((DATA_DIR / "items.json").read_text())
    except (FileNotFoundError, ValueError):
        return []
    return items if isinstance(items, list) else []


def add(text: str) -> dict[str, str]:
    """Append an item atomically (temporary file, then rename), under a lock shared with any
    other process of this app that the shell runs on the same data folder."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    with THREADS, (DATA_DIR / ".items.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        items = load()
        item = {"id": os.urandom(6).hex(), "text": text}
        items.append(item)
        tmp = DATA_DIR / f".items.json.{os.getpid()}.tmp"
        with tmp.open("w") as file:
            json.dump(items, file)
            file.flush()
            os.fsync(file.fileno())
        tmp.replace(DATA_DIR / "items.json")
    notify_change("/items")
    return item


def notify_change(path: str) -> None:
    """Tell the shell that `path` of this app's authority changed (POST /api/data-changes as this
    instance); a lost notice must not fail the write, so failures are only printed."""
    request = urllib.request.Request(
        os.environ.get("OS_SHELL_URL", "").rstrip("/") + "/api/data-changes",
        data=json.dumps({"path": path}).encode(),
        headers={
            "Authorization": "Bearer " + app_secret("OS_APP_TOKEN"),
            "Content-Type": "application/json",
        },
        method="POST",
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=5):
            pass
    except OSError as err:
        print(f"notify_change {path} failed: {err}", file=sys.stderr)


def page(headers: Message) -> bytes:
    """The page, greeting who is looking: the shell names them on every page request
    (`X-Os-User-Id`, `X-Os-User-Name` percent-encoded UTF-8, `X-Os-User-Role`: `owner`, or
    `viewer`/`editor` for a user the instance was shared with)."""
    user_id = headers.get("X-Os-User-Id")
    if not user_id:
        return PAGE
    name = urllib.parse.unquote(headers.get("X-Os-User-Name") or user_id, errors="replace")
    who = f'<p class="status" id="who">Hello, {html.escape(name)}</p>'
    return PAGE.replace(b"<!--os-user-->", who.encode(), 1)


class Handler(BaseHTTPRequestHandler):
    """One connection from the shell: the secret first, then the route."""

    protocol_version = "HTTP/1.1"  # keep-alive: the shell reuses connections
    disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK stall

    def log_message(self, format: str, *args: object) -> None:
        pass

    def send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Os-App-Id", APP_ID)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, data: object) -> None:
        self.send(status, json.dumps(data).encode())

    def error(self, status: int, code: str, message: str) -> None:
        self.send_json(status, {"error": {"code": code, "message": message}})

    def handle_request(self) -> None:
        given = self.headers.get_all("X-Os-Shell-Secret") or []
        if not SECRET or len(given) != 1 or not hmac.compare_digest(given[0].encode(), SECRET):
            self.close_connection = True  # the body is left unread
            self.error(403, "permission_denied", "this app only answers the Atrium shell")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.partition("?")[0]
        page_request = self.headers.get("X-Os-Request-Kind") == "page"
        if page_request and any(path == r or path.startswith(r + "/") for r in SHELL_ROUTES):
            self.error(404, "not_found", f"{path} is for the shell")
        elif path == "/health" and self.command in ("GET", "HEAD"):
            self.send_json(200, {"appId": APP_ID, "instanceId": INSTANCE_ID, "ok": True})
        elif path.startswith("/api/lifecycle/") and self.command == "POST":
            self.hook(path.removeprefix("/api/lifecycle/"), body)
        elif path == PROVIDER:
            self.items(body)
        elif path == "/" and self.command in ("GET", "HEAD"):
            self.send(200, page(self.headers), "text/html; charset=utf-8")
        else:
            self.error(404, "not_found", f"no route for {self.command} {path}")

    def hook(self, name: str, raw: bytes) -> None:
        if name.startswith("onActivityDestroy/"):
            self.send_json(200, {"ok": True})
        elif name == "onActivityCreate":
            # extras come from whoever started the intent (`intent.callerAppId`, null for the
            # user): this adds an item only because the filter's permission let that caller in
            try:
                extras = json.loads(raw or b"{}").get("extras")
            except (ValueError, AttributeError):
                extras = None
            text = extras.get("text") if isinstance(extras, dict) else None
            if isinstance(text, str) and text.strip():
                add(text)
            self.send_json(200, {"path": "/", "title": "{{APP_NAME}}"})
        elif name in HOOKS:
            self.send_json(200, {"ok": True})
        else:
            self.error(404, "not_found", f"no lifecycle hook {name!r}")

    def items(self, raw: bytes) -> None:
        if self.command in ("GET", "HEAD"):
            self.send_json(200, load())
            return
        if self.command != "POST":
            self.error(405, "bad_request", f"{self.command} /items: use GET or POST")
            return
        try:
            text = json.loads(raw).get("text")
        except (ValueError, AttributeError):
            text = None
        if not isinstance(text, str) or not text.strip():
            self.error(400, "bad_request", 'the body must be a JSON object {"text": "..."}')
            return
        self.send_json(201, add(text))

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = handle_request


if __name__ == "__main__":
    host = os.environ.get("OS_HOST", "127.0.0.1")
    port = int(os.environ.get("OS_PORT") or os.environ.get("PORT") or "0")
    # the shell may open up to 64 connections at once: listen with room for all of them
    # (http.server's backlog is 5; the kernel drops what does not fit, and TCP retries late)
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.serve_forever()
