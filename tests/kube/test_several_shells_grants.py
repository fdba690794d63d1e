"""A pod's grants listed, made and revoked on any shell (docs/decisions.md "Several shells: a
pod's grants on any shell"): two real shells (two homes) on one PostgreSQL database and one
namespace of the fake cluster (tests/kube/conftest.py says why a fake). Grants are rows of the
database; the grantee's views are held in the memory of the shell that runs the instance, which
a revoke made elsewhere asks to close them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, asynccontextmanager, closing, contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from atrium.lifecycle import asked
from tests.integration.conftest import RunningShell, wait_for
from tests.kube.test_several_shells_actions import requests_of
from tests.kube.test_several_shells_origins import (
    SLOW,
    enter,
    kube_shells,
    new_view,
    on_origin,
    two_kube_shells,
)
from tests.kube.test_several_shells_views import launch, lock_waiters, views_of

__all__ = ["kube_shells", "two_kube_shells"]  # the fixtures, shared with the origins' tests


def test_a_pods_grants_answer_on_any_shell_and_a_revoke_there_closes_every_view(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """Behind a balancer without stickiness the owner's grant, list and revoke of shell 1's pod
    reached shell 2, which answered `503 instance_elsewhere`: sharing failed half the time.
    Shell 2 answers them now with shell 1's checks (the owner only: a grantee or a stranger
    gets the 404 of no instance), and its revoke has shell 1 close bob's views at once, those
    made on shell 1 and on shell 2 alike, their cookies and unused ticket refused on both."""
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    bob, eve = one.add_user("bob"), one.add_user("eve")
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = launch(api)
        held = one.shell.lifecycle.get(iid)
        own, _ = new_view(api, iid)  # the owner's view keeps the pod serving throughout
        granted = api_two.post(
            f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"}
        )
        assert granted.status_code == 201, granted.text
        grant = granted.json()["grantId"]
        assert granted.json()["instanceId"] == iid
        again = api_two.post(f"/api/instances/{iid}/grants", json={"user": "bob", "role": "editor"})
        assert again.status_code == 200, again.text
        assert again.json()["grantId"] == grant
        for shell_api in (api, api_two):
            listed = shell_api.get(f"/api/instances/{iid}/grants")
            assert listed.status_code == 200, listed.text
            assert [(g["grantId"], g["role"]) for g in listed.json()] == [(grant, "editor")]
        for invalid in ({"user": "Not An Id", "role": "viewer"}, {"user": "bob", "role": "boss"}):
            refused = api_two.post(f"/api/instances/{iid}/grants", json=invalid)
            assert refused.status_code == 400, refused.text
        nobody = api_two.post(
            f"/api/instances/{iid}/grants", json={"user": "nobody", "role": "viewer"}
        )
        assert nobody.status_code == 404, nobody.text
        assert nobody.json()["error"]["kind"] == "user"
        # a grantee and a stranger: no instance, as on shell 1
        for token in (bob, eve):
            with two.client(token, timeout=SLOW) as other:
                for answer in (
                    other.get(f"/api/instances/{iid}/grants"),
                    other.post(
                        f"/api/instances/{iid}/grants", json={"user": "eve", "role": "viewer"}
                    ),
                    other.delete(f"/api/instances/{iid}/grants/{grant}"),
                ):
                    assert answer.status_code == 404, answer.text
                    assert answer.json()["error"]["kind"] == "instance"

        # shell 1 learns the grant made on 2 by its event (as any change on another shell)
        wait_for(lambda: one.shell.grants.role_of("bob", held) is not None, "one hears it", SLOW)
        with ExitStack() as stack:
            bob_one = stack.enter_context(one.client(bob, timeout=SLOW))
            bob_two = stack.enter_context(two.client(bob, timeout=SLOW))
            view_a, url_a = new_view(bob_one, iid)
            view_b, url_b = new_view(bob_two, iid)
            _, unused = new_view(bob_two, iid)
            assert view_a in held.views
            wait_for(lambda: view_b in held.views, "one learns bob's view made on two", SLOW)
            on_one = stack.enter_context(closing(enter(one, url_a)))
            on_two = stack.enter_context(closing(enter(two, url_b)))
            # each cookie on the other shell too
            a_on_two, _ = on_origin(two, url_a)
            b_on_one, _ = on_origin(one, url_b)
            stack.enter_context(closing(a_on_two))
            stack.enter_context(closing(b_on_one))
            a_on_two.headers["Cookie"] = on_one.headers["Cookie"]
            b_on_one.headers["Cookie"] = on_two.headers["Cookie"]
            for page in (on_one, on_two, a_on_two, b_on_one):
                assert page.get("/boot").status_code == 200

            revoked = api_two.delete(f"/api/instances/{iid}/grants/{grant}")
            assert revoked.status_code == 200, revoked.text
            assert revoked.json() == {"ok": True, "grantId": grant, "closedViews": 3}
            # at once, on both shells: no wait for an event
            for page in (on_one, on_two, a_on_two, b_on_one):
                assert page.get("/boot").status_code == 401
            for shell in (one, two):
                ticket, target = on_origin(shell, unused)
                with closing(ticket):
                    assert ticket.get(target, follow_redirects=False).status_code == 401
            assert set(held.views) == {own}
            assert views_of(url, held.slug) == [own]
            for bob_api in (bob_one, bob_two):
                gone = bob_api.post(f"/api/instances/{iid}/views", json={"path": "/boot"})
                assert gone.status_code == 404, gone.text

        assert api_two.delete(f"/api/instances/{iid}/grants/{grant}").status_code == 404
        for shell_api in (api, api_two):
            assert shell_api.get(f"/api/instances/{iid}/grants").json() == []
        assert held.state.value == "started"  # the owner's view still holds it


@contextmanager
def deaf_to_grants(shell: RunningShell) -> Iterator[None]:
    """``shell`` hears no grant made on another shell meanwhile (its event delayed): its memory
    of grants trails the database."""
    users, grants = shell.shell.users, shell.shell.grants
    users.on_heard.remove(grants.heard)
    try:
        yield
    finally:
        users.on_heard.append(grants.heard)


def test_a_grantees_view_entered_before_the_grant_is_heard_there_is_kept(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """A shell knows a grant made on another only once its event arrives. Meanwhile the
    grantee's view, made on the shell that granted, was entered on it: shell 1 (which runs the
    pod) dropped the view it learnt as its user's, and shell 2 (entering a view of shell 1's
    pod) dropped it for the same reason, deleting its row: the grantee's first page was a 401
    and their view gone for good; and a new view asked of such a shell was a 404. A refusal of
    a user's grant is asked of the database first."""
    one, two = two_kube_shells
    bob = one.add_user("bob")
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = launch(api)
        held = one.shell.lifecycle.get(iid)
        new_view(api, iid)  # the owner's keeps the pod serving
        # granted on two, unheard on one: bob's view made on two, entered on one
        with deaf_to_grants(one):
            granted = api_two.post(
                f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"}
            )
            assert granted.status_code == 201, granted.text
            with two.client(bob, timeout=SLOW) as bob_two:
                view, url = new_view(bob_two, iid)
            with closing(enter(one, url)) as on_one:
                assert on_one.get("/boot").status_code == 200
            assert view in held.views
        revoked = api.delete(f"/api/instances/{iid}/grants/{granted.json()['grantId']}")
        assert revoked.status_code == 200, revoked.text
        assert revoked.json()["closedViews"] == 1
        wait_for(lambda: two.shell.grants.role_of("bob", held) is None, "two hears it", SLOW)
        # granted on one, unheard on two: bob's view made on one, entered on two
        with deaf_to_grants(two):
            granted = api.post(
                f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"}
            )
            assert granted.status_code == 201, granted.text
            with one.client(bob, timeout=SLOW) as bob_one:
                view, url = new_view(bob_one, iid)
            with closing(enter(two, url)) as on_two:
                assert on_two.get("/boot").status_code == 200
            assert view in held.views
        # a new view asked of a shell that has not heard the grant: on one, then on two
        for granting, viewing in ((api_two, one), (api, two)):
            revoked = api.delete(f"/api/instances/{iid}/grants/{granted.json()['grantId']}")
            assert revoked.status_code == 200, revoked.text
            wait_for(
                lambda: all(s.shell.grants.role_of("bob", held) is None for s in (one, two)),
                "both shells know the revoke",
                SLOW,
            )
            with deaf_to_grants(viewing):
                granted = granting.post(
                    f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"}
                )
                assert granted.status_code == 201, granted.text
                with viewing.client(bob, timeout=SLOW) as bob_there:
                    made = bob_there.post(f"/api/instances/{iid}/views", json={"path": "/boot"})
                    assert made.status_code == 200, made.text


