"""What only a real cluster proves (docs/deploying.md "What only a real cluster proves"):
admission of the pods under a PodSecurity ``restricted`` namespace, scheduling, the data claim
bound by a real storage class, and the NetworkPolicy enforced by the network plugin.

Skipped unless ``ATRIUM_TEST_KUBECONFIG`` names a kubeconfig whose user may do what the shell's
Role allows (and create and delete namespaces). Also read:

- ``ATRIUM_TEST_KUBE_IMAGE``: the base image (Python 3.11+ with this checkout's ``atrium``
  package installed), pullable by the cluster;
- ``ATRIUM_TEST_KUBE_SHELL_HOST``: the address pods reach this machine at (the test's shell
  listens on every interface of this machine, on a free port).

The fake cluster (tests/kube/conftest.py) proves everything else the runner promises.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.lifecycle.runners.kubernetes import render
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, launch_shell

KUBECONFIG = os.environ.get("ATRIUM_TEST_KUBECONFIG", "")
IMAGE = os.environ.get("ATRIUM_TEST_KUBE_IMAGE", "")
SHELL_HOST = os.environ.get("ATRIUM_TEST_KUBE_SHELL_HOST", "")
PROBE = "test.contract.probe"
SLOW = 300.0  # a real cluster pulls images and binds volumes: minutes, not seconds

pytestmark = [
    pytest.mark.kube,
    pytest.mark.skipif(
        not (KUBECONFIG and IMAGE and SHELL_HOST),
        reason="needs a real cluster: ATRIUM_TEST_KUBECONFIG, ATRIUM_TEST_KUBE_IMAGE and "
        "ATRIUM_TEST_KUBE_SHELL_HOST",
    ),
]


def _core(action: str, *args: Any) -> Any:
    """One call of the real API with the test's kubeconfig (kubernetes-asyncio, as the shell)."""
    from kubernetes_asyncio import client, config

    async def call() -> Any:
        configuration = client.Configuration()
        await config.load_kube_config(config_file=KUBECONFIG, client_configuration=configuration)
        async with client.ApiClient(configuration=configuration) as api:
            answer = await getattr(client.CoreV1Api(api), action)(*args)
            return api.sanitize_for_serialization(answer)

    return asyncio.run(call())


@pytest.fixture
def namespace() -> Iterator[str]:
    """A scratch namespace that admits only pods meeting PodSecurity ``restricted``."""
    name = f"atrium-test-{uuid.uuid4().hex[:8]}"
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    _core("create_namespace", {"metadata": {"name": name, "labels": labels}})
    yield name
    _core("delete_namespace", name)


@pytest.fixture
def shell(tmp_path: Path, namespace: str) -> Iterator[RunningShell]:
    system_apps = tmp_path / "system-apps"
    system_apps.mkdir()
    shutil.copytree(TESTS_DIR / "apps" / PROBE, system_apps / PROBE)
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))  # noqa: S104 - pods reach the shell from the cluster
        port = probe.getsockname()[1]
    running = launch_shell(
        tmp_path / "home",
        system_apps,
        host="0.0.0.0",  # noqa: S104
        port=port,
        runner="kubernetes",
        kube_config=Path(KUBECONFIG),
        kube_namespace=namespace,
        kube_image=IMAGE,
        kube_shell_url=f"http://{SHELL_HOST}:{port}",
        kube_start_timeout_seconds=SLOW,
    )
    yield running
    with running.client(timeout=SLOW) as api:
        for instance in api.get("/api/instances").json():
            api.delete(f"/api/instances/{instance['instanceId']}")
    running.stop()


def launch(api: httpx.Client, new: bool = False) -> dict[str, Any]:
    answer = api.post("/api/instances", json={"appId": PROBE, "new": new}, timeout=SLOW)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_the_hardened_pod_is_admitted_under_restricted_and_scheduled(
    shell: RunningShell, namespace: str
) -> None:
    with shell.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
        pod = _core("read_namespaced_pod", render.pod_name(iid), namespace)
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"]
        assert api.get(f"/api/proxy/{iid}/boot").status_code == 200


def test_the_data_claim_is_bound_and_outlives_the_instance(
    shell: RunningShell, namespace: str
) -> None:
    with shell.client(timeout=SLOW) as api:
        iid = launch(api)["instanceId"]
        name = render.claim_name(shell.settings.user, iid)
        claim = _core("read_namespaced_persistent_volume_claim", name, namespace)
        assert claim["status"]["phase"] == "Bound"
        assert api.delete(f"/api/instances/{iid}").status_code == 200
        kept = _core("read_namespaced_persistent_volume_claim", name, namespace)
        assert kept["metadata"]["uid"] == claim["metadata"]["uid"]
        assert launch(api)["instanceId"] == iid


def test_the_network_policy_lets_an_app_pod_reach_only_the_shell(
    shell: RunningShell, namespace: str
) -> None:
    port = shell.settings.port
    with shell.client(timeout=SLOW) as api:
        first = launch(api)["instanceId"]
        second = launch(api, new=True)["instanceId"]
        other = _core("read_namespaced_pod", render.pod_name(second), namespace)

        def reach(host: str, to: int) -> dict[str, Any]:
            answer = api.post(f"/api/proxy/{first}/reach", params={"host": host, "port": to})
            assert answer.status_code == 200, answer.text
            body: dict[str, Any] = answer.json()
            return body

        assert reach(SHELL_HOST, port)["reached"] is True
        assert reach(other["status"]["podIP"], render.POD_PORT)["reached"] is False
        assert reach("1.1.1.1", 443)["reached"] is False
