"""Pods among several shells (docs/decisions.md "Several shells: pods taken over"): two real
shells (two homes) on one PostgreSQL database and one namespace of the fake cluster
(tests/kube/conftest.py says why a fake). A pod's crash is one `app:crashed` in the shared event
log whichever shells run; a shell killed with SIGKILL leaves its pods running, and the other
takes its instances over within seconds: the same pods, no hook called again, the views going
on through it."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from atrium.identity import new_token
from atrium.lifecycle.runners.kubernetes import render
from atrium.lifecycle.states import InstanceState
from atrium.state.locks import lock_key
from atrium.state.schema import events, instances
from tests.integration.conftest import RunningShell, launch_shell, serving, wait_for
from tests.kube.cluster import FakeCluster
from tests.kube.test_several_shells_origins import (
    PROBE,
    SLOW,
    StartShell,
    enter,
    free_port,
    kube_shells,
    new_view,
    probe_site,
)

__all__ = ["kube_shells"]  # the fixture, shared with the origins' tests


def crashes(url: str, iid: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(events.c.data).where(events.c.topic == "app:crashed"))
            return sum(1 for (data,) in rows if data.get("instanceId") == iid)
    finally:
        engine.dispose()


def row_of(url: str, iid: str) -> Any:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(instances).where(instances.c.id == iid)).first()
    finally:
        engine.dispose()


def test_a_pods_crash_is_one_app_crashed_and_its_row_says_error(
    kube_shells: StartShell,
) -> None:
    one, two = kube_shells("one"), kube_shells("two")
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
        api.post(f"/api/proxy/{iid}/exit?code=3")
        wait_for(
            lambda: (row := row_of(url, iid)) is not None and row.state == "error",
            "the crashed instance's row says error",
            SLOW,
        )
        wait_for(lambda: crashes(url, iid) == 1, "app:crashed in the shared log", SLOW)
        # the pod's later events (its deletion by the reset) are no crash again, on either shell
        assert api.post(f"/api/instances/{iid}/reset").status_code == 200
        assert two.shell.lifecycle.find(iid) is None
    assert crashes(url, iid) == 1
    # one lives: two sees its shell lock held, and takes nothing over
    name = one.shell.lifecycle.rows.shell  # type: ignore[union-attr]
    assert two.on_loop(two.shell.coordination.shells_alive({name, "gone"})) == {name}


@dataclass
class Site:
    url: str
    namespace: str
    cluster: FakeCluster
    system_apps: Path
    token: str


@pytest.fixture
def site(tmp_path: Path, kube_settings: FakeCluster, postgres_server: str) -> Iterator[Site]:
    cluster = kube_settings
    namespace, url, system_apps = probe_site(tmp_path, cluster, postgres_server)
    try:
        yield Site(url, namespace, cluster, system_apps, new_token())
    finally:
        cluster.call(cluster.api.remove, "v1/namespaces", "", namespace)


def in_process(site: Site, home: Path) -> RunningShell:
    port = free_port()
    return launch_shell(
        home,
        site.system_apps,
        database_url=site.url,
        token=site.token,
        host="0.0.0.0",  # noqa: S104 - pods reach the shell on the bridge
        port=port,
        runner="kubernetes",
        kube_config=site.cluster.kubeconfig,
        kube_namespace=site.namespace,
        kube_shell_url=f"http://{site.cluster.host_address}:{port}",
        kube_start_timeout_seconds=30.0,
    )


def test_a_killed_shells_instance_is_taken_over_with_its_pod_and_its_views(
    site: Site, tmp_path: Path
) -> None:
    port = free_port()
    two: RunningShell | None = None
    try:
        with serving(
            tmp_path / "one",
            stop=signal.SIGKILL,
            ATRIUM_DATABASE_URL=site.url,
            ATRIUM_TOKEN=site.token,
            ATRIUM_SYSTEM_APPS=str(site.system_apps),
            ATRIUM_HOST="0.0.0.0",  # noqa: S104
            ATRIUM_PORT=str(port),
            ATRIUM_RUNNER="kubernetes",
            ATRIUM_KUBE_CONFIG=str(site.cluster.kubeconfig),
            ATRIUM_KUBE_NAMESPACE=site.namespace,
            ATRIUM_KUBE_SHELL_URL=f"http://{site.cluster.host_address}:{port}",
            ATRIUM_KUBE_START_TIMEOUT_SECONDS="30",
        ) as one:
            two = in_process(site, tmp_path / "two")
            with one.client(timeout=SLOW) as api:
                api.headers["Authorization"] = f"Bearer {site.token}"
                launched = api.post("/api/instances", json={"appId": PROBE})
                assert launched.status_code == 200, launched.text
                iid = launched.json()["instanceId"]
                boot = api.get(f"/api/proxy/{iid}/boot").json()
                assert boot["hooks"] == ["onCreate", "onStart"]
                _, view_url = new_view(api, iid)
            pod = site.cluster.pod(site.namespace, render.pod_name(iid))
            assert pod is not None
            uid = pod["metadata"]["uid"]
            on_two = enter(two, view_url)  # two serves one's pod from its row
            assert on_two.get("/boot").json()["boot"] == boot["boot"]
            assert row_of(site.url, iid).shell != two.shell.lifecycle.rows.shell  # type: ignore[union-attr]
            # the first try is refused (as by a Role without 'patch'): no crash, tried again
            site.cluster.fail_next("PATCH", rf"/pods/{render.pod_name(iid)}$", 403)
            one.proc.kill()
            one.proc.wait()

        def taken() -> bool:
            instance = two.shell.lifecycle.find(iid)
            return instance is not None and instance.state is InstanceState.STARTED

        wait_for(taken, "two takes the killed shell's instance over", 15)
        with closing(on_two):
            page = on_two.get("/boot")
            assert page.status_code == 200, page.text
            # the same process in the same pod: no respawn, no hook called again
            assert page.json() == boot
        after = site.cluster.pod(site.namespace, render.pod_name(iid))
        assert after is not None
        assert after["metadata"]["uid"] == uid
        # relabelled: two's watch and its next start's survivors, never one's
        assert after["metadata"]["labels"][render.LABEL_SHELL] == render.label_value(
            render.shell_key(str(tmp_path / "two"), site.namespace)
        )
        assert row_of(site.url, iid).shell == two.shell.lifecycle.rows.shell  # type: ignore[union-attr]
        assert crashes(site.url, iid) == 0
        assert not site.cluster.api.faults  # the refusal was met
        with two.client(timeout=SLOW) as api:
            shown = api.get(f"/api/instances/{iid}")
            assert shown.status_code == 200, shown.text
            assert shown.json()["state"] == "started"
            assert shown.json()["views"] == 1
    finally:
        if two is not None and two.thread.is_alive():
            two.stop()


def test_a_shell_cut_off_lets_go_of_what_another_took_over_and_calls_no_hook(
    kube_shells: StartShell,
) -> None:
    """Shell 1's beacon session ended and its shell lock held by someone else (as when its link
    is cut until the server ends its sessions): shell 2 takes its instance over; shell 1, back,
    lets the instance go before it acts again, without a hook, a row or a crash of its own."""
    one, two = kube_shells("one"), kube_shells("two")
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
        boot = api.get(f"/api/proxy/{iid}/boot").json()
        _, view_url = new_view(api, iid)
    uid = site_pod_uid(one, iid)
    coordination = one.shell.coordination
    with cut_until_taken(one, two, iid):
        pass
    wait_for(lambda: one.shell.lifecycle.find(iid) is None, "one lets the instance go", 15)
    wait_for(lambda: coordination.lost is None, "one back", 15)
    with closing(enter(two, view_url)) as on_two:
        assert on_two.get("/boot").json() == boot  # the same process: no hook called again
    assert site_pod_uid(one, iid) == uid
    assert row_of(url, iid).shell == two.shell.lifecycle.rows.shell  # type: ignore[union-attr]
    assert crashes(url, iid) == 0
    # the pod's token is its app on both: two holds it now, and one let it go without revoking it
    token = two.shell.lifecycle.get(iid).token
    assert token is not None
    for shell in (one, two):
        with shell.client(token=token) as app:
            unset = app.get(f"/api/kv/app/{PROBE}/unset")
            assert unset.status_code == 404, unset.text  # known, and the key is not set
    with one.client(timeout=SLOW) as api:
        # one acts on it no more: two does (one asks it, as any shell not holding it would)
        stopped = api.post(f"/api/instances/{iid}/stop")
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["state"] == "stopped"
    assert one.shell.lifecycle.find(iid) is None
    assert two.shell.lifecycle.get(iid).state is InstanceState.STOPPED
    with one.client(timeout=SLOW) as api:
        removed = api.delete(f"/api/instances/{iid}")
        assert removed.status_code in (200, 204), removed.text
    with one.client(token=token) as app:  # removed by two: its token refused on one too
        wait_for(
            lambda: app.get(f"/api/kv/app/{PROBE}/unset").status_code == 401,
            "the removed instance's token refused on one",
        )


@contextmanager
def cut_until_taken(one: RunningShell, two: RunningShell, iid: str) -> Iterator[None]:
    """One's link cut: its sessions end at the server (its shell lock with them) and it cannot
    connect again until the cut ends (the network namespaces of the failover test cut a real
    link; here the lock sessions' engine refuses), until two has taken ``iid`` over; the body
    runs then, one still cut off."""
    with cut_off(one):
        wait_for(taken_by(two, iid), "two takes the cut-off shell's instance over", 15)
        # one acts on nothing meanwhile, once its beacon's next check (within a second of its
        # session's end) has found the session gone: two may have taken over before that
        wait_for(lambda: one.shell.coordination.lost is not None, "one knows it is cut off", 5)
        yield


@contextmanager
def cut_off(one: RunningShell) -> Iterator[None]:
    """One's link cut while the body runs (`cut_until_taken`)."""
    key = lock_key("shell", one.shell.lifecycle.rows.shell)  # type: ignore[union-attr]
    coordination = one.shell.coordination
    cut = Cut(coordination._engine)
    engine = sa.create_engine(one.shell.settings.state_url)
    try:
        coordination._engine = cut  # type: ignore[assignment]
        with engine.connect() as conn:
            hi, lo = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1"
                ),
                {"hi": hi, "lo": lo},
            )
            conn.commit()
        yield
    finally:
        cut.over = True
        engine.dispose()


