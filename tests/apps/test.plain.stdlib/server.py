"""Fixture `test.plain.stdlib`: an app written against the stdlib only, without the SDK.

It shows what the shell needs from any app: the secret check, /health, the hooks, and
`X-Os-App-Id` on every response. Its provider echoes requests and sets a cookie; a few paths
misbehave on purpose for the data proxy's tests (see EDGES).
"""

from __future__ import annotations

import hmac
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl

APP_ID = os.environ.get("OS_APP_ID", "test.plain.stdlib")
INSTANCE_ID = os.environ.get("OS_INSTANCE_ID", "")
SECRET = os.environ.get("OS_SHELL_SECRET", "").encode()
PROVIDER_PREFIX = "/api/data/items"
#: /api/data/items/<edge>: hop (hop-by-hop response headers), cut?bytes=N (announces N bytes, sends
#: half, closes), slow?seconds=N (answers late), chunked?bytes=N (a chunked answer, also to HEAD),
#: notmodified (304 with the Content-Length of a representation it does not send),
#: lateread?seconds=N (reads the request body only after N seconds, answers its length)
EDGES = ("hop", "cut", "slow", "chunked", "notmodified", "lateread")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    #: headers and body are two writes: without TCP_NODELAY the body waits for the shell's
    #: delayed ACK (40 ms) on every keep-alive request
    disable_nagle_algorithm = True

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
        path, _, query = self.path.partition("?")
        if path == PROVIDER_PREFIX + "/lateread":
            time.sleep(float(dict(parse_qsl(query)).get("seconds", "1")))
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if path == "/health" and self.command in {"GET", "HEAD"}:
            self.send(200, {"appId": APP_ID, "instanceId": INSTANCE_ID, "ok": True})
        elif path == "/api/lifecycle/onActivityCreate" and self.command == "POST":
            self.send(200, {"path": "/", "title": "Plain stdlib"})
        elif path.startswith("/api/lifecycle/") and self.command == "POST":
            self.send(200, {"ok": True})
        elif path.removeprefix(PROVIDER_PREFIX + "/") in EDGES:
            self.edge(path.removeprefix(PROVIDER_PREFIX + "/"), dict(parse_qsl(query)), body)
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
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                },
            )
        else:
            self.send(404, {"error": {"code": "not_found", "message": f"no route {path}"}})

    def edge(self, name: str, query: dict[str, str], body: bytes) -> None:
        if name == "lateread":
            self.send(200, {"bytes": len(body)})
            return
        if name == "slow":
            time.sleep(float(query.get("seconds", "1")))
            self.send(200, {"slow": True})
            return
        if name == "notmodified":
            self.send_response(304)
            self.send_header("X-Os-App-Id", APP_ID)
            self.send_header("Content-Length", "1234")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("X-Os-App-Id", APP_ID)
        if name == "hop":
            self.send_header("Connection", "x-private, keep-alive")
            self.send_header("X-Private", "only for the next hop")
            self.send_header("Keep-Alive", "timeout=5")
            self.send_header("X-Kept", "end to end")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        elif name == "cut":
            announced = int(query.get("bytes", "100000"))
            self.send_header("Content-Length", str(announced))
            self.end_headers()
            self.wfile.write(b"c" * (announced // 2))
            self.wfile.flush()
            self.close_connection = True
        else:  # chunked
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if self.command == "HEAD":
                return
            left = int(query.get("bytes", "1000"))
            while left:
                piece = min(left, 70000)
                self.wfile.write(b"%x\r\n" % piece + b"k" * piece + b"\r\n")
                left -= piece
            self.wfile.write(b"0\r\n\r\n")

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = route


if __name__ == "__main__":
    host = os.environ.get("OS_HOST", "127.0.0.1")
    port = int(os.environ.get("OS_PORT") or os.environ.get("PORT") or "0")
    # the shell may open up to 64 connections at once: listen with room for all of them
    # (http.server's backlog is 5; the kernel drops what does not fit, and TCP retries late)
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.serve_forever()
