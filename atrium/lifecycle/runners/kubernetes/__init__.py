"""The Kubernetes runner: one Pod per instance, as KubeSpawner runs notebook servers.

``render`` (pure) turns one instance's plan into the objects the runner creates, the same ones
`atrium kube render` prints; ``runner`` (I/O, kubernetes-asyncio) creates them, watches pods and
adopts the ones an earlier shell left running.
"""
