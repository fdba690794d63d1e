"""The objects the Kubernetes runner creates: valid for two Kubernetes versions (schema, strict),
names Kubernetes accepts and that never collide, secrets only in the Secret, the pod hardened."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from atrium.lifecycle.runners.kubernetes.render import (
    ANNOTATION_INSTANCE,
    ANNOTATION_PIDS,
    FETCH_MODULE,
    LABEL_APP,
    LABEL_DATA,
    LABEL_INSTANCE,
    LABEL_OWNER,
    LABEL_SHELL,
    LABEL_STATE,
    PLACEHOLDER_SECRET,
    POD_APP_DIR,
    POD_DATA_DIR,
    POD_HOST,
    POD_PORT,
    POD_SECRETS_DIR,
    POD_TMP_DIR,
    SHELL_POD_LABELS,
    PodPlan,
    claim_name,
    dns_name,
    instance_objects,
    label_value,
    namespace_objects,
    plan_for,
    pod_argv,
    pod_command,
    pod_name,
    secret_name,
    shell_key,
    shell_objects,
    to_yaml,
)

VERSIONS = ("1.29.0", "1.35.0")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
TOKEN = "tok-4e1c3f0b9d2a7c6e5f8a1b2c3d4e5f60"
SECRET = "sec-9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d"
DIGEST = "sha256:" + "ab" * 32


def plan(**changes: Any) -> PodPlan:
    values: dict[str, Any] = {
        "namespace": "atrium",
        "shell": shell_key("/var/lib/atrium", "atrium"),
        "app_id": "com.example.notes",
        "instance_id": "com.example.notes~alice-1",
        "owner": "alice",
        "image": "registry.example/atrium-python:3.11",
        "source_digest": DIGEST,
        "shell_url": "http://atrium-shell.atrium.svc:7070",
        "entrypoint": ["python3", "server.py"],
        "env": {
            "OS_APP_ID": "com.example.notes",
            "OS_INSTANCE_ID": "com.example.notes~alice-1",
            "OS_HOST": "127.0.0.1",
            "OS_PORT": "43111",
            "PORT": "43111",
            "OS_SHELL_URL": "http://127.0.0.1:7070",
            "PATH": "/usr/local/bin:/usr/bin",
            "PYTHONPATH": "/root/.local/share/atrium/sdk",
            "PYTHONUNBUFFERED": "1",
        },
        "secrets": {"OS_APP_TOKEN": TOKEN, "OS_SHELL_SECRET": SECRET},
        "memory_mib": 256,
        "cpu_milli": 500,
        "pids": 128,
    }
    values.update(changes)
    return plan_for(**values)


def every_object(p: PodPlan) -> list[dict[str, Any]]:
    return [
        *namespace_objects(p.namespace, p.shell, SHELL_POD_LABELS),
        *instance_objects(p),
        *shell_objects(p.namespace, "registry.example/atrium:1", app_image=p.image),
    ]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = (o for o in objects if o["kind"] == kind)
    return found


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"memory_mib": None, "cpu_milli": None, "pids": None},
        {"storage_class": "fast-ssd", "entrypoint": "run.sh"},
        {"owner": "Bob_" + "x" * 80, "instance_id": "A.B~" + "y" * 200},
        {"state": "0f" * 16, "data_of": "com.example.notes~alice-1", "scratch_data": False},
        {"scratch_data": True},
    ],
    ids=["limits", "no-limits", "storage-class", "long-names", "provider", "trial"],
)
def test_every_object_is_valid_for_the_kubernetes_version(
    version: str, changes: dict[str, Any]
) -> None:
    for obj in every_object(plan(**changes)):
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_refuses_what_kubernetes_would() -> None:
    """The check above can fail: a port given as a string is refused."""
    pod = by_kind(instance_objects(plan()), "Pod")
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = "8080"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, VERSIONS[0], strict=True)


NAMES = [
    ("plain",),
    ("com.example.notes-1",),
    ("Upper", "Case"),
    ("under_score", "x"),
    ("a" * 100,),
    ("a" * 100 + "b",),
    ("a-b", "c"),
    ("a", "b-c"),
    ("a-b-c",),
    ("", "x"),
    ("___",),
    ("é", "ü"),
]


@pytest.mark.parametrize("parts", NAMES)
def test_a_name_is_a_dns_label_of_at_most_63(parts: tuple[str, ...]) -> None:
    name = dns_name(*parts)
    assert len(name) <= 63
    assert DNS_LABEL.fullmatch(name), name
    assert name.startswith("atrium")


def test_distinct_inputs_give_distinct_names() -> None:
    names = [dns_name(*parts) for parts in NAMES]
    assert len(set(names)) == len(names)
    # cut at the same place, they differ only past the cut: the hash keeps them apart
    long_a, long_b = dns_name("x" * 70 + "a"), dns_name("x" * 70 + "b")
    assert long_a != long_b
    assert len(long_a) == len(long_b) == 63


def test_a_name_that_needs_no_change_is_kept_readable() -> None:
    assert dns_name("apps", "abc123") == "atrium-apps-abc123"
    assert pod_name("notes1") == "atrium-notes1"
    # changed: readable start, then "--" and the hash (which no kept name has)
    assert dns_name("Notes").startswith("atrium-notes--")


def test_a_kept_name_never_equals_a_changed_one() -> None:
    """A kept name has no ``--``; an attacker choosing a part cannot spell another's hash."""
    changed = dns_name("Bob")
    suffix = changed.removeprefix("atrium-")
    assert dns_name(suffix) != changed
    assert dns_name(*suffix.split("-")) != changed


