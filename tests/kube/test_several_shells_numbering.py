"""Every instance id unique across shells (docs/decisions.md "Several shells: one numbering of
instances", "Several shells: pooled, headless and trial instances numbered too"): two real
shells on one PostgreSQL database and one namespace of the fake cluster (tests/kube/conftest.py
says why a fake), where a pod, its Secret and its claim are named by the instance id. A launch
numbered past every shell's rows already; the warm pool's refill, a data request's headless
provider and an update's trial instance chose their ids from their shell's memory, so the
second shell's pod met the first one's name (`spawn_failed`: "another shell made it")."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from atrium.lifecycle.runners.kubernetes import render
from atrium.lifecycle.states import InstanceState
from tests.conftest import TESTS_DIR
from tests.integration.conftest import wait_for
from tests.kube.cluster import FakeCluster
from tests.kube.test_several_shells_origins import PROBE, SLOW, StartShell, kube_shells
from tests.kube.test_several_shells_pods import row_of

__all__ = ["kube_shells"]  # the fixture, shared with the origins' tests

POOLED = "test.numbering.pooled"
WOKEN = "test.numbering.woken"
TRIED = "test.numbering.tried"
SLOW_START = """import runpy, time
time.sleep(3)
runpy.run_path("server.py", run_name="__main__")
"""
PROVIDE = """
@app.provider("/items")
def items(request: Request) -> dict[str, object]:
    return {"boot": BOOT}


