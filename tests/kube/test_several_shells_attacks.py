"""What a caller of another shell than the one that runs a pod may not get (docs/decisions.md
"Several shells: a pod's actions asked of its shell", "… what a grantee learns of another
shell's instance"): two real shells (two homes) on one PostgreSQL database and one namespace of
the fake cluster (tests/kube/conftest.py says why a fake)."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from atrium.lifecycle import asked
from atrium.lifecycle.states import InstanceState
from atrium.state.schema import instance_requests
from tests.integration.conftest import RunningShell, wait_for
from tests.kube.test_several_shells_actions import requests_of
from tests.kube.test_several_shells_origins import PROBE, SLOW, kube_shells, two_kube_shells
from tests.kube.test_several_shells_pods import row_of

__all__ = ["kube_shells", "two_kube_shells"]  # the fixtures, shared with the origins' tests


def test_a_grantee_releasing_a_view_on_another_shell_is_told_no_machine(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """Bob, a viewer of shell 1's pod, opens and releases a view of it on shell 2: the release
    answered him the instance with `elsewhere` naming shell 1's machine, which a grantee is
    never told (on one shell, nor in his `?shared=1`); its owner still is."""
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
        wait_for(lambda: row_of(url, iid).state == "started", "the started row", SLOW)
        bob = one.add_user("bob")
        granted = api.post(f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"})
        assert granted.status_code == 201, granted.text
        # the owner's view keeps the pod serving while bob's comes and goes
        own = api_two.post(f"/api/instances/{iid}/views", json={"path": "/"})
        assert own.status_code == 200, own.text
        with two.client(bob, timeout=SLOW) as as_bob:
            made = as_bob.post(f"/api/instances/{iid}/views", json={"path": "/"})
            assert made.status_code == 200, made.text
            released = as_bob.delete(f"/api/instances/{iid}/views/{made.json()['viewId']}")
        assert released.status_code == 200, released.text
        assert released.json()["elsewhere"] is None, released.text
        assert released.json()["instanceId"] == iid
        mine = api_two.delete(f"/api/instances/{iid}/views/{own.json()['viewId']}")
        assert mine.status_code == 200, mine.text
        assert mine.json()["elsewhere"], mine.text


def test_an_asked_activitys_extras_are_not_kept_once_answered_or_withdrawn(
    two_kube_shells: tuple[RunningShell, RunningShell], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An activity asked of shell 1 from shell 2 carries its extras (up to a request's 2 MiB)
    in the request's row, kept an hour: an owner (or any app of theirs, with its token) asking
    in a loop wrote 2 MiB a request into the database. Shell 1 needs them only until it takes
    the request: once answered, or withdrawn untaken, the row keeps no body."""
    monkeypatch.setattr(asked, "TAKE_SECONDS", 0.5)
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    extras = {"blob": "x" * 500_000}
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
        wait_for(lambda: row_of(url, iid).state == "started", "the started row", SLOW)
        opened = api_two.post(f"/api/instances/{iid}/activities", json={"extras": extras})
        assert opened.status_code == 200, opened.text
        [done] = requests_of(url, iid)
        assert done.state == "done"
        assert done.body is None

        rows = one.shell.lifecycle.rows
        assert rows is not None
        heard = list(rows.on_request)
        rows.on_request.clear()  # shell 1 hears nothing: the request is withdrawn untaken
        try:
            late = api_two.post(f"/api/instances/{iid}/activities", json={"extras": extras})
        finally:
            rows.on_request.extend(heard)
        assert late.status_code == 504, late.text
        withdrawn = [r for r in requests_of(url, iid) if r.state == "withdrawn"]
        assert [r.body for r in withdrawn] == [None]


def test_an_ask_heard_late_whose_asker_could_not_withdraw_it_is_never_done(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """A stop asked of shell 1 a minute ago, which its asker never withdrew (it died, or the
    database restarted under every shell and its withdraw failed: its caller got an error),
    heard by shell 1 only now (back on the database, it reads the events it missed): it was
    taken and done then, stopping an instance its owner may have started again since. Shell 1
    takes only what its asker still waits for."""
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
        held = one.shell.lifecycle.get(iid)
        wait_for(lambda: row_of(url, iid).state == "started", "the started row", SLOW)
    rows_one, rows_two = one.shell.lifecycle.rows, two.shell.lifecycle.rows
    desk = one.shell.lifecycle.asked
    assert rows_one is not None
    assert rows_two is not None
    assert desk is not None
    row = two.on_loop(rows_two.by_id(iid))
    assert row is not None
    heard = list(rows_one.on_request)
    missed: list[str] = []
    # shell 1 is behind: the ask's event passes it by, heard again only later
    rows_one.on_request[:] = [lambda _iid, _slug, request_id, _answered: missed.append(request_id)]
    try:
        assert two.on_loop(rows_two.ask(row, "5ta1eask", "stop"))  # its asker then gone
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    sa.update(instance_requests)
                    .where(instance_requests.c.id == "5ta1eask")
                    .values(asked_at=time.time() - 60)
                )
        finally:
            engine.dispose()
        wait_for(lambda: "5ta1eask" in missed, "the ask's event at shell 1", SLOW)
    finally:
        rows_one.on_request[:] = heard
    one.on_loop(desk._do(held, "5ta1eask"))  # heard now
    [request] = requests_of(url, iid)
    assert request.state == "asked", request.answer
    assert held.state is InstanceState.STARTED
    assert row_of(url, iid).state == "started"
