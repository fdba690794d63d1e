"""Running it for real: a sign-in that survives a restart, the bootstrap token kept unless
`ATRIUM_TOKEN` changes it, and an app origin opened directly in a browser."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from atrium.identity import SESSION_COOKIE
from tests.integration.conftest import serving

pytestmark = pytest.mark.integration

PASSWORD = "a long enough password"


def test_a_password_sign_in_and_the_token_survive_a_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with serving(home) as first:
        with first.client() as api:
            made = api.post("/api/users", json={"id": "bob", "name": "Bob", "password": PASSWORD})
            assert made.status_code == 201, made.text
        with httpx.Client(base_url=first.url, timeout=20) as page:
            signed = page.post("/api/session", json={"user": "bob", "password": PASSWORD})
            assert signed.status_code == 200, signed.text
            secret = page.cookies[SESSION_COOKIE]
        # the login link's sign-in, as a bookmarked host page would have it
        with httpx.Client(base_url=first.url, timeout=20) as linked:
            assert linked.get(f"/login?token={first.token}").status_code in {200, 303}
            link_secret = linked.cookies[SESSION_COOKIE]
        token = first.token
    with serving(home) as second:
        assert second.token == token  # the login link printed before still works
        assert (home / "run" / "token").read_text().strip() == token
        for cookie, who in ((secret, "bob"), (link_secret, "default")):
            with httpx.Client(base_url=second.url, timeout=20) as page:
                page.cookies.set(SESSION_COOKIE, cookie)
                me = page.get("/api/me")
                assert me.status_code == 200, me.text
                assert me.json()["id"] == who
    changed = "another-token-of-enough-length"
    with serving(home, ATRIUM_TOKEN=changed) as third:
        assert third.token == changed
        with httpx.Client(base_url=third.url, timeout=20) as page:
            page.cookies.set(SESSION_COOKIE, link_secret)  # the old link's sign-in ends
            assert page.get("/api/me").status_code == 401
            page.cookies.set(SESSION_COOKIE, secret)  # a password sign-in does not
            assert page.get("/api/me").status_code == 200
    # and once ATRIUM_TOKEN is unset again, the last token written stays
    with serving(home) as fourth:
        assert fourth.token == changed