if __name__ == "__main__":"""


def probe_app(tmp_path: Path, app_id: str, **manifest: Any) -> None:
    """The probe app under ``app_id`` in the shells' system apps (`kube_shells`'s folder, read
    by each shell at its start), serving data under `/items` (its boot token)."""
    target = tmp_path / "system-apps" / app_id
    shutil.copytree(TESTS_DIR / "apps" / PROBE, target)
    server = target / "server.py"
    server.write_text(server.read_text().replace('if __name__ == "__main__":', PROVIDE))
    data = json.loads((target / "app.manifest.json").read_text())
    data.update({"id": app_id, **manifest})
    (target / "app.manifest.json").write_text(json.dumps(data))


def pod_instance(cluster: FakeCluster, namespace: str, iid: str) -> str | None:
    """The instance id the pod named for ``iid`` says it runs (None: no such pod)."""
    pod = cluster.pod(namespace, render.pod_name(iid))
    return None if pod is None else pod["metadata"]["annotations"][render.ANNOTATION_INSTANCE]


def test_a_pool_refill_numbers_past_another_shells_instances(
    tmp_path: Path, kube_shells: StartShell
) -> None:
    """Only the leader fills pools (each shell filling its own would boot every pool once per
    shell): shell 2, not leading, pools nothing. The leader's refill numbered from its memory:
    after shell 2 launched `<app>-2`, the leader handing out its pooled `<app>-1` refilled with
    `<app>-2` too, whose pod's Secret was shell 2's, and the refill failed again and again."""
    probe_app(tmp_path, POOLED, warmPool=1)
    one = kube_shells("one")
    lifecycle = one.shell.lifecycle
    url = one.shell.settings.state_url

    def pooled() -> list[Any]:
        return [
            i
            for i in lifecycle.of_app(POOLED)
            if lifecycle.is_pooled(i) and i.state is InstanceState.RESUMED
        ]

    [first] = wait_for(pooled, "shell 1's pool filled", SLOW)
    wait_for(lambda: row_of(url, first.id).state == "resumed", "the pooled row", SLOW)
    two = kube_shells("two")
    assert not two.shell.lifecycle.coordination.is_leader
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        made = api_two.post("/api/instances", json={"appId": POOLED, "new": True})
        assert made.status_code == 200, made.text
        theirs = made.json()["instanceId"]
        assert theirs != first.id
        assert not [
            i for i in two.shell.lifecycle.of_app(POOLED) if two.shell.lifecycle.is_pooled(i)
        ]
        taken = api.post("/api/instances", json={"appId": POOLED})
        assert taken.status_code == 200, taken.text
        assert taken.json()["instanceId"] == first.id  # handed out of the pool

        [refilled] = wait_for(pooled, "the pool refilled past shell 2's instance", 20)
        assert refilled.id not in (first.id, theirs)
        ids = [i["instanceId"] for i in api.get("/api/instances").json() if i["appId"] == POOLED]
        assert sorted(ids) == sorted({first.id, theirs, refilled.id})


def test_each_shells_headless_provider_has_an_id_of_its_own(
    tmp_path: Path, kube_shells: StartShell, kube_settings: FakeCluster
) -> None:
    """A shell wakes a provider of its own when no other shell's serves that user's requests
    where it reaches it: here shell 1 runs local instances (its provider is a process on its
    machine), so shell 2 wakes one in a pod. Both were `<app>-provider`: shell 2's pod met
    the name of shell 1's row and the request answered 503 (waking failed: spawn_failed). Now
    shell 2's provider is numbered past shell 1's row, and each shell's requests go to its own
    provider."""
    probe_app(
        tmp_path,
        WOKEN,
        dataProvider={
            "authority": "numbered",
            "providers": [{"path": "/items", "readPerm": None}],
            "wake": True,
            "idleTimeoutMs": 60_000,
        },
    )
    one, two = kube_shells("one", runner="auto"), kube_shells("two")
    namespace = two.shell.settings.kube_namespace
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        assert api.get("/api/data/numbered/items/a").status_code == 200
        [mine] = one.shell.lifecycle.of_app(WOKEN)
        assert mine.id == f"{WOKEN}-provider"
        answer = api_two.get("/api/data/numbered/items/b")
        assert answer.status_code == 200, answer.text
        [theirs] = two.shell.lifecycle.of_app(WOKEN)
        assert theirs.id == f"{WOKEN}-provider2"
        assert two.shell.lifecycle.is_headless(theirs)
        assert api_two.get("/api/data/numbered/items/c").status_code == 200
        assert two.shell.lifecycle.headless.wakes == {WOKEN: 1}  # its own provider again
        assert one.shell.lifecycle.headless.wakes == {WOKEN: 1}
        assert pod_instance(kube_settings, namespace, theirs.id) == theirs.id
        for client in (api, api_two):
            listed = [i for i in client.get("/api/instances").json() if i["appId"] == WOKEN]
            assert sorted(i["instanceId"] for i in listed) == sorted([mine.id, theirs.id])


def test_two_shells_trying_one_app_at_once_make_trial_pods_of_their_own(
    tmp_path: Path, kube_shells: StartShell, kube_settings: FakeCluster
) -> None:
    """A trial instance was `<app>-check` on every shell: an install checked on shell 2 while
    shell 1 checked the same app (each shell holds its own operations) met shell 1's trial
    Secret and failed (`install_failed`: spawn_failed). Its id is numbered past every shell's
    rows now. The app sleeps before it serves, so shell 1's trial pod is there throughout."""
    source = tmp_path / "sources" / TRIED
    shutil.copytree(TESTS_DIR / "apps" / PROBE, source)
    (source / "slow.py").write_text(SLOW_START)
    manifest = source / "app.manifest.json"
    data = {**json.loads(manifest.read_text()), "id": TRIED}
    manifest.write_text(json.dumps(data))
    one, two = kube_shells("one"), kube_shells("two")
    namespace = one.shell.settings.kube_namespace
    installing = {"ref": f"local:{source}", "autoApprove": True}
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        for client in (api, api_two):
            installed = client.post("/api/dist/install", json=installing)
            assert installed.json()["ok"] is True, installed.text
        data.update(version="2.0.0", entrypoint=["python3", "slow.py"], startTimeoutMs=20_000)
        manifest.write_text(json.dumps(data))
        update = f"/api/dist/update/{TRIED}"
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(api.post, update, json={"check": True})
            wait_for(
                lambda: first.done() or pod_instance(kube_settings, namespace, f"{TRIED}-check"),
                "shell 1's trial pod",
                SLOW,
            )
            assert not first.done(), first.result().text
            second = api_two.post(update, json={"check": True})
            assert second.json().get("ok") is True, second.text
            assert first.result().json().get("ok") is True, first.result().text
    # a trial runs on an empty folder thrown away after it: no claim kept for the next trial
    # (each trial's claim was kept, so the next one of its id started on its data)
    owner = one.shell.settings.user
    for trial in (f"{TRIED}-check", f"{TRIED}-check2"):
        name = render.claim_name(owner, trial)
        assert (
            kube_settings.call(kube_settings.api.get, "v1/persistentvolumeclaims", namespace, name)
            is None
        )


