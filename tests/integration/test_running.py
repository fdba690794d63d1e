"""Running it for real: a sign-in that survives a restart, the bootstrap token kept unless
`ATRIUM_TOKEN` changes it, and an app origin opened directly in a browser."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from atrium.identity import SESSION_COOKIE
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell, serving

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


HTML = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"  # what a browser sends


@pytest.fixture
def echo_apps(start_shell: StartShell, system_apps: Path) -> RunningShell:
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", system_apps / "test.sdk.echo")
    # a LAN's app domain (one wildcard DNS record), not the default `localhost`
    return start_shell(app_domain="atrium.test")


def test_an_app_origin_opened_directly_in_a_browser_links_to_the_host_page(
    echo_apps: RunningShell,
) -> None:
    shell = echo_apps
    with shell.client(timeout=30) as api:
        instance = api.post("/api/instances", json={"appId": "test.sdk.echo", "new": True}).json()
        view = api.post(f"/api/instances/{instance['instanceId']}/views", json={"path": "/"})
        url = view.json()["url"]
    parts = urlsplit(url)
    host_page = f"http://{shell.settings.app_domain}:{shell.settings.port}/"
    with httpx.Client(base_url=shell.url, headers={"Host": parts.netloc}, timeout=30) as origin:
        target = f"{parts.path}?{parts.query}"
        assert origin.get(target).status_code == 303  # the ticket is used now
        for path in (target, "/", "/notes/7"):  # a used view URL, the origin, a page of it
            page = origin.get(path, headers={"Accept": HTML})
            assert page.status_code == 401
            assert page.headers["content-type"].startswith("text/html")
            assert page.headers["cache-control"] == "no-store"
            assert page.headers["content-security-policy"].startswith("default-src 'none'")
            assert f'<a href="{host_page}">' in page.text
            assert "open it from the host page" in page.text
            # a script or the SDK still gets the error object
            for accept in ("application/json", "*/*", None):
                headers = {"Accept": accept} if accept else {}
                answer = origin.get(path, headers=headers)
                assert answer.status_code == 401
                assert answer.json()["error"]["code"] == "unauthenticated"
        # the shell's API on the origin is never a page
        api_answer = origin.get("/_os/api/apps", headers={"Accept": HTML})
        assert api_answer.json()["error"]["code"] == "unauthenticated"
    gone = f"abcdefabcdef.{shell.settings.app_domain}:{shell.settings.port}"
    with httpx.Client(base_url=shell.url, headers={"Host": gone}, timeout=30) as origin:
        page = origin.get("/", headers={"Accept": HTML})
        assert page.status_code == 404
        assert f'<a href="{host_page}">' in page.text
        assert origin.get("/").json()["error"]["code"] == "not_found"
    # the link works: the host page answers on the app domain's own name
    lan = {"Host": urlsplit(host_page).netloc}
    with httpx.Client(base_url=shell.url, headers=lan, timeout=30) as browser:
        answer = browser.get("/", headers={"Accept": HTML})
        assert answer.status_code == 200
        assert "<title>Atrium</title>" in answer.text
