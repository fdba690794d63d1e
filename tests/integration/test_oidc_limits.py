"""The OIDC sign-in's bounds against anyone on the network: starting sign-ins is limited per
address, a provider that is down is not asked again on every start, and two callbacks racing to
sign up the same new identity make one member."""

from __future__ import annotations

import asyncio
import html
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from atrium.api.oidc import DISCOVERY_RETRY_SECONDS, START_LIMIT
from atrium.errors import UserExists
from atrium.users.model import Role, User
from tests.integration.conftest import RunningShell, StartShell
from tests.integration.test_oidc import at_provider, me, refused, to_provider
from tests.oidc_mock import MOCK_WARNINGS, MockProvider, mock_provider

pytestmark = MOCK_WARNINGS


@pytest.fixture(scope="module")
def provider() -> Iterator[MockProvider]:
    with mock_provider() as running:
        yield running


class _Down(BaseHTTPRequestHandler):
    """A provider whose discovery answers 503, counting how often it is asked."""

    asked = 0
    lock = threading.Lock()

    def do_GET(self) -> None:
        with _Down.lock:
            _Down.asked += 1
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def down_provider() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Down)
    _Down.asked = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def from_address(shell: RunningShell, address: str) -> httpx.Client:
    return httpx.Client(
        base_url=shell.url, transport=httpx.HTTPTransport(local_address=address), timeout=30
    )


def test_starting_sign_ins_is_limited_per_address(
    start_shell: StartShell, provider: MockProvider
) -> None:
    """Each start keeps a flow in the shell's memory: one address may not start them without
    end. Over the limit the browser gets a page (429, Retry-After), and only that address."""
    shell = start_shell(oidc_providers=[provider.config("mock")])
    with from_address(shell, "127.0.0.1") as browser:
        for _ in range(START_LIMIT):
            assert browser.get("/auth/oidc/mock/login").status_code == 302
        over = browser.get("/auth/oidc/mock/login")
        refused(over, 429, "too many sign-ins started")
        assert 0 < int(over.headers["retry-after"]) <= 60
        assert "atrium_oidc" not in over.cookies
    with from_address(shell, "127.0.0.2") as other:
        assert other.get("/auth/oidc/mock/login").status_code == 302


def test_a_provider_that_is_down_is_not_asked_on_every_start(
    start_shell: StartShell, down_provider: str
) -> None:
    down = {
        "id": "down",
        "issuer": down_provider,
        "clientId": "c",
        "clientSecret": "s",
        "displayName": "Down",
    }
    shell = start_shell(oidc_providers=[down])
    with shell.anonymous() as browser:
        for _ in range(5):
            answer = browser.get("/auth/oidc/down/login")
            refused(answer, 502, "could not be reached")
            assert 0 < int(answer.headers["retry-after"]) <= DISCOVERY_RETRY_SECONDS
    assert _Down.asked == 1


def test_two_callbacks_racing_to_sign_up_one_identity_make_one_member(
    start_shell: StartShell, provider: MockProvider
) -> None:
    """The same new person finishing two sign-ins at once (two tabs, a double click): both end
    signed in as one new member, linked once; no second member, no refusal."""
    shell = start_shell(oidc_providers=[provider.config("open", allowSignup=True)])
    provider.set_user("twin-sub", preferred_username="twin", name="Twin")
    browsers = [shell.anonymous(), shell.anonymous()]
    try:
        callbacks = [at_provider(to_provider(b, "open"), "twin-sub") for b in browsers]
        barrier = threading.Barrier(2)

        def finish(n: int) -> httpx.Response:
            barrier.wait()
            return browsers[n].get(callbacks[n])

        with ThreadPoolExecutor(2) as pool:
            done = list(pool.map(finish, range(2)))
    finally:
        for b in browsers:
            b.close()
    for answer in done:
        assert answer.status_code == 303, html.unescape(answer.text)
    assert [me(shell, answer)["id"] for answer in done] == ["twin", "twin"]
    assert [u.id for u in shell.shell.users.all()] == ["default", "twin"]
    (identity,) = shell.shell.users.identities_of("twin")
    assert identity.subject == "twin-sub"


def test_two_adds_of_one_id_at_once_are_one_user_and_one_user_exists(shell: RunningShell) -> None:
    """The store's own check is in memory and the row is written later: a second add of the same
    id waiting meanwhile met SQLite's constraint and answered 500."""
    users = shell.shell.users

    async def both() -> list[User | BaseException]:
        made = await asyncio.gather(
            users.add("same", None, Role.MEMBER),
            users.add("same", None, Role.MEMBER),
            return_exceptions=True,
        )
        return list(made)

    made = shell.on_loop(both())
    # whichever commits first is the user (the two wait for one transaction lock, in no order)
    assert len([m for m in made if isinstance(m, User)]) == 1, made
    assert len([m for m in made if isinstance(m, UserExists)]) == 1, made
    assert [u.id for u in users.all()] == ["default", "same"]
