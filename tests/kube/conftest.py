"""The fake Kubernetes cluster the Kubernetes runner is tested against.

Why a fake: no kube-apiserver can be had on the machines the suite runs on. Debian 12 packages
only kubectl (1.20) and etcd, and neither PyPI nor npm ships an API server (no envtest, kwok or
control-plane binaries), so a real cluster is only for ``@pytest.mark.kube`` tests with
``ATRIUM_TEST_KUBECONFIG``. The fake is a real server and real processes: a kmock-based API server
(tests/kube/fake_api.py) spoken to by the real client (kubernetes-asyncio) over HTTP, and a fake
kubelet (tests/kube/kubelet.py) that runs each pod under bubblewrap in a network namespace of its
own, so the shell reaches pods off loopback as it would in a cluster.

``fake_cluster`` (session-wide: one bridge, one API server) is a `tests.kube.cluster.FakeCluster`:
``url``, ``kubeconfig`` (a file naming the server, context namespace ``atrium``),
``host_address`` (where pods reach a server of the test or the shell: bind it there or on
0.0.0.0), ``api`` (state, ``api.store``), ``kubelet`` (``missing_images``,
``ceiling_memory_mib``, ``ceiling_cpu_milli``, ``pod_pids_limit``, ``run_as_user``,
``claim_folder(ns, claim)``), fault helpers
``fail_next(method, path_regex, status, count)``, ``outage(seconds, refuse=False)``,
``expire_watches()``, and ``pod(ns, name)``. Tests that change the kubelet's settings put them back
(``kube_settings`` does it for them). Each test should use namespaces of its own
(``kube_namespace``) so that tests do not see each other's pods; everything is removed at the end
of the session, and the leftovers of a session that crashed are removed at the start of the next.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.kube.cluster import FakeCluster


def _unavailable() -> str | None:
    for tool in ("ip", "bwrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@pytest.fixture(scope="session")
def fake_cluster() -> Iterator[FakeCluster]:
    problem = _unavailable()
    if problem is not None:
        pytest.skip(f"the fake cluster needs {problem}")
    cluster = FakeCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kube_settings(fake_cluster: FakeCluster) -> Iterator[FakeCluster]:
    """The fake cluster, its kubelet's images and ceilings put back after the test."""
    kubelet = fake_cluster.kubelet
    saved = (
        set(kubelet.missing_images),
        kubelet.ceiling_memory_mib,
        kubelet.ceiling_cpu_milli,
        kubelet.pod_pids_limit,
        kubelet.run_as_user,
    )
    yield fake_cluster
    (
        kubelet.missing_images,
        kubelet.ceiling_memory_mib,
        kubelet.ceiling_cpu_milli,
        kubelet.pod_pids_limit,
        kubelet.run_as_user,
    ) = saved
    fake_cluster.api.faults.clear()
    fake_cluster.api.outage_until = 0.0


@pytest.fixture
async def kube_namespace(fake_cluster: FakeCluster) -> AsyncIterator[str]:
    """A namespace of the test's own in the fake cluster, deleted (with its pods) after it."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    await fake_cluster.acall(
        fake_cluster.api.create, "v1/namespaces", "", {"metadata": {"name": name}}
    )
    yield name
    await fake_cluster.acall(fake_cluster.api.remove, "v1/namespaces", "", name)
