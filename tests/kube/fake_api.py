"""A Kubernetes API server good enough for kubernetes-asyncio and the Kubernetes runner's tests.

kmock 0.8 gives the HTTP server, the routing of Kubernetes URLs, API discovery, Status error
bodies and its reaction DSL (``fake[kmock.method.POST, ...] << 422``). Its emulator's object store
lacks what the runner depends on, so this subclass keeps its own: every object gets
``metadata.uid``, ``creationTimestamp`` and a ``resourceVersion`` from one global counter bumped on
every change; list and watch honour ``labelSelector`` and ``fieldSelector`` (``metadata.name``,
``status.phase``); a watch from a ``resourceVersion`` sends only the later events, and one from a
version older than the oldest kept answers an ERROR event with a 410 Gone Status (so the client must
re-list); kubernetes-asyncio's ``watch=True`` is taken like ``watch=true``; pods are deleted with a
grace period (``deletionTimestamp`` set, the kubelet kills, then the object goes); ``pods/log`` is
read from the kubelet's capture; PATCH takes a JSON merge patch (strategic merge is treated as
one: lists are replaced) or a JSON patch, and ``/status`` patches change only ``status``.

Faults for tests: `FakeApi.fail_next` answers the next N requests matching a method and a path
pattern with an error Status; `FakeApi.outage` answers every request 503, or refuses connections,
for some seconds; `FakeApi.expire_watches` compacts the history so that every open watch ends with
410 Gone and a resume from an earlier version is refused.

Everything here runs on one event loop (the fake cluster's thread); the fault helpers may be called
from any thread.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import apps, parsing, rendering

#: (resource as "v1/pods" or "group/version/plural", namespace or "", name)
Key = tuple[str, str, str]
#: one captured output line: when it was written and the line (with its newline)
LogLine = tuple[datetime.datetime, str]
#: how many events a watch can resume from (older versions answer 410 Gone)
HISTORY = 5000
#: what a pod's grace period is when neither the delete nor the pod says
DEFAULT_GRACE = 30


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_nano(when: datetime.datetime) -> str:
    """Kubernetes' log timestamp format (nanoseconds; ours end in 000)."""
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def parse_time(text: str) -> datetime.datetime:
    """An RFC 3339 time (fractions of any length, ``Z`` or an offset)."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    base, fraction, zone = match.groups()
    micro = (fraction or "").ljust(6, "0")[:6]
    offset = "+00:00" if zone == "Z" else zone
    return datetime.datetime.fromisoformat(f"{base}.{micro}{offset}")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = merge_patch(result.get(name), value)
    return result


def json_patch(target: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 JSON patch: add, replace, remove, test (enough for clients' label edits)."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        kind = op["op"]
        if kind in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(index, op["value"])
                else:
                    parent[index] = op["value"]
            else:
                parent[last] = op["value"]
        elif kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif kind == "test":
            here = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if here != op.get("value"):
                raise kmock.KubernetesError(422, "Invalid", f"test failed at {op['path']}")
        else:
            raise kmock.KubernetesError(422, "Invalid", f"unsupported JSON patch op {kind!r}")
    return doc


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """A label selector of comma-separated ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k`` terms."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            name, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(name) == value:
                return False
        elif "=" in term:
            name, value = (s.strip() for s in re.split("==?", term, maxsplit=1))
            if labels.get(name) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def field_matches(selector: str, obj: dict[str, Any]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        name, value = (s.strip() for s in re.split("!=|==?", term, maxsplit=1))
        here: Any = obj
        for part in name.split("."):
            here = here.get(part) if isinstance(here, dict) else None
        if (str(here) == value) == negate:
            return False
    return True


_kmock_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    """kmock reads ``/api/v1/namespaces/<name>`` as a namespace prefix with nothing after it and
    fails; here it is the namespace object (``status`` and ``finalize`` its subresources)."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and (
        len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize"))
    ):
        name = parts[3] if len(parts) > 3 else None
        sub = parts[4] if len(parts) > 4 else None
        return parsing.ParsedPath("", "v1", "namespaces", None, name, sub)
    return _kmock_parse_path(path)


parsing.parse_path = _parse_path


@dataclass
class Fault:
    """Answer the next ``count`` requests whose method and path match with ``status``."""

    method: str
    path: re.Pattern[str]
    status: int
    count: int


_REASONS = {
    403: "Forbidden",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    503: "ServiceUnavailable",
}


def status_body(code: int, message: str, reason: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": code,
        "reason": reason or _REASONS.get(code, "InternalError"),
        "message": message,
    }


def _not_found(resource: str, name: str) -> kmock.KubernetesError:
    plural = resource.rsplit("/", 1)[-1]
    return kmock.KubernetesError(404, "NotFound", f'{plural} "{name}" not found')


@attrs.define(kw_only=True)
class FakeApi(kmock.KubernetesScaffold):
    """The state (``store``), the history of events and the faults of one fake cluster."""

    store: dict[Key, dict[str, Any]] = attrs.field(factory=dict, init=False)
    resource_version: int = attrs.field(default=1000, init=False)
    #: watches from a version below this answer 410 Gone
    oldest_version: int = attrs.field(default=1000, init=False)
    history: deque[tuple[int, str, dict[str, Any]]] = attrs.field(
        factory=lambda: deque(maxlen=HISTORY), init=False
    )
    #: the queues of open watches (and of the kubelet), each gets (version, resource, event)
    watchers: list[asyncio.Queue[tuple[int, str, dict[str, Any]] | None]] = attrs.field(
        factory=list, init=False
    )
    #: set by the kubelet: the output lines of a pod's container (ns, pod, container)
    log_source: Callable[[str, str, str | None], list[LogLine] | None] | None = attrs.field(
        default=None, init=False
    )
    #: set when a kubelet runs: then a pod's delete waits for it to kill (the grace period)
    kubelet_attached: bool = attrs.field(default=False, init=False)
    faults: list[Fault] = attrs.field(factory=list, init=False)
    outage_until: float = attrs.field(default=0.0, init=False)
    _fault_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[kmock.action.LIST] << self._serve_list
        self.fallback[kmock.action.WATCH] << self._serve_watch
        self.fallback[kmock.action.FETCH] << self._serve_fetch
        self.fallback[kmock.action.CREATE] << self._serve_create
        self.fallback[kmock.action.UPDATE] << self._serve_patch
        self.fallback[kmock.action.DELETE] << self._serve_delete
        self.fallback[kmock.method.PUT] << self._serve_put
        self.fallback[kmock.method.DELETE] << self._serve_delete_collection

    # --- faults (any thread) ---------------------------------------------------------------------

    def fail_next(self, method: str, path: str, status: int, count: int = 1) -> None:
        """The next ``count`` requests with ``method`` (``*`` for any) whose path matches the
        regular expression ``path`` (searched) get ``status`` and change nothing."""
        with self._fault_lock:
            self.faults.append(Fault(method.upper(), re.compile(path), status, count))

    def outage(self, seconds: float) -> None:
        """Every request gets 503 for ``seconds`` (`cut_watches` ends the open ones)."""
        with self._fault_lock:
            self.outage_until = time.monotonic() + seconds

    def _take_fault(self, method: str, path: str) -> int | None:
        with self._fault_lock:
            if time.monotonic() < self.outage_until:
                return 503
            for fault in self.faults:
                if fault.method in ("*", method) and fault.path.search(path):
                    fault.count -= 1
                    if fault.count <= 0:
                        self.faults.remove(fault)
                    return fault.status
        return None

    def cut_watches(self) -> None:
        """End every open watch's stream (as a server that goes down does); the loop's thread."""
        for queue in list(self.watchers):
            queue.put_nowait((-1, "", {}))

    def expire_watches(self) -> None:
        """Compact: a version is used up, every open watch ends with 410 Gone, and a watch from
        any earlier version is refused the same way (the client must list again)."""
        self.resource_version += 1
        self.oldest_version = self.resource_version
        self.history.clear()
        for queue in list(self.watchers):
            queue.put_nowait(None)

    # --- the HTTP entry ---------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        status = self._take_fault(raw_request.method, raw_request.path)
        if status is not None:
            await raw_request.read()
            message = "injected fault" if status != 503 else "the API server is down (injected)"
            return aiohttp.web.json_response(status_body(status, message), status=status)
        if raw_request.query.get("watch", "").lower() in ("true", "1"):
            # kubernetes-asyncio sends watch=True; kmock knows only watch=true
            url = raw_request.rel_url.update_query(watch="true")
            raw_request = raw_request.clone(rel_url=url)
        return await super().__call__(raw_request)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        # the state lives here, not in kmock's emulator: skip straight to the reactions
        return await apps.RawHandler._handle(self, request)

    # --- the state (the fake cluster's loop) ------------------------------------------------------

    def _bump(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def _publish(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        version = int(obj["metadata"]["resourceVersion"])
        event = {"type": kind, "object": copy.deepcopy(obj)}
        if len(self.history) == self.history.maxlen:  # the oldest event falls out: no resume
            self.oldest_version = max(self.oldest_version, self.history[0][0])  # from before it
        self.history.append((version, resource, event))
        for queue in list(self.watchers):
            queue.put_nowait((version, resource, event))

    def subscribe(self) -> asyncio.Queue[tuple[int, str, dict[str, Any]] | None]:
        """Every later event of every resource (the kubelet's feed); None: history compacted."""
        queue: asyncio.Queue[tuple[int, str, dict[str, Any]] | None] = asyncio.Queue()
        self.watchers.append(queue)
        return queue

    # kmock's handler has HTTP client helpers get/delete; here they are the store's (no client)
    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:  # type: ignore[override]
        return self.store.get((resource, namespace, name))

    def create(self, resource: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise kmock.KubernetesError(422, "Invalid", "metadata.name: Required value")
        if namespace:
            meta["namespace"] = namespace
        key = (resource, namespace, name)
        if key in self.store:
            plural = resource.rsplit("/", 1)[-1]
            raise kmock.KubernetesError(409, "AlreadyExists", f'{plural} "{name}" already exists')
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        meta["resourceVersion"] = self._bump()
        if resource == "v1/pods":
            obj["status"] = {"phase": "Pending"}
        if resource == "v1/namespaces":
            obj["status"] = {"phase": "Active"}
        if resource == "v1/persistentvolumeclaims":
            obj["status"] = {"phase": "Bound"}  # no provisioner: every claim binds at once
        if resource == "v1/secrets" and "stringData" in obj:
            data = obj.setdefault("data", {})
            for field, text in obj.pop("stringData").items():
                data[field] = base64.b64encode(str(text).encode()).decode()
        self.store[key] = obj
        self._publish(resource, "ADDED", obj)
        return obj

    def update(
        self, resource: str, namespace: str, name: str, new: dict[str, Any]
    ) -> dict[str, Any]:
        """Store a changed object (uid and creation kept), bump its version, tell the watches."""
        old = self.store[(resource, namespace, name)]
        meta = new.setdefault("metadata", {})
        for field in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp"):
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
        meta["resourceVersion"] = self._bump()
        if new.get("spec") != old.get("spec"):
            meta["generation"] = old["metadata"].get("generation", 1) + 1
        self.store[(resource, namespace, name)] = new
        self._publish(resource, "MODIFIED", new)
        return new

    def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], uid: str
    ) -> dict[str, Any] | None:
        """Merge ``status`` into the pod ``uid`` (the kubelet's write); None if that pod is gone,
        also when another of its name has been made since: a kubelet's status write carries the
        pod's uid as a precondition and is dropped for a pod deleted and made again, or the end
        of a pod deleted at once (grace 0) would land on the new pod of its name."""
        obj = self.get("v1/pods", namespace, name)
        if obj is None or obj["metadata"]["uid"] != uid:
            return None
        new = copy.deepcopy(obj)
        new["status"] = merge_patch(obj.get("status", {}), status)
        return self.update("v1/pods", namespace, name, new)

    def remove(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object is gone now (DELETED sent); a namespace takes its objects with it."""
        obj = self.store.pop((resource, namespace, name), None)
        if obj is None:
            return None
        obj["metadata"]["resourceVersion"] = self._bump()
        self._publish(resource, "DELETED", obj)
        if resource == "v1/namespaces":
            for key in [k for k in self.store if k[1] == name]:
                self.remove(*key)
        return obj

    def delete(  # type: ignore[override]
        self, resource: str, namespace: str, name: str, grace: int | None
    ) -> dict[str, Any]:
        obj = self.get(resource, namespace, name)
        if obj is None:
            raise _not_found(resource, name)
        if resource != "v1/pods" or not self.kubelet_attached or grace == 0:
            gone = self.remove(resource, namespace, name)
            assert gone is not None
            return gone
        if obj["metadata"].get("deletionTimestamp"):
            return obj
        if grace is None:
            grace = obj.get("spec", {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE)
        new = copy.deepcopy(obj)
        when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=grace or 0)
        new["metadata"]["deletionGracePeriodSeconds"] = grace
        new["metadata"]["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        return self.update(resource, namespace, name, new)

    def _matching(self, request: rendering.Request) -> list[dict[str, Any]]:
        resource = _resource(request)
        labels = request.params.get("labelSelector", "")
        fields = request.params.get("fieldSelector", "")
        found = []
        for (res, namespace, _), obj in self.store.items():
            here = request.namespace is None or namespace == request.namespace
            if res == resource and here and _selected(obj, labels, fields):
                found.append(obj)
        return sorted(found, key=lambda o: int(o["metadata"]["resourceVersion"]))

    # --- serving ---------------------------------------------------------------------------------

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        items = self._matching(request)
        return {
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": str(self.resource_version)},
            "items": items,
        }

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # the headers go now, even if nothing happens
        resource = _resource(request)
        labels = request.params.get("labelSelector", "")
        fields = request.params.get("fieldSelector", "")
        if request.name is not None:
            fields = ",".join(filter(None, [fields, f"metadata.name={request.name}"]))
        since = request.params.get("resourceVersion", "")
        timeout = float(request.params.get("timeoutSeconds", "0") or 0)
        deadline = time.monotonic() + timeout if timeout > 0 else None

        def wanted(res: str, event: dict[str, Any]) -> bool:
            obj = event["object"]
            namespace = obj.get("metadata", {}).get("namespace", "")
            if res != resource or (
                request.namespace is not None and namespace != request.namespace
            ):
                return False
            return _selected(obj, labels, fields)

        queue = self.subscribe()
        try:
            start, first = self._watch_start(request, since, wanted)
            for event in first:
                yield event
            if start < 0:
                return
            while True:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    return
                try:
                    item = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    return
                if item is None:
                    yield _gone(start, self.oldest_version)
                    return
                version, res, event = item
                if version < 0:  # cut: the server went away under it
                    return
                if version > start and wanted(res, event):
                    yield event
        finally:
            self.watchers.remove(queue)

    def _watch_start(
        self, request: rendering.Request, since: str, wanted: Callable[[str, dict[str, Any]], bool]
    ) -> tuple[int, list[dict[str, Any]]]:
        """Where a watch starts and what it sends first: every object as ADDED when no version
        is given, the later events when one is, 410 Gone (and start -1: the end) when it is older
        than the history kept."""
        if since in ("", "0"):
            first = [
                {"type": "ADDED", "object": copy.deepcopy(obj)}
                for obj in self._matching(request)
                if request.name is None or obj["metadata"]["name"] == request.name
            ]
            return self.resource_version, first
        start = int(since) if since.isdigit() else 0
        if start < self.oldest_version:
            return -1, [_gone(start, self.oldest_version)]
        return start, [e for v, r, e in self.history if v > start and wanted(r, e)]

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        resource, namespace, name = _key(request)
        obj = self.get(resource, namespace, name)
        if obj is None:
            raise _not_found(resource, name)
        if request.subresource == "log":
            return self._log(namespace, name, request.params).encode()
        return obj

    def _log(self, namespace: str, name: str, params: Mapping[str, str]) -> str:
        container = params.get("container")
        found = self.log_source(namespace, name, container) if self.log_source else None
        if found is None:  # as a kubelet answers for a container that never started
            message = f'container "{container or ""}" in pod "{name}" is waiting to start'
            raise kmock.KubernetesError(400, "BadRequest", message)
        lines = found
        if "sinceTime" in params:
            try:
                since = parse_time(params["sinceTime"])
            except ValueError as err:
                raise kmock.KubernetesError(400, "BadRequest", str(err)) from err
            lines = [line for line in lines if line[0] >= since]
        if "sinceSeconds" in params:
            cut = datetime.datetime.now(datetime.UTC) - datetime.timedelta(
                seconds=int(params["sinceSeconds"])
            )
            lines = [line for line in lines if line[0] >= cut]
        if "tailLines" in params:
            tail = int(params["tailLines"])
            lines = lines[-tail:] if tail > 0 else []
        stamped = params.get("timestamps", "").lower() in ("true", "1")
        return "".join(f"{rfc3339_nano(when)} {text}" if stamped else text for when, text in lines)

    async def _serve_create(self, request: rendering.Request) -> rendering.Payload:
        if not isinstance(request.data, dict):
            raise kmock.KubernetesError(400, "BadRequest", "the body is not a JSON object")
        return rendering.Response(
            status=201,
            payload=self.create(_resource(request), request.namespace or "", request.data),
        )

    async def _serve_patch(self, request: rendering.Request) -> rendering.Payload:
        resource, namespace, name = _key(request)
        obj = self.get(resource, namespace, name)
        if obj is None:
            raise _not_found(resource, name)
        kind = request.headers.get("Content-Type", "")
        if "json-patch" in kind:
            if not isinstance(request.data, list):
                raise kmock.KubernetesError(400, "BadRequest", "a JSON patch is a list")
            patched = json_patch(obj, request.data)
        elif isinstance(request.data, dict):
            patched = merge_patch(obj, request.data)
        else:
            raise kmock.KubernetesError(400, "BadRequest", "the patch is not a JSON object")
        new = copy.deepcopy(obj)
        if request.subresource == "status":
            new["status"] = patched.get("status", {})
        else:
            new = patched
            if "status" in obj:
                new["status"] = obj["status"]
        return self.update(resource, namespace, name, new)

    async def _serve_put(self, request: rendering.Request) -> rendering.Payload:
        resource, namespace, name = _key(request)
        obj = self.get(resource, namespace, name)
        if obj is None:
            raise _not_found(resource, name)
        if not isinstance(request.data, dict):
            raise kmock.KubernetesError(400, "BadRequest", "the body is not a JSON object")
        asked = request.data.get("metadata", {}).get("resourceVersion")
        if asked and asked != obj["metadata"]["resourceVersion"]:
            raise kmock.KubernetesError(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version",
            )
        new = copy.deepcopy(request.data)
        if request.subresource == "status":
            new = {**copy.deepcopy(obj), "status": new.get("status", {})}
        elif "status" in obj:
            new["status"] = obj["status"]
        return self.update(resource, namespace, name, new)

    async def _serve_delete(self, request: rendering.Request) -> rendering.Payload:
        resource, namespace, name = _key(request)
        return self.delete(resource, namespace, name, _grace(request))

    async def _serve_delete_collection(self, request: rendering.Request) -> rendering.Payload:
        if request.resource is None or request.name is not None:
            raise NotImplementedError
        grace = _grace(request)
        gone = [
            self.delete(
                _resource(request),
                obj["metadata"].get("namespace", ""),
                obj["metadata"]["name"],
                grace,
            )
            for obj in self._matching(request)
        ]
        return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": gone}

    def _get_resources(self) -> list[kmock.resource]:
        found = set(super()._get_resources())
        for resource, _, _ in self.store:
            group, version, plural = (["", *resource.split("/")])[-3:]
            found.add(kmock.resource(group=group, version=version, plural=plural))
        return list(found)


def _resource(request: rendering.Request) -> str:
    res = request.resource
    if res is None:
        raise kmock.KubernetesError(404, "NotFound", "not a resource URL")
    parts = [res.group, res.version, res.plural]
    return "/".join(str(p) for p in parts if p)


def _key(request: rendering.Request) -> Key:
    if request.name is None:
        raise kmock.KubernetesError(405, "MethodNotAllowed", "no object named")
    return _resource(request), request.namespace or "", request.name


def _selected(obj: dict[str, Any], labels: str, fields: str) -> bool:
    if labels and not selector_matches(labels, obj.get("metadata", {}).get("labels") or {}):
        return False
    return not fields or field_matches(fields, obj)


def _grace(request: rendering.Request) -> int | None:
    body = request.data if isinstance(request.data, dict) else {}
    value = body.get("gracePeriodSeconds", request.params.get("gracePeriodSeconds"))
    return None if value is None else int(value)


def _gone(since: int, oldest: int) -> dict[str, Any]:
    message = f"too old resource version: {since} ({oldest})"
    return {"type": "ERROR", "object": status_body(410, message, "Expired")}


def names(objects: Iterable[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]
