"""Password sign-in through the real shell: the session cookie, one answer for every failure, the
per-(account, address) limit, sign-out, one's sign-ins, a password change, login CSRF."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from argon2 import PasswordHasher

from atrium.api.users import MAX_IN_FLIGHT
from atrium.identity import SESSION_COOKIE
from atrium.users.passwords import Passwords
from atrium.users.throttle import ADDRESS_LIMIT
from tests.integration.conftest import RunningShell, StartShell

pytestmark = pytest.mark.integration

PASSWORD = "a long enough password"


@pytest.fixture
def bob(shell: RunningShell, api: httpx.Client) -> str:
    made = api.post("/api/users", json={"id": "bob", "name": "Bob", "password": PASSWORD})
    assert made.status_code == 201, made.text
    return "bob"


def browser(shell: RunningShell, address: str = "127.0.0.1", **headers: str) -> httpx.Client:
    """A client from ``address`` (any 127.x reaches the shell) that sends the host page's Origin."""
    return httpx.Client(
        base_url=shell.url,
        transport=httpx.HTTPTransport(local_address=address),
        headers={"Origin": shell.url, "User-Agent": "test-browser/1.0", **headers},
        timeout=30,
    )


@pytest.fixture
def page(shell: RunningShell) -> Iterator[httpx.Client]:
    with browser(shell) as client:
        yield client


def sign_in(client: httpx.Client, user: str, password: str) -> httpx.Response:
    return client.post("/api/session", json={"user": user, "password": password})


def test_a_good_password_sets_the_session_cookie(
    shell: RunningShell, bob: str, page: httpx.Client
) -> None:
    answer = sign_in(page, "bob", PASSWORD)
    assert answer.status_code == 200, answer.text
    assert answer.json() | {"session": None} == {
        "id": "bob",
        "name": "Bob",
        "role": "member",
        "session": None,
    }
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/"):
        assert attribute.lower() in cookie.lower()
    assert "domain" not in cookie.lower()
    assert answer.headers["cache-control"] == "no-store"
    assert page.get("/api/me").json()["id"] == "bob"
    (session,) = page.get("/api/sessions").json()
    assert session["current"] is True
    assert session["kind"] == "password"
    assert session["device"] == "test-browser/1.0"
    assert session["address"] == "127.0.0.1"
    # signing out ends it: the same cookie no longer identifies anyone
    secret = page.cookies[SESSION_COOKIE]
    out = page.delete("/api/session")
    assert out.status_code == 200, out.text
    with browser(shell) as stale:
        stale.cookies.set(SESSION_COOKIE, secret)
        assert stale.get("/api/me").status_code == 401


def test_every_failure_is_the_same_401(shell: RunningShell, api: httpx.Client, bob: str) -> None:
    api.post("/api/users", json={"id": "nopass"})
    api.post("/api/users", json={"id": "gone", "password": PASSWORD})
    api.patch("/api/users/gone", json={"disabled": True})
    answers = []
    for user, password in [
        ("bob", "wrong password!"),
        ("nobody", PASSWORD),
        ("nopass", PASSWORD),
        ("gone", PASSWORD),
        ("Not An Id", PASSWORD),
    ]:
        with browser(shell) as client:
            answer = sign_in(client, user, password)
            assert SESSION_COOKIE not in client.cookies
        assert answer.status_code == 401, answer.text
        answers.append(answer.json())
    assert all(a == answers[0] for a in answers), answers
    assert answers[0]["error"]["code"] == "bad_credentials"


