"""Fixture `test.plain.stdlib`: an app written against the stdlib only, without the SDK.

It shows what the shell needs from any app: the secret check, /health, the hooks, and
`X-Os-App-Id` on every response. Its provider echoes requests and sets a cookie.
"""

from __future__ import annotations

import hmac
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl

APP_ID = os.environ.get("OS_APP_ID", "test.plain.stdlib")
INSTANCE_ID = os.environ.get("OS_INSTANCE_ID", "")
SECRET = os.environ.get("OS_SHELL_SECRET", "").encode()
PROVIDER_PREFIX = "/api/data/items"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Os-App-Id", APP_ID)
        self.send_header("Set-Cookie", "provider=secret; Path=/")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def is_trusted(self) -> bool:
        given = self.headers.get("X-Os-Shell-Secret", "").encode("utf-8", "surrogateescape")
        return bool(SECRET) and hmac.compare_digest(given, SECRET)

    def route(self) -> None:
        if not self.is_trusted():
            self.close_connection = True  # the body is left unread
            self.send(403, {"error": {"code": "permission_denied", "message": "not the shell"}})
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path, _, query = self.path.partition("?")
        if path == "/health" and self.command in {"GET", "HEAD"}:
            self.send(200, {"appId": APP_ID, "instanceId": INSTANCE_ID, "ok": True})
        elif path == "/api/lifecycle/onActivityCreate" and self.command == "POST":
            self.send(200, {"path": "/", "title": "Plain stdlib"})
        elif path.startswith("/api/lifecycle/") and self.command == "POST":
            self.send(200, {"ok": True})
        elif path == PROVIDER_PREFIX or path.startswith(PROVIDER_PREFIX + "/"):
            self.send(
                200,
                {
                    "method": self.command,
                    "path": path,
                    "query": dict(parse_qsl(query, keep_blank_values=True)),
                    "body": body.decode("utf-8", "replace"),
                    "callerAppId": self.headers.get("X-Os-Caller-App-Id"),
                    "permission": self.headers.get("X-Os-Permission"),
                    "cookie": self.headers.get("Cookie"),
                },
            )
        else:
            self.send(404, {"error": {"code": "not_found", "message": f"no route {path}"}})

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = route


if __name__ == "__main__":
    host = os.environ.get("OS_HOST", "127.0.0.1")
    port = int(os.environ.get("OS_PORT") or os.environ.get("PORT") or "0")
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.serve_forever()
