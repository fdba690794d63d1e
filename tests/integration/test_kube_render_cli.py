"""`atrium kube render` through the real CLI: offline from a home, YAML that parses, objects
Kubernetes accepts, the manifest's command and limits, and no real secret anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from atrium.lifecycle.runners.kubernetes.render import (
    ANNOTATION_PIDS,
    PLACEHOLDER_SECRET,
    claim_name,
    pod_name,
)
from atrium.lifecycle.runners.kubernetes.source import source_digest

VERSIONS = ("1.29.0", "1.35.0")
APP_ID = "test.kube.render"
MANIFEST = {
    "id": APP_ID,
    "name": "Render me",
    "version": "1.0.0",
    "entrypoint": ["python3", "server.py", "--flag"],
    "resources": {"memoryMiB": 512, "cpuMilli": 250, "pids": 64},
    "permissions": [],
}


def render(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")}
    return subprocess.run(
        [sys.executable, "-m", "atrium", "kube", "render", *args],
        env={**clean, "ATRIUM_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def install_for(home: Path, owner: str) -> Path:
    """The app in ``owner``'s own scope, placed by hand as an offline home holds it."""
    folder = home / "scopes" / "users" / owner / "apps" / APP_ID
    folder.mkdir(parents=True)
    (folder / "app.manifest.json").write_text(json.dumps(MANIFEST))
    (folder / "server.py").write_text("print('hello')\n")
    return folder


def kinds(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def test_render_prints_every_object_of_one_instance_as_valid_yaml(tmp_path: Path) -> None:
    home = tmp_path / "home"
    folder = install_for(home, "alice")
    shown = render(
        home,
        APP_ID,
        "--owner",
        "alice",
        ATRIUM_KUBE_NAMESPACE="apps",
        ATRIUM_KUBE_IMAGE="registry.example/atrium-python:3.11",
        ATRIUM_KUBE_SHELL_URL="http://atrium-shell.apps.svc:7070",
        ATRIUM_KUBE_STORAGE_CLASS="fast",
        ATRIUM_APP_MEMORY_MIB="256",
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("---\n")
    objects = list(yaml.safe_load_all(shown.stdout))
    for obj in objects:
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    by_kind = kinds(objects)
    assert set(by_kind) == {"NetworkPolicy", "Secret", "PersistentVolumeClaim", "Pod"}
    assert {o["metadata"]["namespace"] for o in objects} == {"apps"}
    instance = f"{APP_ID}~alice-1"
    pod = by_kind["Pod"]
    assert pod["metadata"]["name"] == pod_name(instance)
    assert by_kind["PersistentVolumeClaim"]["metadata"]["name"] == claim_name("alice", instance)
    assert by_kind["PersistentVolumeClaim"]["spec"]["storageClassName"] == "fast"
    (app,) = pod["spec"]["containers"]
    (fetch,) = pod["spec"]["initContainers"]
    assert app["image"] == "registry.example/atrium-python:3.11"
    assert app["command"] == ["python3", "server.py", "--flag"]
    assert source_digest(folder) in fetch["command"]
    env = {e["name"]: e["value"] for e in app["env"]}
    assert env["OS_SHELL_URL"] == "http://atrium-shell.apps.svc:7070"
    assert env["OS_INSTANCE_ID"] == instance
    assert str(home) not in json.dumps(pod)  # nothing of the shell's host reaches the pod
    # the manifest's 512 MiB capped by the shell's ceiling; its CPU as asked; no process
    # ceiling is claimed (a pod has none of its own: the node's podPidsLimit), as the runner
    assert app["resources"]["limits"] == {"memory": "256Mi", "cpu": "250m"}
    assert ANNOTATION_PIDS not in pod["metadata"]["annotations"]
    assert set(by_kind["Secret"]["stringData"].values()) == {PLACEHOLDER_SECRET}


def test_render_with_shell_adds_the_shells_own_objects(tmp_path: Path) -> None:
    shown = render(tmp_path / "home", "--shell", "--json")
    assert shown.returncode == 0, shown.stderr
    objects = json.loads(shown.stdout)
    assert [o["kind"] for o in objects] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Service",
        "StatefulSet",
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)


def test_render_names_what_is_wrong(tmp_path: Path) -> None:
    home = tmp_path / "home"
    missing = render(home, "test.kube.absent")
    assert missing.returncode == 1
    assert "test.kube.absent" in missing.stderr
    assert missing.stdout == ""
    install_for(home, "alice")
    # alice's own app is not the bootstrap admin's
    assert render(home, APP_ID).returncode == 1
    bad_owner = render(home, APP_ID, "--owner", "Not A User")
    assert bad_owner.returncode == 1
    assert "--owner" in bad_owner.stderr
    bad_setting = render(home, APP_ID, "--owner", "alice", ATRIUM_KUBE_NAMESPACE="No_Such")
    assert bad_setting.returncode == 2
    assert "ATRIUM_KUBE_NAMESPACE" in bad_setting.stderr


def test_render_prints_the_claim_without_the_key_of_a_database_it_cannot_open(
    tmp_path: Path,
) -> None:
    """The database is read only for its key, which labels data claims; one that cannot be
    opened (here a symlink, which the shell's SQLite opening refuses; as well a file the
    reviewer may not write) printed a traceback (ConfigError) instead of the objects."""
    from atrium.lifecycle.runners.kubernetes.render import LABEL_STATE
    from atrium.state.migrate import upgrade_now

    home = tmp_path / "home"
    install_for(home, "alice")
    real = tmp_path / "elsewhere.sqlite3"
    upgrade_now(f"sqlite+aiosqlite:///{real}")
    (home / "state.sqlite3").symlink_to(real)
    shown = render(home, APP_ID, "--owner", "alice", ATRIUM_KUBE_NAMESPACE="apps")
    assert shown.returncode == 0, shown.stderr  # was 1: a ConfigError's traceback
    claim = kinds(list(yaml.safe_load_all(shown.stdout)))["PersistentVolumeClaim"]
    assert LABEL_STATE not in claim["metadata"]["labels"]
