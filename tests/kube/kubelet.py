"""A fake kubelet: runs the fake API's pods as bubblewrap sandboxes, each in a network namespace.

For every pod it sees (it reads the fake API's event feed in-process, on the same loop):

- scheduling: a pod asking more memory or CPU than `Kubelet.ceiling_memory_mib` /
  `Kubelet.ceiling_cpu_milli` stays Pending with ``PodScheduled False, reason Unschedulable``; an
  image in `Kubelet.missing_images` stays Pending with ``waiting.reason: ErrImagePull``; a claim or a
  Secret that does not exist keeps it ``ContainerCreating`` (as a mount that cannot be made);
- the network: a namespace of its own with one address on a bridge in the root namespace. The
  root namespace holds the bridge's address (`Network.gateway`, the address pods reach the host
  at), so the shell's process reaches ``podIP:8080`` by a connected route, while a pod's
  ``127.0.0.1`` is its own (it cannot reach the root namespace's loopback). IP forwarding stays
  as the host has it (off here), so pods reach nothing past the host;
- the files: the host's filesystem read-only (so the venv's Python and the SDK are there, the
  "image" is otherwise ignored), ``/tmp`` a tmpfs, emptyDir volumes as per-pod folders, a PVC as a
  host folder per claim name that outlives the pod, Secret and ConfigMap volumes as files, every
  ``readOnly`` mount read-only;
- the run: init containers in order, each to the end, then the containers with their literal
  ``env``, ``workingDir``, ``command`` + ``args`` (``python`` is the venv's), in a memory cgroup (v1)
  with ``resources.limits.memory`` (and a pids cgroup with `Kubelet.pod_pids_limit`, the node-wide
  limit a kubelet's ``podPidsLimit`` sets); stdout and stderr captured line by line with the time for
  ``pods/log``; the status patched as a kubelet does (``podIP``, ``phase``, ``conditions``,
  ``containerStatuses`` waiting/running/terminated with ``Completed``/``Error``/``OOMKilled``);
  readiness from an ``httpGet`` or ``tcpSocket`` probe (probed until it first succeeds), else
  ready once started;
- delete: SIGTERM to the sandbox's process group, SIGKILL after the grace period, then the
  namespace, the folders and the cgroup go and the pod leaves the API.

Volumes belong to the pod's ``fsGroup``; containers run as their ``runAsUser`` only with
`Kubelet.run_as_user` (else as root). Not done: container restarts (every pod behaves as
``restartPolicy: Never``), ``valueFrom``/``envFrom``, liveness probes, more than one node.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import atrium
from atrium.lifecycle.limits import oom_kills
from tests.kube.fake_api import FakeApi, LogLine

_LOGGER = logging.getLogger(__name__)
MEMORY_CGROUP = Path("/sys/fs/cgroup/memory")
#: the v1 pids hierarchy (`Kubelet.pod_pids_limit`, as a kubelet's ``podPidsLimit``)
PIDS_CGROUP = Path("/sys/fs/cgroup/pids")
#: entries of / the sandbox gets its own of
_OWN = {"proc", "dev", "tmp"}
_UNITS = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def memory_bytes(quantity: str | int) -> int:
    """A Kubernetes memory quantity (``256Mi``, ``1G``, ``1048576``) in bytes."""
    text = str(quantity)
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    if match is None or (match.group(2) and match.group(2) not in _UNITS):
        raise ValueError(f"not a memory quantity: {text!r}")
    return int(float(match.group(1)) * _UNITS.get(match.group(2), 1))


def cpu_milli(quantity: str | int | float) -> int:
    text = str(quantity)
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def stamp(when: datetime.datetime | None = None) -> str:
    return (when or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


async def run(*argv: str, check: bool = True) -> str:
    """Run a host command (``ip``, ...), its output; raise when it fails and ``check``."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {err.decode().strip()}")
    return out.decode()


