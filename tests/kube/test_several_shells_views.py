"""A pod's views made and released on any shell (docs/decisions.md "Several shells: a pod's
views made and released on any shell"), where the shell that made a view and the shell that
runs the instance race: two or three real shells (homes) on one PostgreSQL database and one
namespace of the fake cluster (tests/kube/conftest.py says why a fake). A view reaches the
instance's own shell only as a row and its `instance:routed`, and that shell alone holds it in
memory, where views drive stop-when-unviewed: a view it holds for an instance that stopped, or
for a user who lost it, keeps the instance from ever stopping unviewed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError

from atrium.bus import Event
from atrium.errors import NotFound
from atrium.events import InstanceRouted
from atrium.lifecycle.states import InstanceState
from atrium.lifecycle.views import ViewDesk
from atrium.state.schema import instances, views
from tests.integration.conftest import RunningShell, wait_for
from tests.kube.test_several_shells_origins import (
    PROBE,
    SLOW,
    StartShell,
    enter,
    kube_shells,
    new_view,
    two_kube_shells,
)

__all__ = ["kube_shells", "two_kube_shells"]  # the fixtures, shared with the origins' tests


def view_row(url: str, view_id: str) -> Any:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(views).where(views.c.id == view_id)).first()
    finally:
        engine.dispose()


def views_of(url: str, slug: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.select(views.c.id).where(views.c.slug == slug)).scalars())
    finally:
        engine.dispose()


def row_state(url: str, iid: str) -> str | None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            state: str | None = conn.execute(
                sa.select(instances.c.state).where(instances.c.id == iid)
            ).scalar_one_or_none()
            return state
    finally:
        engine.dispose()


def write_state(url: str, iid: str, state: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.update(instances).where(instances.c.id == iid).values(state=state))
    finally:
        engine.dispose()


def written(shell: RunningShell) -> None:
    """Until every change of ``shell``'s instances is in their rows (none comes after it here:
    a row the test writes stays as written)."""
    rows = shell.shell.lifecycle.rows
    assert rows is not None
    shell.on_loop(rows.flush())


def launch(api: Any) -> str:
    launched = api.post("/api/instances", json={"appId": PROBE})
    assert launched.status_code == 200, launched.text
    iid: str = launched.json()["instanceId"]
    return iid


def heard_one(shell: RunningShell, iid: str, view_id: str, held: Any) -> None:
    """Until ``shell``, which runs ``iid``, has learnt the view or dropped it and its row."""
    url = shell.shell.settings.state_url
    wait_for(
        lambda: view_id in held.views or view_row(url, view_id) is None,
        f"{iid}'s shell hears of view {view_id}",
        SLOW,
    )


@contextmanager
def view_deletes_refused(url: str) -> Iterator[Callable[[], bool]]:
    """Every delete of a view fails while the body runs, as in a link cut at that moment: a
    trigger raises while a flag row is there, and counts its refusals in a sequence, which no
    rollback undoes. Yields whether one was refused yet."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE refuse_view_deletes (on_ boolean)"))
        conn.execute(sa.text("INSERT INTO refuse_view_deletes VALUES (true)"))
        conn.execute(sa.text("CREATE SEQUENCE view_deletes_refused"))
        conn.execute(
            sa.text(
                "CREATE FUNCTION refuse_view_delete() RETURNS trigger AS $$ BEGIN "
                "IF EXISTS (SELECT 1 FROM refuse_view_deletes) THEN "
                "PERFORM nextval('view_deletes_refused'); "
                "RAISE EXCEPTION 'the link is cut'; END IF; RETURN OLD; END $$ LANGUAGE plpgsql"
            )
        )
        conn.execute(
            sa.text(
                "CREATE TRIGGER refuse_view_delete BEFORE DELETE ON views "
                "FOR EACH ROW EXECUTE FUNCTION refuse_view_delete()"
            )
        )

    def refused() -> bool:
        with engine.connect() as conn:
            row = conn.execute(sa.text("SELECT is_called FROM view_deletes_refused")).one()
            return bool(row.is_called)

    try:
        yield refused
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM refuse_view_deletes"))
    finally:
        engine.dispose()


