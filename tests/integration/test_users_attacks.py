"""A member attacks the boundary between users through the real shell (docs/security.md "The
boundary between users"): their own role, password and tokens, another user's grants and KV
rows, the login link, and the shell's network through their installs."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.integration.conftest import ECHO, RunningShell, StartShell
from tests.integration.instances import as_missing, new_instance

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery"


@pytest.fixture
def alice(echo_shell: RunningShell) -> Iterator[httpx.Client]:
    with echo_shell.client(timeout=30) as client:
        yield client


@pytest.fixture
def bob(echo_shell: RunningShell) -> Iterator[httpx.Client]:
    with echo_shell.client(echo_shell.add_user("bob"), timeout=30) as client:
        yield client


def browser(shell: RunningShell, **headers: str) -> httpx.Client:
    return httpx.Client(base_url=shell.url, headers={"Origin": shell.url, **headers}, timeout=30)


def test_a_member_cannot_make_themselves_admin_nor_disable_anyone(
    echo_shell: RunningShell, bob: httpx.Client
) -> None:
    admin = echo_shell.settings.user
    for body in ({"role": "admin"}, {"disabled": False}, {"name": "Boss"}):
        answer = bob.patch("/api/users/bob", json=body)
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["code"] == "permission_denied"
    for method in ("PATCH", "PUT", "POST"):
        answer = bob.request(method, "/api/me", json={"role": "admin"})
        assert answer.status_code == 405, answer.text
    answer = bob.patch(f"/api/users/{admin}", json={"disabled": True})
    assert answer.status_code == 403, answer.text
    assert bob.get("/api/me").json()["role"] == "member"
    assert echo_shell.shell.users.require(admin).disabled is False


def test_a_password_change_needs_the_current_one_and_a_sign_in(
    echo_shell: RunningShell, alice: httpx.Client, bob: httpx.Client
) -> None:
    assert alice.put("/api/users/bob/password", json={"password": PASSWORD}).status_code == 200
    new = {"password": "a brand new password"}
    with browser(echo_shell) as page:
        signed = page.post("/api/session", json={"user": "bob", "password": PASSWORD})
        assert signed.status_code == 200, signed.text
        for body in (new, {**new, "current": "not it at all"}):
            for client in (page, bob):
                answer = client.put("/api/me/password", json=body)
                assert answer.status_code == 403, answer.text
        # the session cookie without the host page's Origin: refused
        with httpx.Client(base_url=echo_shell.url, cookies=page.cookies, timeout=30) as bare:
            answer = bare.put("/api/me/password", json={**new, "current": PASSWORD})
            assert answer.status_code == 403, answer.text
    # an app of bob's is bob for KV and data, never for his password
    app_token = echo_shell.shell.app_tokens.issue(ECHO, f"{ECHO}-bob", "bob")
    with echo_shell.client(app_token) as app:
        answer = app.put("/api/me/password", json={**new, "current": PASSWORD})
        assert answer.status_code == 403, answer.text
    # nothing changed: the old password still signs in
    with browser(echo_shell) as again:
        ok = again.post("/api/session", json={"user": "bob", "password": PASSWORD})
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("days", [-1, 0, 0.5, 1e12, "7", True, None])
def test_a_token_lifetime_is_whole_days_within_the_limit(bob: httpx.Client, days: object) -> None:
    answer = bob.post("/api/tokens", json={"name": "t", "expiresInDays": days})
    if days is None:
        assert answer.status_code == 201, answer.text
        return
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "bad_request"


def test_a_token_name_is_short_and_tokens_are_counted(bob: httpx.Client) -> None:
    answer = bob.post("/api/tokens", json={"name": "x" * 10_240})
    assert answer.status_code == 400, answer.text
    made = len(bob.get("/api/tokens").json())
    while made < 100:
        answer = bob.post("/api/tokens", json={"name": f"t{made}"})
        assert answer.status_code == 201, answer.text
        made += 1
    answer = bob.post("/api/tokens", json={"name": "one too many"})
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "too_many_tokens"
    assert len(bob.get("/api/tokens").json()) == 100
    # deleting one makes room again
    first = bob.get("/api/tokens").json()[-1]["id"]
    assert bob.delete(f"/api/tokens/{first}").status_code == 200
    assert bob.post("/api/tokens", json={"name": "again"}).status_code == 201


def test_another_users_instance_has_no_grants_for_a_member(
    echo_shell: RunningShell, alice: httpx.Client, bob: httpx.Client
) -> None:
    instance_id = new_instance(alice)
    echo_shell.add_user("carol")
    granted = alice.post(
        f"/api/instances/{instance_id}/grants", json={"user": "carol", "role": "viewer"}
    )
    assert granted.status_code in (200, 201), granted.text
    grant_id = granted.json()["grantId"]
    base = f"/api/instances/{instance_id}/grants"
    as_missing(bob.get(base), instance_id)
    as_missing(bob.post(base, json={"user": "bob", "role": "editor"}), instance_id)
    as_missing(bob.post(base, json={"user": "carol", "role": "editor"}), instance_id)
    as_missing(bob.delete(f"{base}/{grant_id}"), instance_id)
    # bob's own instance does not know alice's grant id
    mine = new_instance(bob)
    answer = bob.delete(f"/api/instances/{mine}/grants/{grant_id}")
    assert answer.status_code == 404, answer.text
    assert instance_id not in answer.text
    assert bob.get(f"/api/instances/{mine}/grants").json() == []
    (still,) = alice.get(base).json()
    assert still["grantId"] == grant_id
    assert still["role"] == "viewer"
    assert bob.get("/api/instances?shared=1").json() == []


def test_a_member_reads_and_writes_only_their_own_kv(
    echo_shell: RunningShell, alice: httpx.Client, bob: httpx.Client
) -> None:
    answer = bob.put("/api/kv/global/x", json={"value": 1})
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "permission_denied"
    assert alice.put("/api/kv/os/secret-a", json={"value": "alice"}).status_code == 200
    assert alice.put(f"/api/kv/app/{ECHO}/secret-a", json={"value": "alice"}).status_code == 200
    for path in (
        "/api/kv/os/secret-a",
        f"/api/kv/app/{ECHO}/secret-a",
        f"/api/kv/app/{ECHO}%2Fsecret-a",
        f"/api/kv/os/..%2Fapp%2F{ECHO}%2Fsecret-a",
        f"/api/kv/os/%2e%2e/app/{ECHO}/secret-a",
        f"/api/kv/app/{ECHO}/%2e%2e/{ECHO}/secret-a",
        f"/api/kv/app/{ECHO}/./secret-a",
        f"/api/kv/os/app/{ECHO}/secret-a",
        f"/api/kv/app/{ECHO}/../../os/secret-a",
    ):
        answer = bob.get(path)
        assert answer.status_code in (400, 404), (path, answer.text)
        assert "alice" not in answer.text.replace("secret-a", ""), (path, answer.text)
    assert bob.put("/api/kv/os/mine", json={"value": "bob"}).status_code == 200
    for path in ("/api/kv/os/", "/api/kv/os/*", f"/api/kv/app/{ECHO}/*"):
        answer = bob.get(path)
        assert answer.status_code < 500, answer.text
        assert "alice" not in answer.text, (path, answer.text)


def test_only_the_bootstrap_token_makes_a_login_link(
    echo_shell: RunningShell, bob: httpx.Client
) -> None:
    personal = echo_shell.add_user("dave")
    app_token = echo_shell.shell.app_tokens.issue(ECHO, f"{ECHO}-dave", "dave")
    admin_token = echo_shell.on_loop(_admin_personal_token(echo_shell))
    for token in (personal, app_token, admin_token):
        with echo_shell.anonymous(follow_redirects=False) as client:
            answer = client.get("/login", params={"token": token})
            assert answer.status_code in (401, 403), answer.text
            assert not client.cookies, client.cookies
    assert not echo_shell.shell.users.sessions_of("dave")


async def _admin_personal_token(shell: RunningShell) -> str:
    secret, _ = await shell.shell.users.create_token(shell.settings.user, "t", None)
    return secret


# ---- the shell's network through a member's install ----------------------------------------


@contextmanager
def listener(host: str = "127.0.0.1") -> Iterator[tuple[int, list[str]]]:
    """A TCP port on ``host`` (IPv4 or IPv6) that records every connection it gets (none may
    come)."""
    seen: list[str] = []
    server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    server.bind((host, 0))
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


def refused(answer: httpx.Response, host: str) -> None:
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "fetch_host_refused", error
    assert error["host"] == host, error


def test_a_members_install_cannot_reach_the_shells_network(
    echo_shell: RunningShell, bob: httpx.Client, alice: httpx.Client
) -> None:
    with listener() as (port, seen):
        refs = {
            f"git://127.0.0.1:{port}/app.git": "127.0.0.1",
            f"git+https://localhost:{port}/app.git": "localhost",
            f"oci://127.0.0.1:{port}/app:1": "127.0.0.1",
            f"oci://localhost:{port}/app:1": "localhost",
            "oci://169.254.169.254/latest:1": "169.254.169.254",
            "git://10.1.2.3/app.git": "10.1.2.3",
        }
        for ref, host in refs.items():
            for route in ("/api/dist/install", "/api/dist/install/preview"):
                answer = bob.post(route, json={"ref": ref, "scope": "user"})
                refused(answer, host)
        assert seen == []
        # the admin is not restricted: their preview reaches the port (and fails there)
        answer = alice.post(
            "/api/dist/install/preview", json={"ref": f"oci://127.0.0.1:{port}/app:1"}
        )
        assert answer.json()["error"]["code"] != "fetch_host_refused", answer.text
        assert seen


class _Redirect(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:
        self.send_response(307)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_allowed_host_cannot_redirect_a_members_fetch_elsewhere(
    start_shell: StartShell,
) -> None:
    with listener("127.0.0.2") as (port, seen):
        _Redirect.target = f"http://127.0.0.2:{port}"
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            shell = start_shell(member_fetch_hosts="localhost")
            with shell.client(shell.add_user("bob"), timeout=30) as bob:
                base = f"localhost:{server.server_address[1]}"
                answer = bob.post("/api/dist/install/preview", json={"ref": f"oci://{base}/a:1"})
                refused(answer, "127.0.0.2")
            assert seen == []
        finally:
            server.shutdown()
            server.server_close()
