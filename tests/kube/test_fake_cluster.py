"""The fake cluster speaks enough Kubernetes for the real client (kubernetes-asyncio), and its
kubelet runs pods as a cluster would: own addresses, logs, limits, claims, grace on delete."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.kube.cluster import PREFIX, FakeCluster, sweep, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def api_client(fake_cluster: FakeCluster) -> AsyncIterator[client.ApiClient]:
    made = await config.new_client_from_config(config_file=str(fake_cluster.kubeconfig))
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


def config_map(name: str, **labels: str) -> Any:  # the client takes a dict for a V1ConfigMap
    return {"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}


def pod(name: str, script: str, **extra: Any) -> Any:  # the client takes a dict for a V1Pod
    container: dict[str, Any] = {
        "name": "app",
        "image": "atrium/base:1",
        "command": ["python", "-c", script],
    }
    container.update(extra.pop("container", {}))
    return {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [container], **extra},
    }


async def status_of(core: client.CoreV1Api, ns: str, name: str) -> Any:
    return (await core.read_namespaced_pod(name, ns)).status


async def until_phase(core: client.CoreV1Api, ns: str, name: str, *phases: str) -> Any:
    async def check() -> Any:
        status = await status_of(core, ns, name)
        return status if status.phase in phases else None

    return await wait_for(check)


async def until_log(core: client.CoreV1Api, ns: str, name: str, text: str) -> str:
    async def check() -> str | None:
        try:
            log: str = await core.read_namespaced_pod_log(name, ns)
        except ApiException as err:  # 400 until the container starts
            if err.status != 400:
                raise
            return None
        return log if text in log else None

    return await wait_for(check)


async def test_objects_get_uid_version_and_selectors(
    core: client.CoreV1Api, kube_namespace: str
) -> None:
    ns = kube_namespace
    first = await core.create_namespaced_config_map(ns, config_map("one", app="a", tier="x"))
    second = await core.create_namespaced_config_map(ns, config_map("two", app="b", tier="x"))
    assert first.metadata.uid
    assert first.metadata.uid != second.metadata.uid
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert first.metadata.creation_timestamp is not None
    got = await core.read_namespaced_config_map("one", ns)
    assert (got.metadata.uid, got.metadata.resource_version) == (
        first.metadata.uid,
        first.metadata.resource_version,
    )

    async def names(selector: str) -> list[str]:
        found = await core.list_namespaced_config_map(ns, label_selector=selector)
        return sorted(item.metadata.name for item in found.items)

    assert await names("app=a") == ["one"]
    assert await names("tier=x,app!=a") == ["two"]
    assert await names("tier==x") == ["one", "two"]
    assert await names("missing") == []
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_config_map(ns, config_map("one"))
    assert caught.value.status == 409
    with pytest.raises(ApiException) as caught:
        await core.read_namespaced_config_map("nobody", ns)
    assert caught.value.status == 404


async def test_a_watch_from_a_version_sends_only_later_events(
    core: client.CoreV1Api, kube_namespace: str
) -> None:
    ns = kube_namespace
    await core.create_namespaced_config_map(ns, config_map("before", app="a"))
    listed = await core.list_namespaced_config_map(ns)
    await core.create_namespaced_config_map(ns, config_map("after", app="a"))
    await core.create_namespaced_config_map(ns, config_map("other", app="b"))
    await core.patch_namespaced_config_map("after", ns, {"data": {"k": "changed"}})
    seen = []
    async with watch.Watch() as watching:
        events = watching.stream(
            core.list_namespaced_config_map,
            ns,
            label_selector="app=a",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=1,
        )
        async for event in events:
            seen.append((event["type"], event["object"].metadata.name, event["object"].data["k"]))
    assert seen == [("ADDED", "after", "v"), ("MODIFIED", "after", "changed")]


async def test_410_gone_ends_a_watch_and_a_relist_resumes(
    core: client.CoreV1Api, kube_namespace: str, fake_cluster: FakeCluster
) -> None:
    ns = kube_namespace
    old = (await core.list_namespaced_config_map(ns)).metadata.resource_version
    await core.create_namespaced_config_map(ns, config_map("one"))

    async def watch_all(since: str) -> list[str]:
        names = []
        async with watch.Watch() as watching:
            events = watching.stream(
                core.list_namespaced_config_map, ns, resource_version=since, timeout_seconds=1
            )
            async for event in events:
                names.append(event["object"].metadata.name)
        return names

    open_watch = asyncio.create_task(watch_all(old))
    await asyncio.sleep(0.2)
    fake_cluster.expire_watches()
    with pytest.raises(ApiException) as caught:
        await open_watch
    assert caught.value.status == 410
    with pytest.raises(ApiException) as caught:
        await watch_all(old)  # resuming from before the compaction is refused too
    assert caught.value.status == 410
    fresh = await core.list_namespaced_config_map(ns)
    assert [item.metadata.name for item in fresh.items] == ["one"]
    await core.create_namespaced_config_map(ns, config_map("two"))
    assert await watch_all(fresh.metadata.resource_version) == ["two"]


async def test_status_patches_and_injected_faults(
    core: client.CoreV1Api, kube_namespace: str, kube_settings: FakeCluster
) -> None:
    ns = kube_namespace
    kube_settings.kubelet.missing_images.add("nowhere/image:1")
    body = pod("held", "pass", container={"image": "nowhere/image:1"})
    kube_settings.fail_next("POST", f"/namespaces/{ns}/pods$", 422)
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_pod(ns, body)
    assert caught.value.status == 422
    created = await core.create_namespaced_pod(ns, body)

    async def pull_failed() -> Any:
        statuses = (await status_of(core, ns, "held")).container_statuses or []
        waiting = [s.state.waiting for s in statuses if s.state.waiting]
        return waiting[0] if waiting and waiting[0].reason == "ErrImagePull" else None

    assert (await pull_failed() or await wait_for(pull_failed)).reason == "ErrImagePull"
    patched = await core.patch_namespaced_pod_status("held", ns, {"status": {"message": "noted"}})
    assert patched.status.message == "noted"
    assert patched.status.container_statuses  # a merge: the kubelet's fields stay
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)
    relabelled = await core.patch_namespaced_pod(
        "held", ns, {"metadata": {"labels": {"x": "1"}}, "status": {}}
    )
    assert relabelled.metadata.labels["x"] == "1"
    assert relabelled.status.message == "noted"

    for status in (403, 409, 410):
        kube_settings.fail_next("GET", "/pods/held$", status)
        with pytest.raises(ApiException) as caught:
            await core.read_namespaced_pod("held", ns)
        assert caught.value.status == status
    with pytest.raises(ApiException) as caught:
        await core.read_namespaced_pod_log("held", ns)  # its container never started
    assert caught.value.status == 400

    async def watch_until_cut() -> list[str]:
        async with watch.Watch() as watching:
            return [e["type"] async for e in watching.stream(core.list_namespaced_pod, ns)]

    open_watch = asyncio.create_task(watch_until_cut())
    await asyncio.sleep(0.2)
    kube_settings.outage(2)
    with pytest.raises(ApiException) as caught:  # cut, and its client's re-watch refused
        await asyncio.wait_for(open_watch, 10)
    assert caught.value.status == 503
    with pytest.raises(ApiException) as caught:
        await core.read_namespaced_pod("held", ns)
    assert caught.value.status == 503
    await wait_for(lambda: _quietly(core.read_namespaced_pod("held", ns)))
    kube_settings.outage(0.5, refuse=True)
    with pytest.raises(aiohttp.ClientConnectionError):
        await core.read_namespaced_pod("held", ns)
    assert (
        await wait_for(lambda: _quietly(core.read_namespaced_pod("held", ns)))
    ).metadata.name == "held"


async def _quietly(call: Any) -> Any:
    try:
        return await call
    except (ApiException, aiohttp.ClientError):
        return None


async def test_an_unschedulable_pod_stays_pending(
    core: client.CoreV1Api, kube_namespace: str, kube_settings: FakeCluster
) -> None:
    kube_settings.kubelet.ceiling_memory_mib = 512
    limits = {"resources": {"limits": {"memory": "1Gi"}}}
    await core.create_namespaced_pod(kube_namespace, pod("big", "pass", container=limits))

    async def unscheduled() -> Any:
        conditions = (await status_of(core, kube_namespace, "big")).conditions or []
        return next(
            (c for c in conditions if c.type == "PodScheduled" and c.status == "False"), None
        )

    assert (await wait_for(unscheduled)).reason == "Unschedulable"
    assert (await status_of(core, kube_namespace, "big")).phase == "Pending"


@pytest.fixture
async def host_servers(fake_cluster: FakeCluster) -> AsyncIterator[tuple[int, int]]:
    """A server on the published host address and one on the root namespace's loopback."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nhost")
        await writer.drain()
        writer.close()

    public = await asyncio.start_server(answer, fake_cluster.host_address, 0)
    loopback = await asyncio.start_server(answer, "127.0.0.1", 0)
    ports = (public.sockets[0].getsockname()[1], loopback.sockets[0].getsockname()[1])
    try:
        yield ports
    finally:
        public.close()
        loopback.close()


