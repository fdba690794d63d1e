"""A host page's views released when the page is gone, whichever shells its event stream and
its views were on (docs/decisions.md "Several shells: a host page's going seen by every
shell"): two real shells (homes) on one PostgreSQL database and one namespace of the fake
cluster (tests/kube/conftest.py says why a fake). With no stickiness a tab's stream may be on
one shell and its views on another: the shell that saw the stream go must release views it
never held, and a shell that holds a view must not release it while another shell streams the
page."""

from __future__ import annotations

import socket
from contextlib import closing

import pytest

from atrium.lifecycle.instance import Instance
from atrium.lifecycle.states import InstanceState
from tests.integration.conftest import RunningShell, wait_for
from tests.kube.test_several_shells_origins import PROBE, SLOW, StartShell, kube_shells
from tests.kube.test_several_shells_views import view_deletes_refused, view_row

__all__ = ["kube_shells"]  # the fixture, shared with the origins' tests

GRACE = 0.5


@pytest.fixture
def shells(kube_shells: StartShell) -> tuple[RunningShell, RunningShell]:
    """Two shells whose host pages are gone half a second after their last stream."""
    return (
        kube_shells("one", view_grace_seconds=GRACE),
        kube_shells("two", view_grace_seconds=GRACE),
    )


def page_stream(shell: RunningShell, client: str) -> socket.socket:
    """The event stream of the host page ``client``, open on ``shell`` (closed by the caller)."""
    sock = socket.create_connection(("127.0.0.1", shell.settings.port), timeout=SLOW)
    sock.sendall(
        f"GET /api/events?client={client} HTTP/1.1\r\nHost: localhost\r\n"
        f"Authorization: Bearer {shell.token}\r\n\r\n".encode()
    )
    received = b""
    while b": connected" not in received:
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    return sock


def views_made(one: RunningShell, two: RunningShell, client: str) -> tuple[Instance, list[str]]:
    """A pod on one, and two views of it held by the page ``client``: one made on one, one on
    two. The instance as one holds it, once it holds both, and the two views' ids."""
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        launched = api.post("/api/instances", json={"appId": PROBE})
        assert launched.status_code == 200, launched.text
        iid = launched.json()["instanceId"]
        made = [
            shell_api.post(f"/api/instances/{iid}/views", json={"client": client})
            for shell_api in (api, api_two)
        ]
    assert all(m.status_code == 200 for m in made), [m.text for m in made]
    ids = [m.json()["viewId"] for m in made]
    held = one.shell.lifecycle.get(iid)
    wait_for(lambda: set(ids) <= set(held.views), "one holds both views", SLOW)
    return held, ids


def test_a_pages_views_on_another_shell_are_released_when_its_stream_there_is_gone(
    shells: tuple[RunningShell, RunningShell],
) -> None:
    """The page's stream on two, its views held by one (the pod's shell): two sees the stream
    go and releases both, one stops the unviewed pod."""
    one, two = shells
    url = one.shell.settings.state_url
    stream = page_stream(two, "tab-streams-on-two")
    held, ids = views_made(one, two, "tab-streams-on-two")
    stream.close()
    wait_for(lambda: all(view_row(url, v) is None for v in ids), "the views released", SLOW)
    wait_for(lambda: not held.views, "one dropped both views")
    wait_for(lambda: held.state is InstanceState.STOPPED, "the unviewed pod stopped", SLOW)


def test_a_view_is_kept_while_another_shell_streams_its_page(
    shells: tuple[RunningShell, RunningShell],
) -> None:
    """The page's stream stays open on two, while a stream of it on one comes and goes: one's
    grace ends with the page still there, and nothing is released."""
    one, two = shells
    url = one.shell.settings.state_url
    with closing(page_stream(two, "tab-stays-on-two")):
        held, ids = views_made(one, two, "tab-stays-on-two")
        page_stream(one, "tab-stays-on-two").close()  # a reload that landed on one
        presence, timers = one.shell.presence, one.shell.presence._timers
        wait_for(
            lambda: (
                not presence.is_present("tab-stays-on-two") and "tab-stays-on-two" not in timers
            ),
            "one saw the stream go and its grace end",
        )
        assert all(view_row(url, v) is not None for v in ids)
        assert set(ids) <= set(held.views)
        assert held.state is InstanceState.STARTED


def test_a_pages_views_are_released_when_the_shell_of_its_stream_is_gone(
    shells: tuple[RunningShell, RunningShell],
) -> None:
    """The shell that had the page's stream stops before its grace is over (its row still says
    it streams): the leader, one, counts the page gone from when it finds that shell gone, and
    releases its views a grace later."""
    one, two = shells
    url = one.shell.settings.state_url
    stream = page_stream(two, "tab-of-a-gone-shell")
    held, ids = views_made(one, two, "tab-of-a-gone-shell")
    two.stop()
    stream.close()
    wait_for(lambda: all(view_row(url, v) is None for v in ids), "the views released", SLOW)
    wait_for(lambda: held.state is InstanceState.STOPPED, "the unviewed pod stopped", SLOW)


def test_a_pages_views_are_released_when_the_shell_of_its_stream_restarts_within_the_grace(
    kube_shells: StartShell, shells: tuple[RunningShell, RunningShell]
) -> None:
    """The shell that had the page's stream restarts (same home: same shell name) before the
    leader has counted the page gone (held still here, so that it cannot look meanwhile): the
    page's rows say that shell had its stream, and the new run must not wipe that out — its
    views are released a grace later all the same, and the unviewed pod stops."""
    one, two = shells
    url = one.shell.settings.state_url
    stream = page_stream(two, "tab-of-a-restarted-shell")
    held, ids = views_made(one, two, "tab-of-a-restarted-shell")
    with one.stalled():
        stream.close()
        two.stop()
        kube_shells("two", view_grace_seconds=GRACE)
    wait_for(lambda: all(view_row(url, v) is None for v in ids), "the views released", SLOW)
    wait_for(lambda: held.state is InstanceState.STOPPED, "the unviewed pod stopped", SLOW)


def test_a_pages_views_a_release_could_not_drop_are_released_once_the_database_takes_it(
    shells: tuple[RunningShell, RunningShell],
) -> None:
    """The page is counted gone (its rows deleted in that transaction), and then the database
    refuses the release's writes (a link cut at that moment, made here by a trigger that fails
    each delete of a view while a flag is set, counting its refusals in a sequence, which no
    rollback undoes): the views must be released once the database takes writes again, not
    held by their pod for as long as it runs because no row of the page is left to look at."""
    one, two = shells
    url = one.shell.settings.state_url
    with view_deletes_refused(url) as refused:
        stream = page_stream(two, "tab-released-in-a-cut")
        held, ids = views_made(one, two, "tab-released-in-a-cut")
        stream.close()
        wait_for(refused, "a release refused by the database", SLOW)
    wait_for(lambda: all(view_row(url, v) is None for v in ids), "the views released", SLOW)
    wait_for(lambda: held.state is InstanceState.STOPPED, "the unviewed pod stopped", SLOW)
