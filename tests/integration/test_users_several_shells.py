"""Sign-ins, tokens and grants on two real shells (two homes) sharing one PostgreSQL database:
what one shell makes is valid on the other, and what one ends is refused on the other."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atrium.identity import SESSION_COOKIE
from tests.integration.conftest import (
    RunningShell,
    SseReader,
    shells_on_one_database,
    wait_for,
)

pytestmark = pytest.mark.integration

PASSWORD = "a long enough password"


@pytest.fixture
def two_shells(
    postgres_server: str, tmp_path: Path, system_apps: Path
) -> Iterator[tuple[RunningShell, RunningShell]]:
    with shells_on_one_database(postgres_server, tmp_path, system_apps) as (one, two):
        yield one, two


def signed_in(shell: RunningShell, cookie: str) -> httpx.Client:
    """A client of ``shell`` carrying only the session cookie (as a browser would)."""
    return httpx.Client(
        base_url=shell.url,
        cookies={SESSION_COOKIE: cookie},
        headers={"Origin": shell.url},
        timeout=20,
    )


def test_a_sign_in_and_a_token_made_on_one_shell_hold_on_the_other_until_ended_there(
    two_shells: tuple[RunningShell, RunningShell],
) -> None:
    one, two = two_shells
    with one.client() as admin:
        made = admin.post("/api/users", json={"id": "carol", "role": "member"})
        assert made.status_code == 201, made.text
        reset = admin.put("/api/users/carol/password", json={"password": PASSWORD})
        assert reset.status_code in (200, 204), reset.text
    with httpx.Client(base_url=one.url, timeout=20) as anonymous:
        answer = anonymous.post(
            "/api/session",
            json={"user": "carol", "password": PASSWORD},
            headers={"Origin": one.url},
        )
        assert answer.status_code in (200, 201), answer.text
        cookie = answer.cookies[SESSION_COOKIE]
    # made on one: the cookie works on two, which never saw the sign-in
    with signed_in(one, cookie) as on_one, signed_in(two, cookie) as on_two:
        assert on_two.get("/api/me").json()["id"] == "carol"
        assert on_one.get("/api/me").json()["id"] == "carol"
        (session,) = on_two.get("/api/sessions").json()
        # ended on two: refused on one, which remembered it
        assert on_two.delete(f"/api/sessions/{session['id']}").status_code in (200, 204)
        wait_for(lambda: on_one.get("/api/me").status_code == 401, "the ended session refused")
        assert on_two.get("/api/me").status_code == 401

    with two.client() as admin_on_two:
        minted = admin_on_two.post("/api/tokens", json={"name": "cli"})
        assert minted.status_code in (200, 201), minted.text
        token = minted.json()["token"]
        token_id = minted.json()["id"]
    with one.client(token) as by_token_on_one:
        assert by_token_on_one.get("/api/me").json()["id"] == "default"
        with two.client() as admin_on_two:
            gone = admin_on_two.delete(f"/api/tokens/{token_id}")
            assert gone.status_code in (200, 204), gone.text
        wait_for(
            lambda: by_token_on_one.get("/api/me").status_code == 401, "the deleted token refused"
        )


def test_a_user_disabled_on_one_shell_is_refused_on_the_other(
    two_shells: tuple[RunningShell, RunningShell],
) -> None:
    one, two = two_shells
    dave = one.add_user("dave")
    with two.client(dave) as on_two:
        assert on_two.get("/api/me").json()["id"] == "dave"
        with one.client() as admin:
            assert admin.patch("/api/users/dave", json={"disabled": True}).status_code == 200
        wait_for(lambda: on_two.get("/api/me").status_code == 401, "the disabled user refused")
    # the last enabled admin is checked against the database, not a shell's memory
    with two.client() as admin_on_two:
        last = admin_on_two.patch("/api/users/default", json={"role": "member"})
        assert last.status_code == 409, last.text


def test_a_theme_chosen_on_one_shell_is_served_by_the_other_and_announced_once(
    two_shells: tuple[RunningShell, RunningShell],
) -> None:
    """The theme service keeps a copy of each selection: another shell's `kv:changed` makes it
    read the row again, and only the shell that made the change announces `theme:changed`."""
    one, two = two_shells
    with one.client() as on_one, two.client() as on_two:
        assert on_two.get("/api/os/theme").json()["themeIdDark"] != "fjord"
        heard_on_two = SseReader(on_two, {"topics": "theme:*"})
        chosen = on_one.post("/api/os/themes/select", json={"themeIdDark": "fjord"})
        assert chosen.status_code == 200, chosen.text
        wait_for(lambda: on_two.get("/api/os/theme").json()["themeIdDark"] == "fjord", "fjord")
        heard_on_two.wait(1, "theme:changed")
        time.sleep(1)  # a second announcement, from the other shell's refresh, would come now
        assert len(heard_on_two.of("theme:changed")) == 1


def test_a_user_disabled_while_a_shell_fell_behind_the_events_is_refused_there(
    two_shells: tuple[RunningShell, RunningShell],
) -> None:
    """A shell whose reader misses rows (more than the table keeps were written while it could
    not read: a long cut from the database, a stalled process) never hears the `user:changed`
    among them; its remembered credentials must not outlive what it missed."""
    one, two = two_shells
    dave = one.add_user("dave")
    with two.client(dave) as on_two:
        assert on_two.get("/api/me").json()["id"] == "dave"  # two remembers dave's token now
        with two.stalled():  # two's reader reads nothing meanwhile
            with one.client() as admin:
                assert admin.patch("/api/users/dave", json={"disabled": True}).status_code == 200
            one.flood_events()  # more rows than are kept: the user:changed is gone
        wait_for(lambda: on_two.get("/api/me").status_code == 401, "the disabled user refused")
