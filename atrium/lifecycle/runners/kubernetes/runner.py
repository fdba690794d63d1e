"""The Kubernetes runner: one Pod per instance, heard about through one watch (I/O).

`spawn` creates the objects `render.instance_objects` gives (the Secret, the data claim unless it
exists, the Pod) and returns once the pod runs at an address; the lifecycle manager then checks
``/health`` at ``podIP:8080`` as for any runner. One watch per runner (the pods with this shell's
label) feeds every handle: it is resumed after ``410 Gone`` by a re-list, and reconnects with a
backoff while the API is down (a spawn falls back on reading its pod meanwhile).

API failures become SpawnFailed causes that say what to fix: ``api`` (403 with the RBAC verb and
resource, 422 with the fields, an API unreachable for ``API_PATIENCE`` seconds), ``image``,
``schedule``, ``exited``, ``oom``, ``timeout``; an instance is never left waiting on a pod that
will not come. Pods outlive the shell (``survives_shell``): `survivors` finds them for the next
shell, with the secrets read back from each one's Secret.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from atrium.errors import SpawnFailed
from atrium.lifecycle.runners import ExitStatus, LogChunk, SpawnSpec, Survivor
from atrium.lifecycle.runners.kubernetes import KubeSettings, render
from atrium.lifecycle.runners.kubernetes.source import source_digest

_LOGGER = logging.getLogger(__name__)
T = TypeVar("T")

#: how long an API that does not answer is retried before a spawn fails with cause ``api``
API_PATIENCE: Final = 10.0
#: one API request's own limit (a hung connection counts as "not answering")
REQUEST_TIMEOUT: Final = 10.0
#: a watch is re-opened this often (the server may end it sooner)
WATCH_SECONDS: Final = 240
#: how often a spawn reads its pod itself, in case the watch is behind or down
POLL_SECONDS: Final = 1.0
#: waiting reasons of a container whose image cannot be pulled or run
IMAGE_REASONS: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
#: the SIGKILL-like code of a pod that was deleted under a running app
KILLED_CODE: Final = -9


def exit_of(pod: Mapping[str, Any]) -> ExitStatus | None:
    """How a pod's app ended, from its status (None while it runs or starts). Pure."""
    status = pod.get("status") or {}
    for init in status.get("initContainerStatuses") or ():
        ended = (init.get("state") or {}).get("terminated")
        if ended and ended.get("exitCode", 0) != 0:
            return ExitStatus(
                int(ended.get("exitCode", 1)),
                "oom" if ended.get("reason") == "OOMKilled" else "exited",
            )
        waiting = (init.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_REASONS:
            return ExitStatus(-1, "image")
    for container in status.get("containerStatuses") or ():
        state = container.get("state") or {}
        ended = state.get("terminated")
        waiting = state.get("waiting") or {}
        if ended is None and waiting.get("reason") == "CrashLoopBackOff":
            ended = (container.get("lastState") or {}).get("terminated")
        if ended is not None:
            code = int(ended.get("exitCode", 1))
            return ExitStatus(code, "oom" if ended.get("reason") == "OOMKilled" else "exited")
        if waiting.get("reason") in IMAGE_REASONS:
            return ExitStatus(-1, "image")
    phase = status.get("phase")
    if phase == "Failed":
        return ExitStatus(KILLED_CODE if status.get("reason") == "Evicted" else 1, "killed")
    if phase == "Succeeded":
        return ExitStatus(0, "exited")
    return None


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's reason a pod cannot be placed (None when it can or has been). Pure."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return str(condition.get("message") or "no node fits it")
    return None


def waiting_message(pod: Mapping[str, Any]) -> str:
    """What a pod is waiting on, for a failure message. Pure."""
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + (
        status.get("containerStatuses") or []
    ):
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason')}: {waiting.get('message', '')}".strip(": ")
    return f"phase {status.get('phase') or 'unknown'}"


def runs(pod: Mapping[str, Any]) -> bool:
    """The pod has an address and its app container runs (not being deleted). Pure."""
    status = pod.get("status") or {}
    if not status.get("podIP") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    containers = status.get("containerStatuses") or ()
    return status.get("phase") == "Running" and all(
        "running" in (c.get("state") or {}) for c in containers
    )


def api_problem(err: ApiException, verb: str, resource: str, namespace: str) -> str:
    """An API refusal in words that say what to fix. Pure."""
    try:
        body = json.loads(err.body) if err.body else {}
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") or err.reason or ""
    if err.status == 403:
        return (
            f"forbidden: the shell may not {verb} {resource} in namespace {namespace!r}; its "
            f"Role needs the verb {verb!r} on {resource!r} (docs/deploying.md): {message}"
        )
    if err.status == 422:
        causes = (body.get("details") or {}).get("causes") or ()
        fields = "; ".join(f"{c.get('field', '?')}: {c.get('message', '')}" for c in causes)
        return f"the cluster refused the {resource} as invalid: {fields or message}"
    if err.status == 404:
        return f"{resource} not found in namespace {namespace!r}: {message}"
    return f"{verb} {resource}: {err.status} {message}".strip()


def _transient(err: BaseException) -> bool:
    if isinstance(err, ApiException):
        return err.status in (0, 429, 500, 502, 503, 504)
    return isinstance(err, aiohttp.ClientError | OSError | TimeoutError)


class PodApp:
    """One instance's pod: the RunningApp of the Kubernetes runner (fed by the runner's watch)."""

    def __init__(self, runner: KubernetesRunner, name: str, pod: Mapping[str, Any]) -> None:
        self._runner = runner
        self._name = name
        self._pod: Mapping[str, Any] = pod
        self._uid = str((pod.get("metadata") or {}).get("uid") or "")
        self._exited: asyncio.Future[ExitStatus] = asyncio.get_running_loop().create_future()
        self._changed = asyncio.Event()
        self._stopping: asyncio.Task[ExitStatus] | None = None
        #: the pod has left the API (not only ended): what stop() waits for
        self._gone = False

    def __repr__(self) -> str:
        return f"<PodApp {self._runner.namespace}/{self._name} uid={self._uid}>"

    @property
    def name(self) -> str:
        return self._name

    @property
    def host(self) -> str:
        return str((self._pod.get("status") or {}).get("podIP") or "")

    @property
    def port(self) -> int:
        return render.POD_PORT

    @property
    def pid(self) -> int | None:
        return None

    @property
    def uid(self) -> str:
        return self._uid

    @property
    def ref(self) -> dict[str, Any]:
        return {"namespace": self._runner.namespace, "pod": self._name, "uid": self._uid}

    @property
    def pod(self) -> Mapping[str, Any]:
        return self._pod

    @property
    def instance_id(self) -> str:
        return _annotation(self._pod, render.ANNOTATION_INSTANCE)

    @property
    def status(self) -> ExitStatus | None:
        return self._exited.result() if self._exited.done() else None

    def observe(self, pod: Mapping[str, Any] | None) -> None:
        """What the watch (or a read) says of the pod now; None: it is gone."""
        if pod is not None:
            uid = str((pod.get("metadata") or {}).get("uid") or "")
            if self._uid and uid and uid != self._uid:
                pod = None  # a pod of the same name that is not this one: this one is gone
            else:
                self._uid = self._uid or uid
                self._pod = pod
        if pod is None:
            self._gone = True
            self._finish(ExitStatus(KILLED_CODE, "killed"))
        elif (ended := exit_of(pod)) is not None:
            deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
            if ended.reason == "exited" and deleting and self._stopping is None:
                # deleted by someone other than this shell: the app's own exit is only how it
                # took that delete's SIGTERM, so it is a kill from outside
                ended = ExitStatus(ended.code, "killed")
            self._finish(ended)
        self._changed.set()

    def _finish(self, status: ExitStatus) -> None:
        if not self._exited.done():
            self._exited.set_result(status)

    async def changed(self, seconds: float) -> None:
        """Until the next observation, or ``seconds``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), seconds)
        self._changed.clear()

    async def wait(self) -> ExitStatus:
        return await asyncio.shield(self._exited)

    async def stop(self, grace: float = 3.0) -> ExitStatus:
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._stop(grace), name=f"stop {self._name}")
        return await asyncio.shield(self._stopping)

    async def _stop(self, grace: float) -> ExitStatus:
        """Delete the pod (the kubelet's SIGTERM, SIGKILL after ``grace``) and its Secret; the
        claim stays. Returns when the pod is gone (or the API cannot say so within a bound)."""
        runner = self._runner
        await runner.delete_pod(self._name, self._uid, grace)
        if self.instance_id:
            await runner.delete_secret(self.instance_id)
        deadline = time.monotonic() + grace + API_PATIENCE * 3
        while not self._gone and time.monotonic() < deadline:
            await self.changed(POLL_SECONDS)
            if not self._gone:
                with contextlib.suppress(SpawnFailed):
                    self.observe(await runner.read_pod(self._name))
        runner.forget(self)
        self._finish(ExitStatus(-15, "killed"))
        return self._exited.result()

    async def logs(self, lines: int, after: str | None = None) -> LogChunk:
        """``pods/log`` with timestamps: the cursor is the last line's time; ``after`` asks for
        the lines after that time (the API's ``sinceSeconds`` bounds the read, the time filters)."""
        return await self._runner.pod_logs(self._name, lines, after)


class KubernetesRunner:
    """Runs instances as pods (module docstring)."""

    name = "kubernetes"
    survives_shell = True
    fixed_port: int | None = render.POD_PORT

    def __init__(self, settings: KubeSettings) -> None:
        self.settings = settings
        self.namespace = settings.namespace
        self._api: client.ApiClient | None = None
        self._core: client.CoreV1Api | None = None
        self._handles: dict[str, PodApp] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._api_lock = asyncio.Lock()
        self._policy_made = False
        #: set once the watch has listed the pods (or failed to: survivors reads itself)
        self.watching = asyncio.Event()

    # -- the client ----------------------------------------------------------------------------

    async def core(self) -> client.CoreV1Api:
        async with self._api_lock:
            if self._core is None:
                configuration = client.Configuration()
                if self.settings.config is not None:
                    await config.load_kube_config(
                        config_file=str(self.settings.config),
                        client_configuration=configuration,
                    )
                else:
                    config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                self._api = client.ApiClient(configuration=configuration)
                self._core = client.CoreV1Api(self._api)
            if self._watcher is None:
                self._watcher = asyncio.create_task(self._watch(), name="kubernetes pod watch")
            return self._core

    def _plain(self, obj: Any) -> dict[str, Any]:
        if isinstance(obj, dict):
            return obj
        if self._api is None:  # pragma: no cover - objects come from the client
            raise RuntimeError("the Kubernetes client is closed")
        plain: dict[str, Any] = self._api.sanitize_for_serialization(obj)
        return plain

    async def close(self) -> None:
        """End the watch and the client (the pods keep running)."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
            self._watcher = None
        if self._api is not None:
            await self._api.close()
            self._api = self._core = None

    async def _call(
        self,
        call: Callable[[client.CoreV1Api], Awaitable[T]],
        *,
        verb: str,
        resource: str,
        app_id: str,
    ) -> T:
        """One API request, retried while the API does not answer (``API_PATIENCE``); a refusal
        or a long outage is SpawnFailed cause ``api`` with what to fix."""
        deadline = time.monotonic() + API_PATIENCE
        delay = 0.2
        while True:
            try:
                core = await self.core()
                return await call(core)
            except ApiException as err:
                if not _transient(err):
                    raise
                last: BaseException = err
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                last = err
            if time.monotonic() + delay > deadline:
                raise SpawnFailed(
                    f"the Kubernetes API did not answer for {API_PATIENCE:.0f} s "
                    f"({verb} {resource} in {self.namespace!r}): {last}",
                    app_id=app_id,
                    cause="api",
                ) from last
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _refused(self, err: ApiException, verb: str, resource: str, app_id: str) -> SpawnFailed:
        return SpawnFailed(
            api_problem(err, verb, resource, self.namespace), app_id=app_id, cause="api"
        )

    # -- spawn ---------------------------------------------------------------------------------

    def plan(self, spec: SpawnSpec, digest: str) -> render.PodPlan:
        """The PodPlan of one spawn, built as `atrium kube render` builds it (`render.pod_command`,
        `render.plan_for`), so what is reviewed is what is created."""
        limits = spec.limits
        return render.plan_for(
            namespace=self.namespace,
            shell=self.settings.shell,
            app_id=spec.app_id,
            instance_id=spec.instance_id,
            owner=spec.owner,
            image=self.settings.image,
            source_digest=digest,
            shell_url=self.settings.shell_url,
            entrypoint=render.pod_command(spec.argv, str(spec.app_dir)),
            env=spec.env,
            secrets=spec.secrets,
            memory_mib=limits.memory_mib if limits else None,
            cpu_milli=limits.cpu_milli if limits else None,
            pids=limits.pids if limits else None,
            storage_class=self.settings.storage_class,
            state=self.settings.state,
            data_of=spec.data_of or "",
            scratch_data=spec.scratch_data,
        )

    async def spawn(self, spec: SpawnSpec) -> PodApp:
        digest = spec.source_digest
        if digest is None:
            digest = await asyncio.to_thread(source_digest, spec.app_dir)
        await self._ensure_policy(spec.app_id)
        objects = render.instance_objects(self.plan(spec, digest))
        pod_body: dict[str, Any] | None = None
        for body in objects:
            kind = body.get("kind")
            if kind == "Secret":
                await self._put_secret(body, spec.app_id)
            elif kind == "PersistentVolumeClaim":
                await self._ensure_claim(body, spec.app_id)
            elif kind == "Pod":
                pod_body = body
        if pod_body is None:  # pragma: no cover - render always gives one
            raise SpawnFailed("render gave no Pod", app_id=spec.app_id, cause="api")
        app = await self._create_pod(pod_body, spec.app_id)
        try:
            await self._until_running(app, spec.app_id)
        except BaseException:
            await app.stop(0)
            raise
        return app

    async def _put_secret(self, body: dict[str, Any], app_id: str) -> None:
        """Create the instance's Secret; one an earlier spawn of it left (409) is deleted and
        made again with this spawn's values (it is immutable, and RBAC grants no update)."""
        for attempt in range(2):
            try:
                await self._call(
                    lambda c: c.create_namespaced_secret(
                        self.namespace, _any(body), _request_timeout=REQUEST_TIMEOUT
                    ),
                    verb="create",
                    resource="secrets",
                    app_id=app_id,
                )
                return
            except ApiException as err:
                if err.status != 409 or attempt:
                    raise self._refused(err, "create", "secrets", app_id) from err
            await self._not_anothers("secrets", body["metadata"]["name"], app_id)
            await self.delete_secret(body["metadata"]["annotations"][render.ANNOTATION_INSTANCE])

    async def _ensure_claim(self, body: dict[str, Any], app_id: str) -> None:
        """The data claim, created once: it is kept after destroy, so a relaunch finds it."""
        try:
            await self._call(
                lambda c: c.create_namespaced_persistent_volume_claim(
                    self.namespace, _any(body), _request_timeout=REQUEST_TIMEOUT
                ),
                verb="create",
                resource="persistentvolumeclaims",
                app_id=app_id,
            )
        except ApiException as err:
            if err.status != 409:
                raise self._refused(err, "create", "persistentvolumeclaims", app_id) from err
            await self._not_anothers("persistentvolumeclaims", body["metadata"]["name"], app_id)

    async def _not_anothers(self, resource: str, name: str, app_id: str) -> None:
        """Refuse to take over an object of this name another shell made: two shells in one
        namespace share instance ids, and one must never delete the other's Secret or mount the
        other's data claim as its own instance's."""
        readers = {
            "secrets": lambda c: c.read_namespaced_secret(
                name, self.namespace, _request_timeout=REQUEST_TIMEOUT
            ),
            "persistentvolumeclaims": lambda c: c.read_namespaced_persistent_volume_claim(
                name, self.namespace, _request_timeout=REQUEST_TIMEOUT
            ),
        }
        try:
            there = self._plain(
                await self._call(readers[resource], verb="get", resource=resource, app_id=app_id)
            )
        except ApiException as err:
            if err.status == 404:  # gone since the 409: the next create decides
                return
            raise self._refused(err, "get", resource, app_id) from err
        if not self._ours(there) and not (
            resource == "persistentvolumeclaims" and self._shared(there)
        ):
            # a claim: not one of this database's shells' either (they share the users' claims)
            raise SpawnFailed(
                f"a {resource[:-1]} named {name!r} already exists in namespace "
                f"{self.namespace!r} and another shell made it: not touched (give each shell "
                "a namespace of its own)",
                app_id=app_id,
                cause="api",
            )

    async def _ensure_policy(self, app_id: str) -> None:
        """The namespace's NetworkPolicy for this shell's app pods, made before the first pod:
        a pod never runs unfenced. A shell outside the cluster (a kubeconfig) is admitted by its
        address in ``shell_url`` when that is an IP address."""
        if self._policy_made:
            return
        cidrs = render.shell_cidrs(self.settings.shell_url, self.settings.config is not None)
        for body in render.namespace_objects(
            self.namespace, self.settings.shell, render.SHELL_POD_LABELS, cidrs
        ):

            async def create(_: client.CoreV1Api, policy: dict[str, Any] = body) -> Any:
                # the client is made by `core()` before `_call` calls this
                networking = client.NetworkingV1Api(self._api)
                return await networking.create_namespaced_network_policy(
                    self.namespace, _any(policy), _request_timeout=REQUEST_TIMEOUT
                )

            try:
                await self._call(
                    create,
                    verb="create",
                    resource="networkpolicies",
                    app_id=app_id,
                )
            except ApiException as err:
                if err.status != 409:  # there already: made by an earlier start of this shell
                    raise self._refused(err, "create", "networkpolicies", app_id) from err
        self._policy_made = True

    async def _create_pod(self, body: dict[str, Any], app_id: str) -> PodApp:
        """Create the pod. A pod of that name already there (409) is an earlier spawn's that no
        instance holds now (a live one would have been adopted at start): when this shell made
        it, it is deleted and made again, so its secrets are this spawn's; else the spawn fails."""
        name = body["metadata"]["name"]
        for attempt in range(2):
            try:
                created = await self._call(
                    lambda c: c.create_namespaced_pod(
                        self.namespace, _any(body), _request_timeout=REQUEST_TIMEOUT
                    ),
                    verb="create",
                    resource="pods",
                    app_id=app_id,
                )
            except ApiException as err:
                if err.status != 409 or attempt:
                    raise self._refused(err, "create", "pods", app_id) from err
                there = await self.read_pod(name)
                if there is not None and not self._ours(there):
                    raise SpawnFailed(
                        f"a pod named {name!r} already exists in namespace {self.namespace!r} "
                        "and another shell made it: not touched",
                        app_id=app_id,
                        cause="api",
                    ) from err
                if there is not None:
                    _LOGGER.warning("pod %s left by an earlier spawn: deleted and made again", name)
                    uid = str((there.get("metadata") or {}).get("uid") or "")
                    await self.delete_pod(name, uid, 0)
                    await self._until_gone(name, app_id)
                continue
            app = PodApp(self, name, self._plain(created))
            self._handles[name] = app
            return app
        raise AssertionError("unreachable")  # pragma: no cover

    async def _until_gone(self, name: str, app_id: str) -> None:
        deadline = time.monotonic() + API_PATIENCE * 3
        while time.monotonic() < deadline:
            if await self.read_pod(name) is None:
                return
            await asyncio.sleep(0.2)
        raise SpawnFailed(
            f"pod {name!r} left by an earlier spawn did not go away", app_id=app_id, cause="api"
        )

    async def _until_running(self, app: PodApp, app_id: str) -> None:
        """Until the pod runs at an address; a pod that cannot (its image, no node, it ended,
        deleted) or does not within the start timeout fails the spawn with that cause."""
        deadline = time.monotonic() + self.settings.start_timeout
        while True:
            pod = app.pod
            ended = app.status
            if ended is not None:
                cause = {"killed": "exited"}.get(ended.reason, ended.reason)
                said = await self._last_words(app.name, pod)
                raise SpawnFailed(
                    f"pod {app.name} {_ended_words(ended)}: {said or waiting_message(pod)}",
                    app_id=app_id,
                    cause=cause,
                )
            if (problem := unschedulable(pod)) is not None:
                raise SpawnFailed(
                    f"pod {app.name} cannot be scheduled: {problem}",
                    app_id=app_id,
                    cause="schedule",
                )
            if runs(pod):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise SpawnFailed(
                    f"pod {app.name} did not run within {self.settings.start_timeout:g} s "
                    f"({waiting_message(pod)})",
                    app_id=app_id,
                    cause="timeout",
                )
            await app.changed(min(POLL_SECONDS, left))
            if app.status is None and not runs(app.pod):
                with contextlib.suppress(SpawnFailed):
                    fresh = await self.read_pod(app.name)
                    app.observe(fresh)

    async def _last_words(self, name: str, pod: Mapping[str, Any]) -> str:
        """The last lines of the container that ended (the init container's first), for a
        failure message; empty when they cannot be read."""
        status = pod.get("status") or {}
        for container in (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []
        ):
            if ((container.get("state") or {}).get("terminated") or {}).get("exitCode", 0):
                break
        else:
            return ""
        try:
            text = await self._call(
                lambda c: c.read_namespaced_pod_log(
                    name,
                    self.namespace,
                    container=str(container.get("name")),
                    tail_lines=5,
                    _request_timeout=REQUEST_TIMEOUT,
                ),
                verb="get",
                resource="pods/log",
                app_id="",
            )
        except (ApiException, SpawnFailed):
            return ""
        lines = " | ".join(str(text or "").strip().splitlines()[-5:])
        return f"{container.get('name')} said: {lines}" if lines else ""

    # -- reads and deletes (bounded; a failure here never hides the caller's own) --------------

    async def read_pod(self, name: str) -> dict[str, Any] | None:
        """The pod now, or None when it does not exist; SpawnFailed ``api`` when the API does not
        answer."""
        try:
            pod = await self._call(
                lambda c: c.read_namespaced_pod(
                    name, self.namespace, _request_timeout=REQUEST_TIMEOUT
                ),
                verb="get",
                resource="pods",
                app_id="",
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise self._refused(err, "get", "pods", "") from err
        return self._plain(pod)

    async def runs_at(self, ref: Mapping[str, Any], host: str) -> str | None:
        """Why the pod ``ref`` names is not the one running at ``host`` now (None: it is): gone,
        another pod of its name (uid), ended or being deleted, or at another address. Another
        shell's pod no shell holds (`atrium.lifecycle.unheld`); SpawnFailed ``api`` when the API
        does not answer."""
        name, uid = str(ref.get("pod") or ""), str(ref.get("uid") or "")
        if not name or not uid:
            return "its row names no pod"
        pod = await self.read_pod(name)
        if pod is None:
            return f"pod {name} is gone"
        if str((pod.get("metadata") or {}).get("uid") or "") != uid:
            return f"pod {name} is another pod now (not uid {uid})"
        if exit_of(pod) is not None or not runs(pod):
            return f"pod {name} no longer runs"
        there = str((pod.get("status") or {}).get("podIP") or "")
        if there != host:
            return f"pod {name} is at {there or 'no address'} now, not {host}"
        return None

    async def delete_pod(self, name: str, uid: str, grace: float) -> None:
        body: dict[str, Any] = {"gracePeriodSeconds": max(0, round(grace))}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._call(
                lambda c: c.delete_namespaced_pod(
                    name,
                    self.namespace,
                    body=_any(body),
                    grace_period_seconds=max(0, round(grace)),
                    _request_timeout=REQUEST_TIMEOUT,
                ),
                verb="delete",
                resource="pods",
                app_id="",
            )
        except ApiException as err:
            if err.status not in (404, 409):  # gone, or a new pod of that name (not ours)
                _LOGGER.warning(
                    "deleting pod %s: %s", name, api_problem(err, "delete", "pods", self.namespace)
                )
        except SpawnFailed as err:
            _LOGGER.warning("deleting pod %s: %s", name, err.message)

    async def delete_secret(self, instance_id: str) -> None:
        name = render.secret_name(instance_id)
        try:
            await self._call(
                lambda c: c.delete_namespaced_secret(
                    name, self.namespace, _request_timeout=REQUEST_TIMEOUT
                ),
                verb="delete",
                resource="secrets",
                app_id="",
            )
        except ApiException as err:
            if err.status != 404:
                _LOGGER.warning(
                    "deleting secret %s: %s",
                    name,
                    api_problem(err, "delete", "secrets", self.namespace),
                )
        except SpawnFailed as err:
            _LOGGER.warning("deleting secret %s: %s", name, err.message)

    def forget(self, app: PodApp) -> None:
        if self._handles.get(app.name) is app:
            del self._handles[app.name]

    async def pod_logs(self, name: str, lines: int, after: str | None) -> LogChunk:
        since: int | None = None
        if after:
            with contextlib.suppress(ValueError):
                then = datetime.fromisoformat(after.replace("Z", "+00:00"))
                since = max(1, int((datetime.now(UTC) - then).total_seconds()) + 2)
        window: dict[str, Any] = {"since_seconds": since} if since is not None else {}
        if not after:
            window["tail_lines"] = lines
        try:
            text = await self._call(
                lambda c: c.read_namespaced_pod_log(
                    name,
                    self.namespace,
                    timestamps=True,
                    _request_timeout=REQUEST_TIMEOUT,
                    **window,
                ),
                verb="get",
                resource="pods/log",
                app_id="",
            )
        except ApiException as err:
            raise self._refused(err, "get", "pods/log", "") from err
        kept: list[str] = []
        cursor = after or ""
        for line in str(text or "").splitlines():
            stamp, _, rest = line.partition(" ")
            if after and stamp <= after:
                continue
            kept.append(rest)
            cursor = stamp
        if not after:
            kept = kept[-lines:]
        return LogChunk("".join(f"{line}\n" for line in kept), cursor)

    # -- the watch -----------------------------------------------------------------------------

    def _selector(self) -> str:
        return f"{render.LABEL_SHELL}={render.label_value(self.settings.shell)}"

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return labels.get(render.LABEL_SHELL) == render.label_value(self.settings.shell)

    def _shared(self, found: Mapping[str, Any]) -> bool:
        """Whether a shell of this shell's database made it (a data claim is the user's on every
        shell of one database: an instance deleted on one may be launched again on another)."""
        labels = (found.get("metadata") or {}).get("labels") or {}
        state = self.settings.state
        return bool(state) and labels.get(render.LABEL_STATE) == render.label_value(state)

    async def _watch(self) -> None:
        """List, then watch from the list's version; ``410 Gone`` → list again; the API down →
        again after a backoff (0.2 s doubling to 5 s). Every event reaches its pod's handle."""
        delay = 0.2
        while True:
            try:
                version = await self._relist()
                delay = 0.2
                await self._follow(version)
                continue
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                if err.status == 410:
                    _LOGGER.info("pod watch: %s; listing again", err.reason)
                    continue
                _LOGGER.warning("pod watch: %s %s; again in %.1f s", err.status, err.reason, delay)
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:
                _LOGGER.warning("pod watch: %s; again in %.1f s", err, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _relist(self) -> str | None:
        """Every pod of this shell now: each handle hears of its pod (or that it is gone)."""
        core = await self.core()
        listing = await core.list_namespaced_pod(
            self.namespace, label_selector=self._selector(), _request_timeout=REQUEST_TIMEOUT
        )
        present: dict[str, dict[str, Any]] = {}
        for item in listing.items or ():
            pod = self._plain(item)
            if self._ours(pod):
                present[pod["metadata"]["name"]] = pod
        for name, handle in list(self._handles.items()):
            handle.observe(present.get(name))
        self.watching.set()
        version = listing.metadata.resource_version if listing.metadata else None
        return version if version and version != "..." else None

    async def _follow(self, version: str | None) -> None:
        core = await self.core()
        kwargs: dict[str, Any] = {
            "label_selector": self._selector(),
            "timeout_seconds": WATCH_SECONDS,
        }
        if version:
            kwargs["resource_version"] = version
        async with watch.Watch().stream(
            core.list_namespaced_pod, self.namespace, **kwargs
        ) as events:
            async for event in events:
                pod = event.get("raw_object") or {}
                if not isinstance(pod, dict) or not self._ours(pod):
                    continue
                meta = pod.get("metadata") or {}
                handle = self._handles.get(meta.get("name", ""))
                if handle is None:
                    continue
                if handle.uid and meta.get("uid") and meta["uid"] != handle.uid:
                    # another pod of that name: an earlier one leaving, whose last events may
                    # come after this one was made in its place (they ended the new one's
                    # spawn as killed, 137), or a later one (then this one's own DELETED came)
                    continue
                handle.observe(None if event.get("type") == "DELETED" else pod)

    # -- adoption ------------------------------------------------------------------------------

    async def adopt(self, ref: dict[str, Any]) -> PodApp:
        """The running pod ``ref`` names; SpawnFailed when it is gone, another pod has its name
        (uid differs), it is not this shell's, or it no longer runs."""
        name, uid = str(ref.get("pod", "")), str(ref.get("uid", ""))
        pod = await self.read_pod(name)
        there = str(((pod or {}).get("metadata") or {}).get("uid") or "")
        if pod is None or (uid and there != uid) or not self._ours(pod):
            raise SpawnFailed(f"pod {name!r} (uid {uid}) is gone", app_id="", cause="exited")
        if exit_of(pod) is not None or not runs(pod):
            raise SpawnFailed(f"pod {name!r} no longer runs", app_id="", cause="exited")
        known = self._handles.get(name)
        if known is not None and known.uid == there and known.status is None:
            return known  # an ended handle (its pod once relabelled away) is never handed out
        app = PodApp(self, name, pod)
        self._handles[name] = app
        return app

    async def take_over(self, ref: dict[str, Any]) -> Survivor:
        """Another shell's running pod ``ref`` (that shell is gone, and this one holds the
        instance's lock and row): relabelled as this shell's, so that its watch, its survivors
        at a restart and its NetworkPolicy are this shell's and never the old one's, then
        adopted with its secrets as a survivor is. SpawnFailed when it is gone, another pod has
        its name, or it no longer runs (then it is deleted, its claim kept)."""
        name, uid = str(ref.get("pod", "")), str(ref.get("uid", ""))
        pod = await self.read_pod(name)
        there = str(((pod or {}).get("metadata") or {}).get("uid") or "")
        if pod is None or not uid or there != uid:
            raise SpawnFailed(f"pod {name!r} (uid {uid}) is gone", app_id="", cause="exited")
        app_id = _annotation(pod, render.ANNOTATION_APP)
        await self._ensure_policy(app_id)
        theirs = ((pod.get("metadata") or {}).get("labels") or {}).get(render.LABEL_SHELL)
        instance_id = _annotation(pod, render.ANNOTATION_INSTANCE)
        owner = _annotation(pod, render.ANNOTATION_OWNER)
        # its Secret and claim first (a later spawn of it reuses the claim), the pod last; a
        # refusal midway puts back what it relabelled: the row goes back to the gone shell,
        # whose pod, Secret and claim they must all still be (a claim left labelled as this
        # shell's would be refused to that shell's next spawn of the instance)
        objects = [("pods", name)]
        if instance_id:
            objects[:0] = [
                ("secrets", render.secret_name(instance_id)),
                ("persistentvolumeclaims", render.claim_name(owner, instance_id)),
            ]
        done: list[tuple[str, str]] = []
        patched: dict[str, Any] | None = None
        try:
            for resource, object_name in objects:
                patched = await self._relabel(
                    resource, object_name, render.label_value(self.settings.shell), app_id
                )
                done.append((resource, object_name))
        except Exception:
            if isinstance(theirs, str):
                for resource, object_name in done:
                    with contextlib.suppress(Exception):
                        await self._relabel(resource, object_name, theirs, app_id)
            raise
        if patched is None:  # pragma: no cover - the pod's patch answers the pod or raises
            raise SpawnFailed(f"pod {name!r} is gone", app_id=app_id, cause="exited")
        survivor = await self._survivor(patched)
        if survivor is None:
            raise SpawnFailed(f"pod {name!r} no longer runs", app_id=app_id, cause="exited")
        return survivor

    async def _relabel(
        self, resource: str, object_name: str, value: str, app_id: str
    ) -> dict[str, Any] | None:
        """``object_name``'s shell label set to ``value``; the object as patched (None: a Secret
        or claim that is gone). SpawnFailed cause ``api`` when refused."""
        body = _any({"metadata": {"labels": {render.LABEL_SHELL: value}}})
        patchers: dict[str, Callable[[client.CoreV1Api], Awaitable[Any]]] = {
            "pods": lambda c: c.patch_namespaced_pod(
                object_name, self.namespace, body, _request_timeout=REQUEST_TIMEOUT
            ),
            "secrets": lambda c: c.patch_namespaced_secret(
                object_name, self.namespace, body, _request_timeout=REQUEST_TIMEOUT
            ),
            "persistentvolumeclaims": lambda c: c.patch_namespaced_persistent_volume_claim(
                object_name, self.namespace, body, _request_timeout=REQUEST_TIMEOUT
            ),
        }
        try:
            done = await self._call(
                patchers[resource], verb="patch", resource=resource, app_id=app_id
            )
        except ApiException as err:
            if err.status == 404 and resource != "pods":
                return None
            raise self._refused(err, "patch", resource, app_id) from err
        return self._plain(done)

    async def survivors(self) -> list[Survivor]:
        """The running pods an earlier shell (same label) left, each adopted, with the secrets
        read back from its Secret. A pod that no longer runs, or whose Secret is gone, is
        deleted (its claim kept): no instance can be brought back for it."""
        try:
            listing = await self._call(
                lambda c: c.list_namespaced_pod(
                    self.namespace,
                    label_selector=self._selector(),
                    _request_timeout=REQUEST_TIMEOUT,
                ),
                verb="list",
                resource="pods",
                app_id="",
            )
        except ApiException as err:
            _LOGGER.warning("survivors: %s", api_problem(err, "list", "pods", self.namespace))
            return []
        except SpawnFailed as err:
            _LOGGER.warning("survivors: %s", err.message)
            return []
        found: list[Survivor] = []
        for item in listing.items or ():
            pod = self._plain(item)
            if not self._ours(pod):
                continue
            survivor = await self._survivor(pod)
            if survivor is not None:
                found.append(survivor)
        return found

    async def _survivor(self, pod: dict[str, Any]) -> Survivor | None:
        meta = pod.get("metadata") or {}
        name, uid = str(meta.get("name")), str(meta.get("uid") or "")
        instance_id = _annotation(pod, render.ANNOTATION_INSTANCE)
        app_id = _annotation(pod, render.ANNOTATION_APP)
        owner = _annotation(pod, render.ANNOTATION_OWNER)
        secrets: dict[str, str] = {}
        if instance_id:
            with contextlib.suppress(ApiException, SpawnFailed):
                secret = await self._call(
                    lambda c: c.read_namespaced_secret(
                        render.secret_name(instance_id),
                        self.namespace,
                        _request_timeout=REQUEST_TIMEOUT,
                    ),
                    verb="get",
                    resource="secrets",
                    app_id=app_id,
                )
                plain = self._plain(secret)
                secrets = {**_decoded(plain.get("data") or {}), **(plain.get("stringData") or {})}
        usable = (
            instance_id
            and app_id
            and owner
            and exit_of(pod) is None
            and runs(pod)
            and {"OS_APP_TOKEN", "OS_SHELL_SECRET"} <= secrets.keys()
        )
        if not usable:
            _LOGGER.warning(
                "pod %s cannot be adopted (ended, or its Secret is gone): deleted", name
            )
            await self.delete_pod(name, uid, 0)
            if instance_id:
                await self.delete_secret(instance_id)
            return None
        try:
            app = await self.adopt({"namespace": self.namespace, "pod": name, "uid": uid})
        except SpawnFailed as err:
            # gone or relabelled since the list (another shell of the database took it over):
            # not this shell's, and left as it is
            _LOGGER.warning("pod %s not adopted: %s", name, err.message)
            return None
        return Survivor(
            instance_id=instance_id,
            app_id=app_id,
            owner=owner,
            ref=app.ref,
            token=secrets["OS_APP_TOKEN"],
            secret=secrets["OS_SHELL_SECRET"],
            app=app,
        )

    def early_exit_cause(self, log_path: Path, returncode: int) -> str:
        return "exited"  # the runner builds no sandbox of its own


def _any(body: dict[str, Any]) -> Any:
    """A rendered object as the client's body (it sends a dict as it is)."""
    return body


def _annotation(obj: Mapping[str, Any], key: str) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(key) or "")


def _decoded(data: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        with contextlib.suppress(ValueError, TypeError):
            out[str(key)] = base64.b64decode(str(value)).decode()
    return out


def _ended_words(status: ExitStatus) -> str:
    return {
        "oom": f"was killed for want of memory (exit {status.code})",
        "image": "cannot pull or run its image",
        "killed": "was deleted",
    }.get(status.reason, f"exited with status {status.code}")
