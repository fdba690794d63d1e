"""The distribution commands of the CLI against a real running shell."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atrium.cli.main import app
from tests.conftest import REPO_DIR
from tests.integration.conftest import RunningShell, StartShell
from tests.integration.distribution.conftest import MakeApp, write_manifest

pytestmark = pytest.mark.integration


@pytest.fixture
def cli(dist_shell: RunningShell, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("ATRIUM_URL", dist_shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", dist_shell.token)
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def test_install_a_relative_local_path_then_list_and_uninstall(
    cli: CliRunner, make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_app("com.example.clitool")
    monkeypatch.chdir(source.parent)
    result = cli.invoke(app, ["install", "local:./com.example.clitool", "--scope", "user"])
    assert result.exit_code == 0, result.output
    assert "Installed com.example.clitool 1.0.0 into the user scope" in result.output

    listed = cli.invoke(app, ["installed"])
    assert listed.exit_code == 0, listed.output
    header = next(line for line in listed.output.splitlines() if "scope" in line)
    assert "version" in header
    row = next(line for line in listed.output.splitlines() if "com.example.clitool" in line)
    assert "user" in row
    assert "local" in row
    records = json.loads(cli.invoke(app, ["installed", "--json"]).output)
    assert records[0]["ref"] == f"local:{source}"

    assert (
        "com.example.clitool is up to date"
        in cli.invoke(app, ["update", "com.example.clitool"]).output
    )

    removed = cli.invoke(app, ["uninstall", "com.example.clitool"])
    assert removed.exit_code == 0, removed.output
    assert "Uninstalled com.example.clitool from the user scope" in removed.output
    assert json.loads(cli.invoke(app, ["installed", "--json"]).output) == []


def test_install_asks_before_granting_permissions(cli: CliRunner, make_app: MakeApp) -> None:
    source = make_app("com.example.asker", permissions=["com.atrium.notes.read"])
    refused = cli.invoke(app, ["install", f"local:{source}"], input="n\n")
    assert refused.exit_code == 1
    assert "permission" in refused.output
    assert "com.atrium.notes.read" in refused.output
    assert "Not installed" in refused.output
    assert json.loads(cli.invoke(app, ["installed", "--json"]).output) == []

    granted = cli.invoke(app, ["install", f"local:{source}"], input="y\n")
    assert granted.exit_code == 0, granted.output
    assert "com.atrium.notes.read" in granted.output
    assert "Installed com.example.asker 1.0.0 into the global scope" in granted.output


def test_yes_installs_and_updates_without_asking(cli: CliRunner, make_app: MakeApp) -> None:
    source = make_app("com.example.yes", permissions=["com.atrium.notes.read"])
    assert cli.invoke(app, ["install", f"local:{source}", "--yes"]).exit_code == 0
    write_manifest(source, version="1.2.0", permissions=["com.atrium.notes.write"])
    updated = cli.invoke(app, ["update", "com.example.yes", "--yes"])
    assert updated.exit_code == 0, updated.output
    assert "Updated com.example.yes to 1.2.0 in the global scope" in updated.output


def test_preview_shows_the_diff(cli: CliRunner, make_app: MakeApp) -> None:
    source = make_app("com.example.peek", tools=["jq"])
    result = cli.invoke(app, ["preview", f"local:{source}"])
    assert result.exit_code == 0, result.output
    assert "+ tool" in result.output
    assert "jq" in result.output
    assert "needs your approval" in result.output


def test_errors_are_one_line_with_a_nonzero_exit(cli: CliRunner, tmp_path: Path) -> None:
    result = cli.invoke(app, ["install", "ftp://nowhere.example/x"])
    assert result.exit_code == 1
    assert result.output.startswith("error: bad_ref: 'ftp://nowhere.example/x' is not a ref")
    missing = cli.invoke(app, ["install", f"local:{tmp_path / 'com.example.none'}"])
    assert missing.exit_code == 1
    assert "fetch_failed" in missing.output


def test_index_without_a_url_says_how_to_set_one(cli: CliRunner) -> None:
    result = cli.invoke(app, ["index"])
    assert result.exit_code == 0
    assert "ATRIUM_INDEX_URL" in result.output


def test_index_lists_entries_and_refreshes(
    start_shell: StartShell, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    index = tmp_path / "index.json"
    entry = {
        "id": "com.example.listed",
        "name": "Listed",
        "publisher": "Example",
        "sources": {"git": {"ref": f"git+file://{tmp_path}/com.example.listed.git"}},
        "channels": {"stable": {"git-tag": "v1"}, "beta": {"git-tag": "v2"}},
    }
    index.write_text(json.dumps({"schema": 1, "apps": [entry]}))
    shell = start_shell(index_url=f"file://{index}")
    monkeypatch.setenv("ATRIUM_URL", shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", shell.token)
    monkeypatch.setenv("COLUMNS", "200")
    cli = CliRunner()
    result = cli.invoke(app, ["index"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "com.example.listed" in line)
    assert "beta, stable" in row
    assert "git" in row
    assert "│ Example " in row  # the publisher's name, as the index now serves {name, url?}
    index.write_text(json.dumps({"schema": 1, "apps": [entry, {"id": "bad"}]}))
    refreshed = cli.invoke(app, ["index", "--refresh"])
    assert "skipped entry 1 (bad)" in refreshed.output


def test_history_and_rollback(cli: CliRunner, make_app: MakeApp) -> None:
    source = make_app("com.example.back")
    assert cli.invoke(app, ["install", f"local:{source}", "--yes"]).exit_code == 0
    write_manifest(source, version="2.0.0")
    assert cli.invoke(app, ["update", "com.example.back", "--yes"]).exit_code == 0
    rolled = cli.invoke(app, ["rollback", "com.example.back"])
    assert rolled.exit_code == 0, rolled.output
    assert "Rolled com.example.back back to 1.0.0 (from 2.0.0)" in rolled.output
    listed = cli.invoke(app, ["history", "com.example.back"])
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if "│ rollback" in line)
    assert "1.0.0" in row
    assert "from 2.0.0" in row
    as_json = json.loads(cli.invoke(app, ["history", "com.example.back", "--json"]).output)
    assert [e["operation"] for e in as_json["entries"]] == ["rollback", "update", "install"]
    none_left = cli.invoke(app, ["rollback", "com.example.back", "--to", "7.7.7"])
    assert none_left.exit_code != 0
    assert "7.7.7" in none_left.output


def test_export_and_import_through_the_cli(
    cli: CliRunner, make_app: MakeApp, tmp_path: Path, dist_shell: RunningShell
) -> None:
    source = make_app("com.example.boxed")
    assert cli.invoke(app, ["install", f"local:{source}", "--yes"]).exit_code == 0
    archive = tmp_path / "boxed.tar.zst"
    exported = cli.invoke(app, ["export", "com.example.boxed", "-o", str(archive)])
    assert exported.exit_code == 0, exported.output
    assert archive.stat().st_size > 0
    assert not list(tmp_path.glob(".*.partial"))
    # into the user scope of the same shell: a second copy, masking the global one
    imported = cli.invoke(app, ["import", str(archive), "--scope", "user", "--yes"])
    assert imported.exit_code == 0, imported.output
    assert "Imported com.example.boxed 1.0.0 into the user scope" in imported.output
    broken = tmp_path / "broken.tar.zst"
    broken.write_bytes(archive.read_bytes()[:100])
    refused = cli.invoke(app, ["import", str(broken), "--yes"])
    assert refused.exit_code != 0
    assert "nothing was changed" in refused.output


def test_installing_a_second_copy_says_where_the_data_stays(
    cli: CliRunner, dist_shell: RunningShell, tmp_path: Path
) -> None:
    with dist_shell.client() as api:
        assert api.post("/api/data/notes/notes", json={"text": "mine"}).status_code == 201
    source = tmp_path / "com.atrium.notes"
    shutil.copytree(REPO_DIR / "apps" / "com.atrium.notes", source)
    installed = cli.invoke(app, ["install", f"local:{source}", "--scope", "user", "--yes"])
    assert installed.exit_code == 0, installed.output
    assert "Note: com.atrium.notes also exists in the system scope with data" in installed.output
    assert "stays with that copy" in installed.output
