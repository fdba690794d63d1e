"""The Kubernetes runner: one Pod per instance, as KubeSpawner runs notebook servers.

``render`` (pure) turns one instance's plan into the objects the runner creates, the same ones
`atrium kube render` prints; ``runner`` (I/O, kubernetes-asyncio) creates them, watches pods and
adopts the ones an earlier shell left running.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: what `atrium[kubernetes]` installs; said when it is missing
INSTALL_HINT = "pip install 'atrium[kubernetes]'"


@dataclass(frozen=True, slots=True)
class KubeSettings:
    """The slice of the settings the Kubernetes runner needs (atrium/settings.py ``kube_*``)."""

    namespace: str
    image: str
    #: a kubeconfig file; None: the pod's own service account (in-cluster)
    config: Path | None
    storage_class: str | None
    start_timeout: float
    #: the URL pods reach the shell at (the init container's fetch, the SDK's calls)
    shell_url: str
    #: LABEL_SHELL's value: which shell made a pod (a shell adopts only its own)
    shell: str
    #: LABEL_STATE's value: the key of the shells' database (`atrium.state.key`); "": none
    state: str = ""