def test_claims_pods_and_secrets_of_two_owners_never_meet() -> None:
    # a '-' in an owner could otherwise move into the instance id and meet another pair
    assert claim_name("a-b", "c") != claim_name("a", "b-c")
    assert claim_name("alice", "com.example.notes~alice-1") != claim_name(
        "bob", "com.example.notes~alice-1"
    )
    assert secret_name("x") != pod_name("x")
    assert len(claim_name("o" * 32, "com.example." + "n" * 60 + "~" + "o" * 32 + "-12")) <= 63


@pytest.mark.parametrize(
    "value",
    ["alice", "com.example.notes", "com.example.notes~alice-1", "a--b", "A" * 64, "-x-", "", "é"],
)
def test_label_values_follow_kubernetes_rules(value: str) -> None:
    label = label_value(value)
    assert len(label) <= 63
    assert LABEL_VALUE.fullmatch(label), label


def test_label_values_are_distinct_and_kept_when_valid() -> None:
    assert label_value("com.example.notes") == "com.example.notes"
    assert label_value("alice") == "alice"
    # a changed value always holds "--", which no kept value does
    assert all("--" in label_value(v) for v in ("", "é", "a--b", "~"))
    values = ["a~b", "a-b", "a_b", "a--b", "x" * 64, "x" * 65, "a.b", "", "é"]
    assert len({label_value(v) for v in values}) == len(values)


def test_every_object_name_and_label_is_accepted() -> None:
    """What the schema does not check: names and label values, on hostile ids."""
    for obj in every_object(plan(owner="Bob_" + "x" * 80, instance_id="A.B~" + "y" * 200)):
        assert DNS_LABEL.fullmatch(obj["metadata"]["name"]), obj["metadata"]["name"]
        for key, value in obj["metadata"].get("labels", {}).items():
            assert LABEL_VALUE.fullmatch(value), (key, value)
            assert len(value) <= 63, (key, value)


def test_the_secrets_are_only_in_the_secret() -> None:
    objects = instance_objects(plan())
    secret = by_kind(objects, "Secret")
    assert secret["type"] == "Opaque"
    assert secret["stringData"] == {"OS_APP_TOKEN": TOKEN, "OS_SHELL_SECRET": SECRET}
    for obj in (by_kind(objects, "Pod"), by_kind(objects, "PersistentVolumeClaim")):
        text = json.dumps(obj)
        assert TOKEN not in text
        assert SECRET not in text
    pod = by_kind(objects, "Pod")
    for container in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
        names = {e["name"] for e in container["env"]}
        assert not names & {"OS_APP_TOKEN", "OS_SHELL_SECRET"}
        assert "envFrom" not in container
        assert {"name": "OS_SECRETS_DIR", "value": POD_SECRETS_DIR} in container["env"]
        assert {"name": "secrets", "mountPath": POD_SECRETS_DIR, "readOnly": True} in container[
            "volumeMounts"
        ]


def test_a_secret_passed_as_env_never_reaches_the_pod() -> None:
    leaky = plan(env={"OS_APP_TOKEN": TOKEN, "OS_SHELL_SECRET": SECRET, "OS_APP_ID": "x"})
    pod = by_kind(instance_objects(leaky), "Pod")
    assert TOKEN not in json.dumps(pod)
    assert SECRET not in json.dumps(pod)


def test_render_without_secrets_shows_placeholders() -> None:
    secret = by_kind(instance_objects(plan(secrets={})), "Secret")
    assert set(secret["stringData"].values()) == {PLACEHOLDER_SECRET}


