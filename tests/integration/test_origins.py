"""Apps served on their own origins: tickets, view cookies, `/_os/`, `/api/proxy/`, isolation."""

from __future__ import annotations

import base64
import hashlib
import shutil
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell

pytestmark = pytest.mark.integration


@pytest.fixture
def origin_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    for name in ("test.sdk.echo", "test.plain.stdlib"):
        shutil.copytree(TESTS_DIR / "apps" / name, system_apps / name)
    return start_shell()


@pytest.fixture
def api(origin_shell: RunningShell) -> Iterator[httpx.Client]:
    with origin_shell.client(timeout=30) as client:
        yield client


def open_view(api: httpx.Client, app_id: str, path: str = "/") -> tuple[dict[str, Any], str]:
    instance = api.post("/api/instances", json={"appId": app_id, "new": True}).json()
    view = api.post(f"/api/instances/{instance['instanceId']}/views", json={"path": path}).json()
    return instance, view["url"]


def on_origin(shell: RunningShell, url: str) -> tuple[httpx.Client, str]:
    """A client that talks to 127.0.0.1 but says `Host: <slug>.localhost:<port>`."""
    parts = urlsplit(url)
    host = parts.netloc
    client = httpx.Client(base_url=shell.url, headers={"Host": host}, timeout=30)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return client, target


def enter(shell: RunningShell, url: str) -> tuple[httpx.Client, str]:
    client, target = on_origin(shell, url)
    response = client.get(target, follow_redirects=False)
    assert response.status_code == 303, response.text
    cookie = response.headers["set-cookie"]
    assert "httponly" in cookie.lower()
    assert "domain" not in cookie.lower()
    value = cookie.split(";", 1)[0].split("=", 1)[1]
    client.headers["Cookie"] = f"atrium_view={value}"
    return client, response.headers["location"]