def taken_by(two: RunningShell, iid: str) -> Callable[[], bool]:
    def taken() -> bool:
        instance = two.shell.lifecycle.find(iid)
        return instance is not None and instance.state is InstanceState.STARTED

    return taken


def test_a_takeover_refused_midway_leaves_the_pod_labelled_as_its_row_says(
    kube_shells: StartShell, kube_settings: FakeCluster
) -> None:
    """A takeover whose relabelling is refused midway (its claim's patch, here) gives the row
    back to the gone shell and the next look tries again. It was a SpawnFailed the takeover let
    through: the row stayed the taker's, the instance `installed` in its index, never tried
    again; and the pod, relabelled first, was left the taker's (a shell started again on the
    gone one's home found no survivor for its row, swept it, and the pod ran on unheld). The pod
    is relabelled last, and what was relabelled before a refusal is put back."""
    one, two = kube_shells("one"), kube_shells("two")
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
    ones = pod_label(one, iid)
    faults = kube_settings.api
    faults.fail_next("PATCH", r"/persistentvolumeclaims/", 403, count=1000)
    refusal = faults.faults[-1]
    with cut_off(one):
        wait_for(lambda: refusal.count < 999, "two tries twice to take the instance over", 15)
        name = one.shell.lifecycle.rows.shell  # type: ignore[union-attr]
        wait_for(lambda: row_of(url, iid).shell == name, "the row given back", 5)
        assert pod_label(two, iid) == ones
        secret = kube_settings.call(
            faults.get, "v1/secrets", namespace_of(one), render.secret_name(iid)
        )
        assert secret is not None
        assert secret["metadata"]["labels"][render.LABEL_SHELL] == ones
        with faults._fault_lock:
            faults.faults.remove(refusal)
        wait_for(taken_by(two, iid), "two takes the instance over once allowed", 15)
    assert pod_label(two, iid) != ones
    assert crashes(url, iid) == 0


