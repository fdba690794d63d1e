"""A user's data on a cluster is the same on every shell of one database (docs/decisions.md
"Several shells: a user's data claim is every shell's"): two real shells on one PostgreSQL
database and one namespace of the fake cluster (tests/kube/conftest.py says why a fake), whose
kubelet keeps a folder per claim. A claim carried the label of the shell that made it, and
every other shell refused to mount it (`spawn_failed`: "another shell made it"): an instance
deleted on one shell could not be launched again on another, and its data was that shell's."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from atrium.lifecycle.runners.kubernetes import render
from atrium.lifecycle.states import InstanceState
from atrium.state.database import Database
from atrium.state.schema import instances, users
from tests.integration.conftest import RunningShell, wait_for
from tests.kube.cluster import FakeCluster
from tests.kube.test_several_shells_numbering import SLOW_START, WOKEN, probe_app
from tests.kube.test_several_shells_origins import PROBE, SLOW, StartShell, kube_shells
from tests.kube.test_several_shells_pods import row_of

__all__ = ["kube_shells"]  # the fixture


def claim_of(cluster: FakeCluster, namespace: str, iid: str) -> str | None:
    """The claim the pod of ``iid`` mounts as its data (None: no pod, or no claim)."""
    pod = cluster.pod(namespace, render.pod_name(iid))
    for volume in [] if pod is None else pod["spec"]["volumes"]:
        if volume["name"] == "data" and "persistentVolumeClaim" in volume:
            return str(volume["persistentVolumeClaim"]["claimName"])
    return None


def claims(cluster: FakeCluster, namespace: str) -> dict[str, Any]:
    """The namespace's claims by name."""
    return cluster.call(
        lambda: {
            name: obj
            for (resource, ns, name), obj in cluster.api.store.items()
            if resource.endswith("/persistentvolumeclaims") and ns == namespace
        }
    )


def test_an_instance_deleted_on_one_shell_is_launched_on_another_on_its_data(
    kube_shells: StartShell, kube_settings: FakeCluster
) -> None:
    one, two = kube_shells("one"), kube_shells("two")
    namespace = one.shell.settings.kube_namespace
    owner = one.shell.settings.user
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        made = api.post("/api/instances", json={"appId": PROBE, "new": True})
        assert made.status_code == 200, made.text
        iid = made.json()["instanceId"]
        claim = render.claim_name(owner, iid)
        assert claim_of(kube_settings, namespace, iid) == claim
        kube_settings.kubelet.claim_folder(namespace, claim).joinpath("kept.txt").write_text("1")
        gone = api.delete(f"/api/instances/{iid}")
        assert gone.status_code == 200, gone.text
        url = one.shell.settings.state_url
        wait_for(lambda: row_of(url, iid) is None, "the instance's row gone", SLOW)

        again = api_two.post("/api/instances", json={"appId": PROBE, "new": True})
        assert again.status_code == 200, again.text  # was 502 spawn_failed
        assert again.json()["instanceId"] == iid
        assert two.shell.lifecycle.find(iid) is not None
        assert claim_of(kube_settings, namespace, iid) == claim
        assert kube_settings.kubelet.claim_folder(namespace, claim).joinpath("kept.txt").exists()
        assert list(claims(kube_settings, namespace)) == [claim]


def test_a_woken_provider_runs_on_the_data_of_its_owners_first_instance(
    tmp_path: Path, kube_shells: StartShell, kube_settings: FakeCluster
) -> None:
    """A headless provider runs on the data its app shows, `<app>-1`'s (as on a local runner,
    where it shares that folder): on a cluster it had a claim of its own, empty, so what the
    user's page wrote was not what the app's data requests read."""
    probe_app(
        tmp_path,
        WOKEN,
        dataProvider={
            "authority": "claimed",
            "providers": [{"path": "/items", "readPerm": None}],
            "wake": True,
            "idleTimeoutMs": 60_000,
        },
    )
    one = kube_shells("one")
    namespace = one.shell.settings.kube_namespace
    owner = one.shell.settings.user
    with one.client(timeout=SLOW) as api:
        made = api.post("/api/instances", json={"appId": WOKEN})
        assert made.status_code == 200, made.text
        first = made.json()["instanceId"]
        assert first == f"{WOKEN}-1"
        assert api.delete(f"/api/instances/{first}").status_code == 200
        assert api.get("/api/data/claimed/items/a").status_code == 200
        provider = f"{WOKEN}-provider"
        woken = one.shell.lifecycle.find(provider)
        assert woken is not None
        assert one.shell.lifecycle.is_headless(woken)
        assert claim_of(kube_settings, namespace, provider) == render.claim_name(owner, first)
        assert list(claims(kube_settings, namespace)) == [render.claim_name(owner, first)]


