"""The objects one instance needs on Kubernetes, as plain dicts (pure: no I/O, no client).

One function builds them for both the runner (which creates exactly these) and
`atrium kube render` (which prints them as YAML), so what is reviewed is what runs.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final
from urllib.parse import urlsplit

#: the port every app pod listens on (its own address: no allocator)
POD_PORT: Final = 8080
#: where the app's files are, read-only (an emptyDir the init container filled)
POD_APP_DIR: Final = "/app"
#: the instance's data (the PVC)
POD_DATA_DIR: Final = "/data"
#: the Secret's files (OS_APP_TOKEN, OS_SHELL_SECRET): the SDK reads ``$OS_SECRETS_DIR/<name>``
POD_SECRETS_DIR: Final = "/var/run/atrium/secrets"
#: labels every object carries (values hashed/cut to Kubernetes' 63-character rules)
LABEL_APP: Final = "atrium.dev/app"
LABEL_OWNER: Final = "atrium.dev/owner"
LABEL_INSTANCE: Final = "atrium.dev/instance"
#: which shell made it (a hash of the shell's home and namespace): a shell adopts only its own
LABEL_SHELL: Final = "atrium.dev/shell"
#: the database of the shells that made it (`atrium.state.key`): a data claim is the user's on
#: every shell of that database, which all mount it; another database's shells never do
LABEL_STATE: Final = "atrium.dev/state"
#: a pod's: the data claim it mounts (the pods of one claim are placed on one node)
LABEL_DATA: Final = "atrium.dev/data"
#: annotations: the ids as they are (a label value may be hashed), and what has no pod field
ANNOTATION_APP: Final = "atrium.dev/app-id"
ANNOTATION_OWNER: Final = "atrium.dev/owner"
ANNOTATION_INSTANCE: Final = "atrium.dev/instance-id"
ANNOTATION_DIGEST: Final = "atrium.dev/source-digest"
#: the process ceiling: a pod has no field for it (the kubelet's ``podPidsLimit`` is per node)
ANNOTATION_PIDS: Final = "atrium.dev/pids-limit"
#: the labels of the shell's own pods (`shell_objects`); the NetworkPolicy admits only them
SHELL_POD_LABELS: Final = {
    "app.kubernetes.io/name": "atrium",
    "app.kubernetes.io/component": "shell",
}
#: a pod's server listens on every address of its own network namespace (its podIP)
POD_HOST: Final = "0.0.0.0"  # noqa: S104 - the pod's own namespace; the NetworkPolicy fences it
#: the unprivileged uid/gid every app container runs as (no name in the image needed)
POD_UID: Final = 10001
#: where the init container unpacks the app (the same emptyDir as POD_APP_DIR, writable there)
FETCH_DIR: Final = "/app-rw"
#: the module the init container runs (`atrium.lifecycle.runners.kubernetes.fetch`)
FETCH_MODULE: Final = "atrium.lifecycle.runners.kubernetes.fetch"
#: the interpreter on the base image's PATH
POD_PYTHON: Final = "python3"
#: the pod's own /tmp (an emptyDir: the root filesystem is read-only)
POD_TMP_DIR: Final = "/tmp"  # noqa: S108 - a folder of the pod, no one else's
#: the size of the memory-backed /tmp (counted against the pod's memory limit)
TMP_SIZE: Final = "64Mi"
#: the names of the Secret's keys (never in a pod's env)
SECRET_KEYS: Final = ("OS_APP_TOKEN", "OS_SHELL_SECRET")
#: what `atrium kube render` shows instead of a secret: secrets exist only at spawn
PLACEHOLDER_SECRET: Final = "<generated at spawn>"  # noqa: S105 - not a secret
#: the app's environment entries that name the shell's host, not the pod's (its image has both)
HOST_ONLY_ENV: Final = frozenset({"PATH", "PYTHONPATH"})


@dataclass(frozen=True, slots=True)
class PodPlan:
    """Everything about one instance the rendered objects depend on."""

    namespace: str
    shell: str  # LABEL_SHELL's value
    app_id: str
    instance_id: str
    owner: str
    #: the base image: Python and the Atrium SDK
    image: str
    #: the app's content digest (``sha256:…``) the init container fetches and checks
    source_digest: str
    #: where the init container fetches the app and the app reaches the shell
    shell_url: str
    argv: tuple[str, ...]
    #: the environment without secrets (OS_*, as decisions.md "Manifest")
    env: Mapping[str, str] = field(default_factory=dict)
    #: OS_APP_TOKEN, OS_SHELL_SECRET: only ever in the Secret
    secrets: Mapping[str, str] = field(default_factory=dict)
    memory_mib: int | None = None
    cpu_milli: int | None = None
    pids: int | None = None
    storage_class: str | None = None
    storage_mib: int = 1024
    #: LABEL_STATE's value ("": the shell's own database, no label)
    state: str = ""
    #: the instance whose data claim it mounts (a headless provider runs on the data of its
    #: owner's first instance of the app); "": its own
    data_of: str = ""
    #: its data is thrown away with it (an update's trial): an empty volume, no claim
    scratch_data: bool = False


#: the longest name or label value Kubernetes takes (a DNS-1123 label)
MAX_NAME: Final = 63
#: base32 characters of sha256 appended to a changed name: 80 bits, no practical collision
HASH_CHARS: Final = 16
_DNS_PART: Final = re.compile(r"[a-z0-9]+")
_LABEL_VALUE: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def _hash(*parts: str) -> str:
    """A digest of the parts as a list (so ``("a-b", "c")`` and ``("a", "b-c")`` differ)."""
    digest = hashlib.sha256(json.dumps(parts).encode()).digest()
    return base64.b32encode(digest).decode().lower()[:HASH_CHARS]


def dns_name(*parts: str) -> str:
    """``atrium-<parts>`` as a DNS-1123 label of at most 63 characters: lower case, ``[a-z0-9-]``,
    with a hash suffix whenever anything had to be changed or cut (so two inputs never meet).

    A name is kept as it is only when every part is ``[a-z0-9]+`` (no ``-``: joined parts could
    not be told apart) and the whole fits; it then never holds ``--``. Any other input becomes
    its readable part, cut, then ``--`` and a hash of the parts themselves: two changed names
    meet only if their hashes do, and never a kept one (which has no ``--``).
    """
    plain = "-".join(("atrium", *parts))
    if all(_DNS_PART.fullmatch(part) for part in parts) and len(plain) <= MAX_NAME:
        return plain
    readable = re.sub(r"[^a-z0-9]+", "-", plain.lower()).strip("-")
    room = MAX_NAME - HASH_CHARS - 2
    return readable[:room].rstrip("-") + "--" + _hash(*parts)


def label_value(value: str) -> str:
    """``value`` as a label value (63 characters, ``[A-Za-z0-9._-]``, alphanumeric at both ends):
    as it is when it already is one with no ``--``, else its readable part, ``--`` and a hash (so
    two values never meet). The whole value is in the object's annotations."""
    if len(value) <= MAX_NAME and "--" not in value and _LABEL_VALUE.fullmatch(value):
        return value
    readable = re.sub(r"[^A-Za-z0-9._]+", "-", value).strip("-._")
    room = MAX_NAME - HASH_CHARS - 2
    # "x" when nothing is readable: the "--" stays, so it is never a value kept as it is
    return (readable[:room].rstrip("-._") or "x") + "--" + _hash(value)