NETWORK_SCRIPT = """
import os, socket, sys, urllib.request
host, public, loop = sys.argv[1], sys.argv[2], sys.argv[3]
print("host says", urllib.request.urlopen(f"http://{host}:{public}/", timeout=5).read().decode(), flush=True)
try:
    socket.create_connection(("127.0.0.1", int(loop)), timeout=2)
    print("loopback reached", flush=True)
except OSError as err:
    print("loopback unreachable", type(err).__name__, flush=True)
os.execv(sys.executable, [sys.executable, "-m", "http.server", "8080"])
"""


async def test_a_pod_has_an_address_of_its_own(
    core: client.CoreV1Api,
    kube_namespace: str,
    fake_cluster: FakeCluster,
    host_servers: tuple[int, int],
) -> None:
    public, loopback = host_servers
    body = pod("web", NETWORK_SCRIPT)
    body["spec"]["containers"][0]["args"] = [fake_cluster.host_address, str(public), str(loopback)]
    body["spec"]["containers"][0]["readinessProbe"] = {"httpGet": {"path": "/", "port": 8080}}
    await core.create_namespaced_pod(kube_namespace, body)

    async def ready() -> Any:
        status = await status_of(core, kube_namespace, "web")
        return (
            status
            if any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])
            else None
        )

    status = await wait_for(ready)
    assert status.phase == "Running"
    assert status.pod_ip != fake_cluster.host_address
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{status.pod_ip}:8080/") as answer,
    ):
        assert answer.status == 200
    log = await until_log(core, kube_namespace, "web", "loopback")
    assert "host says host" in log
    assert "loopback unreachable ConnectionRefusedError" in log
    assert status.container_statuses[0].state.running is not None