def shared_provider(tmp_path: Path, app_id: str, authority: str, **manifest: Any) -> None:
    """The probe app as a woken data provider (`/items` answers its boot token)."""
    provide = {"path": "/items", "readPerm": None}
    probe_app(
        tmp_path,
        app_id,
        dataProvider={"authority": authority, "providers": [provide], "wake": True, **manifest},
    )


def test_one_provider_serves_every_shell_and_its_idle_time_counts_them_all(
    tmp_path: Path, kube_shells: StartShell
) -> None:
    """Each shell woke a provider of its own for the requests it answered (two pods for one
    user, the second on its own claim). Shell 2 now sends them to shell 1's pod, and notes each
    in its row, so shell 1 does not stop it while shell 2's requests keep coming."""
    shared_provider(tmp_path, WOKEN, "shared", idleTimeoutMs=2_000)
    one, two = kube_shells("one"), kube_shells("two")
    provider = f"{WOKEN}-provider"
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        first = api.get("/api/data/shared/items/a")
        assert first.status_code == 200, first.text
        boot = first.json()["boot"]
        for _ in range(8):  # 4 s of shell 2's requests, twice the idle time
            answer = api_two.get("/api/data/shared/items/b")
            assert answer.status_code == 200, answer.text
            assert answer.json()["boot"] == boot  # shell 1's provider answered
            time.sleep(0.5)
        assert two.shell.lifecycle.of_app(WOKEN) == []
        assert two.shell.lifecycle.headless.wakes == {}
        woken = one.shell.lifecycle.find(provider)
        assert woken is not None
        assert woken.state is InstanceState.RESUMED
        # no request now from either shell: its idle time runs out on shell 1
        wait_for(lambda: one.shell.lifecycle.find(provider) is None, "the idle stop", SLOW)


def test_a_wake_waits_for_the_provider_another_shell_is_booting(
    tmp_path: Path, kube_shells: StartShell
) -> None:
    """A request on shell 2 while shell 1's provider boots waited for its own provider
    (`<app>-provider2`, a second pod); it waits for shell 1's now, within its wake time."""
    shared_provider(tmp_path, WOKEN, "booting", wakeTimeoutMs=30_000, idleTimeoutMs=60_000)
    folder = tmp_path / "system-apps" / WOKEN
    (folder / "slow.py").write_text(SLOW_START)
    manifest = json.loads((folder / "app.manifest.json").read_text())
    manifest.update(entrypoint=["python3", "slow.py"], startTimeoutMs=30_000)
    (folder / "app.manifest.json").write_text(json.dumps(manifest))
    one, two = kube_shells("one"), kube_shells("two")
    url = one.shell.settings.state_url
    provider = f"{WOKEN}-provider"
    with (
        one.client(timeout=SLOW) as api,
        two.client(one.token, timeout=SLOW) as api_two,
        ThreadPoolExecutor(1) as pool,
    ):
        first = pool.submit(api.get, "/api/data/booting/items/a")
        wait_for(lambda: row_of(url, provider) is not None, "shell 1's provider's row", SLOW)
        assert not first.done()
        second = api_two.get("/api/data/booting/items/b")
        assert second.status_code == 200, second.text
        assert first.result().status_code == 200, first.result().text
        assert second.json()["boot"] == first.result().json()["boot"]
        assert row_of(url, f"{provider}2") is None
        assert two.shell.lifecycle.of_app(WOKEN) == []