def claim_name(owner: str, instance_id: str) -> str:
    """The PVC of an instance's data, ``atrium-<owner>-<instance>`` (kept after destroy)."""
    return dns_name(owner, instance_id)


def pod_name(instance_id: str) -> str:
    return dns_name(instance_id)


def secret_name(instance_id: str) -> str:
    return dns_name(instance_id, "secrets")


def policy_name(shell: str) -> str:
    """The NetworkPolicy of one shell's app pods."""
    return dns_name("apps", shell)


def shell_key(home: str, namespace: str) -> str:
    """LABEL_SHELL's value for the shell with this home in this namespace: two shells sharing a
    namespace never adopt (or fence in) each other's pods."""
    return _hash(home, namespace)


def pod_argv(entrypoint: str | Sequence[str]) -> tuple[str, ...]:
    """The manifest's entrypoint as the pod's command: a file of the app is under POD_APP_DIR;
    ``python3``/``python`` is the base image's ``python3`` (which has the SDK); any other command
    is looked up on the image's PATH, and a relative path is the app's (the working directory is
    POD_APP_DIR), as the local runners do with the shell's interpreter and the app's folder."""
    if isinstance(entrypoint, str):
        return (f"{POD_APP_DIR}/{entrypoint}",)
    argv = list(entrypoint)
    if argv and argv[0] in {"python3", "python"}:
        argv[0] = POD_PYTHON
    return tuple(argv)


