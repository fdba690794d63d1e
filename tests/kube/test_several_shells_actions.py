"""A pod's instance listed and acted on from any shell (docs/decisions.md "Several shells: a
pod's actions asked of its shell"): two real shells (two homes) on one PostgreSQL database and
one namespace of the fake cluster (tests/kube/conftest.py says why a fake). Behind a balancer
without stickiness the host page's calls reach either shell: shell 2 lists shell 1's instance
and has shell 1 do its actions (only the shell that holds the pod acts on it), reads its pod's
log from the cluster, and refuses a stranger as shell 1 does."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from atrium.lifecycle import asked
from atrium.lifecycle.runners.kubernetes import render
from atrium.lifecycle.states import InstanceState
from atrium.state.schema import events, instance_requests
from tests.integration.conftest import RunningShell, wait_for
from tests.kube.cluster import FakeCluster
from tests.kube.test_several_shells_origins import (
    PROBE,
    SLOW,
    kube_shells,
    new_view,
    two_kube_shells,
)
from tests.kube.test_several_shells_pods import row_of

__all__ = ["kube_shells", "two_kube_shells"]  # the fixtures, shared with the origins' tests


def moves_to(url: str, iid: str, state: str) -> int:
    """How many `app:state` events in the shared log moved ``iid`` into ``state``."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(events.c.data).where(events.c.topic == "app:state"))
            return sum(
                1 for (data,) in rows if data.get("instanceId") == iid and data.get("to") == state
            )
    finally:
        engine.dispose()


def requests_of(url: str, iid: str) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(
                conn.execute(
                    sa.select(instance_requests).where(instance_requests.c.instance_id == iid)
                )
            )
    finally:
        engine.dispose()