def test_a_shell_that_fell_behind_the_events_looks_for_the_provider_again(
    tmp_path: Path, kube_shells: StartShell
) -> None:
    """Shell 2 keeps where another shell's provider serves until that instance's next event; a
    shell whose reader misses rows (more than the table keeps were written while it could not
    read) never hears it. It sent the user's requests to the address of a pod gone meanwhile
    (502 at every request, and on a cluster, whose addresses are given again, to whichever pod
    has that address now) until shell 1 happened to wake its provider again; it looks again."""

    shared_provider(tmp_path, WOKEN, "behind", idleTimeoutMs=1_000)
    one, two = kube_shells("one"), kube_shells("two")
    provider = f"{WOKEN}-provider"
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        first = api.get("/api/data/behind/items/a")
        assert first.status_code == 200, first.text
        served = api_two.get("/api/data/behind/items/b")
        assert served.status_code == 200, served.text
        assert served.json()["boot"] == first.json()["boot"]  # shell 1's pod: kept by shell 2
        with two.stalled():  # two's reader reads nothing meanwhile
            # no request now: its idle time runs out on shell 1, and its pod goes
            wait_for(lambda: one.shell.lifecycle.find(provider) is None, "the idle stop", SLOW)
            one.flood_events()  # more rows than are kept: the app:state is gone

        def served_again() -> Any:  # once its reader has read what is left (502 until then)
            answer = api_two.get("/api/data/behind/items/c")
            return answer if answer.status_code == 200 else None

        # was 502 at every request (the gone pod's address) until shell 1's provider woke again
        again = wait_for(served_again, "shell 2's request served again", SLOW)
        assert again.json()["boot"] != first.json()["boot"]


SLOW_RESUME = """
@app.hook("onResume")
def slow_resume(body: dict[str, object]) -> None:
    time.sleep(3)


if __name__ == "__main__":"""


def test_a_wake_waits_for_the_provider_another_shell_is_resuming(
    tmp_path: Path, kube_shells: StartShell
) -> None:
    """A provider's `onResume` runs while its state is still `started` (the hook comes before
    the move to `resuming`), and a row saying `started` was not read as on its way: a request
    on shell 2 then found no provider anywhere and woke a second one (`<app>-provider2`)."""
    shared_provider(tmp_path, WOKEN, "resuming", wakeTimeoutMs=30_000, idleTimeoutMs=60_000)
    server = tmp_path / "system-apps" / WOKEN / "server.py"
    server.write_text(server.read_text().replace('\nif __name__ == "__main__":', SLOW_RESUME, 1))
    manifest_file = tmp_path / "system-apps" / WOKEN / "app.manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest_file.write_text(json.dumps({**manifest, "hookTimeoutMs": 10_000}))
    one, two = kube_shells("one"), kube_shells("two")
    url = one.shell.settings.state_url
    provider = f"{WOKEN}-provider"

    def started() -> bool:
        row = row_of(url, provider)
        return row is not None and row.state == InstanceState.STARTED.value

    with (
        one.client(timeout=SLOW) as api,
        two.client(one.token, timeout=SLOW) as api_two,
        ThreadPoolExecutor(1) as pool,
    ):
        first = pool.submit(api.get, "/api/data/resuming/items/a")
        wait_for(started, "shell 1's provider in its onResume", SLOW)
        second = api_two.get("/api/data/resuming/items/b")
        assert second.status_code == 200, second.text
        assert first.result().status_code == 200, first.result().text
        assert second.json()["boot"] == first.result().json()["boot"]
        assert row_of(url, f"{provider}2") is None
        assert two.shell.lifecycle.of_app(WOKEN) == []