def test_a_revoke_its_instances_shell_does_not_answer_still_closes_the_views(
    two_kube_shells: tuple[RunningShell, RunningShell], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shell 1, which runs the pod, does not take the revoke's ask (its events delayed): the
    revoke made on shell 2 stands, and the grantee's views go all the same. Their rows are
    deleted there, which shell 2 checks each request against at once, each with the event by
    which shell 1 drops the view from memory when it hears it."""
    monkeypatch.setattr(asked, "TAKE_SECONDS", 0.5)
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    bob = one.add_user("bob")
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = launch(api)
        held = one.shell.lifecycle.get(iid)
        own, _ = new_view(api, iid)
        granted = api.post(f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"})
        assert granted.status_code == 201, granted.text
        with one.client(bob, timeout=SLOW) as bob_one:
            view, view_url = new_view(bob_one, iid)
        rows = one.shell.lifecycle.rows
        assert rows is not None
        heard = list(rows.on_request)
        rows.on_request.clear()  # shell 1 hears no ask: it is withdrawn untaken
        try:
            with closing(enter(two, view_url)) as on_two:
                assert on_two.get("/boot").status_code == 200
                revoked = api_two.delete(f"/api/instances/{iid}/grants/{granted.json()['grantId']}")
                assert revoked.status_code == 200, revoked.text
                assert revoked.json()["closedViews"] == 1
                assert on_two.get("/boot").status_code == 401
        finally:
            rows.on_request.extend(heard)
        assert [r.state for r in requests_of(url, iid)] == ["withdrawn"]
        assert views_of(url, held.slug) == [own]
        wait_for(lambda: view not in held.views, "one drops bob's view when it hears", SLOW)
        assert set(held.views) == {own}


def test_a_view_written_under_the_grant_as_it_is_revoked_is_closed_with_the_others(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """Bob's view of shell 1's pod is being written on shell 2 (whose memory holds his grant)
    as the owner revokes it there: the view's transaction has read the grant and waits, here
    on a lock the test holds on the tickets' table (a slow database), while the revoke runs.
    Unlocked, that read let the revoke by: its release found no view of bob's to close, and the
    view committed after it, a live ticket for a user who may no longer see the instance on
    any shell that had not heard the revoke. The read locks the grant's row (`FOR SHARE`): the
    revoke waits for the view, and its release closes it with the others."""
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    bob = one.add_user("bob")
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = launch(api)
        held = one.shell.lifecycle.get(iid)
        own, _ = new_view(api, iid)
        granted = api.post(f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"})
        assert granted.status_code == 201, granted.text
        grant = granted.json()["grantId"]
        wait_for(lambda: two.shell.grants.get(held.owner, iid, grant), "two hears it", SLOW)
        engine = sa.create_engine(url)
        try:
            with ThreadPoolExecutor(2) as pool, two.client(bob, timeout=SLOW) as bob_two:
                with engine.begin() as conn:
                    conn.execute(sa.text("LOCK TABLE view_tickets IN SHARE ROW EXCLUSIVE MODE"))
                    made = pool.submit(
                        bob_two.post, f"/api/instances/{iid}/views", json={"path": "/boot"}
                    )
                    wait_for(lambda: lock_waiters(engine) > 0, "the view's write waits", SLOW)
                    revoking = pool.submit(api_two.delete, f"/api/instances/{iid}/grants/{grant}")
                    wait_for(
                        lambda: revoking.done() or lock_waiters(engine) > 1,
                        "the revoke waits for the view (or is done: no lock)",
                        SLOW,
                    )
                view = made.result(timeout=SLOW)
                revoked = revoking.result(timeout=SLOW)
        finally:
            engine.dispose()
        assert view.status_code == 200, view.text  # its checks passed before the revoke
        assert revoked.status_code == 200, revoked.text
        assert revoked.json()["closedViews"] == 1
        assert views_of(url, held.slug) == [own]
        for shell in (one, two):
            ticket, target = on_origin(shell, view.json()["url"])
            with closing(ticket):
                assert ticket.get(target, follow_redirects=False).status_code == 401


class HeldReads:
    """The database of a shell's grants, whose reads of one user's grants wait until let go:
    a slow database for that user alone (PostgreSQL's row locks hold up no plain read)."""

    def __init__(self, db: Any, user: str) -> None:
        self._db = db
        self._user = user
        self.reached = threading.Event()
        self.release = threading.Event()

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Any]:
        async with self._db.connect() as conn:
            yield _HeldConnection(conn, self)

    async def hold(self, statement: Any) -> None:
        if self._user in statement.compile().params.values():
            self.reached.set()
            await asyncio.to_thread(self.release.wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


class _HeldConnection:
    def __init__(self, conn: Any, held: HeldReads) -> None:
        self._conn = conn
        self._held = held

    async def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        await self._held.hold(statement)
        return await self._conn.execute(statement, *args, **kwargs)


def test_a_users_grants_read_again_wait_for_no_other_users_read(
    two_kube_shells: tuple[RunningShell, RunningShell], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eve asks shell 1 for views of instances that are not there, each of which has it read
    her grants again (one may have been made on another shell a moment ago), and her read is
    slow (held here). Bob, granted on shell 2 (not heard on 1 yet), asks shell 1 for a view:
    his grants are read again, and he got his view only once eve's read was done, for one lock
    held every user's reads (a flood of requests for made-up ids queued everyone's grant
    decisions behind it). Each user's reads are their own now; eve's asks share her reads."""
    one, two = two_kube_shells
    bob, eve = one.add_user("bob"), one.add_user("eve")
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = launch(api)
        new_view(api, iid)  # the owner's keeps the pod serving
        held = HeldReads(one.shell.grants._db, "eve")
        monkeypatch.setattr(one.shell.grants, "_db", held)
        with (
            ThreadPoolExecutor(4) as pool,
            one.client(eve, timeout=SLOW) as eve_one,
            one.client(bob, timeout=SLOW) as bob_one,
        ):
            try:
                flood = [
                    pool.submit(
                        eve_one.post, f"/api/instances/nope-{n}/views", json={"path": "/boot"}
                    )
                    for n in range(3)
                ]
                assert held.reached.wait(SLOW), "eve's read is held"
                with deaf_to_grants(one):
                    granted = api_two.post(
                        f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"}
                    )
                    assert granted.status_code == 201, granted.text
                    made = pool.submit(
                        bob_one.post, f"/api/instances/{iid}/views", json={"path": "/boot"}
                    )
                    # (before: bob's read waited for eve's, held until the finally below)
                    assert made.result(timeout=10).status_code == 200, made.result().text
                assert not any(f.done() for f in flood), "eve's read is still held"
            finally:
                held.release.set()
            for asked_view in flood:
                refused = asked_view.result(timeout=SLOW)
                assert refused.status_code == 404, refused.text
        # nothing kept of a user once their reads are done (made-up ids grow nothing)
        wait_for(lambda: not one.shell.grants._flights, "every read done and forgotten", SLOW)