def namespace_of(shell: RunningShell) -> str:
    runner: Any = shell.shell.lifecycle._booter.runner
    return str(runner.namespace)


def pod_label(shell: RunningShell, iid: str) -> str:
    async def read() -> str:
        runner: Any = shell.shell.lifecycle._booter.runner
        pod = await runner.read_pod(render.pod_name(iid))
        return str(pod["metadata"]["labels"][render.LABEL_SHELL])

    label: str = shell.on_loop(read())
    return label


def test_a_shell_cut_off_lets_go_of_what_another_took_over_and_removed(
    kube_shells: StartShell,
) -> None:
    """Taken over while shell 1 was cut off, the instance is removed on shell 2 (its row and pod
    gone): back, shell 1 let go only of instances whose rows name another shell, and kept this
    one, started, its pod gone (a ghost whose watch would one day say it crashed)."""
    one, two = kube_shells("one"), kube_shells("two")
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
    with cut_until_taken(one, two, iid), two.client(timeout=SLOW) as api:
        assert api.delete(f"/api/instances/{iid}").status_code == 200
        wait_for(lambda: row_of(url, iid) is None, "the removed instance's row gone", SLOW)
    wait_for(lambda: one.shell.coordination.lost is None, "one back", 15)
    wait_for(lambda: one.shell.lifecycle.find(iid) is None, "one lets the instance go", 15)
    assert row_of(url, iid) is None
    assert crashes(url, iid) == 0


