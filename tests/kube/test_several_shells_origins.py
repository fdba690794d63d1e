"""Any shell serves any app origin (docs/deploying.md "Several shells"): two real shells (two
homes) on one PostgreSQL database, both with the Kubernetes runner on the fake cluster
(tests/kube/conftest.py says why a fake). An instance started by shell 1 runs in a pod every
shell reaches; its view, made on shell 1, is entered on shell 2, which serves its pages from that
pod and refuses the view as soon as shell 1 releases it, disables its user or removes the
instance; a ticket works once across both shells."""

from __future__ import annotations

import json
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import sqlalchemy as sa

from atrium.lifecycle.states import InstanceState
from atrium.state.locks import instance_key
from atrium.state.migrate import upgrade_now
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, launch_shell, wait_for
from tests.kube.cluster import FakeCluster
from tests.postgres import new_database

PROBE = "test.contract.probe"
SLOW = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))  # noqa: S104 - pods reach the shell on the bridge
        port: int = probe.getsockname()[1]
        return port


StartShell = Callable[..., RunningShell]


def probe_site(tmp_path: Path, cluster: FakeCluster, postgres_server: str) -> tuple[str, str, Path]:
    """A namespace of its own in the fake cluster, a new migrated database and a system apps
    folder holding the probe app: ``(namespace, database url, system apps)``."""
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    cluster.call(cluster.api.create, "v1/namespaces", "", {"metadata": {"name": namespace}})
    url = new_database(postgres_server)
    upgrade_now(url)
    system_apps = tmp_path / "system-apps"
    system_apps.mkdir()
    shutil.copytree(TESTS_DIR / "apps" / PROBE, system_apps / PROBE)
    return namespace, url, system_apps


@pytest.fixture
def kube_shells(
    tmp_path: Path, kube_settings: FakeCluster, postgres_server: str
) -> Iterator[StartShell]:
    """Start (and restart) shells, each on the home named, on one PostgreSQL database and one
    namespace of the fake cluster (``runner`` another than `kubernetes`: a shell of local
    instances on that database)."""
    cluster = kube_settings
    namespace, url, system_apps = probe_site(tmp_path, cluster, postgres_server)
    shells: list[RunningShell] = []

    def start(name: str, runner: str = "kubernetes", **overrides: Any) -> RunningShell:
        port = free_port()
        shell = launch_shell(
            tmp_path / name,
            system_apps,
            database_url=url,
            host="0.0.0.0",  # noqa: S104
            port=port,
            runner=runner,
            kube_config=cluster.kubeconfig,
            kube_namespace=namespace,
            kube_shell_url=f"http://{cluster.host_address}:{port}",
            kube_start_timeout_seconds=30.0,
            **overrides,
        )
        shells.append(shell)
        return shell

    try:
        yield start
    finally:
        for shell in shells:
            if shell.thread.is_alive():
                shell.stop()
        # the shells leave their pods running (they outlive a shell): the namespace takes them
        cluster.call(cluster.api.remove, "v1/namespaces", "", namespace)


@pytest.fixture
def two_kube_shells(kube_shells: StartShell) -> tuple[RunningShell, RunningShell]:
    return kube_shells("one"), kube_shells("two")


def on_origin(shell: RunningShell, url: str) -> tuple[httpx.Client, str]:
    """A client of ``shell`` that names the app origin of ``url`` in its `Host`, at that shell's
    port (behind a load balancer every shell is reached at the one port users see)."""
    parts = urlsplit(url)
    host = f"{parts.hostname}:{urlsplit(shell.url).port}"
    client = httpx.Client(base_url=shell.url, headers={"Host": host}, timeout=SLOW)
    return client, parts.path + (f"?{parts.query}" if parts.query else "")


def enter(shell: RunningShell, url: str) -> httpx.Client:
    """The view entered on ``shell`` through its ticket: a client carrying its cookie."""
    client, target = on_origin(shell, url)
    response = client.get(target, follow_redirects=False)
    assert response.status_code == 303, response.text
    value = response.headers["set-cookie"].split(";", 1)[0].split("=", 1)[1]
    client.headers["Cookie"] = f"atrium_view={value}"
    return client


def new_view(api: httpx.Client, iid: str) -> tuple[str, str]:
    made = api.post(f"/api/instances/{iid}/views", json={"path": "/boot"})
    assert made.status_code == 200, made.text
    return made.json()["viewId"], made.json()["url"]


