"""App origins on two real shells (two homes) sharing one PostgreSQL database, with a local
runner: another shell's instance runs on an address only its own shell reaches, so the other
shell answers `503 instance_elsewhere` instead of forwarding; a view's cookie still works only on
its own instance's origin. (Serving another shell's pod: tests/kube/test_several_shells_origins.)
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import socket
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import sqlalchemy as sa

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, shells_on_one_database

pytestmark = pytest.mark.integration

APP = "test.plain.stdlib"


@pytest.fixture
def two_shells(
    postgres_server: str, tmp_path: Path, system_apps: Path
) -> Iterator[tuple[RunningShell, RunningShell]]:
    shutil.copytree(TESTS_DIR / "apps" / APP, system_apps / APP)
    with shells_on_one_database(postgres_server, tmp_path, system_apps) as (one, two):
        yield one, two


def on_origin(shell: RunningShell, url: str) -> tuple[httpx.Client, str]:
    """A client of ``shell`` naming the app origin of ``url`` at that shell's port."""
    parts = urlsplit(url)
    host = f"{parts.hostname}:{urlsplit(shell.url).port}"
    client = httpx.Client(base_url=shell.url, headers={"Host": host}, timeout=30)
    return client, parts.path + (f"?{parts.query}" if parts.query else "")


def test_another_shells_local_instance_is_named_not_forwarded_and_cookies_stay_per_origin(
    two_shells: tuple[RunningShell, RunningShell],
) -> None:
    one, two = two_shells
    with one.client(timeout=30) as api:
        urls = []
        for _ in range(2):
            made = api.post("/api/instances", json={"appId": APP, "new": True})
            assert made.status_code == 200, made.text
            view = api.post(f"/api/instances/{made.json()['instanceId']}/views", json={})
            assert view.status_code == 200, view.text
            urls.append((made.json()["instanceId"], view.json()["url"]))
    (first_id, first_url), (_, second_url) = urls
    client, target = on_origin(two, first_url)
    with closing(client):
        entered = client.get(target, follow_redirects=False)
        assert entered.status_code == 303, entered.text
        cookie = entered.headers["set-cookie"].split(";", 1)[0]
        client.headers["Cookie"] = cookie
        page = client.get("/")
        assert page.status_code == 503, page.text
        error = page.json()["error"]
        assert error["code"] == "instance_elsewhere"
        assert error["instanceId"] == first_id
        assert "another shell" in error["message"]
        assert error["shell"] == socket.gethostname()
        assert str(one.shell.settings.home) not in page.text
        # nothing of where it runs reaches the caller
        address = one.shell.lifecycle.get(first_id).address
        assert f":{address.port}" not in page.text
    # on the shell that runs it, the page needs no row: the instance and its views are in
    # its memory (the hot path reads nothing of the database)
    read: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if re.search(r"\b(instances|views|view_tickets)\b", statement):
            read.append(statement)

    engine = one.shell.db.engine.sync_engine
    local, target = on_origin(one, second_url)
    with closing(local):
        entered = local.get(target, follow_redirects=False)
        assert entered.status_code == 303, entered.text
        local.headers["Cookie"] = entered.headers["set-cookie"].split(";", 1)[0]
        sa.event.listen(engine, "before_cursor_execute", seen)
        try:
            for _ in range(5):
                # the app's own answer (it has no page at /): the request reached it
                assert local.get("/").headers.get("x-os-app-id") == APP
        finally:
            sa.event.remove(engine, "before_cursor_execute", seen)
    assert read == []
    # the first view's cookie is nothing on the second instance's origin, on either shell
    for shell in (one, two):
        other, _ = on_origin(shell, second_url)
        with closing(other):
            other.headers["Cookie"] = cookie
            refused = other.get("/")
            assert refused.status_code == 401, refused.text


def test_a_view_cookie_works_on_both_shells_and_a_used_ticket_gives_none(
    two_shells: tuple[RunningShell, RunningShell],
) -> None:
    """Whichever shell redeems a ticket, the cookie it sets is the view's on both; and the
    ticket, which travels in a URL (a proxy's request log), gives no cookie once used: the
    cookie was once a hash of it, which any reader of the log could compute."""
    one, two = two_shells
    with one.client(timeout=30) as api:
        made = api.post("/api/instances", json={"appId": APP, "new": True})
        assert made.status_code == 200, made.text
        urls = []
        for _ in range(2):
            view = api.post(f"/api/instances/{made.json()['instanceId']}/views", json={})
            assert view.status_code == 200, view.text
            urls.append(view.json()["url"])
    for url, entering, using in ((urls[0], two, one), (urls[1], one, two)):
        client, target = on_origin(entering, url)
        with closing(client):
            entered = client.get(target, follow_redirects=False)
            assert entered.status_code == 303, entered.text
        cookie = entered.headers["set-cookie"].split(";", 1)[0]
        ticket = parse_qs(urlsplit(url).query)["ticket"][0]
        digest = hashlib.sha256(b"atrium view cookie\0" + ticket.encode()).digest()
        derived = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        for shell, sent, status in ((using, cookie, 200), (one, f"atrium_view={derived}", 401)):
            other, _ = on_origin(shell, url)
            with closing(other):
                other.headers["Cookie"] = sent
                assert other.get("/_os/client.js").status_code == status
        other, _ = on_origin(two, url)
        with closing(other):
            other.headers["Cookie"] = f"atrium_view={derived}"
            assert other.get("/_os/client.js").status_code == 401