def pod_command(argv: Sequence[str], app_dir: str) -> list[str]:
    """A local spawn's argv (`atrium.lifecycle.spawning.resolve_argv`) as the pod's: the app's
    folder ``app_dir`` is POD_APP_DIR, the shell's interpreter is the image's ``python3``. The
    runner's spawn and `atrium kube render` both start from the local argv, so they agree."""
    command = [
        POD_APP_DIR + arg[len(app_dir) :]
        if arg == app_dir or arg.startswith(app_dir + "/")
        else arg
        for arg in argv
    ]
    if command and command[0].rpartition("/")[2].startswith("python"):
        command[0] = POD_PYTHON
    return command


def plan_for(
    *,
    namespace: str,
    shell: str,
    app_id: str,
    instance_id: str,
    owner: str,
    image: str,
    source_digest: str,
    shell_url: str,
    entrypoint: str | Sequence[str],
    env: Mapping[str, str],
    secrets: Mapping[str, str],
    memory_mib: int | None = None,
    cpu_milli: int | None = None,
    pids: int | None = None,
    storage_class: str | None = None,
    state: str = "",
    data_of: str = "",
    scratch_data: bool = False,
) -> PodPlan:
    """The plan of one instance from plain values: the runner's spawn and `atrium kube render`
    both call this, then `instance_objects`.

    ``env`` is the app's environment as `atrium.lifecycle.spawning.app_environment` builds it
    for a local child; what names the shell's own host (``PATH``, ``PYTHONPATH``) is left out
    (the image has its own), ``OS_SHELL_URL`` becomes ``shell_url``, and a secret's name is never
    kept (secrets are files). `instance_objects` adds the pod's address and folders.
    """
    pod_env = {
        key: value
        for key, value in env.items()
        if key not in HOST_ONLY_ENV and key not in SECRET_KEYS and key not in secrets
    }
    pod_env["OS_SHELL_URL"] = shell_url
    return PodPlan(
        namespace=namespace,
        shell=shell,
        app_id=app_id,
        instance_id=instance_id,
        owner=owner,
        image=image,
        source_digest=source_digest,
        shell_url=shell_url,
        argv=pod_argv(entrypoint),
        env=pod_env,
        secrets=dict(secrets),
        memory_mib=memory_mib,
        cpu_milli=cpu_milli,
        pids=pids,
        storage_class=storage_class,
        state=state,
        data_of=data_of,
        scratch_data=scratch_data,
    )


def instance_labels(plan: PodPlan) -> dict[str, str]:
    """The labels of every object of one instance (the runner's watch selects on LABEL_SHELL)."""
    return {
        "app.kubernetes.io/managed-by": "atrium",
        LABEL_APP: label_value(plan.app_id),
        LABEL_OWNER: label_value(plan.owner),
        LABEL_INSTANCE: label_value(plan.instance_id),
        LABEL_SHELL: label_value(plan.shell),
        **({LABEL_STATE: label_value(plan.state)} if plan.state else {}),
    }


def data_claim(plan: PodPlan) -> str:
    """The name of the claim the instance's data is on (its own, or ``data_of``'s)."""
    return claim_name(plan.owner, plan.data_of or plan.instance_id)


def _annotations(plan: PodPlan) -> dict[str, str]:
    return {
        ANNOTATION_APP: plan.app_id,
        ANNOTATION_OWNER: plan.owner,
        ANNOTATION_INSTANCE: plan.instance_id,
    }


