"""The objects one instance needs on Kubernetes, as plain dicts (pure: no I/O, no client).

One function builds them for both the runner (which creates exactly these) and
`atrium kube render` (which prints them as YAML), so what is reviewed is what runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

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


def dns_name(*parts: str) -> str:
    """``atrium-<parts>`` as a DNS-1123 label of at most 63 characters: lower case, ``[a-z0-9-]``,
    with a hash suffix whenever anything had to be changed or cut (so two inputs never meet)."""
    raise NotImplementedError


def claim_name(owner: str, instance_id: str) -> str:
    """The PVC of an instance's data, ``atrium-<owner>-<instance>`` (kept after destroy)."""
    raise NotImplementedError


def pod_name(instance_id: str) -> str:
    raise NotImplementedError


def secret_name(instance_id: str) -> str:
    raise NotImplementedError


def instance_objects(plan: PodPlan) -> list[dict[str, Any]]:
    """The Secret, the PersistentVolumeClaim and the Pod of one instance, in creation order."""
    raise NotImplementedError


def namespace_objects(
    namespace: str, shell: str, shell_labels: Mapping[str, str]
) -> list[dict[str, Any]]:
    """What the namespace needs once: the NetworkPolicy that lets app pods take traffic only from
    the shell (pods labelled ``shell_labels``) and reach only the shell and DNS."""
    raise NotImplementedError
