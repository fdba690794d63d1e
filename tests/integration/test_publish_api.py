"""`POST /api/dist/publish` and `atrium publish` against a real running shell."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from atrium.api import publish as publish_api
from atrium.cli.publish import publish as publish_command
from atrium.events import DIST_PUBLISH_COMPLETE
from tests.integration.conftest import RunningShell, SseReader, wait_for
from tests.integration.registry import free_port
from tests.integration.tars import app_dir

pytestmark = pytest.mark.integration

APP_ID = "com.example.hello"
SSE = {"Accept": "text/event-stream"}


@pytest.fixture
def publishing(shell: RunningShell) -> RunningShell:
    """The shell with the publish route (registered here until create_app lists it)."""
    router = shell.server.app.starlette.router
    if not any(getattr(route, "path", None) == "/api/dist/publish" for route in router.routes):
        router.routes.extend(publish_api.routes)
    return shell


@pytest.fixture
def api(publishing: RunningShell) -> Iterator[httpx.Client]:
    with publishing.client(timeout=60.0) as client:
        yield client


@pytest.fixture
def app(tmp_path: Path) -> Path:
    return app_dir(tmp_path / "src", APP_ID)


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    path = tmp_path / "remotes" / f"{APP_ID}.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(path)], check=True, timeout=60)
    return path


def read_sse(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    name, data = "", ""
    for line in response.iter_lines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()
        elif not line and data:
            events.append((name, json.loads(data)))
            name, data = "", ""
    return events


def git_tags(bare: Path) -> list[str]:
    out = subprocess.run(
        ["git", "--git-dir", str(bare), "tag"], check=True, capture_output=True, timeout=60
    )
    return out.stdout.decode().split()


def test_publish_answers_one_json_document(api: httpx.Client, app: Path, bare: Path) -> None:
    response = api.post("/api/dist/publish", json={"path": str(app), "to": str(bare), "tag": "v1"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ok"] is True
    assert body["ref"] == f"git+{bare.as_uri()}#v1"
    assert body["installCommand"] == f"atrium install git+{bare.as_uri()}#v1"
    assert body["events"][-1]["type"] == "publish.done"
    assert {e["type"] for e in body["events"][:-1]} == {"publish.progress"}
    assert git_tags(bare) == ["v1"]


def test_publish_streams_progress_then_done(api: httpx.Client, app: Path, bare: Path) -> None:
    body = {"path": str(app), "to": f"git+{bare.as_uri()}", "tag": "v2"}
    with api.stream("POST", "/api/dist/publish", json=body, headers=SSE) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = read_sse(response)
    assert [name for name, _ in events][-1] == "publish.done"
    assert all(name == data["type"] for name, data in events)
    assert events[-1][1]["installCommand"] == f"atrium install git+{bare.as_uri()}#v2"


def test_a_failure_after_the_stream_began_is_an_error_event(api: httpx.Client, app: Path) -> None:
    body = {"path": str(app), "to": f"oci://127.0.0.1:{free_port()}/{APP_ID}", "tag": "1.0.0"}
    with api.stream("POST", "/api/dist/publish", json=body, headers=SSE) as response:
        events = read_sse(response)
    name, data = events[-1]
    assert name == "error"
    assert data["code"] == "upstream_failed"
    assert "cannot reach the registry" in data["message"]


def test_an_invalid_manifest_is_422_even_when_streaming(
    api: httpx.Client, app: Path, bare: Path, tmp_path: Path
) -> None:
    renamed = app.rename(tmp_path / "src" / "com.example.renamed")
    body = {"path": str(renamed), "to": str(bare), "tag": "v1"}
    response = api.post("/api/dist/publish", json=body, headers=SSE)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_manifest"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"path": "relative/dir", "to": "/srv/x.git", "tag": "v1"}, "bad_request"),
        ({"to": "/srv/x.git", "tag": "v1"}, "bad_request"),
        ({"path": "/", "to": "/srv/x.git", "tag": "not a tag"}, "bad_request"),
        ({"path": "/", "to": "ftp://host/x", "tag": "v1"}, "bad_ref"),
    ],
)
def test_bad_requests_are_refused_before_anything_moves(
    api: httpx.Client, app: Path, body: dict[str, str], code: str
) -> None:
    if body.get("path") == "/":
        body = {**body, "path": str(app)}
    response = api.post("/api/dist/publish", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code


def test_publish_needs_the_user(publishing: RunningShell, app: Path, bare: Path) -> None:
    with publishing.anonymous() as anonymous:
        response = anonymous.post(
            "/api/dist/publish", json={"path": str(app), "to": str(bare), "tag": "v1"}
        )
    assert response.status_code == 401
    assert git_tags(bare) == []


def test_publish_announces_itself_on_the_bus(api: httpx.Client, app: Path, bare: Path) -> None:
    reader = SseReader(api, {"topics": "dist:publish.*"})
    api.post("/api/dist/publish", json={"path": str(app), "to": str(bare), "tag": "v1"})
    complete = wait_for(lambda: reader.of(DIST_PUBLISH_COMPLETE), "dist:publish.complete")
    assert complete[0].data["id"] == APP_ID
    assert complete[0].data["ref"] == f"git+{bare.as_uri()}#v1"


def test_the_cli_prints_progress_and_the_install_command(
    publishing: RunningShell,
    app: Path,
    bare: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ATRIUM_URL", publishing.url)
    monkeypatch.setenv("ATRIUM_TOKEN", publishing.token)
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.chdir(bare.parent)
    cli = typer.Typer()
    cli.command()(publish_command)
    result = CliRunner().invoke(cli, [str(app), "--to", f"./{bare.name}", "--tag", "v3"])
    assert result.exit_code == 0, result.output
    assert "pushing" in result.output
    assert f"atrium install git+{bare.as_uri()}#v3" in result.output.splitlines()[-1]


def test_the_cli_prints_the_json_answer_with_json(
    publishing: RunningShell, app: Path, bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATRIUM_URL", publishing.url)
    monkeypatch.setenv("ATRIUM_TOKEN", publishing.token)
    cli = typer.Typer()
    cli.command()(publish_command)
    result = CliRunner().invoke(cli, [str(app), "--to", str(bare), "--tag", "v1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["installCommand"] == f"atrium install git+{bare.as_uri()}#v1"


def test_the_cli_reports_a_failure_on_one_line(
    publishing: RunningShell, app: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATRIUM_URL", publishing.url)
    monkeypatch.setenv("ATRIUM_TOKEN", publishing.token)
    cli = typer.Typer()
    cli.command()(publish_command)
    target = f"127.0.0.1:{free_port()}/{APP_ID}"
    result = CliRunner().invoke(cli, [str(app), "--to", target, "--tag", "1.0.0"])
    assert result.exit_code == 1
    assert "upstream_failed" in result.output