def _metadata(plan: PodPlan, name: str, **annotations: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": plan.namespace,
        "labels": instance_labels(plan),
        "annotations": {**_annotations(plan), **annotations},
    }


def _resources(plan: PodPlan) -> dict[str, Any]:
    """Requests equal to limits (the scheduler reserves what the app may use; with both set the
    pod is Guaranteed, evicted last); no entry for what has no limit."""
    limits: dict[str, str] = {}
    if plan.memory_mib is not None:
        limits["memory"] = f"{plan.memory_mib}Mi"
    if plan.cpu_milli is not None:
        limits["cpu"] = f"{plan.cpu_milli}m"
    return {"requests": dict(limits), "limits": limits} if limits else {}


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_environment(plan: PodPlan) -> dict[str, str]:
    """The app container's environment: the plan's, then the pod's own address and folders
    (a secret's name never: the app reads ``$OS_SECRETS_DIR/<name>``)."""
    env = {k: v for k, v in plan.env.items() if k not in SECRET_KEYS and k not in plan.secrets}
    env.update(
        OS_HOST=POD_HOST,
        OS_PORT=str(POD_PORT),
        PORT=str(POD_PORT),
        OS_DATA_DIR=POD_DATA_DIR,
        OS_SECRETS_DIR=POD_SECRETS_DIR,
        OS_SHELL_URL=plan.shell_url,
    )
    return env


def _env_list(env: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in env.items()]


def secret_object(plan: PodPlan) -> dict[str, Any]:
    """The instance's Secret: its token and the shell's secret, read by the pod as files."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(plan, secret_name(plan.instance_id)),
        "type": "Opaque",
        "immutable": True,
        "stringData": {key: plan.secrets.get(key, PLACEHOLDER_SECRET) for key in SECRET_KEYS},
    }


def claim_object(plan: PodPlan) -> dict[str, Any]:
    """The instance's data claim: no owner reference, so deleting the pod keeps it. Labelled
    and annotated as the instance whose data it is (``data_of``'s, for a provider)."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{plan.storage_mib}Mi"}},
    }
    if plan.storage_class is not None:
        spec["storageClassName"] = plan.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(
            replace(plan, instance_id=plan.data_of or plan.instance_id), data_claim(plan)
        ),
        "spec": spec,
    }


def pod_object(plan: PodPlan) -> dict[str, Any]:
    """The instance's Pod (see docs/decisions.md "Kubernetes: the objects of an instance")."""
    annotations = {ANNOTATION_DIGEST: plan.source_digest}
    if plan.pids is not None:
        annotations[ANNOTATION_PIDS] = str(plan.pids)
    secrets_mount = {"name": "secrets", "mountPath": POD_SECRETS_DIR, "readOnly": True}
    resources = _resources(plan)
    fetch: dict[str, Any] = {
        "name": "fetch",
        "image": plan.image,
        "command": [
            POD_PYTHON,
            "-m",
            FETCH_MODULE,
            "--digest",
            plan.source_digest,
            "--to",
            FETCH_DIR,
        ],
        "env": _env_list({"OS_SHELL_URL": plan.shell_url, "OS_SECRETS_DIR": POD_SECRETS_DIR}),
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "app", "mountPath": FETCH_DIR},
            {"name": "tmp", "mountPath": POD_TMP_DIR},
            secrets_mount,
        ],
    }
    app: dict[str, Any] = {
        "name": "app",
        "image": plan.image,
        "command": list(plan.argv),
        "workingDir": POD_APP_DIR,
        "env": _env_list(pod_environment(plan)),
        "ports": [{"name": "http", "containerPort": POD_PORT, "protocol": "TCP"}],
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "app", "mountPath": POD_APP_DIR, "readOnly": True},
            {"name": "data", "mountPath": POD_DATA_DIR},
            {"name": "tmp", "mountPath": POD_TMP_DIR},
            secrets_mount,
        ],
    }
    if resources:
        fetch["resources"] = resources
        app["resources"] = resources
    metadata = _metadata(plan, pod_name(plan.instance_id), **annotations)
    placement: dict[str, Any] = {}
    if not plan.scratch_data:
        # a provider and its owner's page instance run on one ReadWriteOnce claim: the scheduler
        # is asked to put the pods of one claim on one node, where both may mount it
        data = label_value(data_claim(plan))
        metadata["labels"][LABEL_DATA] = data
        placement["affinity"] = {
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {LABEL_DATA: data}},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            **placement,
            # the shell decides restarts (its crash policy), not the kubelet
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": POD_UID,
                "runAsGroup": POD_UID,
                "fsGroup": POD_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "initContainers": [fetch],
            "containers": [app],
            "volumes": [
                {"name": "app", "emptyDir": {}},
                {"name": "data", "emptyDir": {}}
                if plan.scratch_data
                else {"name": "data", "persistentVolumeClaim": {"claimName": data_claim(plan)}},
                {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": TMP_SIZE}},
                {
                    "name": "secrets",
                    # group-readable: the files belong to root and the pod's fsGroup
                    "secret": {"secretName": secret_name(plan.instance_id), "defaultMode": 0o440},
                },
            ],
        },
    }