def test_a_shell_whose_clock_is_apart_keeps_a_provider_only_while_it_uses_it(
    tmp_path: Path, kube_shells: StartShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shell 1's idle stop read the time shell 2 wrote in the row as a time, against its own
    clock: shell 2's clock an hour behind, its requests did not count and shell 1 stopped the
    provider they used (another boot answered them); an hour ahead, one request held the
    provider an hour. The mark is compared now, not its time: neither."""
    import threading
    from datetime import UTC, datetime, timedelta

    from atrium.state import instances

    shared_provider(tmp_path, WOKEN, "apart", idleTimeoutMs=1_000)
    one, two = kube_shells("one"), kube_shells("two")
    provider = f"{WOKEN}-provider"
    skew = [timedelta(hours=-1)]
    real = instances._now

    def two_apart() -> str:  # shell 2's clock (each shell serves from a thread of its own)
        if threading.current_thread() is not two.thread:
            return real()
        return (datetime.now(UTC) + skew[0]).isoformat(timespec="milliseconds")

    monkeypatch.setattr(instances, "_now", two_apart)
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        first = api.get("/api/data/apart/items/a")
        assert first.status_code == 200, first.text
        for _ in range(8):  # 2.4 s of shell 2's requests, more than twice the idle time
            answer = api_two.get("/api/data/apart/items/b")
            assert answer.status_code == 200, answer.text  # was 502: the provider stopped
            assert answer.json()["boot"] == first.json()["boot"]
            time.sleep(0.3)
        skew[0] = timedelta(hours=1)
        ahead = api_two.get("/api/data/apart/items/c")
        assert ahead.status_code == 200, ahead.text
        assert ahead.json()["boot"] == first.json()["boot"]
        # was an hour
        wait_for(lambda: one.shell.lifecycle.find(provider) is None, "the idle stop", SLOW)


def test_a_provider_another_shell_took_over_is_not_waited_for_the_whole_wake_time(
    tmp_path: Path, kube_shells: StartShell
) -> None:
    """A shell that takes a gone shell's provider pod over holds it `started` (no request is
    handed to it until its owner's next wake there). A request on a third shell waited for it
    as for a provider in its `onResume`, the whole wake time, and its own wake then had none
    left: 503 at every request while it was held. A `started` provider is waited for within
    the app's hook time only."""
    shared_provider(tmp_path, WOKEN, "taken", wakeTimeoutMs=8_000, idleTimeoutMs=60_000)
    one, two = kube_shells("one"), kube_shells("two")
    provider = f"{WOKEN}-provider"
    token = one.token
    with one.client(timeout=SLOW) as api:
        first = api.get("/api/data/taken/items/a")
        assert first.status_code == 200, first.text
    one.stop()  # its pods run on: the leader takes them over

    def taken() -> bool:
        instance = two.shell.lifecycle.find(provider)
        return instance is not None and instance.state is InstanceState.STARTED

    wait_for(taken, "two takes the provider over", SLOW)
    three = kube_shells("three")
    with three.client(token, timeout=SLOW) as api_three:
        answer = api_three.get("/api/data/taken/items/b")
        assert answer.status_code == 200, answer.text  # was 503 after 8 s


@pytest.mark.parametrize("how", ["disabled", "removed"])
def test_a_user_disabled_or_removed_on_one_shell_has_their_pods_ended_on_every_shell(
    how: str, kube_shells: StartShell, kube_settings: FakeCluster
) -> None:
    """Disabling or removing a user ended only the instances of the shell that answered: a pod
    another shell ran went on (nothing stops it: its owner's views ended with their sign-ins),
    and with data requests served by any shell's pod, an account made again under that id
    would have been served by the old one's."""
    one, two = kube_shells("one"), kube_shells("two")
    namespace = one.shell.settings.kube_namespace
    bob = one.add_user("bob")
    with (
        one.client(bob, timeout=SLOW) as as_bob,
        two.client(one.token, timeout=SLOW) as admin_two,
    ):
        made = as_bob.post("/api/instances", json={"appId": PROBE})
        assert made.status_code == 200, made.text
        iid = made.json()["instanceId"]
        assert one.shell.lifecycle.find(iid) is not None
        assert kube_settings.pod(namespace, render.pod_name(iid)) is not None
        if how == "disabled":
            answer = admin_two.patch("/api/users/bob", json={"disabled": True})
        else:
            answer = admin_two.delete("/api/users/bob")
        assert answer.status_code == 200, answer.text
        wait_for(lambda: one.shell.lifecycle.find(iid) is None, "shell 1 ends bob's instance", SLOW)
        wait_for(
            lambda: kube_settings.pod(namespace, render.pod_name(iid)) is None,
            "bob's pod gone",
            SLOW,
        )


def made_at(shell: RunningShell, user_id: str, stamp: str) -> None:
    """Write the user's creation time in the shared database (not in the shells' memory)."""
    url = shell.settings.database_url
    assert url is not None

    async def write() -> None:
        async with Database.open(url.get_secret_value()) as db, db.transaction() as tx:
            await tx.execute(sa.update(users).where(users.c.id == user_id).values(created_at=stamp))

    asyncio.run(write())


def test_a_user_removed_and_made_again_while_a_shell_stalled_has_their_old_pods_ended_there(
    kube_shells: StartShell, kube_settings: FakeCluster
) -> None:
    """Shell 2 heard bob's removal, read bob again and ended his instances only if the read
    showed him gone or disabled. Removed and made again under the same id before that read
    (shell 2 stalled meanwhile), bob read as an enabled user: the old account's pod ran on on
    shell 2 and served the new account. The removal's `user:changed` says the account ended."""
    one, two = kube_shells("one"), kube_shells("two")
    namespace = one.shell.settings.kube_namespace
    bob = one.add_user("bob")
    with (
        two.client(bob, timeout=SLOW) as as_bob_two,
        one.client(timeout=SLOW) as admin_one,
    ):
        made = as_bob_two.post("/api/instances", json={"appId": PROBE})
        assert made.status_code == 200, made.text
        iid = made.json()["instanceId"]
        assert two.shell.lifecycle.find(iid) is not None
        old = two.shell.users.get("bob")
        assert old is not None
        with two.stalled():  # shell 2 reads bob's rows again only after both changes
            gone = admin_one.delete("/api/users/bob")
            assert gone.status_code == 200, gone.text
            again = admin_one.post("/api/users", json={"id": "bob"})
            assert again.status_code == 201, again.text
            # made in the same second: nothing read of the new account tells it apart
            made_at(one, "bob", old.created_at)
        wait_for(lambda: two.shell.lifecycle.find(iid) is None, "shell 2 ends bob's instance", SLOW)
        wait_for(
            lambda: kube_settings.pod(namespace, render.pod_name(iid)) is None,
            "the old account's pod gone",
            SLOW,
        )
        assert not two.shell.users.require("bob").disabled  # the new account stays


def test_a_boot_its_shell_died_in_is_not_waited_for(
    tmp_path: Path, kube_shells: StartShell
) -> None:
    """A shell that dies while an instance of the app boots leaves its row as it was (`creating`,
    no pod yet), until its home starts again. A data request on another shell took that row for
    one on its way and waited the whole wake time for it, then had none left for its own wake:
    503 at every request. A row whose shell holds no lock is on its way nowhere. (The row is
    written here as the dead shell left it: killing a shell inside a boot is a race.)"""
    # a wake time its own boot has ample room in under load (it failed a busy run at 4 s), which
    # the wait for the dead shell's row took whole before
    shared_provider(tmp_path, WOKEN, "orphaned", wakeTimeoutMs=20_000, idleTimeoutMs=60_000)
    two = kube_shells("two")
    url = two.shell.settings.state_url
    assert url is not None
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(instances).values(
                    {
                        "id": f"{WOKEN}-1",
                        "app_id": WOKEN,
                        "owner": two.shell.settings.user,
                        "slug": "orphanedboot1",
                        "state": InstanceState.CREATING.value,
                        "runner": "kubernetes",
                        "shell": "gone-host:/gone/home",
                        "updated_at": "2026-01-01T00:00:00.000Z",
                    }
                )
            )
    finally:
        engine.dispose()
    with two.client(timeout=SLOW) as api:
        answer = api.get("/api/data/orphaned/items/a")
        assert answer.status_code == 200, answer.text  # was 503 after the whole wake time
