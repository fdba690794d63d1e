"""A pod's own API calls answered by any shell (docs/decisions.md "Several shells: app tokens in
the database"): two real shells (two homes) on one PostgreSQL database and one namespace of the
fake cluster (tests/kube/conftest.py says why a fake). A pod reaches the shells through the one
address they share, so its calls with its token (`OS_APP_TOKEN`) land on either; the token shell
1 issued is the same app, for the same owner, on shell 2, until the instance goes; the database
holds only its hash."""

from __future__ import annotations

import json

import sqlalchemy as sa

from atrium.identity import new_token
from atrium.identity import token_hash as digest
from atrium.lifecycle.states import InstanceState
from atrium.state.schema import app_tokens, instances, metadata
from tests.integration.conftest import RunningShell, wait_for
from tests.kube.test_several_shells_origins import (
    PROBE,
    SLOW,
    StartShell,
    kube_shells,
    two_kube_shells,
)

__all__ = ["kube_shells", "two_kube_shells"]  # the fixtures, shared with the origins' tests


def dumped(url: str) -> str:
    """Every row of every table of the shared database, as text (what a dump would give)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return "\n".join(
                repr(tuple(row))
                for table in metadata.sorted_tables
                for row in conn.execute(sa.select(table))
            )
    finally:
        engine.dispose()


def test_a_pods_token_is_its_app_on_every_shell_until_the_instance_goes(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    one, two = two_kube_shells
    with one.client(timeout=SLOW) as api:
        launched = api.post("/api/instances", json={"appId": PROBE})
        assert launched.status_code == 200, launched.text
        iid = launched.json()["instanceId"]
        instance = one.shell.lifecycle.find(iid)
        assert instance is not None
        assert instance.token is not None
        token = instance.token  # what the pod holds in its Secret

        # the pod's calls through the balancer: on two, the same app for the same owner
        with two.client(token=token, timeout=SLOW) as app_on_two:
            for n in range(3):  # the first reads the database, the others what two remembers
                put = app_on_two.put(
                    f"/api/kv/app/{PROBE}/seen", content=json.dumps({"value": f"two {n}"})
                )
                assert put.status_code in (200, 204), put.text
            read = api.get(f"/api/kv/app/{PROBE}/seen")
            assert read.status_code == 200, read.text
            assert read.json()["value"] == "two 2"  # the owner's row: the app acted for them
            other = app_on_two.get("/api/kv/app/com.example.other/seen")
            assert other.status_code == 403, other.text  # an app, and only this one
            assert app_on_two.get("/api/me").status_code == 403  # not its owner's token

        # the database holds its hash, never the token
        url = two.shell.settings.database_url
        assert url is not None
        dump = dumped(url.get_secret_value())
        assert digest(token) in dump
        assert token not in dump

        # a forged token is refused on both, again and again
        forged = new_token()
        for shell in (one, two, two):
            with shell.client(token=forged) as nobody:
                assert nobody.get(f"/api/kv/app/{PROBE}/seen").status_code == 401

        # the instance destroyed on one: its token refused on both (two heard the revoke)
        gone = api.delete(f"/api/instances/{iid}")
        assert gone.status_code in (200, 204), gone.text
        with one.client(token=token) as on_one, two.client(token=token) as on_two:
            assert on_one.get(f"/api/kv/app/{PROBE}/seen").status_code == 401
            wait_for(
                lambda: on_two.get(f"/api/kv/app/{PROBE}/seen").status_code == 401,
                "the destroyed instance's token refused on two",
            )


def test_the_token_of_a_gone_shells_pod_that_ended_is_refused_once_taken_over(
    kube_shells: StartShell,
) -> None:
    """A shell killed leaves its tokens' rows naming it; the leader takes its instances over.
    One whose pod ended while no shell held it stays here in `error`, with no token in memory:
    its row, left naming the gone shell, kept the token valid on every shell (a token the app
    sent out went on acting for its owner), and a later stop here deleted nothing."""
    two = kube_shells("two")
    url = two.shell.settings.state_url
    gone, iid = "elsewhere:/gone/home", "test.contract.probe-7"
    token = new_token()
    takeover = two.shell.lifecycle.takeover
    assert takeover is not None
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(instances).values(
                    id=iid,
                    app_id=PROBE,
                    owner="default",
                    slug="endedpod",
                    state="started",
                    runner="kubernetes",
                    ref={"namespace": takeover._runner.namespace, "pod": "gone", "uid": "u1"},
                    network=None,
                    address=None,
                    secret=None,
                    shell=gone,
                    updated_at="2026-01-01T00:00:00.000Z",
                )
            )
            conn.execute(
                sa.insert(app_tokens).values(
                    hash=digest(token),
                    instance_id=iid,
                    app_id=PROBE,
                    owner="default",
                    shell=gone,
                    issued_at="2026-01-01T00:00:00.000Z",
                )
            )
    finally:
        engine.dispose()
    with two.client(token=token) as app:
        app.get(f"/api/kv/app/{PROBE}/seen")  # remembered by two, if not taken over yet

        def in_error() -> bool:
            instance = two.shell.lifecycle.find(iid)
            return instance is not None and instance.state is InstanceState.ERROR

        wait_for(in_error, "two takes the gone shell's instance over: its pod ended", 15)
        wait_for(
            lambda: app.get(f"/api/kv/app/{PROBE}/seen").status_code == 401,
            "the ended pod's token refused on two",
            5,
        )
    assert digest(token) not in dumped(url)


def test_a_local_instances_token_is_its_shells_alone(kube_shells: StartShell) -> None:
    """A local runner's instance calls its own shell (on the loopback) and dies with it: its
    token is kept in that shell's memory only. Written to the database, it was valid on every
    other shell, and a shell killed (its instances dying with it) left rows that kept their
    tokens (which an app may have sent out) valid there until that home started again."""
    one, two = kube_shells("one", runner="auto"), kube_shells("two")
    with one.client(timeout=SLOW) as api:
        launched = api.post("/api/instances", json={"appId": PROBE})
        assert launched.status_code == 200, launched.text
        instance = one.shell.lifecycle.find(launched.json()["instanceId"])
        assert instance is not None
        token = instance.token
        assert token is not None
    with one.client(token=token) as on_one, two.client(token=token) as on_two:
        assert on_one.get(f"/api/kv/app/{PROBE}/seen").status_code in (200, 404)
        assert on_two.get(f"/api/kv/app/{PROBE}/seen").status_code == 401
    assert digest(token) not in dumped(one.shell.settings.state_url)