def instance_objects(plan: PodPlan) -> list[dict[str, Any]]:
    """The Secret, the PersistentVolumeClaim (none for scratch data) and the Pod of one
    instance, in creation order."""
    if plan.scratch_data:
        return [secret_object(plan), pod_object(plan)]
    return [secret_object(plan), claim_object(plan), pod_object(plan)]


def shell_cidrs(shell_url: str, outside: bool) -> list[str]:
    """The addresses the NetworkPolicy admits as the shell besides its pods: a shell outside the
    cluster (one with a kubeconfig) whose ``shell_url`` names an IP address is that address."""
    host = urlsplit(shell_url).hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return []
    return [f"{address}/{address.max_prefixlen}"] if outside else []


def namespace_objects(
    namespace: str,
    shell: str,
    shell_labels: Mapping[str, str],
    shell_cidrs: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """What the namespace needs once: the NetworkPolicy that lets app pods take traffic only from
    the shell (pods labelled ``shell_labels``) and reach only the shell and DNS.

    ``shell_cidrs``: addresses of a shell that is not a pod of the namespace (one run with a
    kubeconfig from outside the cluster), admitted and reachable as the shell's pods are.
    """
    peers: list[dict[str, Any]] = [{"podSelector": {"matchLabels": dict(shell_labels)}}]
    peers += [{"ipBlock": {"cidr": cidr}} for cidr in shell_cidrs]
    dns = {
        "to": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": policy_name(shell),
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "atrium", LABEL_SHELL: shell},
            },
            "spec": {
                "podSelector": {"matchLabels": {LABEL_SHELL: label_value(shell)}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": POD_PORT}]}],
                "egress": [{"to": peers}, dns],
            },
        }
    ]


#: what the shell's service account may do in its namespace, and no more
SHELL_RULES: Final = (
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "delete", "patch"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods/log", "pods/status"],
        "verbs": ["get", "list", "watch"],
    },
    {
        "apiGroups": [""],
        "resources": ["secrets", "persistentvolumeclaims"],
        "verbs": ["get", "list", "create", "delete", "patch"],
    },
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "create"],
    },
)
SHELL_NAME: Final = "atrium-shell"
#: where the shell's home is in its own pod (its PVC)
SHELL_HOME: Final = "/var/lib/atrium"
SHELL_PORT: Final = 7070