def test_five_failures_limit_that_account_from_that_address_only(
    shell: RunningShell, api: httpx.Client, bob: str
) -> None:
    api.post("/api/users", json={"id": "carol", "password": PASSWORD})
    with browser(shell) as guesser:
        for _ in range(5):
            assert sign_in(guesser, "bob", "not the password").status_code == 401
        refused = sign_in(guesser, "bob", PASSWORD)  # even the right one, for the window
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_attempts"
        wait = int(refused.headers["retry-after"])
        assert 0 < wait <= 60
        assert refused.json()["error"]["retryAfter"] == wait
        # another account from this address is not limited
        assert sign_in(guesser, "carol", PASSWORD).status_code == 200
    # the real user, from another address, signs in
    with browser(shell, "127.0.0.2") as owner:
        answer = sign_in(owner, "bob", PASSWORD)
        assert answer.status_code == 200, answer.text
        assert owner.get("/api/sessions").json()[0]["address"] == "127.0.0.2"
    # names that are no one's are limited alike: the 429 tells nothing of who exists
    with browser(shell) as guesser:
        for _ in range(5):
            assert sign_in(guesser, "nobody", "x" * 8).status_code == 401
        assert sign_in(guesser, "nobody", "x" * 8).status_code == 429


def test_sessions_are_listed_and_ended_one_by_one_and_only_ones_own(
    shell: RunningShell, api: httpx.Client, bob: str
) -> None:
    with browser(shell) as laptop, browser(shell, "127.0.0.3") as phone:
        assert sign_in(laptop, "bob", PASSWORD).status_code == 200
        phone_id = sign_in(phone, "bob", PASSWORD).json()["session"]
        listed = laptop.get("/api/sessions").json()
        assert sorted((s["address"], s["current"]) for s in listed) == [
            ("127.0.0.1", True),
            ("127.0.0.3", False),
        ]
        # another user's session id answers like a missing one
        missing = api.delete(f"/api/sessions/{phone_id}")
        assert missing.status_code == 404, missing.text
        assert missing.json()["error"] == {
            "code": "not_found",
            "message": f"no session {phone_id!r}",
            "kind": "session",
            "id": phone_id,
        }
        assert phone.get("/api/me").status_code == 200
        assert laptop.delete(f"/api/sessions/{phone_id}").status_code == 200
        assert phone.get("/api/me").status_code == 401
        assert laptop.get("/api/me").status_code == 200
        assert laptop.delete(f"/api/sessions/{phone_id}").status_code == 404


def test_a_sign_in_from_another_origin_is_refused(shell: RunningShell, bob: str) -> None:
    """Login CSRF: a page elsewhere must not sign this browser in to an account of its own."""
    with browser(shell, Origin="http://evil.example") as foreign:
        answer = sign_in(foreign, "bob", PASSWORD)
        assert answer.status_code == 403, answer.text
        assert SESSION_COOKIE not in foreign.cookies
    with browser(shell, **{"Sec-Fetch-Site": "cross-site"}) as cross:
        del cross.headers["Origin"]
        assert sign_in(cross, "bob", PASSWORD).status_code == 403
    # a script or the CLI sends no Origin at all
    with shell.anonymous() as script:
        assert sign_in(script, "bob", PASSWORD).status_code == 200
    # with a cookie already present, the cookie's own Origin rule holds
    with browser(shell) as page:
        assert sign_in(page, "bob", PASSWORD).status_code == 200
        page.headers["Origin"] = "http://evil.example"
        assert sign_in(page, "bob", PASSWORD).status_code == 403
        assert page.delete("/api/session").status_code == 403


def test_a_good_sign_in_rehashes_a_weaker_hash(shell: RunningShell, bob: str) -> None:
    weak = PasswordHasher(time_cost=1, memory_cost=8 * 1024).hash(PASSWORD)
    users = shell.shell.users
    shell.on_loop(users.set_password("bob", weak, end_sessions=False))
    assert Passwords.needs_rehash(weak)
    with browser(shell) as page:
        assert sign_in(page, "bob", PASSWORD).status_code == 200
    stored = users.password_hash("bob")
    assert stored is not None
    assert stored != weak
    assert not Passwords.needs_rehash(stored)


