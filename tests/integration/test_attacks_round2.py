"""Attacks on this session's new surfaces through the real shell, second round: a member's fetch
rule (odd spellings of loopback, names that do not resolve, a token realm elsewhere), the trust
API, the page an app origin shows a browser, the dev problems alert, the audit log's bounds and
the service unit. Each test is an attack; those that found nothing stay as guards."""

from __future__ import annotations

import http.server
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from tests.integration.conftest import RunningShell, StartShell
from tests.integration.test_users_attacks import listener

pytestmark = pytest.mark.integration


@pytest.fixture
def bob(echo_shell: RunningShell) -> Iterator[httpx.Client]:
    with echo_shell.client(echo_shell.add_user("bob"), timeout=30) as client:
        yield client


# ---- 1. a member's fetch rule -----------------------------------------------------------------


def _clean_refusal(answer: httpx.Response) -> dict[str, object]:
    """A refusal in the error shape: 4xx, or 502 fetch_failed where the fetcher itself refused
    the spelling before connecting (yarl will not take a non-canonical IPv4 host)."""
    error: dict[str, object] = answer.json()["error"]
    assert 400 <= answer.status_code < 500 or error["code"] == "fetch_failed", answer.text
    return error


@contextmanager
def listener6() -> Iterator[tuple[int, list[str]]]:
    """``listener`` on ::1."""
    seen: list[str] = []
    server = socket.socket(socket.AF_INET6)
    server.bind(("::1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            seen.append(str(peer))
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], seen
    finally:
        stop.set()
        thread.join()
        server.close()


@pytest.mark.parametrize(
    "spelling",
    [
        "git://2130706433:{port}/x",
        "git://0x7f000001:{port}/x",
        "git://0177.0.0.1:{port}/x",
        "git://127.1:{port}/x",
        "git://[::ffff:127.0.0.1]:{port}/x",
        "git://localhost.:{port}/x",
        "git://LOCALHOST:{port}/x",
        "git://127.0.0.1%2e:{port}/x",
        "git+https://user:pass@127.0.0.1:{port}/x",
        "git+https://8.8.8.8:{port}@127.0.0.1:{port}/x",
        "git+https://%31%32%37.0.0.1:{port}/x",
        "git+https://127.0.0.1.:{port}/x",
        "git+https://0x7f.1:{port}/x",
        "oci://2130706433:{port}/app:1",
        "oci://0177.0.0.1:{port}/app:1",
        "oci://127.1:{port}/app:1",
        "oci://localhost.:{port}/app:1",
        "oci://[::ffff:127.0.0.1]:{port}/app:1",
    ],
)
def test_odd_spellings_of_loopback_are_refused_without_a_connection(
    bob: httpx.Client, spelling: str
) -> None:
    with listener() as (port, seen):
        ref = spelling.format(port=port)
        for route in ("/api/dist/install", "/api/dist/install/preview"):
            answer = bob.post(route, json={"ref": ref, "scope": "user"})
            error = _clean_refusal(answer)
            assert error["code"] in ("fetch_host_refused", "bad_ref", "fetch_failed"), (ref, error)
    assert seen == [], ref


@pytest.mark.parametrize(
    "spelling", ["git://[::1]:{port}/x", "oci://[::1]:{port}/app:1", "git+https://[::1]:{port}/x"]
)
def test_ipv6_loopback_is_refused_without_a_connection(bob: httpx.Client, spelling: str) -> None:
    with listener6() as (port, seen):
        ref = spelling.format(port=port)
        answer = bob.post("/api/dist/install/preview", json={"ref": ref, "scope": "user"})
        assert _clean_refusal(answer)["code"] == "fetch_host_refused", answer.text
    assert seen == []


@pytest.mark.parametrize(
    "ref",
    [
        "oci://127.0.0.1.nip.io/app:1",
        "git://127.0.0.1.nip.io/x",
        "git+https://127.0.0.1.nip.io/x",
        "oci://no-such-host.invalid/app:1",
    ],
)
def test_a_name_that_does_not_resolve_fails_cleanly(bob: httpx.Client, ref: str) -> None:
    """Git must never be handed a name the shell could not check: it would resolve it again
    itself, and a DNS server that fails the shell's lookup and answers git's with 127.0.0.1
    would get past the rule. The shell refuses such a name itself (aiohttp, for OCI, connects
    only through the checked lookup, so its own failure is the answer)."""
    for route in ("/api/dist/install", "/api/dist/install/preview"):
        answer = bob.post(route, json={"ref": ref, "scope": "user"})
        error = _clean_refusal(answer)
        if ref.startswith("git"):
            assert answer.status_code == 403, answer.text
            assert error["code"] == "fetch_host_refused", error
            assert "resolve" in str(error["message"]), error


class _Challenge(http.server.BaseHTTPRequestHandler):
    """A registry on an allowed host whose token service (the realm) is elsewhere."""

    realm = ""

    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", f'Bearer realm="{self.realm}",service="x"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "realm", ["http://127.0.0.2:{port}/token", "http://2130706434:{port}/token"]
)
def test_a_token_realm_elsewhere_is_refused(start_shell: StartShell, realm: str) -> None:
    with listener("127.0.0.2") as (port, seen):
        _Challenge.realm = realm.format(port=port)
        with serving(_Challenge) as registry:
            shell = start_shell(member_fetch_hosts="localhost")
            with shell.client(shell.add_user("bob"), timeout=30) as bob:
                ref = f"oci://localhost:{registry}/a:1"
                answer = bob.post("/api/dist/install/preview", json={"ref": ref})
                error = _clean_refusal(answer)
                assert error["code"] in ("fetch_host_refused", "fetch_failed"), error
        assert seen == []


class _GitRedirect(http.server.BaseHTTPRequestHandler):
    target = ""
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(302)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_https_git_source_cannot_redirect_a_members_fetch(
    start_shell: StartShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key),
         "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("GIT_SSL_CAINFO", str(cert))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with listener("127.0.0.2") as (port, seen):
        _GitRedirect.target = f"https://127.0.0.2:{port}"
        _GitRedirect.hits = []
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GitRedirect)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            shell = start_shell(member_fetch_hosts="localhost")
            with shell.client(shell.add_user("bob"), timeout=30) as bob:
                ref = f"git+https://localhost:{server.server_address[1]}/app.git#v1"
                answer = bob.post("/api/dist/install/preview", json={"ref": ref})
                error = _clean_refusal(answer)
                assert error["code"] in ("fetch_host_refused", "fetch_failed"), error
            assert _GitRedirect.hits, "git never reached the allowed host (the test proves nothing)"
        finally:
            server.shutdown()
            server.server_close()
    assert seen == []
