"""The example catalogue (issue 18): `atrium publish-examples` publishes three apps (one per
template) through a running shell to a real registry and a `git daemon`, and writes the index;
a fresh shell pointed at that index lists them and installs them by id, from either source."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from atrium.authoring.catalogue import EXAMPLES
from atrium.cli.main import app
from tests.integration.conftest import StartShell
from tests.integration.distribution.conftest import GitDaemon
from tests.integration.registry import Registry, running_registry

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path / "registry") as started:
        yield started


def test_the_examples_are_published_listed_and_installed_by_id(
    start_shell: StartShell,
    registry: Registry,
    git_daemon: GitDaemon,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    publisher = start_shell()
    monkeypatch.setenv("ATRIUM_URL", publisher.url)
    monkeypatch.setenv("ATRIUM_TOKEN", publisher.token)
    index_file = tmp_path / "index.json"
    published = CliRunner().invoke(
        app,
        [
            "publish-examples",
            "-o",
            str(index_file),
            "--oci",
            f"{registry.host}/examples",
            "--git-dir",
            str(git_daemon.base),
            "--git-url",
            f"git://127.0.0.1:{git_daemon.port}",
        ],
    )
    assert published.exit_code == 0, published.output
    index = json.loads(index_file.read_text())
    assert [a["id"] for a in index["apps"]] == [e.id for e in EXAMPLES]
    hello = index["apps"][0]
    assert hello["sources"]["oci"]["ref"] == f"{registry.host}/examples/com.example.hello"
    assert hello["channels"]["stable"] == {"oci-tag": "0.1.0", "git-tag": "v0.1.0"}
    # the store's fields: publisher, categories, and the size of the artifact an install fetches
    manifest = httpx.get(
        f"http://{registry.host}/v2/examples/com.example.hello/manifests/0.1.0",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    ).json()
    assert hello["size"] == sum(layer["size"] for layer in manifest["layers"])
    assert hello["publisher"] == {"name": "Atrium examples"}
    assert hello["categories"] == list(EXAMPLES[0].categories)
    assert "screenshots" not in hello  # the examples have none
    publisher.stop()

    # a fresh shell, as on another machine, with only the index's address
    shell = start_shell(index_url=f"file://{index_file}")
    monkeypatch.setenv("ATRIUM_URL", shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", shell.token)
    with shell.client(timeout=60) as api:
        listed = api.get("/api/dist/index").json()
        assert [a["id"] for a in listed["index"]["apps"]] == [e.id for e in EXAMPLES]
        assert listed["problems"] == []
        assert listed["index"]["apps"][0]["size"] == hello["size"]
        installed = CliRunner().invoke(app, ["install", "com.example.hello", "--yes"])
        assert installed.exit_code == 0, installed.output
        record = api.get("/api/apps/com.example.hello").json()["record"]
        assert (record["source"], record["channel"], record["version"]) == (
            "oci",
            "stable",
            "0.1.0",
        )
        # the git source of another example, as the index names it
        git_ref = index["apps"][2]["sources"]["git"]["ref"] + "#v0.1.0"
        answer = api.post(
            "/api/dist/install", json={"ref": git_ref, "scope": "user", "autoApprove": True}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["record"]["source"] == "git"
        for app_id in ("com.example.hello", "com.example.nodelist"):
            started = api.post("/api/instances", json={"appId": app_id})
            assert started.status_code == 200, started.text
            items = api.post(f"/api/data/{app_id}/items", json={"text": "from the catalogue"})
            assert items.status_code == 201, items.text


def test_publish_examples_needs_a_target(tmp_path: Path) -> None:
    answer = CliRunner().invoke(
        app,
        ["publish-examples", "-o", str(tmp_path / "i.json")],
        env={"ATRIUM_URL": "http://127.0.0.1:9"},
    )
    assert answer.exit_code == 1
    assert "--oci" in answer.output
    assert not (tmp_path / "i.json").exists()


def test_a_file_git_url_gives_refs_the_shell_accepts(
    start_shell: StartShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--git-url file:///…` (repositories on this machine): the index names them as the shell
    reads git refs (`git+file://`), so its entries are listed and install."""
    shell = start_shell()
    monkeypatch.setenv("ATRIUM_URL", shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", shell.token)
    repos = tmp_path / "repos"
    index_file = tmp_path / "index.json"
    args = ["publish-examples", "-o", str(index_file), "--git-dir", str(repos)]
    published = CliRunner().invoke(app, [*args, "--git-url", repos.as_uri()])
    assert published.exit_code == 0, published.output
    index = json.loads(index_file.read_text())
    refs = [a["sources"]["git"]["ref"] for a in index["apps"]]
    assert all(r.startswith("git+file:///") for r in refs), refs
    with shell.client(timeout=60) as api:
        answer = api.post(
            "/api/dist/install",
            json={"ref": refs[1] + "#v0.1.0", "scope": "user", "autoApprove": True},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["record"]["source"] == "git"