def test_a_user_changes_their_own_password_with_the_current_one(
    shell: RunningShell, bob: str
) -> None:
    with browser(shell) as page, browser(shell, "127.0.0.3") as other:
        assert sign_in(page, "bob", PASSWORD).status_code == 200
        assert sign_in(other, "bob", PASSWORD).status_code == 200
        new = "another long password"
        wrong = page.put("/api/me/password", json={"current": "not it at all", "password": new})
        assert wrong.status_code == 403, wrong.text
        short = page.put("/api/me/password", json={"current": PASSWORD, "password": "short"})
        assert short.status_code == 400
        assert short.json()["error"]["problems"][0]["field"] == "password"
        changed = page.put("/api/me/password", json={"current": PASSWORD, "password": new})
        assert changed.status_code == 200, changed.text
        assert changed.json()["endedSessions"] == 1
        assert page.get("/api/me").status_code == 200  # this sign-in stays
        assert other.get("/api/me").status_code == 401  # the others end
    with browser(shell) as page:
        assert sign_in(page, "bob", PASSWORD).status_code == 401
        assert sign_in(page, "bob", new).status_code == 200


def test_an_admin_reset_ends_the_users_sign_ins(
    shell: RunningShell, api: httpx.Client, bob: str
) -> None:
    with browser(shell) as page:
        assert sign_in(page, "bob", PASSWORD).status_code == 200
        reset = api.put("/api/users/bob/password", json={"password": "reset by the admin"})
        assert reset.status_code == 200, reset.text
        assert page.get("/api/me").status_code == 401
        assert sign_in(page, "bob", "reset by the admin").status_code == 200


def test_signing_in_again_ends_the_sign_in_the_cookie_held(
    shell: RunningShell, api: httpx.Client, bob: str
) -> None:
    api.post("/api/users", json={"id": "carol", "password": PASSWORD})
    with browser(shell) as page:
        first = sign_in(page, "bob", PASSWORD).json()["session"]
        assert sign_in(page, "carol", PASSWORD).status_code == 200
        assert page.get("/api/me").json()["id"] == "carol"
    assert first not in [s.id for s in shell.shell.users.sessions_of("bob")]


def test_the_dummy_check_is_ready_before_the_first_answer(shell: RunningShell, bob: str) -> None:
    """The first unknown name must not take a hash longer than a known one (the dummy hash made
    on demand): whichever sign-in comes first makes it, before its own check."""
    with browser(shell) as page:
        assert sign_in(page, "bob", PASSWORD).status_code == 200
    sign_in_state = shell.server.app.state.sign_in
    assert sign_in_state.passwords._dummy is not None


def test_an_app_cannot_sign_anyone_in(shell: RunningShell, api: httpx.Client, bob: str) -> None:
    started = api.post("/api/instances", json={"appId": "com.atrium.notes", "new": True})
    assert started.status_code == 200, started.text
    instance_id = started.json()["instanceId"]
    token = next(
        t for t, c in shell.shell.app_tokens._by_token.items() if c.instance_id == instance_id
    )
    with shell.client(token) as app_client:
        answer = sign_in(app_client, "bob", PASSWORD)
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "permission_denied"


def test_over_ipv6_the_limit_is_still_per_account_and_address(start_shell: StartShell) -> None:
    """Served on ::1 the guesser's address is IPv6 (counted by its /64, tests/unit/
    test_throttle.py): five failures for one account limit that account from there, and only it."""
    shell = start_shell(host="::1")
    url = f"http://[::1]:{shell.settings.port}"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {shell.token}"}) as admin:
        for user in ("bob", "carol"):
            made = admin.post("/api/users", json={"id": user, "password": PASSWORD})
            assert made.status_code == 201, made.text
    with httpx.Client(base_url=url, timeout=30) as guesser:
        for _ in range(5):
            assert sign_in(guesser, "bob", "not the password").status_code == 401
        refused = sign_in(guesser, "bob", PASSWORD)
        assert refused.status_code == 429, refused.text
        assert 0 < int(refused.headers["retry-after"]) <= 60
        carol = sign_in(guesser, "carol", PASSWORD)
        assert carol.status_code == 200, carol.text
        assert guesser.get("/api/sessions").json()[0]["address"] == "::1"


