"""A user's data on a cluster is the same on every shell of one database (docs/decisions.md
"Several shells: a user's data claim is every shell's"): two real shells on one PostgreSQL
database and one namespace of the fake cluster (tests/kube/conftest.py says why a fake), whose
kubelet keeps a folder per claim. A claim carried the label of the shell that made it, and
every other shell refused to mount it (`spawn_failed`: "another shell made it"): an instance
deleted on one shell could not be launched again on another, and its data was that shell's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atrium.lifecycle.runners.kubernetes import render
from tests.integration.conftest import wait_for
from tests.kube.cluster import FakeCluster
from tests.kube.test_several_shells_numbering import WOKEN, probe_app
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
