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
    with two.client(one.token, timeout=30) as api_two:
        # listed on two, named as one's; only one acts on it (a server on one's machine)
        listed = api_two.get("/api/instances")
        assert listed.status_code == 200, listed.text
        mine = [i for i in listed.json() if i["instanceId"] == first_id]
        assert [i["elsewhere"] for i in mine] == [socket.gethostname()]
        assert f":{address.port}" not in listed.text
        for refused in (
            api_two.post(f"/api/instances/{first_id}/stop"),
            api_two.delete(f"/api/instances/{first_id}"),
            api_two.get(f"/api/instances/{first_id}/logs"),
        ):
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "instance_elsewhere"
    assert one.shell.lifecycle.get(first_id).state.value == "started"
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


def test_a_grantee_learns_no_more_of_another_shells_local_instance_than_with_one_shell(
    two_shells: tuple[RunningShell, RunningShell],
) -> None:
    """A user the instance is shared with was told, by the shell that does not run it, the
    machine it runs on (`instance_elsewhere` with its `shell`), even for the owner's record and
    actions, which with one shell answer them as a missing instance. Now: not found for those,
    as with one shell; a view (made, deleted, or its pages) `instance_elsewhere` naming no
    machine. Its owner is still told the machine; anyone else gets the 404 of no instance."""
    one, two = two_shells
    machine = socket.gethostname()
    bob, eve = one.add_user("bob"), one.add_user("eve")
    with one.client(timeout=30) as api:
        made = api.post("/api/instances", json={"appId": APP})
        assert made.status_code == 200, made.text
        iid = made.json()["instanceId"]
        granted = api.post(f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"})
        assert granted.status_code == 201, granted.text
    with one.client(bob, timeout=30) as bob_on_one:
        view = bob_on_one.post(f"/api/instances/{iid}/views", json={})
        assert view.status_code == 200, view.text
        record_on_one = bob_on_one.get(f"/api/instances/{iid}")
        assert record_on_one.status_code == 404, record_on_one.text
    view_id, view_url = view.json()["viewId"], view.json()["url"]

    def unnamed(answer: httpx.Response) -> None:
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "instance_elsewhere"
        assert error["instanceId"] == iid
        assert "shell" not in error
        assert f"on {machine}" not in error["message"]
        assert str(one.shell.settings.home) not in answer.text

    with two.client(bob, timeout=30) as bob_on_two, two.client(eve, timeout=30) as eve_on_two:
        unnamed(bob_on_two.post(f"/api/instances/{iid}/views", json={}))
        unnamed(bob_on_two.delete(f"/api/instances/{iid}/views/{view_id}"))
        for caller in (bob_on_two, eve_on_two):
            for answer in (
                caller.get(f"/api/instances/{iid}"),
                caller.post(f"/api/instances/{iid}/stop"),
                caller.get(f"/api/instances/{iid}/logs"),
            ):
                assert answer.status_code == 404, answer.text
                assert answer.json() == record_on_one.json()
        refused = eve_on_two.post(f"/api/instances/{iid}/views", json={})
        assert refused.status_code == 404, refused.text
        assert refused.json() == record_on_one.json()
    # bob's view's pages, entered on two
    client, target = on_origin(two, view_url)
    with closing(client):
        entered = client.get(target, follow_redirects=False)
        assert entered.status_code == 303, entered.text
        client.headers["Cookie"] = entered.headers["set-cookie"].split(";", 1)[0]
        unnamed(client.get("/"))
    # bob's list of what is shared with him names no machine either
    with two.client(bob, timeout=30) as bob_on_two:
        listed = bob_on_two.get("/api/instances?shared=1")
        assert listed.status_code == 200, listed.text
        (shared,) = [i for i in listed.json() if i["instanceId"] == iid]
        assert shared["access"] == "viewer"
        assert shared["elsewhere"] is None
    # its owner is told where it runs; its grants too are that shell's (it alone closes the
    # grantee's views): a pod's answer on any shell, a local runner's do not
    grant = granted.json()["grantId"]
    with two.client(one.token, timeout=30) as owner_on_two:
        named = owner_on_two.post(f"/api/instances/{iid}/views", json={})
        assert named.status_code == 503, named.text
        assert named.json()["error"]["shell"] == machine
        for answer in (
            owner_on_two.get(f"/api/instances/{iid}/grants"),
            owner_on_two.post(
                f"/api/instances/{iid}/grants", json={"user": "eve", "role": "viewer"}
            ),
            owner_on_two.delete(f"/api/instances/{iid}/grants/{grant}"),
        ):
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "instance_elsewhere"
            assert answer.json()["error"]["shell"] == machine
    with two.client(bob, timeout=30) as bob_on_two:
        assert bob_on_two.get(f"/api/instances/{iid}/grants").json() == record_on_one.json()