def shell_objects(
    namespace: str,
    image: str,
    *,
    app_image: str,
    storage_class: str | None = None,
    home_mib: int = 10240,
    labels: Mapping[str, str] = SHELL_POD_LABELS,
) -> list[dict[str, Any]]:
    """The shell itself in the namespace: its ServiceAccount, the Role it needs and its binding,
    its Service and a one-replica StatefulSet whose home is a PVC (docs/deploying.md
    "On Kubernetes"). ``image`` runs ``atrium serve``; ``app_image`` is ATRIUM_KUBE_IMAGE."""
    meta = {"namespace": namespace, "labels": dict(labels)}
    url = f"http://{SHELL_NAME}.{namespace}.svc:{SHELL_PORT}"
    env = {
        "ATRIUM_HOME": SHELL_HOME,
        "ATRIUM_HOST": POD_HOST,
        "ATRIUM_PORT": str(SHELL_PORT),
        "ATRIUM_RUNNER": "kubernetes",
        "ATRIUM_KUBE_NAMESPACE": namespace,
        "ATRIUM_KUBE_IMAGE": app_image,
        "ATRIUM_KUBE_SHELL_URL": url,
    }
    if storage_class is not None:
        env["ATRIUM_KUBE_STORAGE_CLASS"] = storage_class
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{home_mib}Mi"}},
    }
    if storage_class is not None:
        claim_spec["storageClassName"] = storage_class
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SHELL_NAME, **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": SHELL_NAME, **meta},
            "rules": [dict(rule) for rule in SHELL_RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": SHELL_NAME, **meta},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": SHELL_NAME,
            },
            "subjects": [{"kind": "ServiceAccount", "name": SHELL_NAME, "namespace": namespace}],
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SHELL_NAME, **meta},
            "spec": {
                "selector": dict(labels),
                "ports": [
                    {"name": "http", "port": SHELL_PORT, "targetPort": "http", "protocol": "TCP"}
                ],
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": SHELL_NAME, **meta},
            "spec": {
                # one shell per home: a second replica would share nothing and fight over pods
                "replicas": 1,
                "serviceName": SHELL_NAME,
                "selector": {"matchLabels": dict(labels)},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "serviceAccountName": SHELL_NAME,
                        "enableServiceLinks": False,
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": POD_UID,
                            "runAsGroup": POD_UID,
                            "fsGroup": POD_UID,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [
                            {
                                "name": "shell",
                                "image": image,
                                "command": ["atrium", "serve"],
                                "env": _env_list(env),
                                "ports": [
                                    {"name": "http", "containerPort": SHELL_PORT, "protocol": "TCP"}
                                ],
                                "readinessProbe": {
                                    "httpGet": {"path": "/health", "port": "http"},
                                    "periodSeconds": 5,
                                },
                                "securityContext": _container_security(),
                                "volumeMounts": [
                                    {"name": "home", "mountPath": SHELL_HOME},
                                    {"name": "tmp", "mountPath": POD_TMP_DIR},
                                ],
                            }
                        ],
                        "volumes": [{"name": "tmp", "emptyDir": {}}],
                    },
                },
                "volumeClaimTemplates": [{"metadata": {"name": "home"}, "spec": claim_spec}],
            },
        },
    ]


#: YAML words a plain key could be read as (a boolean or null in YAML 1.1): quoted
_YAML_WORDS: Final = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"})
_PLAIN_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")


def _yaml_string(text: str) -> str:
    """A double-quoted YAML scalar: every character not printable escaped, so any text (an
    argv from a manifest) reads back as itself."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    return _yaml_string(str(value))


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            name = str(key)
            if not _PLAIN_KEY.fullmatch(name) or name.lower() in _YAML_WORDS:
                name = _yaml_string(name)
            if isinstance(item, dict | list | tuple) and item:
                lines.append(f"{pad}{name}:")
                lines += _yaml_lines(item, indent + 2)
            else:
                lines.append(f"{pad}{name}: {_yaml_scalar(item)}")
    else:
        for item in value:
            if isinstance(item, dict | list | tuple) and item:
                nested = _yaml_lines(item, indent + 2)
                nested[0] = f"{pad}- {nested[0][indent + 2 :]}"
                lines += nested
            else:
                lines.append(f"{pad}- {_yaml_scalar(item)}")
    return lines


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    """The objects as YAML documents (``---`` before each), as `kubectl apply -f` reads them;
    block style, every string double-quoted (no YAML type guessing: ``"0755"`` stays a string)."""
    return "".join("---\n" + "\n".join(_yaml_lines(dict(obj), 0)) + "\n" for obj in objects)
