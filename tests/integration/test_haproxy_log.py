"""What the repository's deploy/haproxy.cfg writes to its log (Debian's haproxy, as it is): the
request's path, never its query string. `GET /login?token=…` carries the bootstrap admin's token,
which every shell of the group accepts until it is replaced: a request line in the log was that
token for anyone who reads the log. The shells behind it are stand-ins answering 200 (what is
logged does not depend on them)."""

from __future__ import annotations

import secrets
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import wait_for
from tests.integration.test_several_shells import DOMAIN, haproxy


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class StandIn:
    url: str


@contextmanager
def stand_in() -> Iterator[StandIn]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield StandIn(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="make test installs Debian's haproxy")
def test_haproxys_log_keeps_no_query_string_so_no_login_token(tmp_path: Path) -> None:
    token = secrets.token_urlsafe(32)
    with stand_in() as one, stand_in() as two, haproxy(tmp_path, [one, two]) as balancer:  # type: ignore[list-item]
        with httpx.Client(
            base_url=f"http://127.0.0.1:{balancer.port}", headers={"Host": DOMAIN}, timeout=10
        ) as client:
            answer = client.get(f"/login?token={token}", follow_redirects=False)
            assert answer.status_code == 200, answer.text
        log = tmp_path / "haproxy.log"
        # a request is logged once it has ended
        line = wait_for(
            lambda: next((x for x in log.read_text().splitlines() if "/login" in x), None),
            "the request's log line",
        )
    assert "GET /login HTTP/1.1" in line, line
    assert token not in log.read_text()