LOG_SCRIPT = """
import sys, time
for n in range(1, 6):
    print("line", n, flush=True)
time.sleep(0.3)
for n in range(6, 9):
    print("line", n, flush=True)
time.sleep(60)
"""


async def test_logs_tail_and_since_time(
    core: client.CoreV1Api, api_client: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    await core.create_namespaced_pod(ns, pod("talker", LOG_SCRIPT))
    await until_log(core, ns, "talker", "line 8")
    assert await core.read_namespaced_pod_log("talker", ns, tail_lines=2) == "line 7\nline 8\n"
    stamped = await core.read_namespaced_pod_log("talker", ns, timestamps=True)
    lines = stamped.splitlines()
    assert len(lines) == 8
    assert lines[0].endswith("Z line 1")
    since = lines[5].split(" ", 1)[0]
    # kubernetes-asyncio has no since_time argument (its OpenAPI spec lacks it): the raw call
    later = await api_client.call_api(
        f"/api/v1/namespaces/{ns}/pods/talker/log",
        "GET",
        query_params=[("sinceTime", since)],
        response_types_map={200: "str"},
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
    )
    assert later == "line 6\nline 7\nline 8\n"


async def test_a_pod_past_its_memory_limit_is_oom_killed(
    core: client.CoreV1Api, kube_namespace: str
) -> None:
    script = "block = bytearray(256 << 20); print('survived', flush=True)"
    limits = {"resources": {"limits": {"memory": "64Mi"}}}
    await core.create_namespaced_pod(kube_namespace, pod("hog", script, container=limits))
    status = await until_phase(core, kube_namespace, "hog", "Failed", "Succeeded")
    assert status.phase == "Failed"
    assert status.container_statuses[0].state.terminated.reason == "OOMKilled"
    assert "survived" not in await core.read_namespaced_pod_log("hog", kube_namespace)


async def test_a_claim_outlives_its_pod_and_secrets_are_read_only_files(
    core: client.CoreV1Api, kube_namespace: str, fake_cluster: FakeCluster
) -> None:
    ns = kube_namespace
    claim: Any = {
        "metadata": {"name": "data-1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    await core.create_namespaced_persistent_volume_claim(ns, claim)
    secret: Any = {"metadata": {"name": "keys"}, "stringData": {"token": "s3cret"}}
    await core.create_namespaced_secret(ns, secret)
    volumes = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data-1"}},
        {"name": "keys", "secret": {"secretName": "keys"}},
    ]
    mounts = [
        {"name": "data", "mountPath": "/data"},
        {"name": "keys", "mountPath": "/var/run/atrium/secrets", "readOnly": True},
    ]
    writer = """
import pathlib
secret = pathlib.Path("/var/run/atrium/secrets/token")
print("secret", secret.read_text(), flush=True)
try:
    secret.write_text("changed")
except OSError as err:
    print("secret read-only", type(err).__name__, flush=True)
pathlib.Path("/data/kept").write_text("from the first pod")
"""
    await core.create_namespaced_pod(
        ns, pod("first", writer, container={"volumeMounts": mounts}, volumes=volumes)
    )
    status = await until_phase(core, ns, "first", "Succeeded", "Failed")
    log = await core.read_namespaced_pod_log("first", ns)
    assert status.phase == "Succeeded", log
    assert "secret s3cret" in log
    assert "secret read-only OSError" in log
    assert status.container_statuses[0].state.terminated.reason == "Completed"
    await core.delete_namespaced_pod("first", ns, grace_period_seconds=0)
    folder = fake_cluster.kubelet.claim_folder(ns, "data-1")
    assert (folder / "kept").read_text() == "from the first pod"

    reader = "import pathlib; print('found', pathlib.Path('/data/kept').read_text(), flush=True)"
    await core.create_namespaced_pod(
        ns, pod("second", reader, container={"volumeMounts": mounts}, volumes=volumes)
    )
    await until_phase(core, ns, "second", "Succeeded", "Failed")
    assert "found from the first pod" in await core.read_namespaced_pod_log("second", ns)


STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, lambda *_: print("asked to stop", flush=True))
print("up", flush=True)
time.sleep(60)
"""


async def test_delete_waits_the_grace_period_then_kills(
    core: client.CoreV1Api, kube_namespace: str, fake_cluster: FakeCluster
) -> None:
    ns = kube_namespace
    await core.create_namespaced_pod(ns, pod("stubborn", STUBBORN))
    await until_log(core, ns, "stubborn", "up")
    await core.delete_namespaced_pod("stubborn", ns, grace_period_seconds=2)
    terminating = await core.read_namespaced_pod("stubborn", ns)
    assert terminating.metadata.deletion_timestamp is not None
    await until_log(core, ns, "stubborn", "asked to stop")
    # it ignored SIGTERM: still there, still running, until the grace period ends
    still = await core.read_namespaced_pod("stubborn", ns)
    assert still.status.container_statuses[0].state.running is not None

    async def gone() -> bool | None:
        try:
            await core.read_namespaced_pod("stubborn", ns)
        except ApiException as err:
            return True if err.status == 404 else None
        return None

    assert await wait_for(gone)
    assert (
        fake_cluster.call(lambda: [p.name for p in fake_cluster.kubelet.pods.values()]).count(
            "stubborn"
        )
        == 0
    )


SLEEPER = """
import sys, time
print("up", sys.argv[1], flush=True)
time.sleep(60)
"""


async def test_a_pod_made_again_under_its_name_is_not_touched_by_the_old_ones_end(
    core: client.CoreV1Api, kube_namespace: str, fake_cluster: FakeCluster
) -> None:
    ns = kube_namespace

    def sleeper(word: str) -> Any:
        return pod("again", SLEEPER, container={"args": [word]})

    old = await core.create_namespaced_pod(ns, sleeper("first"))
    await until_log(core, ns, "again", "up first")

    def delete_and_make_again() -> dict[str, Any]:
        # at once, as a client can right after a delete with grace 0: the old pod's kill and
        # teardown happen after the new pod exists
        fake_cluster.api.delete("v1/pods", ns, "again", 0)
        return fake_cluster.api.create("v1/pods", ns, sleeper("second"))

    made = await fake_cluster.acall(delete_and_make_again)
    new_uid = made["metadata"]["uid"]
    assert new_uid != old.metadata.uid
    with pytest.raises(ApiException) as caught:  # not the old pod's log
        await core.read_namespaced_pod_log("again", ns)
    assert caught.value.status == 400

    def old_gone() -> bool | None:
        return None if old.metadata.uid in fake_cluster.kubelet.pods else True

    await wait_for(lambda: fake_cluster.acall(old_gone))
    await until_log(core, ns, "again", "up second")
    now = await core.read_namespaced_pod("again", ns)
    assert now.metadata.uid == new_uid
    assert now.status.phase == "Running"
    assert "first" not in await core.read_namespaced_pod_log("again", ns)
    # the old pod's end (killed: 137, phase Failed) was its own: no state of the new pod said it
    phases = []
    async with watch.Watch() as watching:
        async for event in watching.stream(
            core.list_namespaced_pod,
            ns,
            field_selector="metadata.name=again",
            resource_version=made["metadata"]["resourceVersion"],
        ):
            seen = event["object"]
            phases.append(seen.status.phase if seen.status else None)
            if int(seen.metadata.resource_version) >= int(now.metadata.resource_version):
                break
    assert "Failed" not in phases
    assert phases[-1] == "Running"


FORKER = """
import os, time
children = 0
try:
    for _ in range(40):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
except OSError as err:
    print("fork refused after", children, type(err).__name__, flush=True)
"""


async def test_the_node_pids_limit_holds_a_pod(
    core: client.CoreV1Api, kube_namespace: str, kube_settings: FakeCluster
) -> None:
    kube_settings.kubelet.pod_pids_limit = 16
    await core.create_namespaced_pod(kube_namespace, pod("forker", FORKER))
    log = await until_log(core, kube_namespace, "forker", "fork refused")
    assert "BlockingIOError" in log
    await core.delete_namespaced_pod("forker", kube_namespace, grace_period_seconds=0)


AS_USER = """
import os, pathlib
print("uid", os.getuid(), "groups", sorted(os.getgroups()), flush=True)
print("secret", pathlib.Path("/var/run/atrium/secrets/token").read_text(), flush=True)
pathlib.Path("/data/mine").write_text("written")
try:
    pathlib.Path("/app/x").write_text("no")
except OSError as err:
    print("app read-only", type(err).__name__, flush=True)
"""


async def test_run_as_user_with_fs_group_volumes(
    core: client.CoreV1Api, kube_namespace: str, kube_settings: FakeCluster
) -> None:
    kube_settings.kubelet.run_as_user = True
    ns = kube_namespace
    claim: Any = {"metadata": {"name": "data-2"}, "spec": {"accessModes": ["ReadWriteOnce"]}}
    await core.create_namespaced_persistent_volume_claim(ns, claim)
    secret: Any = {"metadata": {"name": "keys"}, "stringData": {"token": "s3cret"}}
    await core.create_namespaced_secret(ns, secret)
    volumes = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data-2"}},
        {"name": "app", "emptyDir": {}},
        {"name": "keys", "secret": {"secretName": "keys", "defaultMode": 0o440}},
    ]
    mounts = [
        {"name": "data", "mountPath": "/data"},
        {"name": "app", "mountPath": "/app", "readOnly": True},
        {"name": "keys", "mountPath": "/var/run/atrium/secrets", "readOnly": True},
    ]
    context = {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10002}
    body = pod("user", AS_USER, container={"volumeMounts": mounts}, volumes=volumes)
    body["spec"]["securityContext"] = context
    await core.create_namespaced_pod(ns, body)
    status = await until_phase(core, ns, "user", "Succeeded", "Failed")
    log = await core.read_namespaced_pod_log("user", ns)
    assert status.phase == "Succeeded", log
    assert "uid 10001 groups [10002]" in log
    assert "secret s3cret" in log
    assert "app read-only OSError" in log
    assert (kube_settings.kubelet.claim_folder(ns, "data-2") / "mine").read_text() == "written"


def test_the_leftovers_of_a_dead_session_are_swept(fake_cluster: FakeCluster) -> None:
    dead = next(pid for pid in range(4_000_000, 4_100_000) if not Path(f"/proc/{pid}").exists())
    bridge, netns = f"{PREFIX}{dead}b", f"{PREFIX}{dead}-1"
    folder = Path(f"/tmp/atrium-kube-{dead}")  # noqa: S108
    try:
        subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "netns", "add", netns], check=True)
        folder.mkdir()
        removed = sweep()
        assert {bridge, netns, str(folder)} <= set(removed)
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
        assert bridge not in links.stdout
        assert not folder.exists()
        assert fake_cluster.kubelet.network.bridge in links.stdout  # this session's are kept
    finally:
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)