class Cut:
    """An engine whose new connections are refused until ``over``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.over = False

    def connect(self) -> Any:
        """Refused at the call, as a real engine's is at its await or ``async with`` (the
        shell uses both: an ``async def`` here failed the second with a coroutine never
        awaited, a warning that failed the test when shell one led a takeover in the cut)."""
        if not self.over:
            raise ConnectionRefusedError("the link is cut")
        return self.engine.connect()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def site_pod_uid(shell: RunningShell, iid: str) -> str:
    async def read() -> str:
        runner: Any = shell.shell.lifecycle._booter.runner
        pod = await runner.read_pod(render.pod_name(iid))
        return str(pod["metadata"]["uid"])

    uid: str = shell.on_loop(read())
    return uid


class CutWrites:
    """The instance rows' writer's database, whose write transactions fail until ``over`` (its
    reads go on): the writer keeps what it could not write and tries again each second."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.over = False

    def transaction(self) -> Any:
        if not self.over:
            raise ConnectionRefusedError("the link is cut")
        return self.db.transaction()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def test_a_row_write_queued_during_a_cut_writes_no_ghost_of_an_instance_taken_and_removed(
    kube_shells: StartShell,
) -> None:
    """A change of shell 1's instance is noted while its row writer cannot reach the database
    (as a state change made just before a cut is), and stays queued through the cut. Shell 2
    takes the instance over and removes it meanwhile. Back, the queued write inserted the row
    again, naming shell 1 (a ghost for a pod gone), and shell 1 kept the instance since a write
    of it was pending; now the writer only updates a row it wrote where it still names shell 1,
    writes nothing, and shell 1 lets the instance go."""
    one, two = kube_shells("one"), kube_shells("two")
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
    rows = one.shell.lifecycle.rows
    assert rows is not None
    wait_for(lambda: row_of(url, iid).state == "started", "the started row written", SLOW)
    writes = CutWrites(rows._db)
    rows._db = writes  # type: ignore[assignment]

    async def noted() -> None:
        rows.touch(one.shell.lifecycle.get(iid))

    try:
        one.on_loop(noted())
        with cut_until_taken(one, two, iid), two.client(timeout=SLOW) as api:
            assert rows.pending(iid)
            assert api.delete(f"/api/instances/{iid}").status_code == 200
            wait_for(lambda: row_of(url, iid) is None, "the removed instance's row gone", SLOW)
            writes.over = True
        wait_for(lambda: one.shell.coordination.lost is None, "one back", 15)
        wait_for(lambda: one.shell.lifecycle.find(iid) is None, "one lets the instance go", 15)
        wait_for(lambda: not rows.pending(iid), "the queued write tried", 5)
        one.on_loop(rows.flush())
        assert row_of(url, iid) is None
    finally:
        writes.over = True
        rows._db = writes.db
    assert crashes(url, iid) == 0