def test_a_view_ticket_sets_a_view_cookie_and_the_page_is_proxied(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    _, url = open_view(api, "test.plain.stdlib", "/items?x=1")
    assert urlsplit(url).hostname.endswith(".localhost")  # type: ignore[union-attr]
    client, location = enter(origin_shell, url)
    with closing(client):
        assert location == "/items?x=1"
        page = client.get("/items", params={"q": "2"})
        # the app's own answer (it serves no page at /items), so the request reached it
        assert page.status_code == 404
        assert page.json()["error"]["message"] == "no route /items"
        assert page.headers["x-os-app-id"] == "test.plain.stdlib"


def test_a_ticket_works_once(origin_shell: RunningShell, api: httpx.Client) -> None:
    _, url = open_view(api, "test.sdk.echo")
    first, _ = enter(origin_shell, url)
    first.close()
    again, target = on_origin(origin_shell, url)
    with again:
        response = again.get(target, follow_redirects=False)
    assert response.status_code == 401


def former_cookie_of(ticket: str) -> str:
    """What the view cookie was once derived as: a hash of the ticket, which anyone who saw
    the ticket's URL (a proxy's request log, the browser's history) could compute."""
    digest = hashlib.sha256(b"atrium view cookie\0" + ticket.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_a_used_ticket_read_from_its_url_gives_no_view_cookie(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    """A ticket travels in a URL, so it may be read after its use (HAProxy's httplog writes
    it): the view's cookie must be a secret of its own, not a function of the ticket."""
    _, url = open_view(api, "test.sdk.echo")
    client, _ = enter(origin_shell, url)
    with closing(client):
        assert client.get("/_os/client.js").status_code == 200
        made = client.headers["Cookie"].removeprefix("atrium_view=")
    ticket = parse_qs(urlsplit(url).query)["ticket"][0]
    assert made != former_cookie_of(ticket)
    reader, _ = on_origin(origin_shell, url)
    with closing(reader):
        reader.headers["Cookie"] = f"atrium_view={former_cookie_of(ticket)}"
        assert reader.get("/_os/client.js").status_code == 401


def test_an_app_origin_without_a_view_cookie_is_401(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    _, url = open_view(api, "test.sdk.echo")
    client, _ = on_origin(origin_shell, url)
    with closing(client):
        assert client.get("/").status_code == 401
        client.headers["Cookie"] = "atrium_view=forged"
        assert client.get("/").status_code == 401
        client.headers["Authorization"] = f"Bearer {origin_shell.token}"
        assert client.get("/_os/api/apps").status_code == 401


def test_an_apps_own_authorization_reaches_it_on_its_origin_never_the_users_bearer(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    """A server that authenticates its users itself (a CalDAV server's Basic sign-in from its own
    page) gets the Authorization its page sent on its origin; the user's bearer token on the
    shell's `/api/proxy/` stays with the shell."""
    instance, url = open_view(api, "test.sdk.echo")
    client, _ = enter(origin_shell, url)
    with closing(client):
        seen = client.get("/whoami", headers={"Authorization": "Basic YXRyaXVtOg=="})
        assert seen.status_code == 200, seen.text
        assert seen.json()["authorization"] == "Basic YXRyaXVtOg=="
    proxied = api.get(f"/api/proxy/{instance['instanceId']}/whoami")
    assert proxied.status_code == 200, proxied.text
    assert proxied.json()["authorization"] is None


def test_an_unknown_app_origin_is_404(origin_shell: RunningShell) -> None:
    client = httpx.Client(
        base_url=origin_shell.url,
        timeout=10,
        headers={"Host": f"abcdefabcdef.localhost:{origin_shell.settings.port}"},
    )
    with closing(client):
        assert client.get("/").status_code == 404


def test_os_api_on_an_app_origin_is_the_shell_api_called_as_that_app(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    _, url = open_view(api, "test.sdk.echo")
    client, _ = enter(origin_shell, url)
    own = f"http://{urlsplit(url).netloc}"
    with closing(client):
        listed = client.get("/_os/api/instances")
        assert listed.status_code == 200
        assert all(i["port"] is None and i["pid"] is None for i in listed.json())
        own_kv = client.put(
            "/_os/api/kv/app/test.sdk.echo/k", json={"value": 1}, headers={"Origin": own}
        )
        assert own_kv.status_code == 200
        user_only = client.post(
            "/_os/api/instances", json={"appId": "test.sdk.echo"}, headers={"Origin": own}
        )
        assert user_only.status_code == 403
        assert user_only.json()["error"]["callerAppId"] == "test.sdk.echo"
        cross = client.put(
            "/_os/api/kv/app/test.sdk.echo/k",
            json={"value": 2},
            headers={"Origin": "http://zzzzzzzzzzzz.localhost:1"},
        )
        assert cross.status_code == 403
    assert api.get("/api/kv/app/test.sdk.echo/k").json()["value"] == 1


def test_an_app_page_cannot_make_a_cookie_authenticated_change_on_the_host(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    _, url = open_view(api, "test.sdk.echo")
    app_origin = f"http://{urlsplit(url).netloc}"
    with httpx.Client(
        base_url=f"http://localhost:{origin_shell.settings.port}", timeout=10
    ) as browser:
        browser.get(f"/login?token={origin_shell.token}")
        attempt = browser.put(
            "/api/scopes/global/git-repo",
            json={"url": "https://evil.test/r"},
            headers={"Origin": app_origin},
        )
    assert attempt.status_code == 403
    assert api.get("/api/scopes").json()[1]["remote"] is None


def test_api_proxy_serves_bearer_clients_and_never_the_cookie(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    instance, _ = open_view(api, "test.plain.stdlib")
    iid = instance["instanceId"]
    response = api.post(
        f"/api/proxy/{iid}/api/data/items?a=b",
        content=b"hello",
        headers={"X-Os-Caller-App-Id": "spoofed", "Cookie": "x=y"},
    )
    assert response.status_code == 200
    echoed = response.json()
    assert echoed["method"] == "POST"
    assert echoed["body"] == "hello"
    assert echoed["callerAppId"] in (None, "")
    with httpx.Client(
        base_url=f"http://localhost:{origin_shell.settings.port}", timeout=10
    ) as browser:
        browser.get(f"/login?token={origin_shell.token}")
        assert browser.get(f"/api/proxy/{iid}/").status_code == 403


def test_a_page_of_an_instance_that_is_not_serving_is_a_503_that_retries(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    instance, url = open_view(api, "test.sdk.echo")
    client, _ = enter(origin_shell, url)
    iid = instance["instanceId"]
    assert api.post(f"/api/instances/{iid}/stop").json()["state"] == "stopped"
    with closing(client):
        page = client.get("/")
    assert page.status_code == 503
    assert page.headers["retry-after"] == "1"


def test_the_apps_own_cookies_reach_it_without_the_shells(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    instance, _ = open_view(api, "test.plain.stdlib")
    iid = instance["instanceId"]
    echoed = api.get(
        f"/api/proxy/{iid}/api/data/items",
        headers={"Cookie": "theirs=1; atrium_view=abc; atrium_session=secret"},
    )
    assert echoed.status_code == 200
    assert echoed.json()["cookie"] == "theirs=1"
    assert len(echoed.headers.get_list("date")) == 1
    api.post(f"/api/instances/{iid}/resumed")
    via_data_proxy = api.get("/api/data/plain/items", headers={"Cookie": "theirs=1"})
    assert via_data_proxy.status_code == 200
    assert via_data_proxy.json()["cookie"] is None  # the data API is not a cookie channel


def _raw(shell: RunningShell, host: str, cookie: str, line: str, *headers: str) -> bytes:
    """A raw request (HTTP clients would tidy the path before sending it)."""
    import socket

    with socket.create_connection(("127.0.0.1", int(shell.url.rsplit(":", 1)[1])), 10) as sock:
        head = "\r\n".join(
            [line, f"Host: {host}", f"Cookie: {cookie}", "Content-Length: 0", *headers]
        )
        sock.sendall((head + "\r\n\r\n").encode())
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "target",
    [
        "/api/data/items",
        "/api/data/items/x",
        "//api/data/items",
        "/api/./data/items",
        "/x/../api/data/items",
        "/%61pi/data/items",
        "/%2561pi/data/items",
        "/API/Data/items",
        "/api%2Fdata/items",
        "/api%2fdata%2fitems",
        "/api/data./items",
        "/api\\data\\items",
        "/api/lifecycle/onPause",
        "/api/lifecycle",
        "/health",
        "/HEALTH/",
    ],
)
def test_a_page_request_never_reaches_the_apps_shell_routes(
    origin_shell: RunningShell, api: httpx.Client, target: str
) -> None:
    """Issue 13 row 3: the view cookie rides along with a sibling app's request, so the shell
    refuses, itself, every path an app's server could read as its provider routes, hooks or
    health check."""
    _, url = open_view(api, "test.plain.stdlib")
    client, _ = enter(origin_shell, url)
    with closing(client):
        answer = _raw(
            origin_shell,
            client.headers["Host"],
            client.headers["Cookie"],
            f"GET {target} HTTP/1.1",
            "Connection: close",
        )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404"), answer[:300]
    assert b"x-os-app-id" not in head.lower()  # the shell's answer, not the app's
    assert b"shell's to call" in body


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({}, False),
        ({"Origin": "http://aaaaaaaaaaaa.localhost"}, False),
        ({"Sec-Fetch-Site": "same-site"}, False),
        ({"Origin": "null"}, False),
        ({"Sec-Fetch-Site": "same-origin"}, True),
        ({"Origin": "own"}, True),
    ],
)
def test_a_change_on_an_app_origin_must_come_from_that_origin(
    origin_shell: RunningShell, api: httpx.Client, headers: dict[str, str], allowed: bool
) -> None:
    _, url = open_view(api, "test.plain.stdlib")
    client, _ = enter(origin_shell, url)
    with closing(client):
        if headers.get("Origin") == "own":
            headers = {"Origin": f"http://{client.headers['Host']}"}
        answer = client.post("/items", content=b"x", headers=headers)
        get = client.get("/items", headers={"Origin": "http://aaaaaaaaaaaa.localhost"})
    if allowed:
        assert answer.headers.get("x-os-app-id") == "test.plain.stdlib"  # reached the app
    else:
        assert answer.status_code == 403
        assert answer.json()["error"]["code"] == "permission_denied"
        assert "x-os-app-id" not in answer.headers
    # reads are not changes: a sibling may embed or link A's pages (it cannot read them)
    assert get.headers.get("x-os-app-id") == "test.plain.stdlib"


def test_the_app_is_told_what_each_request_is(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    """`X-Os-Request-Kind`: `page` from the app origin, `user` through `/api/proxy/`, `data`
    through the data proxy; a caller's own value never arrives."""
    instance, url = open_view(api, "test.plain.stdlib")
    client, _ = enter(origin_shell, url)
    with closing(client):
        page = client.get("/", headers={"X-Os-Request-Kind": "data"})
    assert page.status_code == 404  # plain stdlib serves no page; what it saw is not echoed
    data = api.get("/api/data/echo/open/x", headers={"X-Os-Request-Kind": "page"}).json()
    assert data["headers"]["X-Os-Request-Kind"] == "data"
    proxied = api.get(f"/api/proxy/{instance['instanceId']}/api/data/items/y").json()
    assert proxied["headers"]["x-os-request-kind"] == "user"


def test_a_page_request_drops_the_headers_connection_names_both_ways(
    origin_shell: RunningShell, api: httpx.Client
) -> None:
    """Issue 19: the page path filters hop-by-hop headers as the data path does, including
    those a `Connection` header names (RFC 9110 7.6.1), in both directions."""
    instance, _ = open_view(api, "test.plain.stdlib")
    iid = instance["instanceId"]
    sent = api.get(
        f"/api/proxy/{iid}/api/data/items",
        headers={"Connection": "keep-alive, X-Secret-Hop", "X-Secret-Hop": "1", "X-Kept": "2"},
    )
    assert sent.status_code == 200, sent.text
    received = {name.lower() for name in sent.json()["headers"]}
    assert "x-kept" in received
    assert "x-secret-hop" not in received
    answered = api.get(f"/api/proxy/{iid}/api/data/items/hop")
    assert answered.status_code == 200
    assert answered.headers["x-kept"] == "end to end"
    assert "x-private" not in answered.headers
    assert "keep-alive" not in answered.headers