def test_the_pod_is_hardened() -> None:
    pod = by_kind(instance_objects(plan()), "Pod")
    spec = pod["spec"]
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == security["runAsGroup"] == security["fsGroup"] == 10001
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert "hostNetwork" not in spec
    assert "hostPID" not in spec
    for container in spec["containers"] + spec["initContainers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert "privileged" not in context
    assert "ownerReferences" not in pod["metadata"]


def test_the_pod_runs_the_app_fetched_by_digest() -> None:
    pod = by_kind(instance_objects(plan()), "Pod")
    (init,) = pod["spec"]["initContainers"]
    (app,) = pod["spec"]["containers"]
    assert init["image"] == app["image"] == "registry.example/atrium-python:3.11"
    assert init["command"] == ["python3", "-m", FETCH_MODULE, "--digest", DIGEST, "--to", "/app-rw"]
    assert {"name": "app", "mountPath": "/app-rw"} in init["volumeMounts"]
    assert {"name": "app", "mountPath": POD_APP_DIR, "readOnly": True} in app["volumeMounts"]
    assert app["command"] == ["python3", "server.py"]
    assert app["workingDir"] == POD_APP_DIR
    assert app["ports"] == [{"name": "http", "containerPort": POD_PORT, "protocol": "TCP"}]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["app"] == {"name": "app", "emptyDir": {}}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim_name(
        "alice", "com.example.notes~alice-1"
    )
    assert volumes["tmp"]["emptyDir"]["medium"] == "Memory"
    assert {"name": "data", "mountPath": POD_DATA_DIR} in app["volumeMounts"]
    assert {"name": "tmp", "mountPath": POD_TMP_DIR} in app["volumeMounts"]


def test_the_pods_environment_is_its_own_not_the_shells_host() -> None:
    pod = by_kind(instance_objects(plan()), "Pod")
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["OS_HOST"] == POD_HOST
    assert env["OS_PORT"] == env["PORT"] == "8080"
    assert env["OS_DATA_DIR"] == "/data"
    assert env["OS_SHELL_URL"] == "http://atrium-shell.atrium.svc:7070"
    assert env["OS_APP_ID"] == "com.example.notes"
    assert "PATH" not in env
    assert "PYTHONPATH" not in env


def test_labels_and_annotations_name_the_instance() -> None:
    objects = instance_objects(plan())
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels[LABEL_APP] == "com.example.notes"
        assert labels[LABEL_OWNER] == "alice"
        assert labels[LABEL_INSTANCE] == label_value("com.example.notes~alice-1")
        assert labels[LABEL_SHELL] == shell_key("/var/lib/atrium", "atrium")
        assert obj["metadata"]["annotations"]["atrium.dev/instance-id"] == (
            "com.example.notes~alice-1"
        )


def test_limits_become_requests_and_limits() -> None:
    pod = by_kind(instance_objects(plan()), "Pod")
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"memory": "256Mi", "cpu": "500m"}
    assert resources["requests"] == resources["limits"]
    # pids have no pod field: an annotation says what was asked
    assert pod["metadata"]["annotations"][ANNOTATION_PIDS] == "128"


def test_no_limits_means_no_resources() -> None:
    pod = by_kind(instance_objects(plan(memory_mib=None, cpu_milli=None, pids=None)), "Pod")
    assert "resources" not in pod["spec"]["containers"][0]
    assert ANNOTATION_PIDS not in pod["metadata"]["annotations"]