def test_a_view_whose_row_the_database_kept_is_not_said_released(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """`DELETE …/views/{id}` on the pod's shell dropped the view from memory and only logged a
    removal of its row the database refused: the answer said released, and the other shells
    went on serving its cookie from the row. Now the answer says the database did not take it,
    and the view stays on every shell until a release it takes."""
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = launch(api)
        held = one.shell.lifecycle.get(iid)
        view, view_url = new_view(api, iid)
        kept, _ = new_view(api, iid)  # the instance has a view left either way
        with closing(enter(two, view_url)) as on_two:  # its cookie, served by shell two
            with view_deletes_refused(url) as refused:
                answer = api.delete(f"/api/instances/{iid}/views/{view}")
                assert refused()
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "database_unavailable"
            assert view in held.views
            assert view_row(url, view) is not None
            assert on_two.get("/boot").status_code == 200  # still open, as the answer says
            released = api.delete(f"/api/instances/{iid}/views/{view}")
            assert released.status_code == 200, released.text
            assert view not in held.views
            assert view_row(url, view) is None
            assert on_two.get("/boot").status_code == 401
        assert kept in held.views


def test_a_view_made_elsewhere_as_the_instance_stops_is_dropped_there(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """Shell 2 checks the instance's state in its row, then writes the view; shell 1 may stop
    the instance between (and writes its row only a moment after the move). Shell 1 held the
    view made for its stopped instance, with no page to release it, and after the next start
    the instance never stopped when unviewed. Here the row still says `started` after shell 1
    stopped the instance (written back so by the test: its own write of the stop not yet
    made), and the view goes through every check of shell 2: shell 1 drops what it learns for
    an instance that no longer serves, its row with it. (The row's own check, under its lock:
    tests/state/test_instance_rows.py.)"""
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = launch(api)
        held = one.shell.lifecycle.get(iid)
        stopped = api.post(f"/api/instances/{iid}/stop")
        assert stopped.status_code == 200, stopped.text
        written(one)
        assert row_state(url, iid) == "stopped"
        write_state(url, iid, "started")  # the row as it was before that write
        made = api_two.post(f"/api/instances/{iid}/views", json={"path": "/boot"})
        assert made.status_code == 200, made.text
        phantom = made.json()["viewId"]
        heard_one(one, iid, phantom, held)
        assert phantom not in held.views
        assert view_row(url, phantom) is None

        # started again, its one view released: it stops, nothing else holds it
        started = api.post(f"/api/instances/{iid}/start")
        assert started.status_code == 200, started.text
        own, _ = new_view(api, iid)
        released = api.delete(f"/api/instances/{iid}/views/{own}")
        assert released.status_code == 200, released.text
        assert held.state is InstanceState.STOPPED


def test_a_grantees_view_made_elsewhere_as_the_grant_is_revoked_is_dropped_there(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """A grant revoked on shell 1 (which drops the grantee's views it holds) while shell 2
    makes the grantee a view: shell 2's checks (the row, the grant in its memory) pass before
    the revoke, its write comes after (made here in that order, on shell 2, with the call that
    follows those checks). Shell 1 held the view of a user who may no longer see the instance:
    it opened nothing (every request of it is refused) but kept the instance from stopping
    when its owner's last view went. Shell 1 checks the view's user when it learns it, and the
    write itself now checks the grant in the table: refused, nothing is written."""
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = launch(api)
        held = one.shell.lifecycle.get(iid)
        own, _ = new_view(api, iid)
        one.add_user("bob")
        granted = api.post(f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"})
        assert granted.status_code == 201, granted.text
        rows = two.shell.lifecycle.rows
        assert rows is not None
        row = two.on_loop(rows.by_id(iid))  # two's read, as bob asks for a view there
        assert row is not None
        revoked = api.delete(f"/api/instances/{iid}/grants/{granted.json()['grantId']}")
        assert revoked.status_code == 200, revoked.text
        with pytest.raises(NotFound):
            two.on_loop(rows.add_view_elsewhere(row, "b0b5v1ew", "/boot", "bob", "t", 60))
        assert "b0b5v1ew" not in held.views
        assert view_row(url, "b0b5v1ew") is None

        released = api.delete(f"/api/instances/{iid}/views/{own}")
        assert released.status_code == 200, released.text
        assert held.state is InstanceState.STOPPED


def listening(shell: RunningShell, heard: list[Event]) -> Callable[[], None]:
    """Every `instance:routed` ``shell`` hears, after its own listeners (registered at start)
    have acted on it."""

    async def listen() -> Callable[[], None]:
        return shell.shell.bus.listen((InstanceRouted.TOPIC,), heard.append, others=True)

    remove: Callable[[], None] = shell.on_loop(listen())
    return remove


async def settled(desk: ViewDesk) -> None:
    """Until what the view desk set going on hearing a view (a read, a stop) is over."""
    await asyncio.gather(*list(desk._tasks), return_exceptions=True)


def test_a_view_released_on_a_third_shell_leaves_an_instance_numbered_alike_alone(
    kube_shells: StartShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two shells' instances may share an id: a launch, and an instance brought back after a
    change, claim their id's row, but a shell cut off from the database numbers without it.
    Here shell 2 brings one back under the id of shell 1's as a cut-off shell would (its claim
    of the row fails; shell 2 runs local instances: two shells' pods of one id would share a
    pod name in one namespace). A view of shell 1's instance released on shell 3 is announced
    by id and slug; shell 2 once matched it by id alone, found its own instance unviewed, and
    stopped it."""
    one, two, three = kube_shells("one"), kube_shells("two", runner="auto"), kube_shells("three")
    rows = two.shell.lifecycle.rows
    assert rows is not None

    async def cut_off(_instance: object) -> bool:
        raise OperationalError("claim", {}, ConnectionError("cut off"))

    monkeypatch.setattr(rows, "claim", cut_off)
    heard: list[Event] = []
    with (
        one.client(timeout=SLOW) as api,
        three.client(one.token, timeout=SLOW) as api_three,
    ):
        iid = launch(api)
        held = one.shell.lifecycle.get(iid)
        alike = two.on_loop(two.shell.lifecycle.create(PROBE, instance_id=iid))
        assert alike.slug != held.slug
        assert alike.state is InstanceState.STARTED
        assert not alike.views
        stop_listening = listening(two, heard)
        try:
            view, _ = new_view(api_three, iid)
            wait_for(lambda: view in held.views, "one learns the view made on three", SLOW)
            released = api_three.delete(f"/api/instances/{iid}/views/{view}")
            assert released.status_code == 200, released.text
            wait_for(
                lambda: any(
                    e.payload.get("viewId") == view and e.payload.get("viewGone") for e in heard
                ),
                "two hears of the release",
                SLOW,
            )
            two.on_loop(settled(two.shell.lifecycle.views))
        finally:
            assert two.loop is not None
            two.loop.call_soon_threadsafe(stop_listening)
        assert alike.state is InstanceState.STARTED
        assert two.shell.lifecycle.get(iid) is alike
        # one stops its own: that was its last view
        wait_for(
            lambda: held.state is InstanceState.STOPPED, "one stops its unviewed instance", SLOW
        )


def lock_waiters(engine: sa.Engine) -> int:
    """Sessions of the test's database waiting for a lock (a row's, here)."""
    with engine.connect() as conn:
        count: int = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        ).scalar_one()
        return count


def made_while_row_locked(
    shell: RunningShell, iid: str, token: str, stop_or_revoke: Callable[[], None]
) -> httpx.Response:
    """A view asked of ``shell`` (as ``token``'s user) whose rows' write waits on a lock the
    test holds on the instance's row (a slow database) while ``stop_or_revoke`` runs; its
    answer once the lock is let go."""
    url = shell.shell.settings.state_url
    written(shell)
    assert row_state(url, iid) == "started"
    engine = sa.create_engine(url)
    try:
        with ThreadPoolExecutor(1) as pool, shell.client(token, timeout=SLOW) as viewer:
            with engine.begin() as conn:
                conn.execute(
                    sa.select(instances.c.id).where(instances.c.id == iid).with_for_update()
                )
                asked = pool.submit(
                    viewer.post, f"/api/instances/{iid}/views", json={"path": "/boot"}
                )
                wait_for(lambda: lock_waiters(engine) > 0, "the view's write waits", SLOW)
                stop_or_revoke()
            return asked.result(timeout=SLOW)
    finally:
        engine.dispose()


def test_a_view_made_on_its_own_shell_as_the_instance_stops_or_the_grant_goes_is_refused(
    kube_shells: StartShell,
) -> None:
    """On PostgreSQL a shell writes a view's rows before it holds the view in memory, and other
    requests run meanwhile: a stop (the instance's last view released elsewhere, or its owner's
    action) or a revoke of the grantee's grant, which drops only the views already held. The
    view was then held for a stopped instance, or for a user who may no longer see it, and
    kept the instance from its stop-when-unviewed. Now the shell checks both again once the
    rows are written, and refuses the view (its rows deleted) as it would have before."""
    one = kube_shells("one")
    url = one.shell.settings.state_url
    bob = one.add_user("bob")
    with one.client(timeout=SLOW) as api:
        iid = launch(api)
        held = one.shell.lifecycle.get(iid)

        def stop() -> None:
            stopped = api.post(f"/api/instances/{iid}/stop")
            assert stopped.status_code == 200, stopped.text

        refused = made_while_row_locked(one, iid, one.token, stop)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "not_serving"
        assert not held.views

        started = api.post(f"/api/instances/{iid}/start")
        assert started.status_code == 200, started.text
        granted = api.post(f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"})
        assert granted.status_code == 201, granted.text

        def revoke() -> None:
            gone = api.delete(f"/api/instances/{iid}/grants/{granted.json()['grantId']}")
            assert gone.status_code == 200, gone.text

        refused = made_while_row_locked(one, iid, bob, revoke)
        assert refused.status_code == 404, refused.text
        assert not held.views
        assert views_of(url, held.slug) == []

        own, _ = new_view(api, iid)
        released = api.delete(f"/api/instances/{iid}/views/{own}")
        assert released.status_code == 200, released.text
        assert held.state is InstanceState.STOPPED


@contextmanager
def releases_held(shell: RunningShell) -> Iterator[list[Event]]:
    """``shell`` hears no view's release made on another shell (its `instance:routed` held back,
    as a shell behind on the event log or under load hears it late) until the block ends; then
    it hears them. Every other event, the asks among them, comes as it comes."""
    rows = shell.shell.lifecycle.rows
    assert rows is not None
    assert shell.loop is not None
    listeners = rows._bus._listeners  # the shell's event delivery
    [entry] = [e for e in listeners if e[1] == rows._heard]
    globs, heard, others = entry
    held: list[Event] = []

    def holding(event: Any) -> None:
        if event.payload.get("viewGone") is True:
            held.append(event)
            return
        heard(event)

    muffled = (globs, holding, others)
    listeners[listeners.index(entry)] = muffled
    try:
        yield held
    finally:
        listeners[listeners.index(muffled)] = entry

        async def late() -> None:
            for event in held:
                heard(event)
            await settled(shell.shell.lifecycle.views)

        shell.on_loop(late())


def test_a_view_released_on_another_shell_is_closed_where_the_pod_runs_once_answered(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """A view of shell 1's pod released on shell 2: shell 2 answered once the view's rows were
    gone, and shell 1, which holds the view in memory and checks its own instances' cookies
    there, dropped it only when it heard the release's event. Under load that came after the
    answer, and the cookie of a view its user had closed (a tab closed, a sign-out) still
    opened the app on shell 1. Here shell 1 hears the release late: the release is asked of
    it too, and answered once it has dropped the view (and stopped the instance when that
    was its last view, as a release on shell 1 answers). The late event changes nothing."""
    one, two = two_kube_shells
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = launch(api)
        held = one.shell.lifecycle.get(iid)
        kept, _ = new_view(api, iid)
        view, url = new_view(api_two, iid)
        wait_for(lambda: view in held.views, "one learns the view made on two", SLOW)
        with closing(enter(one, url)) as on_one:
            assert on_one.get("/boot").status_code == 200
            with releases_held(one) as late:
                released = api_two.delete(f"/api/instances/{iid}/views/{view}")
                assert released.status_code == 200, released.text
                assert released.json()["state"] == "started"
                assert on_one.get("/boot").status_code == 401
                assert view not in held.views

                last = api_two.delete(f"/api/instances/{iid}/views/{kept}")
                assert last.status_code == 200, last.text
                assert last.json()["state"] == "stopped"
                assert held.state is InstanceState.STOPPED
                assert [e.payload["viewId"] for e in late] == [view, kept]
        assert not held.views
        assert held.state is InstanceState.STOPPED
