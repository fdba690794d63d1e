"""A pod no shell holds (docs/decisions.md "Several shells: a pod no shell holds is checked
before it is sent anything"): two real shells on one PostgreSQL database and one namespace of
the fake cluster (tests/kube/conftest.py says why a fake). Shell 1 stops, leaving its pod; the
leader cannot take it over (as when its app is not installed there), so the pod runs on with no
shell watching it, and shell 2 serves it from its row. The pod is then deleted and the cluster
gives its address to another pod: every shell went on sending the first instance's requests
there (pages with its user's identity, data requests, both with its shell secret)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from atrium.errors import NotFound
from atrium.lifecycle.runners.kubernetes import render
from tests.integration.conftest import RunningShell, wait_for
from tests.kube.cluster import FakeCluster
from tests.kube.test_several_shells_data import shared_provider
from tests.kube.test_several_shells_numbering import WOKEN
from tests.kube.test_several_shells_origins import (
    PROBE,
    SLOW,
    StartShell,
    enter,
    kube_shells,
    new_view,
)
from tests.kube.test_several_shells_pods import namespace_of, row_of

__all__ = ["kube_shells"]  # the fixture


def not_taken_over(two: RunningShell, iid: str) -> list[str]:
    """Shell 2 (the leader) cannot take ``iid`` over: its instance is refused as it is when the
    app is not installed on the leader (here it is: shell 2 serves it, as a shell other than
    the leader does when the leader lacks the app). The tries refused, listed."""
    manager = two.shell.lifecycle
    made = manager.new_instance
    refused: list[str] = []

    def new_instance(app_id: str, *args: Any, **kwargs: Any) -> Any:
        if args and args[0] == iid:
            refused.append(iid)
            raise NotFound("app", app_id)
        return made(app_id, *args, **kwargs)

    manager.new_instance = new_instance  # type: ignore[method-assign]
    pods = manager.pods
    assert pods is not None
    # every request asks: the answer is kept a few seconds in service, a window the decision
    # names (a pod deleted, its address freed and given to a pod that serves, all within it)
    pods.every = 0.0
    return refused


@contextmanager
def unheld(cluster: FakeCluster, one: RunningShell, two: RunningShell, iid: str) -> Iterator[None]:
    """Shell 1 stopped, its pod of ``iid`` running on with no shell holding it (the body runs
    then); after the body, that pod deleted and its address given to a new pod of shell 2."""
    url = one.shell.settings.state_url
    wait_for(lambda: row_of(url, iid).state in ("started", "resumed"), "its row", SLOW)
    host = str(row_of(url, iid).address).rpartition(":")[0]
    refused = not_taken_over(two, iid)
    one.stop()
    wait_for(lambda: bool(refused), "two tries to take the pod over, refused", 15)
    yield
    namespace = namespace_of(two)
    cluster.call(cluster.api.delete, "v1/pods", namespace, render.pod_name(iid), 0)  # evicted

    def freed_first() -> bool:
        """Its address given to the next pod, as a cluster's allocator may do at once (the
        fake kubelet hands a freed address out last)."""
        free: list[str] = cluster.kubelet.network.free
        if host not in free:
            return False
        free.remove(host)
        free.insert(0, host)
        return True

    wait_for(lambda: cluster.call(freed_first), "the pod's address freed", SLOW)
    with two.client(one.token, timeout=SLOW) as api:
        other = api.post("/api/instances", json={"appId": PROBE, "new": True})
        assert other.status_code == 200, other.text
    pod: Any = cluster.pod(namespace, render.pod_name(other.json()["instanceId"]))
    assert pod["status"]["podIP"] == host  # another pod at the row's address


def test_a_page_of_a_pod_no_shell_holds_is_not_sent_to_the_pod_given_its_address(
    kube_shells: StartShell, kube_settings: FakeCluster
) -> None:
    one, two = kube_shells("one"), kube_shells("two")
    with one.client(timeout=SLOW) as api:
        iid = api.post("/api/instances", json={"appId": PROBE}).json()["instanceId"]
        boot = api.get(f"/api/proxy/{iid}/boot").json()["boot"]
        _, view_url = new_view(api, iid)
    with closing(enter(two, view_url)) as on_two:
        with unheld(kube_settings, one, two, iid):
            page = on_two.get("/boot")
            assert page.status_code == 200, page.text
            assert page.json()["boot"] == boot  # served while its pod runs there
        page = on_two.get("/boot")
        # it reached the other pod before, with the first instance's shell secret (which that
        # pod refused with a 403 of its own: another app would have served its pages)
        assert page.status_code == 503, page.text
        assert page.json()["error"]["code"] == "instance_unheld"
        assert "is gone" in page.json()["error"]["message"]


def test_a_data_request_for_a_provider_no_shell_holds_is_not_sent_to_the_pod_given_its_address(
    tmp_path: Path, kube_shells: StartShell, kube_settings: FakeCluster
) -> None:
    shared_provider(tmp_path, WOKEN, "unheld")
    one, two = kube_shells("one"), kube_shells("two")
    with one.client(timeout=SLOW) as api:
        first = api.get("/api/data/unheld/items/a")
        assert first.status_code == 200, first.text
        boot = first.json()["boot"]
    with two.client(one.token, timeout=SLOW) as api_two:
        with unheld(kube_settings, one, two, f"{WOKEN}-provider"):
            answer = api_two.get("/api/data/unheld/items/b")
            assert answer.status_code == 200, answer.text
            assert answer.json()["boot"] == boot  # shell 1's provider, served from its row
        answer = api_two.get("/api/data/unheld/items/c")
        # it reached the other pod before (which refused the first instance's shell secret)
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "provider_unavailable"
        assert "is gone" in answer.json()["error"]["message"]
        assert two.shell.lifecycle.of_app(WOKEN) == []  # nothing woken here either
