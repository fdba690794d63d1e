"""The runner contract (tests/runner_contract.py) on the Kubernetes runner, against the fake
cluster (tests/kube/conftest.py): one shell for the module, in a namespace of its own."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atrium.lifecycle.runners.kubernetes import render
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, launch_shell, wait_for
from tests.kube.cluster import FakeCluster
from tests.kube.kubelet import MEMORY_CGROUP, Pod
from tests.runner_contract import PROBE, Harness, RunnerContract, Traces

SLOW: float = 60  # pods start in seconds, not milliseconds; every wait is bounded, none asserted


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))  # noqa: S104 - pods reach the shell on the bridge
        port: int = probe.getsockname()[1]
        return port


class KubeHarness(Harness):
    """A shell on the Kubernetes runner: pods, Secrets and claims of the fake cluster."""

    survives_shell = True

    def __init__(self, cluster: FakeCluster, namespace: str, home: Path, apps: Path) -> None:
        self.runner = "kubernetes"
        self.cluster = cluster
        self.namespace = namespace
        self.home = home
        self.system_apps = apps
        self.port = free_port()
        if not os.access(MEMORY_CGROUP, os.W_OK):
            self.limits_missing = f"the fake kubelet holds no memory limit here: {MEMORY_CGROUP}"
        #: the kubelet's record of each instance's pods, kept to read their output after
        self.pods: dict[str, list[Pod]] = {}
        self._start()

    @property
    def pids_missing(self) -> str | None:
        return (
            "a pod has no process limit of its own: the node's podPidsLimit holds it (the fake "
            "kubelet's own tests show theirs), the runner sets none and the instance says pids null"
        )

    def _start(self) -> None:
        options: dict[str, Any] = {
            "host": "0.0.0.0",  # noqa: S104 - pods reach the shell on the bridge
            "port": self.port,
            "runner": "kubernetes",
            "kube_config": self.cluster.kubeconfig,
            "kube_namespace": self.namespace,
            "kube_shell_url": f"http://{self.cluster.host_address}:{self.port}",
            "kube_start_timeout_seconds": 30.0,
        }
        self.shell: RunningShell = launch_shell(self.home, self.system_apps, **options)
        self.api = self.shell.client(timeout=SLOW)

    def close(self) -> None:
        """Destroy what runs (a stopped shell leaves its pods to the next), then stop."""
        try:
            for instance in self.api.get("/api/instances").json():
                self.api.delete(f"/api/instances/{instance['instanceId']}")
        finally:
            self.api.close()
            if self.shell.thread.is_alive():
                self.shell.stop()

    def launch(self, app_id: str = PROBE) -> dict[str, Any]:
        instance = super().launch(app_id)
        pod = self.stored("v1/pods", render.pod_name(instance["instanceId"]))
        assert pod is not None, instance
        uid = pod["metadata"]["uid"]
        kubelet = self.cluster.kubelet
        found: Pod = self.cluster.call(lambda: kubelet.pods[uid])
        self.pods.setdefault(instance["instanceId"], []).append(found)
        return instance

    def stored(self, resource: str, name: str) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = self.cluster.call(
            self.cluster.api.get, resource, self.namespace, name
        )
        return obj

    def kill_from_outside(self, instance: dict[str, Any]) -> None:
        name = render.pod_name(instance["instanceId"])
        self.cluster.call(self.cluster.api.delete, "v1/pods", self.namespace, name, None)

    def output(self, instance_id: str) -> str:
        pods = self.pods.get(instance_id, [])

        def text() -> str:
            return "".join(line for pod in pods for log in pod.logs.values() for _, line in log)

        said: str = self.cluster.call(text)
        return said

    def traces(self, instance: dict[str, Any]) -> Traces:
        name = render.pod_name(instance["instanceId"])
        pod = self.stored("v1/pods", name)
        assert pod is not None
        volumes = pod["spec"].get("volumes", [])
        claims = [
            v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
        ]
        secrets = [v["secret"]["secretName"] for v in volumes if "secret" in v]
        assert claims, volumes
        assert secrets, volumes
        found = {"pod": name, "uid": pod["metadata"]["uid"], "claims": claims, "secrets": secrets}
        return Traces(instance["instanceId"], found)

    def leftovers(self, traces: Traces) -> list[str]:
        found = traces.found
        left = [f"pod {found['pod']}"] if self.stored("v1/pods", found["pod"]) else []
        left += [f"Secret {s}" for s in found["secrets"] if self.stored("v1/secrets", s)]
        kubelet = self.cluster.kubelet
        if self.cluster.call(lambda: found["uid"] in kubelet.pods):
            left.append(f"the kubelet's sandbox of pod {found['pod']}")
        return left

    def kept(self, traces: Traces) -> list[str]:
        return [
            f"claim {c}"
            for c in traces.found["claims"]
            if not self.stored("v1/persistentvolumeclaims", c)
        ]

    def restart(self) -> None:
        self.api.close()
        self.shell.stop()
        self._start()


@pytest.fixture(scope="module")
def harness(
    fake_cluster: FakeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeHarness]:
    namespace = f"c-{uuid.uuid4().hex[:8]}"
    fake_cluster.call(
        fake_cluster.api.create, "v1/namespaces", "", {"metadata": {"name": namespace}}
    )
    base = tmp_path_factory.mktemp("contract-kubernetes")
    apps = base / "system-apps"
    apps.mkdir()
    shutil.copytree(TESTS_DIR / "apps" / PROBE, apps / PROBE)
    made = KubeHarness(fake_cluster, namespace, base / "home", apps)
    try:
        yield made
    finally:
        try:
            made.close()
        finally:
            fake_cluster.call(fake_cluster.api.remove, "v1/namespaces", "", namespace)
            kubelet = fake_cluster.kubelet

            def none_left() -> bool:
                return not any(pod.namespace == namespace for pod in kubelet.pods.values())

            # leave the session's cluster as found: its kubelet done with this module's pods
            wait_for(lambda: fake_cluster.call(none_left), "the module's pods to end", SLOW)


class TestKubernetesRunnerContract(RunnerContract):
    """The Kubernetes runner keeps the runner contract (on the fake cluster)."""
