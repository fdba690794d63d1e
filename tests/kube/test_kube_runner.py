"""The Kubernetes runner through a real shell (``ATRIUM_RUNNER=kubernetes``) against the fake
cluster: pods run under the fake kubelet in network namespaces of their own, and the shell reaches
them at ``podIP:8080`` (tests/kube/conftest.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.lifecycle.runners.kubernetes import render
from atrium.lifecycle.runners.kubernetes.source import source_digest
from atrium.state.versions import open_checked
from atrium.users.store import UserStore
from tests.conftest import REPO_DIR, TESTS_DIR
from tests.integration.conftest import RunningShell, SseReader, launch_shell, wait_for
from tests.kube.cluster import FakeCluster

PROBE = "test.contract.probe"
SLOW: float = 60  # every wait is bounded; none is asserted on


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))  # noqa: S104 - pods reach the shell on the bridge
        port: int = probe.getsockname()[1]
        return port


KubeShell = Callable[..., RunningShell]


@pytest.fixture
def namespace(kube_settings: FakeCluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube_settings.call(kube_settings.api.create, "v1/namespaces", "", {"metadata": {"name": name}})
    yield name
    kube_settings.call(kube_settings.api.remove, "v1/namespaces", "", name)


@pytest.fixture
def kube_shell(tmp_path: Path, kube_settings: FakeCluster, namespace: str) -> Iterator[KubeShell]:
    """Start (and restart) shells on one home against the fake cluster; stopped after the test."""
    system_apps = tmp_path / "system-apps"
    system_apps.mkdir()
    shutil.copytree(TESTS_DIR / "apps" / PROBE, system_apps / PROBE)
    running: list[RunningShell] = []

    def start(**overrides: Any) -> RunningShell:
        port = free_port()
        options: dict[str, Any] = {
            "host": "0.0.0.0",  # noqa: S104
            "port": port,
            "runner": "kubernetes",
            "kube_config": kube_settings.kubeconfig,
            "kube_namespace": namespace,
            "kube_shell_url": f"http://{kube_settings.host_address}:{port}",
            "kube_start_timeout_seconds": 30.0,
            **overrides,
        }
        shell = launch_shell(tmp_path / "home", system_apps, **options)
        running.append(shell)
        return shell

    yield start
    for shell in running:
        if shell.thread.is_alive():
            shell.stop()
    # the shell leaves its pods running (they outlive it): the test's go with it
    for pod in pods(kube_settings, namespace):
        kube_settings.call(
            kube_settings.api.delete, "v1/pods", namespace, pod["metadata"]["name"], 0
        )
    wait_for(lambda: not pods(kube_settings, namespace), "the test's pods to go", SLOW)


def launch(api: httpx.Client, app_id: str = PROBE) -> dict[str, Any]:
    answer = api.post("/api/instances", json={"appId": app_id}, timeout=SLOW)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def pods(cluster: FakeCluster, namespace: str) -> list[dict[str, Any]]:
    def listed() -> list[dict[str, Any]]:
        return [
            obj
            for (resource, ns, _), obj in cluster.api.store.items()
            if resource == "v1/pods" and ns == namespace
        ]

    found: list[dict[str, Any]] = cluster.call(listed)
    return found


def test_a_launch_runs_a_pod_the_shell_reaches_at_its_address(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        instance = launch(api)
        iid = instance["instanceId"]
        assert instance["state"] == "started"
        pod = kube_settings.pod(namespace, render.pod_name(iid))
        assert pod is not None
        assert pod["status"]["phase"] == "Running"
        # the secrets are files of a Secret, never in the pod's spec
        assert "OS_APP_TOKEN" not in str(pod["spec"])
        boot = api.get(f"/api/proxy/{iid}/boot")
        assert boot.status_code == 200, boot.text
        assert shell.shell.lifecycle.get(iid).child.host == pod["status"]["podIP"]  # type: ignore[union-attr]


def instance_state(api: httpx.Client, iid: str) -> str:
    state: str = api.get(f"/api/instances/{iid}").json()["state"]
    return state


def test_a_crash_is_one_app_crashed_with_its_reason(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
        events = SseReader(api, {"topics": "app:crashed"})
        api.post(f"/api/proxy/{iid}/exit?code=3")
        events.wait(1)
        crashed = events.events[0].data
        assert (crashed["instanceId"], crashed["exitCode"], crashed["reason"]) == (iid, 3, "exited")
        assert instance_state(api, iid) == "error"
        # one event only: the pod's later updates (and its deletion) are not crashes again
        api.post(f"/api/instances/{iid}/reset")
        assert len([e for e in events.events if e.data.get("instanceId") == iid]) == 1


def test_logs_come_from_the_pod_and_after_gives_only_what_is_new(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
        api.post(f"/api/proxy/{iid}/log?line=first-line")
        first = wait_for(
            lambda: (
                (r := api.get(f"/api/instances/{iid}/logs")).status_code == 200
                and "first-line" in r.text
                and r
            ),
            "the first line in the pod's log",
        )
        cursor = first.headers["X-Log-End"]
        api.post(f"/api/proxy/{iid}/log?line=second-line")
        later = wait_for(
            lambda: (
                "second-line" in (t := api.get(f"/api/instances/{iid}/logs?after={cursor}").text)
                and t
            ),
            "the second line after the cursor",
        )
        assert "first-line" not in later


def test_destroy_deletes_the_pod_and_secret_and_keeps_the_claim(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
        owner = shell.settings.user
        claim = render.claim_name(owner, iid)
        kube_settings.kubelet.claim_folder(namespace, claim).joinpath("kept.txt").write_text("1")
        answer = api.delete(f"/api/instances/{iid}")
        assert answer.status_code in (200, 204), answer.text
        assert kube_settings.pod(namespace, render.pod_name(iid)) is None
        get = kube_settings.api.get
        assert kube_settings.call(get, "v1/secrets", namespace, render.secret_name(iid)) is None
        assert kube_settings.call(get, "v1/persistentvolumeclaims", namespace, claim) is not None
        again = launch(api)["instanceId"]
        assert again == iid
        assert kube_settings.kubelet.claim_folder(namespace, claim).joinpath("kept.txt").exists()


def test_a_new_shell_adopts_the_running_pod_without_restarting_it(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    first = kube_shell()
    with first.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
        boot = api.get(f"/api/proxy/{iid}/boot").json()["boot"]
    uid = kube_settings.pod(namespace, render.pod_name(iid))["metadata"]["uid"]  # type: ignore[index]
    first.stop()
    pod = kube_settings.pod(namespace, render.pod_name(iid))
    assert pod is not None
    assert pod["status"]["phase"] == "Running"
    second = kube_shell()
    with second.client(timeout=SLOW) as api:
        instance = api.get(f"/api/instances/{iid}").json()
        assert instance["state"] == "started"
        answer = api.get(f"/api/proxy/{iid}/boot")
        assert answer.status_code == 200, answer.text
        assert answer.json()["boot"] == boot  # the same process: not restarted
        assert kube_settings.pod(namespace, render.pod_name(iid))["metadata"]["uid"] == uid  # type: ignore[index]


def test_a_pod_gone_between_the_list_and_its_adoption_does_not_stop_the_start(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    """Another shell of the database may take a pod over (relabel it) between this shell's
    start-up list of pods and its read of one: the adoption's read then finds it gone, which
    failed the whole start. The pod's read answers 404 once here, as the taken pod's would."""
    first = kube_shell()
    with first.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
    first.stop()
    kube_settings.fail_next("GET", rf"/pods/{render.pod_name(iid)}$", 404)
    second = kube_shell()
    with second.client(timeout=SLOW) as api:
        assert api.get("/api/ready").status_code == 200
        assert api.get(f"/api/instances/{iid}").status_code == 404  # not adopted


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        (r"/pods$", 403, "may not create pods"),
        (r"/pods$", 422, "refused the pods as invalid"),
        (r"/secrets$", 403, "may not create secrets"),
    ],
)
def test_an_api_refusal_is_a_spawn_failure_that_says_what_to_fix(
    kube_shell: KubeShell, kube_settings: FakeCluster, path: str, status: int, words: str
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        kube_settings.fail_next("POST", path, status)
        answer = api.post("/api/instances", json={"appId": PROBE}, timeout=SLOW)
        assert answer.status_code == 502, answer.text
        error = answer.json()["error"]
        assert error["cause"] == "api"
        assert words in error["message"]
        iid = next(i for i in api.get("/api/instances").json() if i["appId"] == PROBE)["instanceId"]
        assert instance_state(api, iid) == "error"
        assert api.post(f"/api/instances/{iid}/retry").json()["state"] == "started"


def test_an_api_down_longer_than_the_retry_fails_the_spawn_with_cause_api(
    kube_shell: KubeShell, kube_settings: FakeCluster
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        kube_settings.outage(14)
        answer = api.post("/api/instances", json={"appId": PROBE}, timeout=SLOW)
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["cause"] == "api"
        assert "did not answer" in answer.json()["error"]["message"]


def test_a_short_api_outage_and_an_expired_watch_are_ridden_out(
    kube_shell: KubeShell, kube_settings: FakeCluster
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        kube_settings.outage(2)
        iid = launch(api)["instanceId"]  # retried within the bound
        kube_settings.expire_watches()  # 410 Gone: the runner lists again
        events = SseReader(api, {"topics": "app:crashed"})
        api.post(f"/api/proxy/{iid}/exit?code=4")
        events.wait(1)
        assert events.events[0].data["exitCode"] == 4


def test_a_pod_left_by_an_earlier_spawn_is_replaced_not_a_conflict(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
        uid = kube_settings.pod(namespace, render.pod_name(iid))["metadata"]["uid"]  # type: ignore[index]
        # the shell forgets the instance without deleting its pod (as a crash of the shell
        # between create and record would): the next spawn of that id meets a 409
        shell.on_loop(_forget(shell, iid))
        again = launch(api)
        assert again["instanceId"] == iid
        assert again["state"] == "started"
        assert kube_settings.pod(namespace, render.pod_name(iid))["metadata"]["uid"] != uid  # type: ignore[index]


def test_a_late_event_of_an_earlier_pod_of_its_name_is_not_this_pods(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    """A pod deleted and made again under its name: the watch may still bring the old pod's
    last events (a real cluster's watch lags its writes) after the new one's handle exists. The
    old pod's DELETED ended the new pod's handle as killed (exit 137), so its instance crashed
    though its pod ran on."""
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
        name = render.pod_name(iid)
        pod = kube_settings.pod(namespace, name)
        assert pod is not None
        ghost = json.loads(json.dumps(pod))
        ghost["metadata"]["uid"] = str(uuid.uuid4())

        def late_then_touched() -> None:
            api_ = kube_settings.api
            ghost["metadata"]["resourceVersion"] = api_._bump()
            api_._publish("v1/pods", "DELETED", ghost)
            now = json.loads(json.dumps(api_.get("v1/pods", namespace, name)))
            now["metadata"].setdefault("labels", {})["touched"] = "yes"
            api_.update("v1/pods", namespace, name, now)

        kube_settings.call(late_then_touched)
        child = shell.shell.lifecycle.get(iid).child
        assert child is not None
        # the watch brings events in order: once the touch is seen, the ghost was too
        wait_for(
            lambda: (child.pod.get("metadata") or {}).get("labels", {}).get("touched") == "yes",  # type: ignore[attr-defined]
            "the watch saw the touch",
            SLOW,
        )
        assert child.status is None
        assert api.get(f"/api/instances/{iid}").json()["state"] == "started"


async def _forget(shell: RunningShell, iid: str) -> None:
    lifecycle = shell.shell.lifecycle
    instance = lifecycle.get(iid)
    instance.child = None
    await lifecycle.force(instance)


def test_an_app_past_its_memory_limit_is_oom_killed_alone(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        instance = launch(api)
        iid = instance["instanceId"]
        assert instance["limits"]["enforcement"] == "pod"
        pod = kube_settings.pod(namespace, render.pod_name(iid))
        assert pod is not None
        assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == "64Mi"
        events = SseReader(api, {"topics": "app:crashed"})
        api.post(f"/api/proxy/{iid}/alloc?mib=256")
        events.wait(1)
        assert events.events[0].data["reason"] == "oom"
        assert api.get("/api/version").status_code == 200


def test_the_source_endpoint_answers_only_an_instances_own_app(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
        assert api.get("/api/runner/source").status_code == 403  # the user's token
        pod = kube_settings.pod(namespace, render.pod_name(iid))
        assert pod is not None
        secret = kube_settings.call(
            kube_settings.api.get, "v1/secrets", namespace, render.secret_name(iid)
        )
        assert secret is not None
        token = base64.b64decode(secret["data"]["OS_APP_TOKEN"]).decode()
        # the pod runs, so its init container fetched the tar and found the digest it names;
        # once the instance runs, its token fetches nothing more (409 not_serving)
        instance = shell.shell.lifecycle.find(iid)
        assert instance is not None
        digest = pod["metadata"]["annotations"][render.ANNOTATION_DIGEST]
        assert digest == source_digest(instance.app_dir)
        with shell.client(token=token) as app:
            answer = app.get("/api/runner/source")
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "not_serving"
        with shell.anonymous() as anyone:
            assert anyone.get("/api/runner/source").status_code == 401


def test_an_image_that_cannot_be_pulled_or_a_pod_no_node_fits_is_its_cause(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        kube_settings.kubelet.missing_images = {shell.settings.kube_image}
        answer = api.post("/api/instances", json={"appId": PROBE}, timeout=SLOW)
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["cause"] == "image"
        # the failed pod is not left behind
        wait_for(lambda: not pods(kube_settings, namespace), "the failed pod to go", SLOW)
        kube_settings.kubelet.missing_images = set()
        kube_settings.kubelet.ceiling_memory_mib = 32  # the probe asks 64 MiB
        iid = next(i for i in api.get("/api/instances").json() if i["appId"] == PROBE)["instanceId"]
        again = api.post(f"/api/instances/{iid}/retry", timeout=SLOW)
        assert again.status_code == 502, again.text
        assert again.json()["error"]["cause"] == "schedule"
        assert instance_state(api, iid) == "error"


def test_doctor_says_a_kubernetes_shells_limits_are_its_pods_and_checks_the_kubeconfig(
    tmp_path: Path,
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")},
        "ATRIUM_HOME": str(tmp_path / "home"),
        "ATRIUM_RUNNER": "kubernetes",
        "ATRIUM_KUBE_NAMESPACE": "apps",
        "ATRIUM_KUBE_CONFIG": str(tmp_path / "missing.kubeconfig"),
    }
    said = subprocess.run(
        [sys.executable, "-m", "atrium", "doctor"],
        env=env,
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert said.returncode == 1, said.stdout + said.stderr
    line = next(x for x in said.stdout.splitlines() if x.startswith("limits: "))
    assert "pods' resources" in line
    assert "namespace apps" in line
    assert f"ATRIUM_KUBE_CONFIG {tmp_path / 'missing.kubeconfig'}" in said.stdout


def _foreign(kind: str, name: str, namespace: str) -> dict[str, Any]:
    """An object another shell of the same namespace made (its own shell label)."""
    meta = {
        "name": name,
        "namespace": namespace,
        # a shell of another database: its shells' claims are theirs, never this one's
        "labels": {
            render.LABEL_SHELL: render.label_value("another-shell"),
            render.LABEL_STATE: render.label_value("another-database"),
        },
    }
    if kind == "secret":
        return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {"X": "eQ=="}}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta,
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


@pytest.mark.parametrize("kind", ["secret", "claim"])
def test_a_secret_or_claim_another_shell_made_is_never_taken_over(
    kind: str, kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    """Two shells in one namespace share instance ids: a spawn that meets the other shell's
    Secret must not delete it, nor mount the other shell's data claim as its own."""
    shell = kube_shell()
    iid = f"{PROBE}-1"
    resource, name = (
        ("v1/secrets", render.secret_name(iid))
        if kind == "secret"
        else ("v1/persistentvolumeclaims", render.claim_name(shell.settings.user, iid))
    )
    kube_settings.call(
        kube_settings.api.create, resource, namespace, _foreign(kind, name, namespace)
    )
    before = kube_settings.call(kube_settings.api.get, resource, namespace, name)
    with shell.client(timeout=SLOW) as api:
        answer = api.post("/api/instances", json={"appId": PROBE}, timeout=SLOW)
        assert answer.status_code == 502, answer.text
        error = answer.json()["error"]
        assert error["cause"] == "api"
        assert "another shell" in error["message"]
    after = kube_settings.call(kube_settings.api.get, resource, namespace, name)
    assert after is not None
    assert before is not None
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert kube_settings.pod(namespace, render.pod_name(iid)) is None


def test_the_namespace_gets_the_network_policy_that_fences_app_pods(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        launch(api)
    policies = kube_settings.call(
        lambda: [
            obj
            for (resource, ns, _), obj in kube_settings.api.store.items()
            if resource.endswith("/networkpolicies") and ns == namespace
        ]
    )
    assert len(policies) == 1, policies
    spec = policies[0]["spec"]
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    # the shell runs outside the cluster here: it is admitted by its address
    peers = spec["ingress"][0]["from"]
    assert {"ipBlock": {"cidr": f"{kube_settings.host_address}/32"}} in peers


def test_kube_render_prints_the_objects_the_runner_created(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str, tmp_path: Path
) -> None:
    """`atrium kube render` is for review and GitOps: what it prints must be what the runner
    made, secrets aside (placeholders in the one, this spawn's values in the other)."""
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
    settings = shell.settings
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")}
    printed = subprocess.run(
        [sys.executable, "-m", "atrium", "kube", "render", PROBE, "--instance", iid, "--json"],
        env={
            **clean,
            "ATRIUM_HOME": str(settings.home),
            "ATRIUM_SYSTEM_APPS": str(settings.system_apps),
            "ATRIUM_HOST": settings.host,
            "ATRIUM_PORT": str(settings.port),
            "ATRIUM_RUNNER": "kubernetes",
            "ATRIUM_KUBE_CONFIG": str(settings.kube_config),
            "ATRIUM_KUBE_NAMESPACE": namespace,
            "ATRIUM_KUBE_SHELL_URL": str(settings.kube_shell_url),
        },
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        check=False,
        timeout=SLOW,
    )
    assert printed.returncode == 0, printed.stderr
    rendered = {obj["kind"]: obj for obj in json.loads(printed.stdout)}
    names = {
        "Pod": ("v1/pods", render.pod_name(iid)),
        "Secret": ("v1/secrets", render.secret_name(iid)),
        "PersistentVolumeClaim": (
            "v1/persistentvolumeclaims",
            render.claim_name(settings.user, iid),
        ),
        "NetworkPolicy": (
            "networking.k8s.io/v1/networkpolicies",
            render.policy_name(render.shell_key(str(settings.home), namespace)),
        ),
    }
    assert set(rendered) == set(names)
    for kind, (resource, name) in names.items():
        made = kube_settings.call(kube_settings.api.get, resource, namespace, name)
        assert made is not None, kind
        shown = rendered[kind]
        for part in ("labels", "annotations"):
            assert made["metadata"].get(part) == shown["metadata"].get(part), (kind, part)
        if kind == "Secret":
            assert sorted(made.get("stringData") or made.get("data") or {}) == sorted(
                shown.get("stringData") or shown.get("data") or {}
            )
        else:
            assert made["spec"] == shown["spec"], kind


def test_a_disabled_users_pod_is_not_adopted_by_the_next_shell(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    """A user disabled while their pod outlived the shell (the disable committed, then the
    shell was killed before its sweep reached the pod) must not come back: adoption would give
    their app its token again, acting for a user who may no longer act. The pod is deleted."""
    first = kube_shell()
    bob = first.add_user("bob")
    with first.client(bob, timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
    settings = first.shell.settings
    first.stop()
    assert kube_settings.pod(namespace, render.pod_name(iid)) is not None

    async def disable() -> None:
        async with (
            open_checked(settings.state_url) as db,
            UserStore.open(db, bootstrap_admin=settings.user) as users,
        ):
            await users.update("bob", disabled=True)

    asyncio.run(disable())
    second = kube_shell()
    assert second.shell.lifecycle.find(iid) is None
    wait_for(
        lambda: kube_settings.pod(namespace, render.pod_name(iid)) is None,
        "the disabled user's pod to go",
        SLOW,
    )
    secret = kube_settings.call(
        kube_settings.api.get, "v1/secrets", namespace, render.secret_name(iid)
    )
    assert secret is None  # its token is nowhere to read back


def test_a_pod_naming_an_instance_id_the_shell_would_not_make_is_not_adopted(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    """The adoption reads the instance id back from the pod; the id names the shell's own
    folders (the instance's data, its log), so one that climbs (`<appId>-1/../..`) is never
    taken as an instance: the pod is deleted instead."""
    first = kube_shell()
    with first.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
    first.stop()
    forged = f"{iid}/../../../escaped"
    pod = kube_settings.pod(namespace, render.pod_name(iid))
    assert pod is not None
    pod["metadata"]["annotations"][render.ANNOTATION_INSTANCE] = forged
    kube_settings.call(kube_settings.api.update, "v1/pods", namespace, pod["metadata"]["name"], pod)
    secret = kube_settings.call(
        kube_settings.api.get, "v1/secrets", namespace, render.secret_name(iid)
    )
    assert secret is not None
    copy = {"metadata": {"name": render.secret_name(forged)}, "data": dict(secret["data"])}
    kube_settings.call(kube_settings.api.create, "v1/secrets", namespace, copy)
    second = kube_shell()
    assert second.shell.lifecycle.find(forged) is None
    assert second.shell.lifecycle.find(iid) is None
    wait_for(
        lambda: kube_settings.pod(namespace, render.pod_name(iid)) is None,
        "the forged pod to go",
        SLOW,
    )


def test_a_handle_whose_pod_left_this_shell_is_not_handed_out_again(
    kube_shell: KubeShell, kube_settings: FakeCluster, namespace: str
) -> None:
    """A pod's handle stays in the runner after its instance lets it go (a restart's survivor
    whose row another shell had taken over was dropped without forgetting it), and the watch
    ends it once the pod is relabelled away. `adopt` handed that ended handle out again when the
    same pod came back to this shell (taken over from that other shell once it died): the new
    instance's crash watch saw it ended at once, a false `app:crashed` for a running pod."""
    shell = kube_shell()
    with shell.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
    lifecycle = shell.shell.lifecycle
    instance = lifecycle.get(iid)
    runner: Any = lifecycle._booter.runner
    ended = instance.child
    ref = dict(ended.ref)  # type: ignore[union-attr]

    async def let_go_and_come_back() -> Any:
        lifecycle._booter.detach(instance)  # the instance lets the pod go, as a drop does
        ended.observe(None)  # type: ignore[union-attr]  # what the watch says of a pod relabelled away
        return await runner.adopt(ref)

    again = shell.on_loop(let_go_and_come_back())
    assert ended.status is not None  # type: ignore[union-attr]
    assert again.status is None  # the pod runs
    assert again.uid == ref["uid"]
