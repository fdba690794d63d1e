"""The manifest's ``runtime`` (an existing OCI image as the app): good ones and every bad one,
each problem naming its field."""

from __future__ import annotations

from typing import Any, Final

import pytest

from atrium.errors import ManifestInvalid
from atrium.manifest import parse_manifest

DIR: Final = "com.example.web"
DIGEST: Final = "sha256:" + "ab" * 32
GOOD: Final[dict[str, Any]] = {
    "image": "registry.example.com:5000/apps/web@" + DIGEST,
    "port": 80,
    "health": {"path": "/healthz"},
    "data": ["/data", "/var/lib/web"],
    "env": {"GREETING": "hi", "_X1": ""},
    "command": ["/bin/busybox", "httpd", "-f"],
}


def manifest(**runtime: Any) -> dict[str, Any]:
    return {"id": DIR, "version": "1.0.0", "name": "Web", "runtime": {**GOOD, **runtime}}


def problems(data: dict[str, Any]) -> list[dict[str, str]]:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest(data, DIR)
    found: list[dict[str, str]] = caught.value.problems
    return found


def test_a_full_runtime_parses_and_is_pinned() -> None:
    runtime = parse_manifest(manifest(), DIR).runtime
    assert runtime is not None
    assert runtime.pinned
    assert runtime.digest == DIGEST
    assert runtime.parts() == ("registry.example.com:5000", "apps/web", None, DIGEST)
    assert runtime.data == ["/data", "/var/lib/web"]
    assert runtime.command == ["/bin/busybox", "httpd", "-f"]


def test_a_tag_is_accepted_and_pinning_replaces_it_with_the_digest() -> None:
    runtime = parse_manifest(manifest(image="127.0.0.1:5055/apps/web:1.2"), DIR).runtime
    assert runtime is not None
    assert not runtime.pinned
    pinned = runtime.pin(DIGEST)
    assert pinned.image == "127.0.0.1:5055/apps/web@" + DIGEST
    assert pinned.pinned


def test_an_image_the_app_carries_is_a_layout_folder_pinned_in_place() -> None:
    runtime = parse_manifest(manifest(image="oci:images/web"), DIR).runtime
    assert runtime is not None
    assert runtime.layout == "images/web"
    assert not runtime.pinned
    pinned = runtime.pin(DIGEST)
    assert pinned.image == "oci:images/web@" + DIGEST
    assert (pinned.layout, pinned.digest) == ("images/web", DIGEST)
    registry = parse_manifest(manifest(), DIR).runtime
    assert registry is not None
    assert registry.layout is None


def test_minimal_runtime_defaults() -> None:
    data: dict[str, Any] = {"id": DIR, "version": "1.0.0", "name": "Web"}
    data["runtime"] = {"image": "localhost:5000/web:1", "port": 8080, "health": {"path": "/"}}
    runtime = parse_manifest(data, DIR).runtime
    assert runtime is not None
    assert (runtime.data, runtime.env, runtime.command) == ([], {}, None)
    assert parse_manifest({"id": DIR, "version": "1.0.0", "name": "Web"}, DIR).runtime is None


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"image": "web"}, "runtime.image", "not an OCI image reference"),
        ({"image": "registry.example.com/web"}, "runtime.image", "no tag and no digest"),
        ({"image": "registry.example.com/Web:1"}, "runtime.image", "not an OCI image"),
        ({"image": "r.example.com/web@sha256:abc"}, "runtime.image", "not an OCI image"),
        ({"image": "r.example.com/web@md5:" + "a" * 32}, "runtime.image", "not an OCI image"),
        ({"image": 5}, "runtime.image", "string"),
        ({"image": "oci:../web"}, "runtime.image", "no '..'"),
        ({"image": "oci:/srv/web"}, "runtime.image", "no leading '/'"),
        ({"image": "oci:web/./x"}, "runtime.image", "not an image layout in the app"),
        ({"image": "oci:web:1"}, "runtime.image", "no ':tag'"),
        ({"image": "oci:web@sha256:abc"}, "runtime.image", "not an image layout"),
        ({"image": "oci:"}, "runtime.image", "not an image layout"),
        ({"port": 0}, "runtime.port", "greater than or equal to 1"),
        ({"port": 65536}, "runtime.port", "less than or equal to 65535"),
        ({"port": "80"}, "runtime.port", "integer"),
        ({"health": {"path": "healthz"}}, "runtime.health.path", "starting with '/'"),
        ({"health": {"path": "/a b"}}, "runtime.health.path", "starting with '/'"),
        ({"health": {}}, "runtime.health.path", "Field required"),
        ({"data": ["data"]}, "runtime.data[0]", "absolute, normalised"),
        ({"data": ["/data/../etc"]}, "runtime.data[0]", "absolute, normalised"),
        ({"data": ["/data/"]}, "runtime.data[0]", "absolute, normalised"),
        ({"data": ["//data"]}, "runtime.data[0]", "absolute, normalised"),
        ({"data": ["/data/./x"]}, "runtime.data[0]", "absolute, normalised"),
        ({"data": ["/"]}, "runtime.data[0]", "'/' cannot be a data folder"),
        ({"data": ["/proc/self"]}, "runtime.data[0]", "which the sandbox owns"),
        ({"data": ["/sys"]}, "runtime.data[0]", "which the sandbox owns"),
        ({"data": ["/dev/pts"]}, "runtime.data[0]", "which the sandbox owns"),
        ({"data": ["/data", "/data/sub"]}, "runtime.data", "overlap"),
        ({"data": ["/data", "/data"]}, "runtime.data", "overlap"),
        ({"env": {"1A": "x"}}, "runtime.env", "not an environment variable name"),
        ({"env": {"A-B": "x"}}, "runtime.env", "not an environment variable name"),
        ({"env": {"A=B": "x"}}, "runtime.env", "not an environment variable name"),
        ({"env": {"A": "x\x00y"}}, "runtime.env", "NUL"),
        ({"env": {"A": 1}}, "runtime.env.A", "string"),
        ({"command": []}, "runtime.command", "non-empty argv"),
        ({"command": ["/bin/sh", ""]}, "runtime.command", "non-empty argv"),
        ({"command": "/bin/sh -c x"}, "runtime.command", "list"),
        ({"comand": ["/bin/sh"]}, "runtime.comand", "Extra inputs are not permitted"),
    ],
)
def test_bad_runtime_names_the_field(change: dict[str, Any], field: str, words: str) -> None:
    found = problems(manifest(**change))
    assert [p["field"] for p in found] == [field], found
    assert words in found[0]["message"], found


def test_missing_required_fields_are_each_named() -> None:
    data = {"id": DIR, "version": "1.0.0", "name": "Web", "runtime": {}}
    # runtime.port is not required: the image's ExposedPorts may name it
    assert sorted(p["field"] for p in problems(data)) == ["runtime.health", "runtime.image"]


def test_an_image_app_is_themed_only_when_its_manifest_says_so() -> None:
    assert not parse_manifest(manifest(), DIR).injects_theme
    themed = parse_manifest({**manifest(), "themeStrategy": "inherit"}, DIR)
    assert themed.injects_theme
    contract = {"id": DIR, "version": "1.0.0", "name": "Web"}
    assert parse_manifest(contract, DIR).injects_theme  # a contract app: as before