def test_a_provider_taken_over_is_not_handed_out_by_a_launch(
    tmp_path: Path, kube_shells: StartShell
) -> None:
    """Shell 1's woken provider, taken over by shell 2 when shell 1 stopped (its pod runs on),
    was an ordinary instance there: never idle-stopped (no shell's woken provider), and shell
    2's next launch of the app for its owner handed it out as the owner's page instance (a
    provider's pod, with a claim of its own, not the data of `<app>-1`). It is held as a woken
    provider now, and a launch hands out only an instance numbered as a launch numbers."""
    probe_app(
        tmp_path,
        WOKEN,
        dataProvider={
            "authority": "numbered",
            "providers": [{"path": "/items", "readPerm": None}],
            "wake": True,
            "idleTimeoutMs": 60_000,
        },
    )
    one, two = kube_shells("one"), kube_shells("two")
    with one.client(timeout=SLOW) as api:
        assert api.get("/api/data/numbered/items/a").status_code == 200
    provider = f"{WOKEN}-provider"
    one.stop()

    def taken_over() -> Any:
        instance = two.shell.lifecycle.find(provider)
        return instance if instance and instance.state is InstanceState.STARTED else None

    taken = wait_for(taken_over, "two takes it over", 20)
    # held as one of shell 2's woken providers: stopped once idle (no shell stopped it)
    assert two.shell.lifecycle.is_headless(taken)
    record = two.shell.lifecycle.headless.record(provider)
    assert record is not None
    assert record.idle_timeout == 60
    with two.client(one.token, timeout=SLOW) as api_two:
        launched = api_two.post("/api/instances", json={"appId": WOKEN})
        assert launched.status_code == 200, launched.text
        assert launched.json()["instanceId"] == f"{WOKEN}-1"


def test_an_instance_brought_back_after_a_change_is_not_doubled_by_another_shells_launch(
    kube_shells: StartShell, kube_settings: FakeCluster
) -> None:
    """A change of an app (an update, a restore) stops its instances and brings them back under
    their own ids. While one was stopped its id was free in the rows, and another shell's launch
    numbered its own with it; the bringing back took the id again without asking the rows: two
    shells held one id, and the second's pod, Secret and claim were the first's. It is claimed
    as a new instance's now: the one launched meanwhile keeps the id, and the other is not
    brought back (said in the change's answer, as any instance that fails to come back)."""
    one, two = kube_shells("one"), kube_shells("two")
    namespace = one.shell.settings.kube_namespace
    stops = one.shell.dist.stops
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        made = api.post("/api/instances", json={"appId": PROBE})
        assert made.status_code == 200, made.text
        iid = made.json()["instanceId"]
        assert one.on_loop(stops.stop_all(PROBE)) == [iid]
        url = one.shell.settings.state_url
        wait_for(lambda: row_of(url, iid) is None, "the stopped instance's row gone")
        again = api_two.post("/api/instances", json={"appId": PROBE, "new": True})
        assert again.status_code == 200, again.text
        assert again.json()["instanceId"] == iid  # the lowest free id
        pod = kube_settings.pod(namespace, render.pod_name(iid))
        assert pod is not None
        failed = one.on_loop(stops.restart(PROBE, [iid]))
        assert "another shell launched an instance under its id" in failed[iid]
        assert one.shell.lifecycle.find(iid) is None
        held = two.shell.lifecycle.get(iid)
        assert held.state is InstanceState.STARTED
        after = kube_settings.pod(namespace, render.pod_name(iid))
        assert after is not None
        assert after["metadata"]["uid"] == pod["metadata"]["uid"]  # two's pod, untouched
        rows = two.shell.lifecycle.rows
        assert rows is not None
        assert row_of(url, iid).shell == rows.shell