def test_the_claim_outlives_the_pod() -> None:
    claim = by_kind(instance_objects(plan(storage_class="fast")), "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == claim_name("alice", "com.example.notes~alice-1")
    assert "ownerReferences" not in claim["metadata"]
    assert claim["spec"]["storageClassName"] == "fast"
    assert (
        "storageClassName" not in by_kind(instance_objects(plan()), "PersistentVolumeClaim")["spec"]
    )


def test_a_provider_mounts_its_owners_first_instances_claim_near_its_pods() -> None:
    first = plan(state="k" * 32)
    provider = plan(
        state="k" * 32,
        instance_id="com.example.notes~alice-provider",
        data_of="com.example.notes~alice-1",
    )
    claims = [by_kind(instance_objects(p), "PersistentVolumeClaim") for p in (first, provider)]
    assert claims[0] == claims[1]  # the same claim, labelled as the first instance's
    assert claims[0]["metadata"]["labels"][LABEL_STATE] == "k" * 32
    assert claims[0]["metadata"]["annotations"][ANNOTATION_INSTANCE] == "com.example.notes~alice-1"
    pods = [by_kind(instance_objects(p), "Pod") for p in (first, provider)]
    [mounted] = {
        v["persistentVolumeClaim"]["claimName"]
        for pod in pods
        for v in pod["spec"]["volumes"]
        if v["name"] == "data"
    }
    assert mounted == claims[0]["metadata"]["name"]
    # the scheduler is asked to put both on one node, where a ReadWriteOnce claim mounts twice
    data = {pod["metadata"]["labels"][LABEL_DATA] for pod in pods}
    assert len(data) == 1
    for pod in pods:
        term = pod["spec"]["affinity"]["podAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ][0]["podAffinityTerm"]
        assert term["labelSelector"] == {"matchLabels": {LABEL_DATA: next(iter(data))}}


def test_a_trials_data_is_an_empty_volume_and_no_claim() -> None:
    objects = instance_objects(plan(scratch_data=True))
    assert [o["kind"] for o in objects] == ["Secret", "Pod"]
    pod = by_kind(objects, "Pod")
    assert {"name": "data", "emptyDir": {}} in pod["spec"]["volumes"]
    assert "affinity" not in pod["spec"]


def test_the_network_policy_admits_only_the_shell_and_reaches_only_it_and_dns() -> None:
    shell = shell_key("/h", "atrium")
    (policy,) = namespace_objects("atrium", shell, SHELL_POD_LABELS)
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {LABEL_SHELL: shell}}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = spec["ingress"]
    assert ingress["from"] == [{"podSelector": {"matchLabels": SHELL_POD_LABELS}}]
    assert ingress["ports"] == [{"protocol": "TCP", "port": 8080}]
    to_shell, dns = spec["egress"]
    assert to_shell == {"to": [{"podSelector": {"matchLabels": SHELL_POD_LABELS}}]}
    assert dns["to"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}
    ]
    assert sorted(p["protocol"] for p in dns["ports"]) == ["TCP", "UDP"]
    assert {p["port"] for p in dns["ports"]} == {53}


def test_the_shells_role_is_what_it_needs() -> None:
    objects = shell_objects("atrium", "registry.example/atrium:1", app_image="img")
    role = by_kind(objects, "Role")
    granted = {
        (resource, verb)
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert ("pods", "create") in granted
    assert ("pods", "delete") in granted
    assert ("pods/log", "get") in granted
    assert ("pods", "watch") in granted
    assert ("secrets", "create") in granted
    assert ("persistentvolumeclaims", "delete") in granted
    assert ("networkpolicies", "create") in granted
    assert not any(verb in {"*", "update", "escalate", "bind"} for _, verb in granted)
    # patch only to relabel a dead shell's pod, Secret and claim as the taker's (takeover)
    assert {r for r, verb in granted if verb == "patch"} == {
        "pods",
        "secrets",
        "persistentvolumeclaims",
    }
    assert all("*" not in rule["resources"] for rule in role["rules"])
    shell_set = by_kind(objects, "StatefulSet")
    assert shell_set["spec"]["replicas"] == 1
    assert shell_set["spec"]["template"]["metadata"]["labels"] == SHELL_POD_LABELS


@pytest.mark.parametrize(
    ("entrypoint", "argv"),
    [
        ("entrypoint.sh", ("/app/entrypoint.sh",)),
        (["python", "-m", "server"], ("python3", "-m", "server")),
        (["node", "server.js"], ("node", "server.js")),
        (["./run"], ("./run",)),
    ],
)
def test_the_entrypoint_as_the_pods_command(
    entrypoint: str | list[str], argv: tuple[str, ...]
) -> None:
    assert pod_argv(entrypoint) == argv


def test_a_local_argv_as_the_pods_command() -> None:
    app = "/home/u/.local/share/atrium/scopes/global/apps/com.example.notes"
    assert pod_command(["/usr/local/bin/python3.11", f"{app}/server.py", "--x"], app) == [
        "python3",
        "/app/server.py",
        "--x",
    ]
    assert pod_command([f"{app}/entrypoint.sh"], app) == ["/app/entrypoint.sh"]
    # a sibling folder whose name starts like the app's is not the app's
    assert pod_command(["/bin/sh", f"{app}2/x"], app) == ["/bin/sh", f"{app}2/x"]


def test_the_yaml_reads_back_as_the_objects() -> None:
    """Any text an argv may hold (quotes, a tab, YAML words, U+2028, beyond the BMP) survives."""
    odd = ["python3", "on", "0755", "yes", 'a"b\\c', "\t\n\x85\u2028\U0001f600", "", "- x: y"]
    objects = every_object(plan(entrypoint=odd))
    text = to_yaml(objects)
    assert text.count("---\n") == len(objects)
    assert list(yaml.safe_load_all(text)) == json.loads(json.dumps(objects))