class Network:
    """A bridge ``<prefix>b`` holding `gateway` in the root namespace, and one namespace
    ``<prefix>-<n>`` with a veth ``<prefix>h<n>`` on it per pod."""

    def __init__(self, prefix: str, subnet: ipaddress.IPv4Network) -> None:
        self.prefix = prefix
        self.subnet = subnet
        hosts = list(subnet.hosts())
        self.gateway = str(hosts[0])
        self.free = [str(h) for h in hosts[1:]]
        self.bridge = f"{prefix}b"
        self.count = 0

    async def up(self) -> None:
        await run("ip", "link", "add", self.bridge, "type", "bridge")
        await run(
            "ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge
        )
        await run("ip", "link", "set", self.bridge, "up")

    async def add(self) -> tuple[str, str, str]:
        """A new namespace with its address: (namespace, host-side veth, address)."""
        self.count += 1
        netns, veth, address = (
            f"{self.prefix}-{self.count}",
            f"{self.prefix}h{self.count}",
            self.free.pop(0),
        )
        await run("ip", "netns", "add", netns)
        await run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        await run("ip", "link", "set", veth, "master", self.bridge, "up")
        await run(
            "ip", "-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0"
        )
        await run("ip", "-n", netns, "link", "set", "eth0", "up")
        await run("ip", "-n", netns, "link", "set", "lo", "up")
        await run("ip", "-n", netns, "route", "add", "default", "via", self.gateway)
        return netns, veth, address

    async def remove(self, netns: str, veth: str, address: str) -> None:
        await run("ip", "link", "del", veth, check=False)
        await run("ip", "netns", "del", netns, check=False)
        self.free.append(address)

    async def down(self) -> None:
        await run("ip", "link", "del", self.bridge, check=False)


def image_args() -> list[str]:
    """The "image" is this machine's interpreter and checkout: one under /tmp (a clone tested
    there) is bound again over the pod's own /tmp, or the pod finds no python. Last on the
    command line: the pod's /tmp volume is mounted before."""
    args: list[str] = []
    for needed in (Path(atrium.__file__).resolve().parents[1], Path(sys.prefix)):
        if needed.resolve().is_relative_to("/tmp"):  # noqa: S108
            args += ["--ro-bind", str(needed), str(needed)]
    return args


def filesystem_args(mount_points: list[str]) -> list[str]:
    """The host's filesystem read-only, entry by entry, so that a mount point the host lacks can
    be made: a host folder on the way to one becomes a tmpfs holding its entries instead."""
    rebuilt: set[Path] = set()
    for point in mount_points:
        real = Path(os.path.realpath(point))
        if real.exists():
            continue
        rebuilt.update(p for p in real.parents if p.exists() and p != Path("/"))
    args: list[str] = []

    def entries(folder: Path) -> None:
        for path in sorted(folder.iterdir()):
            if folder == Path("/") and path.name in _OWN:
                continue
            if path.is_symlink():
                args.extend(["--symlink", str(path.readlink()), str(path)])
            elif path in rebuilt:
                args.extend(["--tmpfs", str(path)])  # left writable: bwrap makes mount points in it
                entries(path)
            elif path.is_dir() or path.is_file():
                args.extend(["--ro-bind", str(path), str(path)])

    entries(Path("/"))
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108
    made: set[Path] = set()
    for point in mount_points:  # bwrap would make the missing parents 0700: a user could not pass
        real = Path(os.path.realpath(point))
        for folder in [*reversed(real.parents), real]:
            if not folder.exists() and folder not in made:
                made.add(folder)
                args += ["--perms", "0755", "--dir", str(folder)]
    return args


@dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    spec: dict[str, Any]
    folder: Path
    logs: dict[str, list[LogLine]] = field(default_factory=dict)
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    net: tuple[str, str, str] | None = None
    cgroup: Path | None = None
    pids_cgroup: Path | None = None
    task: asyncio.Task[None] | None = None
    stopping: bool = False
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    init_statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)