def test_a_view_made_on_one_shell_is_served_by_the_other_from_the_pod_until_ended(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    one, two = two_kube_shells
    with one.client(timeout=SLOW) as api:
        launched = api.post("/api/instances", json={"appId": PROBE})
        assert launched.status_code == 200, launched.text
        iid = launched.json()["instanceId"]
        boot = api.get(f"/api/proxy/{iid}/boot").json()["boot"]
        view_a, url_a = new_view(api, iid)

        # made on one, entered on two: two serves the page from one's pod
        with closing(enter(two, url_a)) as on_two:
            assert two.shell.lifecycle.find(iid) is None  # two runs no instance of its own
            page = on_two.get("/boot")
            assert page.status_code == 200, page.text
            assert page.json()["boot"] == boot
            assert page.headers["x-os-app-id"] == PROBE
            # the shell's API as the app, on two: a KV write that one reads
            own = f"http://{on_two.headers['Host']}"
            put = on_two.put(
                "/_os/api/kv/app/test.contract.probe/seen",
                content=json.dumps({"value": "on two"}),
                headers={"Origin": own, "Content-Type": "application/json"},
            )
            assert put.status_code in (200, 204), put.text
            read = api.get("/api/kv/app/test.contract.probe/seen")
            assert read.status_code == 200, read.text
            assert read.json()["value"] == "on two"

            # the ticket is one-time across shells: used on two, refused on one and on two
            for shell in (one, two):
                again, target = on_origin(shell, url_a)
                with closing(again):
                    used = again.get(target, follow_redirects=False)
                    assert used.status_code == 401, used.text

            # the same cookie on one, which holds the view in memory
            cookie = on_two.headers["Cookie"]
            at_one, _ = on_origin(one, url_a)
            with closing(at_one):
                at_one.headers["Cookie"] = cookie
                assert at_one.get("/boot").json()["boot"] == boot

            # a second view keeps the instance running; the first released on one is refused
            # on two at once (two checks another shell's views in the database)
            _, url_b = new_view(api, iid)
            with closing(enter(one, url_b)):
                released = api.delete(f"/api/instances/{iid}/views/{view_a}")
                assert released.status_code in (200, 204), released.text
                gone = on_two.get("/boot")
                assert gone.status_code == 401, gone.text

        # a ticket redeemed on both shells at once works on one of them
        _, url_d = new_view(api, iid)
        clients = [on_origin(shell, url_d) for shell in (one, two)]
        with ThreadPoolExecutor(2) as pool:
            answers = list(
                pool.map(lambda pair: pair[0].get(pair[1], follow_redirects=False), clients)
            )
        for client, _ in clients:
            client.close()
        assert sorted(a.status_code for a in answers) == [303, 401]

        # a grantee's view entered on two is refused there once one disables them
        bob = one.add_user("bob")
        granted = api.post(f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"})
        assert granted.status_code == 201, granted.text
        with one.client(bob, timeout=SLOW) as as_bob:
            _, url_e = new_view(as_bob, iid)
        with closing(enter(two, url_e)) as bob_on_two:
            assert bob_on_two.get("/boot").status_code == 200
            disabled = api.patch("/api/users/bob", json={"disabled": True})
            assert disabled.status_code == 200, disabled.text
            wait_for(
                lambda: bob_on_two.get("/boot").status_code == 401,
                "the disabled grantee's view refused on two",
                SLOW,
            )

        # the instance removed on one: its view entered on two is refused there
        _, url_c = new_view(api, iid)
        with closing(enter(two, url_c)) as on_two:
            assert on_two.get("/boot").status_code == 200
            removed = api.delete(f"/api/instances/{iid}")
            assert removed.status_code in (200, 204), removed.text
            wait_for(
                lambda: on_two.get("/boot").status_code in (401, 404),
                "the removed instance's view refused on two",
                SLOW,
            )


@contextmanager
def instance_lock_held(url: str, iid: str) -> Iterator[Callable[[], None]]:
    """The instance's advisory lock held by a session of the test's own (as a shell holds it
    for a move) until the function yielded is called: a takeover waits there."""
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": instance_key(iid)})

            def release() -> None:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": instance_key(iid)})

            yield release
    finally:
        engine.dispose()


def waited_for(url: str, iid: str) -> bool:
    """Whether a session waits for the instance's advisory lock."""
    key = instance_key(iid)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                        " AND objsubid = 1 AND classid::bigint = :hi AND objid::bigint = :lo"
                    ),
                    {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_a_stopped_shells_pod_is_taken_over_by_the_other_and_stays_there(
    kube_shells: StartShell,
) -> None:
    """A shell that stops leaves its pods and their rows: the other shell keeps serving a view
    of one, and takes it over once the stopped shell's session is gone (docs/decisions.md
    "Several shells: pods taken over"), under the same origin and the same pod. Back, the
    stopped shell does not adopt it again: it is the other's now.

    While the takeover is under way (held here at the instance's lock, as a busy database or
    cluster holds it for a moment) the view is still served: the taker listed the instance as
    its own from the start, not yet serving and with no view, so the view's next request there
    was refused (401) and its row deleted as a view made for a stopped instance, for good."""
    one, two = kube_shells("one"), kube_shells("two")
    db_url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        launched = api.post("/api/instances", json={"appId": PROBE})
        assert launched.status_code == 200, launched.text
        iid = launched.json()["instanceId"]
        boot = api.get(f"/api/proxy/{iid}/boot").json()["boot"]
        _, url = new_view(api, iid)
    with closing(enter(two, url)) as on_two:

        def served() -> None:
            page = on_two.get("/boot")
            assert page.status_code == 200, page.text
            assert page.json()["boot"] == boot  # the same pod, never restarted

        served()
        with instance_lock_held(db_url, iid) as release:
            one.stop()
            served()
            wait_for(lambda: waited_for(db_url, iid), "two's takeover waits for the lock", SLOW)
            served()
            release()
            wait_for(
                lambda: (
                    (taken := two.shell.lifecycle.find(iid)) is not None
                    and taken.state is InstanceState.STARTED
                ),
                "two takes it over",
                SLOW,
            )
        served()
        again = kube_shells("one")
        assert again.shell.lifecycle.find(iid) is None
        served()


def test_a_view_of_one_shells_pod_is_made_and_released_on_the_other(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """The host page's calls reach any shell behind the balancer: a view of shell 1's pod made
    on shell 2 is entered and paged on either shell and held in shell 1's memory (where views
    drive stop-when-unviewed); released on shell 2, it is refused on both and shell 1 forgets
    it, and stops the instance when that was its last view. Shell 2 answers
    `GET /api/instances/{id}` from the row and refuses a user without a grant as shell 1 does
    (its actions, asked of shell 1: test_several_shells_actions.py)."""
    one, two = two_kube_shells
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        launched = api.post("/api/instances", json={"appId": PROBE})
        assert launched.status_code == 200, launched.text
        iid = launched.json()["instanceId"]
        boot = api.get(f"/api/proxy/{iid}/boot").json()["boot"]
        held = one.shell.lifecycle.get(iid)
        view_kept, _ = new_view(api, iid)  # keeps the instance running through the release

        seen = api_two.get(f"/api/instances/{iid}")
        assert seen.status_code == 200, seen.text
        assert seen.json()["state"] == "started"
        assert seen.json()["port"] is None
        assert seen.json()["pid"] is None
        assert "secret" not in seen.text

        view_a, url_a = new_view(api_two, iid)
        assert two.shell.lifecycle.find(iid) is None
        wait_for(lambda: view_a in held.views, "one learns the view made on two", SLOW)
        with closing(enter(one, url_a)) as on_one:
            assert on_one.get("/boot").json()["boot"] == boot
            at_two, _ = on_origin(two, url_a)
            with closing(at_two):
                at_two.headers["Cookie"] = on_one.headers["Cookie"]
                assert at_two.get("/boot").json()["boot"] == boot

                released = api_two.delete(f"/api/instances/{iid}/views/{view_a}")
                assert released.status_code == 200, released.text
                assert at_two.get("/boot").status_code == 401
                assert on_one.get("/boot").status_code == 401
                wait_for(lambda: view_a not in held.views, "one forgets the released view", SLOW)
                again = api_two.delete(f"/api/instances/{iid}/views/{view_a}")
                assert again.status_code == 404, again.text
        assert held.state.value == "started"  # the view made on one still holds it

        # a grantee makes and closes their own view on two; a user without a grant is refused
        # there as on one
        bob = one.add_user("bob")
        granted = api.post(f"/api/instances/{iid}/grants", json={"user": "bob", "role": "viewer"})
        assert granted.status_code == 201, granted.text
        eve = one.add_user("eve")
        with two.client(bob, timeout=SLOW) as bob_on_two:
            view_b, url_b = new_view(bob_on_two, iid)
            with closing(enter(one, url_b)) as bob_on_one:
                assert bob_on_one.get("/boot").json()["boot"] == boot
            assert bob_on_two.get(f"/api/instances/{iid}").status_code == 404  # the owner's
            for shell in (one, two):
                with shell.client(eve, timeout=SLOW) as as_eve:
                    refused = as_eve.post(f"/api/instances/{iid}/views", json={"path": "/boot"})
                    assert refused.status_code == 404, refused.text
                    assert as_eve.get(f"/api/instances/{iid}").status_code == 404
                    closed = as_eve.delete(f"/api/instances/{iid}/views/{view_b}")
                    assert closed.status_code == 404, closed.text
            closed = bob_on_two.delete(f"/api/instances/{iid}/views/{view_b}")
            assert closed.status_code == 200, closed.text
        wait_for(lambda: view_b not in held.views, "one forgets bob's released view", SLOW)

        # its last view released on two: one stops it, as a release on one does
        last = api_two.delete(f"/api/instances/{iid}/views/{view_kept}")
        assert last.status_code == 200, last.text
        wait_for(lambda: held.state.value == "stopped", "one stops its unviewed instance", SLOW)
        wait_for(
            lambda: api_two.get(f"/api/instances/{iid}").json()["state"] == "stopped",
            "two reads the stopped state from the row",
            SLOW,
        )
        stopped = api_two.post(f"/api/instances/{iid}/views", json={"path": "/boot"})
        assert stopped.status_code == 409, stopped.text  # one alone starts it
        assert stopped.json()["error"]["code"] == "not_serving"
