"""Caller identity over real HTTP: tokens, the login cookie, origins, app tokens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from atrium.identity import SESSION_COOKIE
from tests.integration.conftest import RunningShell

pytestmark = pytest.mark.integration


@contextmanager
def _login(shell: RunningShell) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://localhost:{shell.settings.port}", timeout=10) as client:
        response = client.get(f"/login?token={shell.token}", follow_redirects=False)
        assert response.status_code == 303
        yield client


def test_user_endpoints_refuse_requests_without_a_token(shell: RunningShell) -> None:
    with shell.anonymous() as client:
        for path in ("/api/apps", "/api/scopes", "/api/kv/os/theme", "/api/events"):
            response = client.get(path)
            assert response.status_code == 401, path
            assert response.json()["error"]["code"] == "unauthenticated"


def test_the_user_token_is_accepted(api: httpx.Client) -> None:
    assert api.get("/api/apps").status_code == 200


def test_a_wrong_token_is_401_even_on_open_endpoints(shell: RunningShell) -> None:
    with shell.client(token="not-the-token") as client:
        assert client.get("/api/apps").status_code == 401
        assert client.get("/api/version").status_code == 401


def test_a_malformed_authorization_header_is_401(shell: RunningShell) -> None:
    with shell.anonymous() as client:
        response = client.get("/api/apps", headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert response.status_code == 401


def test_open_endpoints_need_no_token(shell: RunningShell) -> None:
    with shell.anonymous() as client:
        assert client.get("/api/version").json() == {
            "version": "0.1.0",
            "api": 1,
            "manifestSchema": 1,
        }
        assert client.get("/").status_code == 200


def test_login_sets_an_httponly_samesite_strict_host_only_cookie(shell: RunningShell) -> None:
    with shell.anonymous() as client:
        response = client.get(f"/login?token={shell.token}", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert "httponly" in attributes
    assert "samesite=strict" in cookie.lower()
    assert "domain" not in attributes
    assert shell.token not in cookie


def test_login_with_a_wrong_token_is_refused(shell: RunningShell) -> None:
    with shell.anonymous() as client:
        response = client.get("/login?token=wrong", follow_redirects=False)
    assert response.status_code == 401
    assert "set-cookie" not in response.headers


def test_the_login_cookie_reads_and_changes_from_the_host_origin(shell: RunningShell) -> None:
    with _login(shell) as client:
        assert client.get("/api/apps").status_code == 200
        origin = f"http://localhost:{shell.settings.port}"
        response = client.put(
            "/api/kv/os/greeting", json={"value": "hi"}, headers={"Origin": origin}
        )
        assert response.status_code == 200
        same_origin = client.put(
            "/api/kv/os/greeting",
            json={"value": "hello"},
            headers={"Sec-Fetch-Site": "same-origin"},
        )
        assert same_origin.status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://abcdefabcdef.localhost:7070"},
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site"},
        {},
    ],
    ids=["app-origin", "foreign-origin", "null-origin", "same-site", "cross-site", "no-headers"],
)
def test_a_cookie_authenticated_change_from_another_origin_is_refused(
    shell: RunningShell, headers: dict[str, str]
) -> None:
    with _login(shell) as client:
        response = client.put("/api/kv/os/greeting", json={"value": "pwned"}, headers=headers)
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "permission_denied"
        assert client.get("/api/kv/os/greeting").status_code == 404


def test_an_app_token_identifies_the_app_which_may_read_but_not_change_the_platform(
    shell: RunningShell,
) -> None:
    token = shell.shell.app_tokens.issue("com.atrium.notes", "com.atrium.notes-1", "default")
    with shell.client(token=token) as client:
        assert client.get("/api/apps").status_code == 200
        response = client.put("/api/scopes/global/git-repo", json={"url": "https://x.test/r.git"})
    assert response.status_code == 403
    assert response.json()["error"] == {
        "code": "permission_denied",
        "message": "only the user may call this endpoint, not app 'com.atrium.notes'",
        "callerAppId": "com.atrium.notes",
    }


def test_a_revoked_app_token_is_401(shell: RunningShell) -> None:
    tokens = shell.shell.app_tokens
    token = tokens.issue("com.atrium.notes", "com.atrium.notes-1", "default")
    tokens.revoke("com.atrium.notes-1")
    with shell.client(token=token) as client:
        assert client.get("/api/apps").status_code == 401
