"""The client's address behind a proxy the shell trusts (ATRIUM_TRUSTED_PROXIES, docs/security.md
"The client's address"): from a trusted peer the shell takes the rightmost X-Forwarded-For entry
that is not itself a trusted proxy; from anyone else the header is the caller's own words and is
ignored. The address is what the sign-in limits count and what a session shows."""

from __future__ import annotations

import httpx
import pytest

from atrium.users.throttle import LIMIT
from tests.integration.conftest import RunningShell, StartShell

pytestmark = pytest.mark.integration

PASSWORD = "a long enough password"


def browser(shell: RunningShell, forwarded: str | None = None) -> httpx.Client:
    headers = {"Origin": shell.url}
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    return httpx.Client(base_url=shell.url, headers=headers, timeout=30)


def sign_in(client: httpx.Client, user: str, password: str) -> httpx.Response:
    return client.post("/api/session", json={"user": user, "password": password})


def seen_from(page: httpx.Client, *forwarded: str) -> str:
    """The address the shell shows for the signed-in ``page``'s session on a request sent with
    the X-Forwarded-For headers ``forwarded`` (a session shows where it was last seen)."""
    headers = [("X-Forwarded-For", value) for value in forwarded]
    listed = page.get("/api/sessions", headers=headers)
    assert listed.status_code == 200, listed.text
    (session,) = [s for s in listed.json() if s["current"]]
    address: str = session["address"]
    return address


def add_bob(shell: RunningShell) -> None:
    with shell.client() as api:
        made = api.post("/api/users", json={"id": "bob", "password": PASSWORD})
        assert made.status_code == 201, made.text


def test_behind_a_trusted_proxy_each_client_is_counted_and_shown_by_its_own_address(
    start_shell: StartShell,
) -> None:
    shell = start_shell(trusted_proxies="127.0.0.1, 10.9.0.0/16")
    add_bob(shell)
    # one guesser behind the proxy is limited for bob's account from its address ...
    with browser(shell, "203.0.113.7") as guesser:
        for _ in range(LIMIT):
            assert sign_in(guesser, "bob", "not the password").status_code == 401
        assert sign_in(guesser, "bob", PASSWORD).status_code == 429
    # ... and bob, behind the same proxy, signs in, seen from his own address
    with browser(shell, "198.51.100.4") as owner:
        answer = sign_in(owner, "bob", PASSWORD)
        assert answer.status_code == 200, answer.text
        (session,) = owner.get("/api/sessions").json()
        assert session["address"] == "198.51.100.4"
        owner.delete("/api/session")
    # the leftmost entries are the client's own words: the rightmost not a trusted proxy counts
    with browser(shell) as page:
        assert sign_in(page, "bob", PASSWORD).status_code == 200
        assert seen_from(page, "1.2.3.4, 198.51.100.9") == "198.51.100.9"
        assert seen_from(page, "203.0.113.7, 198.51.100.9, 10.9.4.4") == "198.51.100.9"
        assert seen_from(page, "evil, 198.51.100.10") == "198.51.100.10"
        # a header sent twice is one list, in order (RFC 9110 5.3)
        assert seen_from(page, "1.2.3.4", "198.51.100.13") == "198.51.100.13"
        # how proxies write addresses: IPv6, with a port, in brackets, IPv4-mapped
        assert seen_from(page, "2001:db8::1") == "2001:db8::1"
        assert seen_from(page, "[2001:db8::2]:4711") == "2001:db8::2"
        assert seen_from(page, "198.51.100.11:4711") == "198.51.100.11"
        assert seen_from(page, "::ffff:198.51.100.12") == "198.51.100.12"
        # garbage gives the peer's own address, never an error
        garbage = ["evil", "", "1.2.3.4, no address", "1.2.3.4,,", "fe80::1%eth0", "x" * 6000]
        for value in garbage:
            assert seen_from(page, value) == "127.0.0.1", value
        # more trusted hops than any chain of proxies: the peer's too; a few: the farthest
        assert seen_from(page, ",".join(["10.9.0.1"] * 40)) == "127.0.0.1"
        assert seen_from(page, "10.9.0.1, 10.9.0.2") == "10.9.0.1"


def test_without_trusted_proxies_a_forwarded_address_is_ignored(shell: RunningShell) -> None:
    """Spoofing: a client that writes its own X-Forwarded-For neither escapes its limit nor
    changes the address its session shows."""
    add_bob(shell)
    for n in range(LIMIT):
        with browser(shell, f"203.0.113.{n}") as guesser:
            assert sign_in(guesser, "bob", "not the password").status_code == 401
    with browser(shell, "198.51.100.4") as guesser:
        assert sign_in(guesser, "bob", PASSWORD).status_code == 429


def test_a_peer_outside_the_list_is_not_trusted(start_shell: StartShell) -> None:
    shell = start_shell(trusted_proxies="10.0.0.0/8")
    add_bob(shell)
    with browser(shell) as page:
        assert sign_in(page, "bob", PASSWORD).status_code == 200
        assert seen_from(page, "198.51.100.4") == "127.0.0.1"


@pytest.mark.parametrize(
    "bad",
    [
        "10.0.0.300",
        "10.0.0.0/33",
        "proxy.lan",
        "1.2.3.4,,5.6.7.8",
        "0.0.0.0/0",
        "::/0",
        # every IPv4 address written as IPv4-mapped IPv6: /96 of it is 0.0.0.0/0
        "::ffff:0.0.0.0/96",
    ],
)
def test_a_bad_entry_is_refused_naming_it(bad: str) -> None:
    from atrium.settings import ConfigError, Settings

    with pytest.raises(ConfigError) as refused:
        Settings.load(trusted_proxies=bad)
    assert "ATRIUM_TRUSTED_PROXIES" in str(refused.value)
    assert repr(bad.split(",")[1] if ",," in bad else bad) in str(refused.value)