def test_one_address_spraying_one_password_over_many_names_is_limited(
    shell: RunningShell, api: httpx.Client, bob: str
) -> None:
    """Password spraying: one guess at each of many accounts never meets the per-account limit.
    One address has a share of sign-ins a minute across all names; others are not touched."""
    with browser(shell, "127.0.0.3") as sprayer:
        for n in range(ADDRESS_LIMIT):
            assert sign_in(sprayer, f"user{n}", "Summer2026!").status_code == 401
        over = sign_in(sprayer, "bob", PASSWORD)
        assert over.status_code == 429, over.text
        assert over.json()["error"]["code"] == "too_many_attempts"
        # the message names the limit met: this address's, not bob's account's
        assert "from this address" in over.json()["error"]["message"]
        assert "this account" not in over.json()["error"]["message"]
        assert 0 < int(over.headers["retry-after"]) <= 60
    with browser(shell, "127.0.0.4") as owner:
        assert sign_in(owner, "bob", PASSWORD).status_code == 200


def test_one_address_may_not_queue_many_password_checks_at_once(
    shell: RunningShell, bob: str
) -> None:
    """Each sign-in waits for one of a few argon2 slots: one address firing many at once would
    queue them all ahead of everyone else. Past a few in flight it is told to wait instead."""
    barrier = threading.Barrier(12)

    def guess(n: int) -> httpx.Response:
        with browser(shell, "127.0.0.5") as client:
            barrier.wait()
            return sign_in(client, f"name{n}", "not a password")

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(guess, range(12)))
    statuses = sorted(a.status_code for a in answers)
    assert set(statuses) == {401, 429}, statuses
    assert statuses.count(401) >= MAX_IN_FLIGHT
    waits = [a for a in answers if a.status_code == 429]
    assert all(a.headers["retry-after"] == "1" for a in waits)
    assert all("at once" in a.json()["error"]["message"] for a in waits)
    with browser(shell, "127.0.0.6") as owner:
        assert sign_in(owner, "bob", PASSWORD).status_code == 200


def test_a_megabyte_password_is_a_400_before_any_hashing(shell: RunningShell, bob: str) -> None:
    with browser(shell, "127.0.0.7") as client:
        answer = sign_in(client, "bob", "x" * (1 << 20))
        assert answer.status_code == 400, answer.text[:300]
        assert "password" in answer.json()["error"]["message"]
        # not counted as a guess: the five failures that make the limit are still to come
        for _ in range(5):
            assert sign_in(client, "bob", "not the password").status_code == 401
        assert sign_in(client, "bob", PASSWORD).status_code == 429


def test_odd_spellings_of_a_name_are_other_names(shell: RunningShell, bob: str) -> None:
    """Ids are compared exactly: case, width, a NUL or a look-alike letter never reach bob, and
    each is the same 401; a lone surrogate is not JSON at all (400), never a 500."""
    for name in ("Bob", "BOB", " bob", "bob\u0000", "\uff42\uff4f\uff42", "b\u043eb"):
        with browser(shell, "127.0.0.8") as client:
            answer = sign_in(client, name, PASSWORD)
            assert answer.status_code == 401, (name, answer.text)
            assert answer.json()["error"]["code"] == "bad_credentials"
    with browser(shell, "127.0.0.8") as client:
        body = json.dumps({"user": "\ud800", "password": PASSWORD})
        answer = client.post(
            "/api/session", content=body, headers={"Content-Type": "application/json"}
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "bad_request"


def test_a_host_page_served_on_ipv6_loopback_may_sign_in(start_shell: StartShell) -> None:
    """A browser on http://[::1]:<port>/ sends that Origin: the shell's host names are written
    as origins with IPv6 literals in brackets, so its own page's sign-in is not refused as
    cross-site."""
    shell = start_shell(host="::1")
    url = f"http://[::1]:{shell.settings.port}"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {shell.token}"}) as admin:
        made = admin.post("/api/users", json={"id": "bob", "password": PASSWORD})
        assert made.status_code == 201, made.text
    with httpx.Client(base_url=url, headers={"Origin": url}, timeout=30) as page:
        answer = sign_in(page, "bob", PASSWORD)
        assert answer.status_code == 200, answer.text
        assert page.get("/api/me").json()["id"] == "bob"
