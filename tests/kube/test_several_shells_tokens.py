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
from atrium.state.apptokens import digest
from atrium.state.schema import metadata
from tests.integration.conftest import RunningShell, wait_for
from tests.kube.test_several_shells_origins import PROBE, SLOW, kube_shells, two_kube_shells

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