class Kubelet:
    """One node. `start` it on the fake API's loop; `stop` kills every pod and removes the net."""

    def __init__(
        self, api: FakeApi, prefix: str, root: Path, subnet: ipaddress.IPv4Network
    ) -> None:
        self.api = api
        self.prefix = prefix
        self.root = root
        self.network = Network(prefix, subnet)
        self.pods: dict[str, Pod] = {}
        self.missing_images: set[str] = set()
        self.ceiling_memory_mib: int | None = None
        self.ceiling_cpu_milli: int | None = None
        self.cgroup_parent = MEMORY_CGROUP / prefix
        self.pids_parent = PIDS_CGROUP / prefix
        #: the most processes one pod may have (None: no limit), a node-wide setting
        self.pod_pids_limit: int | None = None
        #: run containers as their ``runAsUser`` (off: as root, which hides permission mistakes)
        self.run_as_user = False
        self._feed: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def gateway(self) -> str:
        return self.network.gateway

    def claim_folder(self, namespace: str, claim: str) -> Path:
        """Where a PVC's data lives on the host (kept after the pod goes)."""
        return self.root / "claims" / namespace / claim

    async def start(self) -> None:
        await self.network.up()
        with contextlib.suppress(OSError):
            self.cgroup_parent.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            self.pids_parent.mkdir(exist_ok=True)
        self.api.kubelet_attached = True
        self.api.log_source = self._logs
        queue = self.api.subscribe()
        for (resource, _, _), obj in list(self.api.store.items()):
            if resource == "v1/pods":
                self._seen(obj)
        self._feed = asyncio.create_task(self._follow(queue))

    async def stop(self) -> None:
        if self._feed is not None:
            self._feed.cancel()
        self.api.kubelet_attached = False
        await asyncio.gather(*(self._kill(pod, 0) for pod in list(self.pods.values())))
        # the kills and pod runs under way (a pod deleted by the last test) end first: cancelled
        # by the cluster's stop, the host command one was running (``ip``) was left to the
        # garbage collector still running, a ResourceWarning that failed the session
        pending = [*self._tasks, *(p.task for p in self.pods.values() if p.task is not None)]
        if pending:
            await asyncio.wait(pending, timeout=10)
        await self.network.down()
        with contextlib.suppress(OSError):
            self.cgroup_parent.rmdir()
        with contextlib.suppress(OSError):
            self.pids_parent.rmdir()

    def _logs(self, namespace: str, name: str, container: str | None) -> list[LogLine] | None:
        """The logs of the pod of that name the API holds: one deleted at once (grace 0) may
        still be torn down here after a new one of its name was made, and is not asked about."""
        current = self.api.get("v1/pods", namespace, name)
        if current is None:
            return None
        for pod in self.pods.values():
            if pod.uid == current["metadata"]["uid"]:
                names = [c["name"] for c in pod.spec.get("containers", [])]
                lines = pod.logs.get(container or (names[0] if names else ""))
                return None if lines is None else list(lines)
        return None

    async def _follow(self, queue: asyncio.Queue[tuple[int, str, dict[str, Any]] | None]) -> None:
        while True:
            item = await queue.get()
            if item is None:
                continue
            _, resource, event = item
            if resource != "v1/pods":
                continue
            obj = event["object"]
            uid = obj["metadata"]["uid"]
            if event["type"] == "ADDED":
                self._seen(obj)
            elif event["type"] == "DELETED" and uid in self.pods:
                self._background(self._kill(self.pods[uid], 0, remove=False))
            elif obj["metadata"].get("deletionTimestamp") and uid in self.pods:
                pod = self.pods[uid]
                if not pod.stopping:
                    grace = obj["metadata"].get("deletionGracePeriodSeconds") or 0
                    self._background(self._kill(pod, grace, remove=True))

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _seen(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if meta["uid"] in self.pods:
            return
        pod = Pod(
            meta.get("namespace", ""),
            meta["name"],
            meta["uid"],
            obj.get("spec", {}),
            self.root / "pods" / meta["uid"],
        )
        self.pods[pod.uid] = pod
        pod.task = asyncio.create_task(self._run(pod))

    # --- the status ------------------------------------------------------------------------------

    def _patch(self, pod: Pod, **status: Any) -> None:
        body = {
            **status,
            "conditions": list(pod.conditions.values()),
            "containerStatuses": list(pod.statuses.values()),
        }
        if pod.init_statuses:
            body["initContainerStatuses"] = list(pod.init_statuses.values())
        self.api.patch_status(pod.namespace, pod.name, body, pod.uid)

    def _condition(
        self, pod: Pod, kind: str, ok: bool, reason: str | None = None, message: str | None = None
    ) -> None:
        cond: dict[str, Any] = {
            "type": kind,
            "status": "True" if ok else "False",
            "lastTransitionTime": stamp(),
        }
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        pod.conditions[kind] = cond

    def _container_status(
        self, pod: Pod, container: dict[str, Any], state: dict[str, Any], init: bool = False
    ) -> None:
        running = "running" in state
        status = {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": "",
            "ready": running and not init and not container.get("readinessProbe"),
            "started": running,
            "restartCount": 0,
            "state": state,
        }
        if init:
            pod.init_statuses[container["name"]] = status
        else:
            pod.statuses[container["name"]] = status

    # --- the run ---------------------------------------------------------------------------------

    async def _run(self, pod: Pod) -> None:
        try:
            await self._lifecycle(pod)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a defect of the fake must be visible, not a silent Pending
            _LOGGER.exception("fake kubelet: pod %s/%s", pod.namespace, pod.name)
            self._patch(pod, phase="Failed", reason="KubeletError", message=repr(err))

    def _unschedulable(self, pod: Pod) -> str | None:
        memory = cpu = 0
        for container in pod.spec.get("containers", []):
            resources = container.get("resources") or {}
            asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            if "memory" in asked:
                memory += memory_bytes(asked["memory"])
            if "cpu" in asked:
                cpu += cpu_milli(asked["cpu"])
        if self.ceiling_memory_mib is not None and memory > self.ceiling_memory_mib << 20:
            return "0/1 nodes are available: 1 Insufficient memory."
        if self.ceiling_cpu_milli is not None and cpu > self.ceiling_cpu_milli:
            return "0/1 nodes are available: 1 Insufficient cpu."
        return None

    def _volume_problem(self, pod: Pod) -> str | None:
        for volume in pod.spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if self.api.get("v1/persistentvolumeclaims", pod.namespace, claim) is None:
                    return f'persistentvolumeclaim "{claim}" not found'
            for kind, resource, field_name in (
                ("secret", "v1/secrets", "secretName"),
                ("configMap", "v1/configmaps", "name"),
            ):
                if kind in volume:
                    ref = volume[kind][field_name]
                    if self.api.get(resource, pod.namespace, ref) is None and not volume[kind].get(
                        "optional"
                    ):
                        return f'{kind} "{ref}" not found'
        return None

    def _held(self, pod: Pod) -> bool:
        """Whether the pod cannot start (status patched to say why): unschedulable, an image
        that cannot be pulled, a volume that cannot be mounted."""
        containers = pod.spec.get("containers", [])
        inits = pod.spec.get("initContainers", [])
        problem = self._unschedulable(pod)
        if problem is not None:
            self._condition(pod, "PodScheduled", False, "Unschedulable", problem)
            self._patch(pod, phase="Pending")
            return True
        self._condition(pod, "PodScheduled", True)
        waiting = {"waiting": {"reason": "PodInitializing" if inits else "ContainerCreating"}}
        for container in containers:
            self._container_status(pod, container, waiting)
        self._condition(pod, "Initialized", not inits)
        self._condition(pod, "Ready", False, "ContainersNotReady")
        for container in inits + containers:
            if container.get("image") in self.missing_images:
                message = f'failed to pull image "{container.get("image")}": not found'
                pulling = {"waiting": {"reason": "ErrImagePull", "message": message}}
                self._container_status(pod, container, pulling, init=container in inits)
                self._patch(pod, phase="Pending")
                return True
        problem = self._volume_problem(pod)
        if problem is not None:
            for container in containers:
                creating = {"waiting": {"reason": "ContainerCreating", "message": problem}}
                self._container_status(pod, container, creating)
            self._patch(pod, phase="Pending", message=f"MountVolume.SetUp failed: {problem}")
            return True
        return False

    async def _lifecycle(self, pod: Pod) -> None:
        containers = pod.spec.get("containers", [])
        inits = pod.spec.get("initContainers", [])
        if self._held(pod):
            return
        pod.net = await self.network.add()
        pod.cgroup = self._make_cgroup(self.cgroup_parent / pod.uid)
        if self.pod_pids_limit is not None:
            pod.pids_cgroup = self._make_cgroup(self.pids_parent / pod.uid)
            if pod.pids_cgroup is not None:
                (pod.pids_cgroup / "pids.max").write_text(str(self.pod_pids_limit))
        started = stamp()
        self._patch(
            pod,
            phase="Pending",
            podIP=pod.net[2],
            podIPs=[{"ip": pod.net[2]}],
            hostIP=self.gateway,
            startTime=started,
        )
        mounts = self._volumes(pod)
        for container in inits:
            if pod.stopping:
                return
            self._container_status(pod, container, {"running": {"startedAt": stamp()}}, init=True)
            self._patch(pod, phase="Pending")
            code, reason, began = await self._exec(pod, container, mounts)
            self._container_status(
                pod, container, {"terminated": self._terminated(code, reason, began)}, init=True
            )
            if code != 0:
                self._patch(pod, phase="Failed")
                return
        self._condition(pod, "Initialized", True)
        if pod.stopping:
            return
        runs = [asyncio.create_task(self._main(pod, container, mounts)) for container in containers]
        results = await asyncio.gather(*runs)
        self._condition(pod, "Ready", False, "PodCompleted")
        self._patch(pod, phase="Succeeded" if all(code == 0 for code in results) else "Failed")

    async def _main(
        self, pod: Pod, container: dict[str, Any], mounts: dict[str, tuple[Path, bool]]
    ) -> int:
        began = stamp()

        def on_start() -> None:
            self._container_status(pod, container, {"running": {"startedAt": began}})
            if not container.get("readinessProbe"):
                self._ready(pod)
            self._patch(pod, phase="Running")

        probe = asyncio.create_task(self._probe(pod, container))
        try:
            code, reason, began = await self._exec(pod, container, mounts, on_start)
        finally:
            probe.cancel()
        self._container_status(
            pod, container, {"terminated": self._terminated(code, reason, began)}
        )
        return code

    def _ready(self, pod: Pod) -> None:
        if all(s.get("ready") for s in pod.statuses.values()):
            self._condition(pod, "Ready", True)
            self._condition(pod, "ContainersReady", True)

    async def _probe(self, pod: Pod, container: dict[str, Any]) -> None:
        spec = container.get("readinessProbe")
        if not spec or pod.net is None:
            return
        address = pod.net[2]
        check = spec.get("httpGet") or spec.get("tcpSocket") or {}
        port = check.get("port", 8080)
        if isinstance(port, str):
            port = next(
                (p["containerPort"] for p in container.get("ports", []) if p.get("name") == port),
                8080,
            )
        while True:
            await asyncio.sleep(0.1)
            if (
                container["name"] not in pod.statuses
                or "running" not in pod.statuses[container["name"]]["state"]
            ):
                continue
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), 2)
            except (OSError, TimeoutError):
                continue
            ok = True
            try:
                if "httpGet" in spec:
                    path = spec["httpGet"].get("path", "/")
                    writer.write(f"GET {path} HTTP/1.0\r\nHost: {address}:{port}\r\n\r\n".encode())
                    await writer.drain()
                    line = await asyncio.wait_for(reader.readline(), 2)
                    parts = line.split()
                    ok = len(parts) > 1 and parts[1].isdigit() and 200 <= int(parts[1]) < 400
            except (OSError, TimeoutError):
                ok = False
            finally:
                writer.close()
            if ok:
                pod.statuses[container["name"]]["ready"] = True
                self._ready(pod)
                self._patch(pod, phase="Running")
                return

    @staticmethod
    def _terminated(code: int, reason: str, began: str) -> dict[str, Any]:
        return {"exitCode": code, "reason": reason, "startedAt": began, "finishedAt": stamp()}

    @staticmethod
    def _make_cgroup(folder: Path) -> Path | None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        return folder

    def _volumes(self, pod: Pod) -> dict[str, tuple[Path, bool]]:
        """Volume name → (host folder, always read-only)."""
        found: dict[str, tuple[Path, bool]] = {}
        for volume in pod.spec.get("volumes", []):
            name = volume["name"]
            if "persistentVolumeClaim" in volume:
                folder = self.claim_folder(
                    pod.namespace, volume["persistentVolumeClaim"]["claimName"]
                )
                folder.mkdir(parents=True, exist_ok=True)
                self._share(pod, folder)
                found[name] = (folder, bool(volume["persistentVolumeClaim"].get("readOnly")))
            elif "emptyDir" in volume:
                folder = pod.folder / "volumes" / name
                folder.mkdir(parents=True, exist_ok=True)
                self._share(pod, folder)
                found[name] = (folder, False)
            elif "secret" in volume or "configMap" in volume:
                kind = "secret" if "secret" in volume else "configMap"
                source = volume[kind]
                obj = (
                    self.api.get(
                        "v1/secrets" if kind == "secret" else "v1/configmaps",
                        pod.namespace,
                        source["secretName"] if kind == "secret" else source["name"],
                    )
                    or {}
                )
                data: dict[str, bytes] = {}
                for key, value in (obj.get("data") or {}).items():
                    data[key] = base64.b64decode(value) if kind == "secret" else str(value).encode()
                folder = pod.folder / "volumes" / name
                folder.mkdir(parents=True, exist_ok=True)
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                mode = source.get("defaultMode", 0o644)
                for item in items:
                    target = folder / item["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data.get(item["key"], b""))
                    target.chmod(item.get("mode", mode))
                    self._share(pod, target)
                self._share(pod, folder)
                found[name] = (folder, True)
            else:
                raise RuntimeError(f"the fake kubelet has no volume kind of {volume}")
        return found

    @staticmethod
    def _share(pod: Pod, path: Path) -> None:
        """A volume's folder or file as a kubelet hands it to the pod's ``fsGroup``: the group
        owns it, and a folder is group-writable with new files inheriting the group."""
        group = (pod.spec.get("securityContext") or {}).get("fsGroup")
        if group is None:
            return
        os.chown(path, -1, int(group))
        if path.is_dir():
            path.chmod(0o2775 if path.stat().st_mode & 0o200 else 0o2755)

    def _command(
        self, pod: Pod, container: dict[str, Any], volumes: dict[str, tuple[Path, bool]]
    ) -> tuple[list[str], dict[str, str]]:
        """The sandbox's command line (empty: the container has no command) and environment."""
        assert pod.net is not None
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        points = [m["mountPath"] for m in container.get("volumeMounts", [])]
        workdir = container.get("workingDir")
        if workdir:
            points.append(workdir)
        args = filesystem_args(points)
        for mount in container.get("volumeMounts", []):
            folder, always_ro = volumes[mount["name"]]
            if mount.get("subPath"):
                folder = folder / mount["subPath"]
                folder.mkdir(parents=True, exist_ok=True)
            flag = "--ro-bind" if always_ro or mount.get("readOnly") else "--bind"
            # bwrap cannot make a mount point through a symlink (/var/run -> /run): its target
            args += [flag, str(folder), os.path.realpath(mount["mountPath"])]
        args += image_args()
        if workdir:
            args += ["--dir", workdir, "--chdir", workdir]
        args += self._name_files(pod)
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",  # noqa: S108
            "HOSTNAME": pod.name,
        }
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        argv = [*self._user(pod, container), *argv] if argv else argv
        sandbox = [
            "ip", "netns", "exec", pod.net[0],
            "bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--hostname", pod.name, *args, "--", *argv,
        ]  # fmt: skip
        if not argv:
            return [], env
        if pod.cgroup is not None:
            limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            if limit is not None:
                size = str(memory_bytes(limit))
                (pod.cgroup / "memory.limit_in_bytes").write_text(size)
                with contextlib.suppress(OSError):
                    (pod.cgroup / "memory.memsw.limit_in_bytes").write_text(size)
            procs = [str(c / "cgroup.procs") for c in (pod.cgroup, pod.pids_cgroup) if c]
            joins = " && ".join(f'echo 0 > "${n}"' for n in range(1, len(procs) + 1))
            enter = f'{joins} && shift {len(procs)} && exec "$@"'
            sandbox = ["sh", "-c", enter, "sh", *procs, *sandbox]
        return sandbox, env

    async def _exec(
        self,
        pod: Pod,
        container: dict[str, Any],
        volumes: dict[str, tuple[Path, bool]],
        on_start: Callable[[], None] | None = None,
    ) -> tuple[int, str, str]:
        """Run one container to its end: (exit code, reason, when it started)."""
        sandbox, env = self._command(pod, container, volumes)
        began = stamp()
        name = container["name"]
        log = pod.logs.setdefault(name, [])
        if not sandbox:
            log.append((now(), "fake kubelet: the container has no command\n"))
            return 128, "ContainerCannotRun", began
        before = self._oom_count(pod)
        proc = await asyncio.create_subprocess_exec(
            *sandbox,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
            limit=1 << 20,
        )
        pod.procs[name] = proc
        if on_start is not None:
            on_start()
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            log.append((now(), line.decode(errors="replace")))
        code = await proc.wait()
        pod.procs.pop(name, None)
        if code < 0:
            code = 128 - code
        if self._oom_count(pod) > before:
            return code or 137, "OOMKilled", began
        return code, "Completed" if code == 0 else "Error", began

    def _user(self, pod: Pod, container: dict[str, Any]) -> list[str]:
        """With `run_as_user`, the prefix that runs the command as the pod's ``runAsUser`` /
        ``runAsGroup`` with its ``fsGroup`` and ``supplementalGroups``, no capabilities."""
        pod_context = pod.spec.get("securityContext") or {}
        context = {**pod_context, **(container.get("securityContext") or {})}
        uid = context.get("runAsUser")
        if not self.run_as_user or uid in (None, 0):
            return []
        gid = context.get("runAsGroup", uid)
        extra = [pod_context.get("fsGroup"), *(pod_context.get("supplementalGroups") or [])]
        groups = ",".join(str(g) for g in extra if g is not None)
        return [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            f"--groups={groups}" if groups else "--clear-groups",
            "--inh-caps=-all",
            "--",
        ]

    @staticmethod
    def _name_files(pod: Pod) -> list[str]:
        """``/etc/hosts`` naming the pod, and a resolver on the pod's own loopback: there is no
        cluster DNS, and a lookup must fail at once (``http.server`` asks for its own name)
        rather than wait out the host's name server, which a pod cannot reach."""
        assert pod.net is not None
        folder = pod.folder / "etc"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text(f"127.0.0.1 localhost\n{pod.net[2]} {pod.name}\n")
        (folder / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        return [
            *("--ro-bind", str(folder / "hosts"), "/etc/hosts"),
            *("--ro-bind", str(folder / "resolv.conf"), "/etc/resolv.conf"),
        ]

    def _oom_count(self, pod: Pod) -> int:
        if pod.cgroup is None:
            return 0
        try:
            return oom_kills((pod.cgroup / "memory.oom_control").read_text())
        except OSError:
            return 0

    # --- delete ----------------------------------------------------------------------------------

    async def _kill(self, pod: Pod, grace: float, remove: bool = False) -> None:
        if pod.stopping:
            return
        pod.stopping = True
        self._term(pod)
        if pod.task is not None and grace > 0:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(pod.task), grace)
        for proc in list(pod.procs.values()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._kill_cgroup(pod)
        if pod.task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(pod.task), 5)
            pod.task.cancel()
        if pod.net is not None:
            await self.network.remove(*pod.net)
        for folder in [f for f in (pod.cgroup, pod.pids_cgroup) if f is not None]:
            for _ in range(100):
                try:
                    folder.rmdir()
                    break
                except OSError:
                    await asyncio.sleep(0.05)
        shutil.rmtree(pod.folder, ignore_errors=True)
        self.pods.pop(pod.uid, None)
        if remove:
            obj = self.api.get("v1/pods", pod.namespace, pod.name)
            if obj is not None and obj["metadata"]["uid"] == pod.uid:
                self.api.remove("v1/pods", pod.namespace, pod.name)

    @staticmethod
    def _term(pod: Pod) -> None:
        """SIGTERM to the containers' own processes, as a kubelet sends it to each container's
        first process; bwrap (outside and its init inside) is spared, or it would take the app
        down with it at once and the grace period would mean nothing."""
        if pod.cgroup is None:
            for proc in list(pod.procs.values()):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            return
        with contextlib.suppress(OSError):
            for pid in (pod.cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap":
                        continue
                    os.kill(int(pid), signal.SIGTERM)

    @staticmethod
    def _kill_cgroup(pod: Pod) -> None:
        if pod.cgroup is None:
            return
        with contextlib.suppress(OSError):
            for pid in (pod.cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
