"""The data proxy against real provider apps (one SDK, one stdlib-only) and real callers."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO_DIR, TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell, launch_shell, wait_for

pytestmark = pytest.mark.integration

CALLERS = {
    "test.caller.reader": ["test.sdk.echo.read", "test.plain.stdlib.write"],
    "test.caller.writer": ["test.sdk.echo.write"],
    "test.caller.nobody": [],
}


def caller_app(system_apps: Path, app_id: str, permissions: list[str]) -> None:
    """A caller only needs a manifest: the test holds its token, it never runs."""
    app_dir = system_apps / app_id
    app_dir.mkdir()
    (app_dir / "entrypoint.sh").write_text("#!/bin/sh\n")
    (app_dir / "app.manifest.json").write_text(
        json.dumps(
            {
                "id": app_id,
                "name": app_id,
                "version": "1.0.0",
                "permissions": permissions,
            }
        )
    )


def provider_apps(system_apps: Path) -> None:
    for name in ("test.sdk.echo", "test.plain.stdlib", "test.fault.crashes"):
        shutil.copytree(TESTS_DIR / "apps" / name, system_apps / name)
    for app_id, permissions in CALLERS.items():
        caller_app(system_apps, app_id, permissions)


def ready(shell: RunningShell) -> RunningShell:
    with shell.client() as api:
        wait_for(lambda: shell.shell.dataproxy.registered("test.sdk.echo"), "the echo provider")
        plain = api.post("/api/instances", json={"appId": "test.plain.stdlib"}).json()
        api.post(f"/api/instances/{plain['instanceId']}/resumed")
    return shell


@pytest.fixture(scope="module")
def proxy_shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningShell]:
    """One shell for the tests that leave the instances as they found them (starting a shell
    and its providers was 39 of this module's 43 s when each test had its own)."""
    root = tmp_path_factory.mktemp("dataproxy")
    system = root / "system-apps"
    shutil.copytree(REPO_DIR / "apps", system)
    provider_apps(system)
    shell = launch_shell(root / "home", system)
    try:
        yield ready(shell)
    finally:
        shell.stop()


@pytest.fixture
def fresh_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    """A shell of its own, for a test that pauses, stops or crashes a provider."""
    provider_apps(system_apps)
    return ready(start_shell())


@pytest.fixture
def api(proxy_shell: RunningShell) -> Iterator[httpx.Client]:
    with proxy_shell.client(timeout=60) as client:
        yield client


@pytest.fixture
def fresh_api(fresh_shell: RunningShell) -> Iterator[httpx.Client]:
    with fresh_shell.client(timeout=60) as client:
        yield client


def as_app(shell: RunningShell, app_id: str) -> httpx.Client:
    token = shell.shell.app_tokens.issue(app_id, f"{app_id}-1", "default")
    return shell.client(token=token, timeout=30)


def raw_request(shell: RunningShell, line: str) -> tuple[int, dict[str, Any]]:
    """Send a raw request line (HTTP clients would remove dot segments before sending)."""
    with socket.create_connection(("127.0.0.1", shell.settings.port), timeout=10) as sock:
        sock.sendall(
            f"{line}\r\nHost: localhost\r\nAuthorization: Bearer {shell.token}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_every_verb_reaches_the_provider_with_query_and_body(
    api: httpx.Client, method: str
) -> None:
    response = api.request(
        method,
        "/api/data/echo/open/a/b",
        params={"q": "1", "r": "x y"},
        content=b"payload" if method not in {"GET"} else None,
    )
    assert response.status_code == 200
    echoed = response.json()
    assert echoed["method"] == method
    assert echoed["path"] == "/api/data/open/a/b"
    assert echoed["subpath"] == "a/b"
    assert echoed["query"] == {"q": "1", "r": "x y"}
    assert echoed["bodySize"] == (0 if method == "GET" else 7)


def test_head_is_a_read_without_a_body(api: httpx.Client) -> None:
    response = api.head("/api/data/echo/open/big", params={"size": "1000"})
    assert response.status_code == 200
    assert response.content == b""
    assert response.headers["content-length"] == "1000"


def test_the_longest_entry_wins_and_sub_paths_match(proxy_shell: RunningShell) -> None:
    with as_app(proxy_shell, "test.caller.reader") as reader:
        assert reader.get("/api/data/echo/closed").status_code == 200
        assert reader.get("/api/data/echo/closed/5").status_code == 200
        deeper = reader.get("/api/data/echo/closed/deeper/x")
        assert deeper.status_code == 403
        assert deeper.json()["error"]["permission"] == "test.sdk.echo.deep"
        assert reader.post("/api/data/echo/closed/deeper/x").status_code == 200


def test_entries_match_without_case(proxy_shell: RunningShell) -> None:
    """A server that reads `/closed/DEEPER` as `/closed/deeper` (many do) must not be reached
    through the laxer `/closed`: the stricter entry applies, whatever the case."""
    with as_app(proxy_shell, "test.caller.reader") as reader:
        for path in ("/api/data/echo/closed/DEEPER/y", "/api/data/echo/Closed/Deeper"):
            denied = reader.get(path)
            assert denied.status_code == 403, (path, denied.text)
            assert denied.json()["error"]["permission"] == "test.sdk.echo.deep"
        # its own read entry: the shell lets it through, and the SDK's routes (exact) say 404
        passed = reader.get("/api/data/echo/CLOSED/x")
        assert passed.status_code == 404, passed.text
        assert passed.json()["error"]["message"].startswith("no route for GET /api/data/")


def test_an_empty_segment_never_reaches_a_less_guarded_entry(proxy_shell: RunningShell) -> None:
    """`/closed//deeper/x` would match the entry `/closed` (read permission) while the SDK reads
    it as `/closed/deeper/x` (its own, stricter entry): refused before any entry is chosen."""
    with as_app(proxy_shell, "test.caller.reader") as reader, proxy_shell.anonymous() as anon:
        for caller, path in [
            (reader, "/api/data/echo/closed//deeper/x"),
            (reader, "/api/data/echo/closed/deeper//x"),
            (anon, "/api/data/echo/open//closed/x"),
            (anon, "/api/data/echo//closed/x"),
        ]:
            answer = caller.get(path)
            assert answer.status_code == 400, (path, answer.text)
            assert "empty segments" in answer.json()["error"]["message"]


def test_no_entry_no_authority_and_prefix_lookalikes_are_404(api: httpx.Client) -> None:
    for path in ("/api/data/echo/openx", "/api/data/echo/other", "/api/data/nobody/x"):
        response = api.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "no_provider"


@pytest.mark.parametrize(
    "target",
    [
        "/api/data/echo/open/../closed",
        "/api/data/echo/open/./x",
        "/api/data/echo/open/%2e%2e/c",
        "/api/data/echo/open/%2E/x",
        "/api/data/echo/open%2fx",
        "/api/data/echo/open/a%5cb",
        "/api/data/echo/open/a%00b",
        "/api/data/echo/open/..",
        "/api/data/../../api/apps",
        "/api/data/echo/open/%ff",
        "/api/data/x/y/%ff",
        "/api/data/echo/open/%c3%28",
        # read as another path by some servers: path parameters, trailing dots and spaces,
        # a second decoding
        "/api/data/echo/closed/deeper;x/y",
        "/api/data/echo/closed/deeper%3Bx/y",
        "/api/data/echo/closed/deeper./y",
        "/api/data/echo/closed/deeper%20/y",
        "/api/data/echo/closed/%2564eeper/y",
        "/api/data/echo/open.",
    ],
)
def test_non_canonical_paths_are_400(proxy_shell: RunningShell, target: str) -> None:
    status, body = raw_request(proxy_shell, f"GET {target} HTTP/1.1")
    assert status == 400
    assert body["error"]["code"] == "bad_request"


def test_permissions_are_granted_and_denied_per_verb(proxy_shell: RunningShell) -> None:
    with as_app(proxy_shell, "test.caller.reader") as reader:
        assert reader.get("/api/data/echo/closed/x").status_code == 200
        denied = reader.put("/api/data/echo/closed/x", content=b"{}")
        assert denied.status_code == 403
        assert denied.json()["error"] == {
            "code": "permission_denied",
            "message": "app 'test.caller.reader' needs permission 'test.sdk.echo.write' in its "
            "manifest to PUT echo/closed/x",
            "callerAppId": "test.caller.reader",
            "permission": "test.sdk.echo.write",
        }
    with as_app(proxy_shell, "test.caller.writer") as writer:
        assert writer.get("/api/data/echo/closed/x").status_code == 403
        written = writer.delete("/api/data/echo/closed/x")
        assert written.status_code == 200
        assert written.json()["callerAppId"] == "test.caller.writer"
        assert written.json()["permission"] == "test.sdk.echo.write"


def test_the_shell_sets_the_os_headers_and_strips_inbound_ones(proxy_shell: RunningShell) -> None:
    with as_app(proxy_shell, "test.caller.reader") as reader:
        echoed = reader.get(
            "/api/data/echo/closed/x",
            headers={"X-Os-Custom": "forged", "X-Os-Permission": "test.sdk.echo.read"},
        ).json()
    assert echoed["headers"] == {
        "X-Os-Caller-App-Id": "test.caller.reader",
        "X-Os-Permission": "test.sdk.echo.read",
        "X-Os-Request-Kind": "data",
    }


def test_a_forged_caller_id_is_caller_mismatch(
    proxy_shell: RunningShell, api: httpx.Client
) -> None:
    with as_app(proxy_shell, "test.caller.nobody") as nobody:
        forged = nobody.get(
            "/api/data/echo/closed/x", headers={"X-Os-Caller-App-Id": "test.caller.reader"}
        )
    assert forged.status_code == 403
    assert forged.json()["error"]["code"] == "caller_mismatch"
    as_user = api.get("/api/data/echo/open", headers={"X-Os-Caller-App-Id": "test.caller.reader"})
    assert as_user.json()["error"]["code"] == "caller_mismatch"


def test_a_forged_permission_assertion_is_403(proxy_shell: RunningShell) -> None:
    with as_app(proxy_shell, "test.caller.reader") as reader:
        response = reader.get(
            "/api/data/echo/closed/x", headers={"X-Os-Permission": "test.sdk.echo.write"}
        )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"


def test_anonymous_callers_reach_open_entries_only(proxy_shell: RunningShell) -> None:
    with proxy_shell.anonymous() as anonymous:
        opened = anonymous.get("/api/data/echo/open/x")
        assert opened.status_code == 200
        assert opened.json()["callerAppId"] is None
        assert anonymous.get("/api/data/echo/closed/x").status_code == 401
        assert anonymous.get("/api/data/plain/items").status_code == 200
        assert anonymous.post("/api/data/plain/items").status_code == 401


def test_the_user_may_read_and_write_every_entry_without_a_caller_id(api: httpx.Client) -> None:
    for method in ("GET", "PUT", "DELETE"):
        response = api.request(method, "/api/data/echo/closed/deeper/x")
        assert response.status_code == 200
        assert "X-Os-Caller-App-Id" not in response.json()["headers"]


def test_a_provider_calls_its_own_authority_without_permissions(
    proxy_shell: RunningShell,
) -> None:
    with as_app(proxy_shell, "test.sdk.echo") as echo:
        assert echo.put("/api/data/echo/closed/x").status_code == 200


def test_a_provider_cookie_never_reaches_a_caller(
    proxy_shell: RunningShell, api: httpx.Client
) -> None:
    first = api.get("/api/data/plain/items")
    assert "set-cookie" not in first.headers
    second = api.get("/api/data/plain/items")  # the provider set a cookie: nothing replays it
    assert (second.status_code, second.json()["cookie"]) == (200, None)
    with as_app(proxy_shell, "test.caller.reader") as reader:
        reply = reader.post("/api/data/plain/items", content=b"x", headers={"Cookie": "mine=1"})
        assert "set-cookie" not in reply.headers
        assert reply.json()["callerAppId"] == "test.caller.reader"
        assert reply.json()["cookie"] is None


def test_hop_by_hop_headers_stop_at_the_shell_both_ways(api: httpx.Client) -> None:
    sent = api.get(
        "/api/data/plain/items",
        headers={
            "Connection": "keep-alive, x-mine",
            "X-Mine": "for the shell only",
            "Keep-Alive": "timeout=5",
            "TE": "trailers",
            "Upgrade": "websocket",
            "Proxy-Authorization": "Basic Zm9vOmJhcg==",
            "X-End": "to the provider",
        },
    ).json()["headers"]
    assert sent["x-end"] == "to the provider"
    for name in ("x-mine", "keep-alive", "te", "upgrade", "proxy-authorization", "connection"):
        assert name not in sent, name
    answered = api.get("/api/data/plain/items/hop")
    assert (answered.status_code, answered.text) == (200, "ok")
    assert "x-kept" not in answered.headers  # end to end, but not a header a data answer keeps
    assert "x-private" not in answered.headers
    assert "keep-alive" not in answered.headers


@pytest.mark.parametrize("announced", [100_000, 4 * 1024 * 1024])
def test_a_provider_closing_mid_body_fails_that_request_only(
    api: httpx.Client, announced: int
) -> None:
    if announced <= 256 * 1024:  # buffered: the shell can still answer with an error
        cut = api.get("/api/data/plain/items/cut", params={"bytes": str(announced)})
        assert (cut.status_code, cut.json()["error"]["code"]) == (502, "upstream_failed")
    else:  # streamed: the status line is gone, so the caller sees the body cut short
        with pytest.raises(httpx.RemoteProtocolError):
            api.get("/api/data/plain/items/cut", params={"bytes": str(announced)})
    for n in range(20):  # the broken connection is not handed to anyone else
        assert api.get(f"/api/data/plain/items/{n}").json()["path"] == f"/api/data/items/{n}"


def test_a_provider_that_does_not_answer_in_time_is_504(
    api: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("atrium.api.proxy.data.UPSTREAM_TIMEOUT", 0.5)
    late = api.get("/api/data/plain/items/slow", params={"seconds": "3"})
    assert (late.status_code, late.json()["error"]["code"]) == (504, "upstream_timeout")
    assert api.get("/api/data/plain/items").status_code == 200


def test_answers_without_a_body_keep_their_framing(api: httpx.Client) -> None:
    head = api.head("/api/data/plain/items/chunked")
    assert (head.status_code, head.content) == (200, b"")
    assert "content-length" not in head.headers  # unknown: never a made-up 0
    stale = api.get("/api/data/plain/items/notmodified")
    assert (stale.status_code, stale.content) == (304, b"")
    assert api.get("/api/data/plain/items").status_code == 200


@pytest.mark.parametrize("size", [1000, 3_000_000])
def test_a_chunked_answer_streams_through(api: httpx.Client, size: int) -> None:
    with api.stream(
        "GET", "/api/data/plain/items/chunked", params={"bytes": str(size)}
    ) as response:
        assert response.status_code == 200
        assert "content-length" not in response.headers
        assert sum(len(chunk) for chunk in response.iter_bytes()) == size


def test_browser_code_is_identified_by_its_origin(
    proxy_shell: RunningShell, api: httpx.Client
) -> None:
    from urllib.parse import urlsplit

    instance = api.post("/api/instances", json={"appId": "test.fault.crashes"}).json()
    view = api.post(f"/api/instances/{instance['instanceId']}/views", json={}).json()
    parts = urlsplit(view["url"])
    with httpx.Client(
        base_url=proxy_shell.url, headers={"Host": parts.netloc}, timeout=30
    ) as browser:
        entered = browser.get(f"{parts.path}?{parts.query}", follow_redirects=False)
        cookie = entered.headers["set-cookie"].split(";", 1)[0]
        browser.headers["Cookie"] = cookie
        reply = browser.get(
            "/_os/api/data/echo/open/x", headers={"Authorization": f"Bearer {proxy_shell.token}"}
        )
        assert reply.status_code == 200
        assert reply.json()["callerAppId"] == "test.fault.crashes"
        assert browser.get("/_os/api/data/echo/closed/x").status_code == 403


@pytest.mark.parametrize("action", ["pause", "stop"])
def test_a_provider_that_is_not_resumed_is_503_then_recovers(
    fresh_shell: RunningShell, fresh_api: httpx.Client, action: str
) -> None:
    iid = fresh_shell.shell.dataproxy.registered("test.plain.stdlib")
    assert iid is not None
    fresh_api.post(f"/api/instances/{iid}/{action}")
    response = fresh_api.get("/api/data/plain/items")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "provider_unavailable"
    if action == "stop":
        fresh_api.post(f"/api/instances/{iid}/start")
    fresh_api.post(f"/api/instances/{iid}/resumed")
    assert fresh_api.get("/api/data/plain/items").status_code == 200


def test_a_provider_not_running_is_503(fresh_shell: RunningShell, fresh_api: httpx.Client) -> None:
    response = fresh_api.get("/api/data/crashes/crash")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "provider_unavailable"


def test_an_upstream_crash_is_502(fresh_shell: RunningShell, fresh_api: httpx.Client) -> None:
    iid = fresh_api.post("/api/instances", json={"appId": "test.fault.crashes"}).json()[
        "instanceId"
    ]
    fresh_api.post(f"/api/instances/{iid}/resumed")
    response = fresh_api.get("/api/data/crashes/crash/abort")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_failed"
    wait_for(lambda: fresh_api.get(f"/api/instances/{iid}").json()["state"] == "error", "the crash")
    assert fresh_api.get("/api/data/crashes/crash").status_code == 503


def test_a_large_body_streams_both_ways(api: httpx.Client) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    size = 100 * 1024 * 1024
    received = 0
    with api.stream("GET", "/api/data/echo/open/big", params={"size": str(size)}) as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            received += len(chunk)
    assert received == size
    upload = 20 * 1024 * 1024

    def body() -> Iterator[bytes]:
        for _ in range(upload // 65536):
            yield b"y" * 65536

    sent = api.post("/api/data/echo/open/upload", content=body())  # chunked
    assert sent.json()["bodySize"] == upload
    sized = api.post("/api/data/echo/open/upload", content=b"z" * (3 * 1024 * 1024))
    assert sized.json()["bodySize"] == 3 * 1024 * 1024
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024, f"the shell's peak memory grew by {grown_kib} KiB"


@pytest.mark.parametrize("size", [200_000, 3 * 1024 * 1024])
def test_a_body_sent_in_many_small_pieces_arrives_byte_for_byte(
    proxy_shell: RunningShell, size: int
) -> None:
    """A body dribbled in 1,000-byte writes piles up in the shell between reads: the pieces
    reach the provider in order, whole, once (buffered under 256 KiB, streamed above)."""
    body = hashlib.sha256(b"seed").digest() * (size // 32) + b"!" * (size % 32)
    with socket.create_connection(("127.0.0.1", proxy_shell.settings.port), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(
            f"POST /api/data/echo/open/upload HTTP/1.1\r\nHost: localhost\r\n"
            f"Authorization: Bearer {proxy_shell.token}\r\nContent-Length: {size}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        for start in range(0, size, 1000):
            sock.sendall(body[start : start + 1000])
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, answer = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    echoed = json.loads(answer)
    assert echoed["bodySize"] == size
    assert echoed["bodySha256"] == hashlib.sha256(body).hexdigest()


def test_two_visible_apps_declaring_one_authority_are_reported(
    start_shell: StartShell, system_apps: Path
) -> None:
    for app_id in ("test.clash.a", "test.clash.b"):
        app_dir = system_apps / app_id
        app_dir.mkdir()
        (app_dir / "entrypoint.sh").write_text("#!/bin/sh\n")
        (app_dir / "app.manifest.json").write_text(
            json.dumps(
                {
                    "id": app_id,
                    "name": app_id,
                    "version": "1.0.0",
                    "dataProvider": {"authority": "shared", "providers": [{"path": "/x"}]},
                }
            )
        )
    shell = start_shell()
    with shell.client() as api:
        apps = {a["id"]: a for a in api.get("/api/apps").json()}
    assert apps["test.clash.a"]["conflicts"] == []
    assert apps["test.clash.b"]["conflicts"] == [
        {"authority": "shared", "servedBy": "test.clash.a"}
    ]


INERT = {
    "content-security-policy": "sandbox; default-src 'none'; form-action 'none'",
    "x-content-type-options": "nosniff",
    "cross-origin-resource-policy": "same-origin",
}


def test_every_answer_is_inert_for_a_browser(proxy_shell: RunningShell, api: httpx.Client) -> None:
    """A provider's answer opened by a browser must not run script as the user or as another
    app (issue 13 row 2): every data-proxy answer, success or failure of the provider, on the
    host origin and on an app origin, carries the shell's inert headers."""
    for path in (
        "/api/data/echo/open/x",
        "/api/data/echo/open/big?size=10",
        "/api/data/plain/items/x",
        "/api/data/plain/items/nothing-here",
    ):
        reply = api.get(path)
        for name, value in INERT.items():
            assert reply.headers.get_list(name) == [value], (path, name, reply.headers)
    from urllib.parse import urlsplit

    instance = api.post("/api/instances", json={"appId": "test.fault.crashes"}).json()
    view = api.post(f"/api/instances/{instance['instanceId']}/views", json={}).json()
    parts = urlsplit(view["url"])
    with httpx.Client(
        base_url=proxy_shell.url, headers={"Host": parts.netloc}, timeout=30
    ) as browser:
        entered = browser.get(f"{parts.path}?{parts.query}", follow_redirects=False)
        browser.headers["Cookie"] = entered.headers["set-cookie"].split(";", 1)[0]
        reply = browser.get("/_os/api/data/echo/open/x")
        assert reply.status_code == 200
        for name, value in INERT.items():
            assert reply.headers.get_list(name) == [value]


#: what a provider may say to its callers, and what it may not (docs/api.md "Data proxy")
KEPT = {
    "etag": '"v7"',
    "last-modified": "Wed, 21 Oct 2015 07:28:00 GMT",
    "cache-control": "max-age=60",
    "expires": "Wed, 21 Oct 2015 07:28:00 GMT",
    "vary": "Accept",
    "content-language": "fr",
    "content-disposition": 'attachment; filename="items.txt"',
    "retry-after": "5",
    "accept-ranges": "bytes",
    "allow": "GET, POST",
}
DROPPED = {
    "clear-site-data": '"cookies", "storage", "cache"',
    "access-control-allow-origin": "http://evil.localhost",
    "access-control-allow-credentials": "true",
    "access-control-allow-methods": "PUT, DELETE",
    "access-control-allow-headers": "Authorization",
    "access-control-expose-headers": "X-Foo",
    "set-cookie": "atrium_session=planted; Path=/",
    "refresh": "0; url=https://evil.example/",
    "link": "</api/dist/installed>; rel=preload; as=fetch",
    "location": "https://evil.example/",
    "www-authenticate": 'Basic realm="atrium"',
    "alt-svc": 'h2="evil.example:443"',
    "strict-transport-security": "max-age=31536000; includeSubDomains",
    "content-security-policy": "default-src *; report-uri /api/os/themes/select",
    "content-security-policy-report-only": "default-src 'none'; report-uri https://evil.example/",
    "reporting-endpoints": 'default="https://evil.example/"',
    "nel": '{"report_to": "default", "max_age": 31536000}',
    "service-worker-allowed": "/",
    "permissions-policy": "camera=*",
    "x-os-shell": "spoken for the shell",
    "x-foo": "bar",
}


def test_a_provider_answer_carries_only_the_headers_a_data_answer_needs(
    proxy_shell: RunningShell,
) -> None:
    """A provider answer, opened by the user's browser on the host origin, must not act on that
    origin (log the user out with Clear-Site-Data, open it to another origin with
    Access-Control-Allow-*, plant cookies, redirect it, ask for a password...): what passes is
    decided header by header, and anything not on the list stops at the shell."""
    query = {**KEPT, **DROPPED}
    with proxy_shell.anonymous() as browser:
        browser.get(f"/login?token={proxy_shell.token}")  # the session cookie, as a browser
        for origin in ({}, {"Origin": "http://evil.localhost"}):
            reply = browser.get("/api/data/echo/open/headers", params=query, headers=origin)
            assert (reply.status_code, reply.text) == (200, "headers"), reply.text
            for name, value in KEPT.items():
                assert reply.headers.get_list(name) == [value], (name, reply.headers)
            for name in DROPPED.keys() - INERT.keys():  # the shell's own: checked below
                assert name not in reply.headers, (name, reply.headers[name])
            assert "x-os-app-id" not in reply.headers
            assert reply.headers["content-type"] == "text/plain; charset=utf-8"
            for name, value in INERT.items():
                assert reply.headers.get_list(name) == [value], (name, reply.headers)
        # the session survived the answers: the user is still logged in
        assert browser.get("/api/apps").status_code == 200


def test_a_header_the_connection_header_names_is_dropped_even_when_allowed(
    api: httpx.Client,
) -> None:
    reply = api.get("/api/data/echo/open/headers", params={"ETag": '"v1"', "Connection": "etag"})
    assert reply.status_code == 200
    assert "etag" not in reply.headers


def test_a_body_held_back_by_a_provider_that_reads_late_is_not_cut(
    start_shell: StartShell, system_apps: Path
) -> None:
    """The body stall deadline counts only the client's silences: here the provider reads
    nothing for 2 s, the shell stops reading the client (flow control) and the client can send
    nothing, for four times the stall time, and the upload still arrives whole."""
    provider_apps(system_apps)
    shell = ready(start_shell(stall_seconds=0.5))
    body = os.urandom(16 << 20)  # more than the loopback socket buffers hold
    with shell.client(timeout=60) as api:
        response = api.post("/api/data/plain/items/lateread", params={"seconds": "2"}, content=body)
    assert response.status_code == 200, response.text
    assert response.json() == {"bytes": len(body)}


def test_a_client_that_reads_slowly_is_not_reset(
    start_shell: StartShell, system_apps: Path
) -> None:
    """The stall is a client reading nothing: one that reads a little at a time gets the whole
    answer, however long it takes, though the shell's writes wait on it for longer than the
    stall time (8 MB fill the socket buffers; it reads ~3 MB/s against a 0.3 s stall)."""
    provider_apps(system_apps)
    shell = ready(start_shell(stall_seconds=0.3))
    size = 8_000_000
    with socket.create_connection(("127.0.0.1", shell.settings.port), timeout=30) as sock:
        sock.sendall(
            f"GET /api/data/plain/items/chunked?bytes={size} HTTP/1.1\r\nHost: localhost\r\n"
            f"Authorization: Bearer {shell.token}\r\nConnection: close\r\n\r\n".encode()
        )
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
            time.sleep(0.02)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert body.endswith(b"0\r\n\r\n")  # the chunked answer ended, not cut
    assert len(body) > size


def test_a_provider_killed_hands_its_requests_to_the_users_next_resumed_instance(
    fresh_shell: RunningShell, fresh_api: httpx.Client
) -> None:
    """A forced end takes the instance out of the index before its `app:state` (so a move
    waiting on a hook gives up): the registration was dropped only for an instance still in
    the index, and the next resumed instance never registered. 503 while it runs."""
    first = fresh_shell.shell.dataproxy.registered("test.plain.stdlib")
    assert first is not None
    made = fresh_api.post("/api/instances", json={"appId": "test.plain.stdlib", "new": True})
    assert made.status_code == 200, made.text
    second = made.json()["instanceId"]
    assert second != first
    fresh_api.post(f"/api/instances/{second}/resumed")
    assert fresh_api.delete(f"/api/instances/{first}", params={"force": "1"}).status_code == 200
    answer = fresh_api.get("/api/data/plain/items")
    assert answer.status_code == 200, answer.text  # was 503
    assert fresh_shell.shell.dataproxy.registered("test.plain.stdlib") == second