def end_every_session(url: str) -> None:
    """Every session of the database ended at once, as a restart of PostgreSQL ends them."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
            conn.commit()
    finally:
        engine.dispose()


def test_a_restart_of_postgresql_takes_no_living_shells_pods_over(
    kube_shells: StartShell,
) -> None:
    """Every session ends at once (a restart of the server), so every shell lock is free for a
    moment: shell 2, back first and leading, saw shell 1's lock free and took its pods over
    though shell 1 lived (here shell 1 comes back a little later: its lock sessions' engine
    refuses until shell 2 has taken a turn as leader). A shell back after a loss of its own
    counts no shell dead for `SETTLE` s, by which time shell 1 holds its lock again."""
    one, two = kube_shells("one"), kube_shells("two")
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
    wait_for(lambda: row_of(url, iid).state == "started", "the started row written", SLOW)
    name = one.shell.lifecycle.rows.shell  # type: ignore[union-attr]
    takeover = two.shell.lifecycle.takeover
    assert takeover is not None
    leader = two.shell.coordination
    connected = leader._connected_at
    coordination = one.shell.coordination
    cut = Cut(coordination._engine)
    coordination._engine = cut  # type: ignore[assignment]
    try:
        end_every_session(url)
        wait_for(
            lambda: leader._connected_at != connected and leader.is_leader,
            "two back and leading",
            15,
        )
        # one's lock is free now: the rule of before took its pods over at two's next turn
        assert two.on_loop(leader.shells_alive({name})) == set()
        turns = takeover.turns
        wait_for(lambda: takeover.turns > turns, "a turn of two's as leader, one still away", 5)
    finally:
        cut.over = True
    wait_for(lambda: coordination.lost is None, "one back", 15)
    wait_for(lambda: leader.settled, "two settled", 15)
    turns = takeover.turns
    wait_for(lambda: takeover.turns > turns + 1, "two's looks once settled", 5)
    assert two.shell.lifecycle.find(iid) is None
    assert row_of(url, iid).shell == name
    assert one.shell.lifecycle.get(iid).state is InstanceState.STARTED
    assert crashes(url, iid) == 0


def test_a_takeover_acts_only_on_the_row_as_it_is_under_the_lock(
    kube_shells: StartShell,
) -> None:
    """The leader lists the rows of other shells' pods, then takes each under its instance's
    lock. The compare-and-set of the row's shell did not cover a row that changed meanwhile
    and still named the gone shell: shell 1 stopped its instance (its pod deleted, its row
    `stopped`) after the list was read and before it went, and shell 2 took the pod of the list
    over: gone, so one `app:crashed` for an instance stopped on purpose, and it was shell 2's,
    in `error`. The list's read of the row is kept here (the race is milliseconds wide) and
    handed to the takeover once shell 1 is gone: the row's move is rolled back, nothing taken.
    Shell 2's own looks meanwhile leave the stopped row alone too (its `ref` still names the
    deleted pod: they took it over the same way)."""
    one, two = kube_shells("one"), kube_shells("two")
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
        wait_for(lambda: row_of(url, iid).state == "started", "the started row written", SLOW)
        listed = row_of(url, iid)
        stopped = api.post(f"/api/instances/{iid}/stop")
        assert stopped.status_code == 200, stopped.text
    wait_for(lambda: row_of(url, iid).state == "stopped", "the stopped row written", SLOW)
    takeover = two.shell.lifecycle.takeover
    assert takeover is not None
    name = one.shell.lifecycle.rows.shell  # type: ignore[union-attr]
    with cut_off(one):
        wait_for(lambda: not two.on_loop(two.shell.coordination.shells_alive({name})), "one gone")
        assert two.on_loop(takeover._take(listed)) is False
        after = row_of(url, iid)
        assert (after.shell, after.state) == (name, "stopped")
        assert two.shell.lifecycle.find(iid) is None
    assert crashes(url, iid) == 0


def test_a_gone_shells_instance_whose_app_is_not_here_is_tried_again_later_and_said_once(
    kube_shells: StartShell, caplog: pytest.LogCaptureFixture
) -> None:
    """An instance of a gone shell whose app the leader does not have (here its row names an
    app nobody installed) cannot be taken over: it was tried again every second, forever. The
    tries now come twice as late each time (up to `LATER_MAX` s), said once in the log; the
    pod runs on meanwhile, served from its row."""
    one, two = kube_shells("one"), kube_shells("two")
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
    wait_for(lambda: row_of(url, iid).state == "started", "the started row written", SLOW)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.update(instances).where(instances.c.id == iid).values(app_id="test.not.here")
            )
    finally:
        engine.dispose()
    manager = two.shell.lifecycle
    takeover = manager.takeover
    assert takeover is not None
    tries: list[str] = []
    made = manager.new_instance

    def counted(app_id: str, *args: Any, **kwargs: Any) -> Any:
        tries.append(app_id)
        return made(app_id, *args, **kwargs)

    manager.new_instance = counted  # type: ignore[method-assign]
    with cut_off(one):
        wait_for(lambda: "test.not.here" in tries, "two tries to take the instance over", 15)
        turns = takeover.turns
        wait_for(lambda: takeover.turns >= turns + 5, "five more turns of two's", 15)
        assert 1 <= tries.count("test.not.here") <= 3, tries
        assert two.shell.lifecycle.find(iid) is None
        said = [r for r in caplog.records if "cannot be taken over here" in r.getMessage()]
        assert len(said) == 1, said
    assert row_of(url, iid).shell == one.shell.lifecycle.rows.shell  # type: ignore[union-attr]
    assert crashes(url, iid) == 0


def test_a_gone_shells_row_with_no_pod_is_left_to_its_home(kube_shells: StartShell) -> None:
    """An instance whose shell died before its spawn returned has no pod in its row: the
    leader leaves it (docs/decisions.md "Several shells: what the leader does not take
    over"); the shell started again on that home removes it."""
    two = kube_shells("two")
    url = two.shell.settings.state_url
    gone = "elsewhere:/gone/home"
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(instances).values(
                    id="test.contract.probe-9",
                    app_id=PROBE,
                    owner="default",
                    slug="nopodyet",
                    state="starting",
                    runner="kubernetes",
                    ref=None,
                    network=None,
                    address=None,
                    secret=None,
                    shell=gone,
                    updated_at="2026-01-01T00:00:00.000Z",
                )
            )
    finally:
        engine.dispose()
    takeover = two.shell.lifecycle.takeover
    assert takeover is not None
    wait_for(lambda: two.shell.coordination.settled, "two settled", 15)
    turns = takeover.turns
    wait_for(lambda: takeover.turns >= turns + 2, "two more looks of two's", 5)
    row = row_of(url, "test.contract.probe-9")
    assert (row.shell, row.state) == (gone, "starting")
    assert two.shell.lifecycle.find("test.contract.probe-9") is None
    assert crashes(url, "test.contract.probe-9") == 0
