"""Notes: a system app of Atrium, written against the stdlib only.

It serves its page at `/`, answers `/health` and the lifecycle hooks, and provides the `notes`
authority: GET/POST /api/data/notes, GET/PUT/DELETE /api/data/notes/<id>. Notes live in
$OS_DATA_DIR/notes.json, written atomically. Every request must carry the shell's secret.
"""

from __future__ import annotations

import hmac
import json
import os
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

APP_ID = os.environ.get("OS_APP_ID", "com.atrium.notes")
INSTANCE_ID = os.environ.get("OS_INSTANCE_ID", "")
SECRET = os.environ.get("OS_SHELL_SECRET", "")
DATA = Path(os.environ.get("OS_DATA_DIR", ".")) / "notes.json"
LOCK = threading.Lock()
PAGE = Path(__file__).with_name("index.html").read_bytes()


def load() -> dict[str, dict[str, str]]:
    try:
        return json.loads(DATA.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def save(notes: dict[str, dict[str, str]]) -> None:
    tmp = DATA.with_suffix(".tmp")
    tmp.write_text(json.dumps(notes))
    os.replace(tmp, DATA)


class Handler(BaseHTTPRequestHandler):
    server_version = "notes/0.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    def send(self, status: int, body: object, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Os-App-Id", APP_ID)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def body(self) -> object:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def trusted(self) -> bool:
        given = self.headers.get("X-Os-Shell-Secret", "")
        if SECRET and hmac.compare_digest(given, SECRET):
            return True
        self.send(403, {"error": {"code": "permission_denied", "message": "not called by the shell"}})
        return False

    def route(self) -> None:
        if not self.trusted():
            return
        path = self.path.split("?", 1)[0]
        if path == "/health" and self.command == "GET":
            self.send(200, {"appId": APP_ID, "instanceId": INSTANCE_ID, "ok": True})
        elif path.startswith("/api/lifecycle/") and self.command == "POST":
            self.body()
            if path == "/api/lifecycle/onActivityCreate":
                self.send(200, {"path": "/", "title": "Notes"})
            else:
                self.send(200, {"ok": True})
        elif path == "/api/data/notes" or path.startswith("/api/data/notes/"):
            self.notes(path.removeprefix("/api/data/notes").strip("/"))
        elif path == "/" and self.command in {"GET", "HEAD"}:
            self.send(200, PAGE, "text/html; charset=utf-8")
        else:
            self.send(404, {"error": {"code": "not_found", "message": f"no route {path}"}})

    def notes(self, note_id: str) -> None:
        with LOCK:
            notes = load()
            if not note_id and self.command in {"GET", "HEAD"}:
                self.send(200, sorted(notes.values(), key=lambda n: n["id"]))
            elif not note_id and self.command == "POST":
                body = self.body()
                text = body.get("text", "") if isinstance(body, dict) else ""
                note = {"id": uuid.uuid4().hex[:12], "text": str(text)}
                notes[note["id"]] = note
                save(notes)
                self.send(201, note)
            elif note_id not in notes:
                self.send(404, {"error": {"code": "not_found", "message": f"no note {note_id}"}})
            elif self.command in {"GET", "HEAD"}:
                self.send(200, notes[note_id])
            elif self.command == "PUT":
                body = self.body()
                notes[note_id]["text"] = str(body.get("text", "")) if isinstance(body, dict) else ""
                save(notes)
                self.send(200, notes[note_id])
            elif self.command == "DELETE":
                del notes[note_id]
                save(notes)
                self.send(200, {"ok": True})
            else:
                self.send(405, {"error": {"code": "bad_request", "message": "method not allowed"}})

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = route


if __name__ == "__main__":
    host = os.environ.get("OS_HOST", "127.0.0.1")
    port = int(os.environ.get("OS_PORT") or os.environ.get("PORT") or "0")
    ThreadingHTTPServer((host, port), Handler).serve_forever()