def test_one_shells_pod_is_listed_and_acted_on_from_the_other(
    two_kube_shells: tuple[RunningShell, RunningShell], kube_settings: FakeCluster
) -> None:
    """Shell 2 lists shell 1's instance from its row and has shell 1 resume, stop and delete
    it: each move made once, on shell 1 (its state, its one `app:state`, its row written before
    shell 2 answers); an illegal move answers shell 1's 409; a stranger gets 404 and a grantee
    sees it shared, as on shell 1."""
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        launched = api.post("/api/instances", json={"appId": PROBE})
        assert launched.status_code == 200, launched.text
        iid = launched.json()["instanceId"]
        held = one.shell.lifecycle.get(iid)
        assert api.post(f"/api/proxy/{iid}/log?line=heard-on-two").status_code == 200
        # its row is written just after the launch's answer
        wait_for(lambda: row_of(url, iid).state == "started", "the started row", SLOW)

        listed = api_two.get("/api/instances")
        assert listed.status_code == 200, listed.text
        [entry] = [i for i in listed.json() if i["instanceId"] == iid]
        assert entry["state"] == "started"
        assert entry["elsewhere"]
        assert entry["port"] is None
        assert "secret" not in listed.text
        everyone = api_two.get("/api/instances?all=1")
        assert iid in [i["instanceId"] for i in everyone.json()]

        # the kubelet writes the pod's output to its log on its own, just after the line
        wait_for(
            lambda: "heard-on-two" in api_two.get(f"/api/instances/{iid}/logs").text,
            "the pod's log read on two",
            SLOW,
        )
        logs = api_two.get(f"/api/instances/{iid}/logs")
        assert logs.status_code == 200, logs.text

        for action, state in (("resume", "resuming"), ("resumed", "resumed"), ("stop", "stopped")):
            done = api_two.post(f"/api/instances/{iid}/{action}")
            assert done.status_code == 200, done.text
            assert done.json()["state"] == state
            assert done.json()["instanceId"] == iid
            assert held.state.value == state  # shell 1 moved it
            assert row_of(url, iid).state == state  # its row written before the answer
        assert two.shell.lifecycle.find(iid) is None  # shell 2 never held it
        # the bus writes events to the shared log on its own, just after the move
        wait_for(lambda: moves_to(url, iid, "stopped") == 1, "the stop's app:state", SLOW)

        illegal = api_two.post(f"/api/instances/{iid}/resume")
        assert illegal.status_code == 409, illegal.text
        assert illegal.json()["error"]["code"] == "illegal_transition"
        unknown = api_two.post(f"/api/instances/{iid}/fly")
        assert unknown.status_code == 400, unknown.text

        # an activity: shell 1 starts and resumes it for one, as its own API does
        opened = api_two.post(f"/api/instances/{iid}/activities", json={"extras": {"k": 1}})
        assert opened.status_code == 200, opened.text
        activity = opened.json()["activityId"]
        assert activity in held.activities
        assert held.state is InstanceState.RESUMED
        assert opened.json()["url"].startswith(f"http://{held.slug}.")
        ended = api_two.delete(f"/api/instances/{iid}/activities/{activity}")
        assert ended.status_code == 200, ended.text
        assert activity not in held.activities
        gone = api_two.delete(f"/api/instances/{iid}/activities/{activity}")
        assert gone.status_code == 404, gone.text

        eve = one.add_user("eve")
        bob = one.add_user("bob")
        granted = api.post(f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"})
        assert granted.status_code == 201, granted.text
        for token in (eve, bob):
            with two.client(token, timeout=SLOW) as other:
                for refused in (
                    other.post(f"/api/instances/{iid}/start"),
                    other.delete(f"/api/instances/{iid}"),
                    other.get(f"/api/instances/{iid}/logs"),
                    other.post(f"/api/instances/{iid}/activities"),
                ):
                    assert refused.status_code == 404, refused.text
                    assert refused.json()["error"]["code"] == "not_found"
                assert iid not in [i["instanceId"] for i in other.get("/api/instances").json()]
        with two.client(bob, timeout=SLOW) as as_bob:
            [shared] = [
                i for i in as_bob.get("/api/instances?shared=1").json() if i["instanceId"] == iid
            ]
            assert shared["access"] == "viewer"
            assert shared["owner"] == held.owner
        assert held.state is InstanceState.RESUMED

        removed = api_two.delete(f"/api/instances/{iid}")
        assert removed.status_code == 200, removed.text
        assert removed.json() == {"ok": True, "instanceId": iid, "state": "installed"}
        assert one.shell.lifecycle.find(iid) is None
        assert row_of(url, iid) is None
        wait_for(lambda: moves_to(url, iid, "installed") == 1, "the removal's app:state", SLOW)
        # each move once per action, by shell 1 alone (the activity resumed it again)
        for state, times in (("resuming", 2), ("stopping", 2), ("starting", 2), ("destroying", 1)):
            assert moves_to(url, iid, state) == times, state
        namespace = str(one.shell.lifecycle._booter.runner.namespace)  # type: ignore[attr-defined]
        wait_for(
            lambda: kube_settings.pod(namespace, render.pod_name(iid)) is None,
            "the pod deleted",
            SLOW,
        )
        # the three moves, the illegal resume, the activity's three asks (the last answered
        # 404), the delete; nothing asked for the rest
        states = sorted(r.state for r in requests_of(url, iid))
        assert states == ["done"] * 6 + ["failed"] * 2


def test_an_action_its_shell_does_not_take_is_withdrawn_and_never_done(
    two_kube_shells: tuple[RunningShell, RunningShell], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shell 1 hears nothing (neither the ask's event nor its own look for asks: a shell
    wedged): shell 2 answers `504 shell_timeout` once the deadline passes, and the request,
    withdrawn, is never done, even when shell 1 comes to it later."""
    monkeypatch.setattr(asked, "TAKE_SECONDS", 0.5)
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
        held = one.shell.lifecycle.get(iid)
        wait_for(lambda: row_of(url, iid) is not None, "the instance's row", SLOW)
        desk = one.shell.lifecycle.asked
        assert desk is not None
        rows = one.shell.lifecycle.rows
        assert rows is not None
        heard = list(rows.on_request)
        rows.on_request.clear()
        try:
            late = api_two.post(f"/api/instances/{iid}/stop")
        finally:
            rows.on_request.extend(heard)
        assert late.status_code == 504, late.text
        error = late.json()["error"]
        assert error["code"] == "shell_timeout"
        assert error["taken"] is False
        assert error["instanceId"] == iid
        [request] = requests_of(url, iid)
        assert request.state == "withdrawn"
        one.on_loop(desk._do(held, request.id))  # shell 1 comes to it late: nothing is done
        assert held.state is InstanceState.STARTED
        assert row_of(url, iid).state == "started"
        assert moves_to(url, iid, "stopping") == 0


@contextmanager
def deaf_to_asks(shell: RunningShell) -> Iterator[None]:
    """``shell`` misses the `instance:routed` of every action asked of it (behind on the event
    log, or their notifications lost), and hears every other event."""
    rows = shell.shell.lifecycle.rows
    assert rows is not None
    listeners = rows._bus._listeners  # the shell's event delivery
    [entry] = [e for e in listeners if e[1] == rows._heard]
    globs, heard, others = entry

    def deaf(event: Any) -> None:
        if "requestId" in event.payload and event.payload.get("answered") is not True:
            return
        heard(event)

    muffled = (globs, deaf, others)
    listeners[listeners.index(entry)] = muffled
    try:
        yield
    finally:
        listeners[listeners.index(muffled)] = entry


def test_an_action_whose_event_its_shell_missed_is_done_all_the_same(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """Shell 1 misses the event of a stop asked of it on shell 2 (behind on the event log, or
    its notification lost): the asker withdrew the ask after 5 s, `504 shell_timeout`, nothing
    done, though shell 1 was alive and well. Shell 1 also looks for the asks of its instances
    every second: the stop is done, once."""
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
        held = one.shell.lifecycle.get(iid)
        wait_for(lambda: row_of(url, iid).state == "started", "the started row", SLOW)
        with deaf_to_asks(one):
            stopped = api_two.post(f"/api/instances/{iid}/stop")
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["state"] == "stopped"
        assert held.state is InstanceState.STOPPED
        [request] = requests_of(url, iid)
        assert request.state == "done"
        assert moves_to(url, iid, "stopping") == 1


@contextmanager
def instance_writes_held(url: str) -> Iterator[None]:
    """No shell writes an instance row (each reads them) until the block ends: a lock on the
    table that lets reads through."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(sa.text("LOCK TABLE instances IN SHARE MODE"))
            yield
    finally:
        engine.dispose()


def test_one_owners_instances_are_numbered_apart_on_every_shell(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """Each shell numbered its own instances: shell 2's first instance of the probe app got the
    id of shell 1's, so its pod, Secret and claim (named by id, in one namespace) clashed with
    shell 1's and the launch failed (`502 spawn_failed`), and a list showed the id twice. A
    launch now numbers past every shell's rows, and two shells numbering at once each get an
    id of their own (the row, keyed by id, tells them apart): held at the row's write here, both
    number past shell 1's first instance alike, and the one whose row is not written numbers
    again."""
    one, two = two_kube_shells
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        first = api.post("/api/instances", json={"appId": PROBE, "new": True})
        assert first.status_code == 200, first.text
        ids = [first.json()["instanceId"]]

        def numbering(shell: RunningShell) -> list[str]:
            """The ids of the instances the shell made since the first (shell 1's)."""
            return [i.id for i in shell.shell.lifecycle.all() if i is not first_held]

        first_held = one.shell.lifecycle.get(ids[0])

        with ThreadPoolExecutor(2) as pool:
            with instance_writes_held(url):
                launches = [
                    pool.submit(c.post, "/api/instances", json={"appId": PROBE, "new": True})
                    for c in (api, api_two)
                ]
                wait_for(lambda: numbering(one) and numbering(two), "both shells numbering", SLOW)
                # each read the other's rows: one id, past shell 1's first
                assert numbering(one) == numbering(two) != ids, (numbering(one), numbering(two))
            answers = [launch.result() for launch in launches]
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        ids += [a.json()["instanceId"] for a in answers]
        assert len(set(ids)) == 3, ids
        assert two.shell.lifecycle.get(ids[2]).state is InstanceState.STARTED
        for client in (api, api_two):
            listed = [i["instanceId"] for i in client.get("/api/instances").json()]
            assert sorted(listed) == sorted(ids)


def test_a_launch_on_any_shell_hands_out_the_owners_pod_a_page_opened(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """A launch hands out the owner's instance of the app, as one shell does: through the
    balancer the host page's next launch of the app may reach the other shell, which made a
    second instance, with a claim (and so data) of its own. Now it answers shell 1's, and
    has shell 1 start it again when its page went and it stopped."""
    one, two = two_kube_shells
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
        view, _ = new_view(api, iid)
        again = api_two.post("/api/instances", json={"appId": PROBE})
        assert again.status_code == 200, again.text
        assert again.json()["instanceId"] == iid
        assert again.json()["elsewhere"] is not None
        assert not two.shell.lifecycle.all()  # nothing made on shell 2
        # its page goes: unviewed, it stops; the next launch on shell 2 has shell 1 start it
        assert api.delete(f"/api/instances/{iid}/views/{view}").status_code == 200
        held = one.shell.lifecycle.get(iid)
        wait_for(lambda: held.state is InstanceState.STOPPED, "shell 1 stops it", SLOW)
        one.on_loop(one.shell.lifecycle.rows.flush())  # type: ignore[union-attr]
        started = api_two.post("/api/instances", json={"appId": PROBE})
        assert started.status_code == 200, started.text
        assert (started.json()["instanceId"], started.json()["state"]) == (iid, "started")
        assert held.state is InstanceState.STARTED
        assert not two.shell.lifecycle.all()
        # a new one is asked for: made on shell 2, numbered past shell 1's
        fresh = api_two.post("/api/instances", json={"appId": PROBE, "new": True})
        assert fresh.status_code == 200, fresh.text
        assert fresh.json()["instanceId"] != iid
