"""The CLI against a real running shell (Typer's CliRunner; the CLI talks HTTP like any client)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from atrium.cli.main import app
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell

pytestmark = pytest.mark.integration
#: an app id of 40 characters, whose start always fails (it exits before it listens)
LONG_ID_FAULT = "com.example.exits-early-with-a-long-name"
MARKUP_LINE = 'if __name__ == "__main__":\n    sys.stderr.write("[/bold] [red]not markup\\n")\n'


@pytest.fixture
def cli(shell: RunningShell, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("ATRIUM_URL", shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", shell.token)
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def test_apps_prints_a_table_with_a_scope_column(cli: CliRunner) -> None:
    result = cli.invoke(app, ["apps"])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "scope" in line)
    assert "id" in header
    row = next(line for line in result.output.splitlines() if "com.atrium.notes" in line)
    assert "system" in row
    assert "Notes" in row


def test_apps_json_is_the_api_answer(cli: CliRunner) -> None:
    result = cli.invoke(app, ["apps", "--json"])
    assert result.exit_code == 0
    assert [a["id"] for a in json.loads(result.output)] == [
        "com.atrium.console",
        "com.atrium.notes",
        "com.atrium.viewer",
    ]


def test_scopes_lists_counts_and_paths(cli: CliRunner, shell: RunningShell) -> None:
    result = cli.invoke(app, ["scopes", "--json"])
    assert result.exit_code == 0
    counts = {s["id"]: s["appCount"] for s in json.loads(result.output)}
    assert counts == {"system": 3, "global": 0, "user": 0}
    table = cli.invoke(app, ["scopes"])
    assert "global" in table.output
    assert str(shell.settings.home / "scopes/global/apps") in table.output


def test_scopes_set_remote(cli: CliRunner) -> None:
    result = cli.invoke(app, ["scopes", "set-remote", "user", "https://git.example/me/apps.git"])
    assert result.exit_code == 0
    assert "user scope remote set to https://git.example/me/apps.git" in result.output
    listed = json.loads(cli.invoke(app, ["scopes", "--json"]).output)
    assert listed[2]["remote"] == "https://git.example/me/apps.git"


def test_an_error_body_becomes_one_line_and_a_nonzero_exit(cli: CliRunner) -> None:
    result = cli.invoke(app, ["scopes", "set-remote", "system", "https://x.example/r.git"])
    assert result.exit_code == 1
    assert result.output.startswith("error: system_scope_immutable: the system scope is immutable")
    assert len(result.output.strip().splitlines()) == 1


def test_kv_set_get_rm(cli: CliRunner) -> None:
    assert cli.invoke(app, ["kv", "set", "os/colors", '{"a": [1, 2]}']).exit_code == 0
    assert json.loads(cli.invoke(app, ["kv", "get", "os/colors"]).output) == {"a": [1, 2]}
    assert cli.invoke(app, ["kv", "set", "app/com.example.x/name", "plain text"]).exit_code == 0
    assert json.loads(cli.invoke(app, ["kv", "get", "app/com.example.x/name"]).output) == (
        "plain text"
    )
    assert cli.invoke(app, ["kv", "set", "os/n", "42", "--string"]).exit_code == 0
    assert json.loads(cli.invoke(app, ["kv", "get", "os/n"]).output) == "42"
    envelope = json.loads(cli.invoke(app, ["kv", "get", "os/n", "--json"]).output)
    assert set(envelope) == {"value", "updatedAt"}
    assert cli.invoke(app, ["kv", "rm", "os/colors"]).exit_code == 0
    gone = cli.invoke(app, ["kv", "get", "os/colors"])
    assert gone.exit_code == 1
    assert "not_found" in gone.output


def test_kv_refuses_a_bad_address_and_a_bad_key(cli: CliRunner) -> None:
    assert "not a KV address" in cli.invoke(app, ["kv", "get", "theme"]).output
    bad_key = cli.invoke(app, ["kv", "set", "os/a:b", "1"])
    assert bad_key.exit_code == 1
    assert "bad_request" in bad_key.output


def test_events_follows_the_bus(cli: CliRunner, shell: RunningShell) -> None:
    def change_later() -> None:
        while shell.shell.bus.subscriber_count == 0:
            threading.Event().wait(0.01)
        with shell.client() as api:
            api.put("/api/kv/os/x", json={"value": 1})

    writer = threading.Thread(target=change_later)
    writer.start()
    result = cli.invoke(app, ["events", "--topics", "kv:*", "--limit", "1", "--json"])
    writer.join()
    assert result.exit_code == 0, result.output
    event = json.loads(result.output)
    assert event["type"] == "kv:changed"
    assert event["key"] == "x"


def test_an_unreachable_shell_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATRIUM_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ATRIUM_TOKEN", "x" * 20)
    result = CliRunner().invoke(app, ["apps"])
    assert result.exit_code == 2
    assert "cannot reach the shell" in result.output


def test_a_missing_token_is_a_clear_error(
    shell: RunningShell, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("ATRIUM_URL", shell.url)
    monkeypatch.setenv("ATRIUM_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["apps"])
    assert result.exit_code == 1
    assert result.output.startswith("error: unauthenticated:")


def test_launch_prints_a_view_url_and_ps_shows_the_instance(cli: CliRunner) -> None:
    launched = cli.invoke(app, ["launch", "com.atrium.notes"])
    assert launched.exit_code == 0, launched.output
    first, url = launched.output.strip().splitlines()[-2:]
    assert first.startswith("com.atrium.notes-1 resumed on port ")
    assert url.startswith("http://")
    assert ".localhost:" in url
    assert "/_os/enter?ticket=" in url
    listed = cli.invoke(app, ["ps"])
    row = next(line for line in listed.output.splitlines() if "com.atrium.notes-1" in line)
    assert "resumed" in row
    assert "system" in row
    assert cli.invoke(app, ["stop", "com.atrium.notes-1"]).output.strip() == (
        "com.atrium.notes-1 stopped"
    )
    assert cli.invoke(app, ["logs", "com.atrium.notes-1"]).exit_code == 0
    destroyed = cli.invoke(app, ["destroy", "com.atrium.notes-1"])
    assert destroyed.output.strip() == (
        "com.atrium.notes-1 stopped and destroyed; its runtime data is kept "
        "(`atrium launch com.atrium.notes` starts it again)"
    )
    gone = cli.invoke(app, ["stop", "com.atrium.notes-1"])
    assert gone.exit_code == 1
    assert gone.output.startswith("error: not_found:")


def test_launch_of_an_unknown_app_is_a_clear_error(cli: CliRunner) -> None:
    result = cli.invoke(app, ["launch", "com.example.none"])
    assert result.exit_code == 1
    assert result.output.startswith("error: not_found: no app 'com.example.none'")


def test_tools_add_list_rm(cli: CliRunner) -> None:
    added = cli.invoke(app, ["tools", "add", "git"])
    assert added.exit_code == 0, added.output
    listed = json.loads(cli.invoke(app, ["tools", "list", "--json"]).output)
    assert [t["name"] for t in listed] == ["git"]
    assert cli.invoke(app, ["tools", "add", "no-such-tool-x"]).exit_code == 1
    assert cli.invoke(app, ["tools", "rm", "git"]).exit_code == 0
    assert json.loads(cli.invoke(app, ["tools", "list", "--json"]).output) == []


def test_intent_resolve_and_start(cli: CliRunner) -> None:
    resolved = cli.invoke(
        app,
        [
            "intent",
            "resolve",
            "--action",
            "os.intent.action.VIEW",
            "--type",
            "text/plain",
            "--uri",
            "https://x.test/a",
        ],
    )
    assert resolved.exit_code == 0, resolved.output
    row = next(line for line in resolved.output.splitlines() if "com.atrium.viewer" in line)
    assert "│ 50 " in row  # its best filter: text/* (+50) beats the https-scheme one (+30)
    started = cli.invoke(
        app,
        [
            "intent",
            "start",
            "--action",
            "os.intent.action.VIEW",
            "--type",
            "text/plain",
            "--extra",
            "text=hello",
            "--json",
        ],
    )
    assert started.exit_code == 0, started.output
    answer = json.loads(started.output)
    assert (answer["status"], answer["appId"]) == ("started", "com.atrium.viewer")
    bad = cli.invoke(app, ["intent", "start", "--action", "x", "--extra", "novalue"])
    assert bad.exit_code == 1
    assert "key=value" in bad.output


def test_intent_remember_defaults_and_forget(cli: CliRunner) -> None:
    view = ["--action", "os.intent.action.VIEW", "--type", "text/plain"]
    assert "no default handlers" in cli.invoke(app, ["intent", "defaults"]).output
    no_target = cli.invoke(app, ["intent", "start", *view, "--remember"])
    assert no_target.exit_code == 1
    assert "--remember needs --target" in no_target.output
    chosen = cli.invoke(
        app, ["intent", "start", *view, "--target", "com.atrium.viewer", "--remember"]
    )
    assert chosen.exit_code == 0, chosen.output
    listed = cli.invoke(app, ["intent", "defaults", "--json"])
    assert [(d["action"], d["type"], d["appId"]) for d in json.loads(listed.output)] == [
        ("os.intent.action.VIEW", "text/plain", "com.atrium.viewer")
    ]
    resolved = cli.invoke(app, ["intent", "resolve", *view])
    assert "remember: true" in resolved.output
    forgot = cli.invoke(app, ["intent", "forget", *view])
    assert forgot.exit_code == 0, forgot.output
    assert "forgot com.atrium.viewer" in forgot.output
    again = cli.invoke(app, ["intent", "forget", *view])
    assert again.exit_code != 0
    assert "not_found" in again.output or "no intent default" in again.output.lower()


def test_ps_shows_a_woken_provider_with_its_wake(cli: CliRunner, shell: RunningShell) -> None:
    with shell.client() as api:
        assert api.get("/api/data/notes/notes").status_code == 200  # wakes Notes
    listed = cli.invoke(app, ["ps"])
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if "notes-provider" in line)
    assert "provider (wake #1)" in row
    assert "woke in" in row
    assert "1 req" in row


def test_narrow_terminals_fold_ids_instead_of_cutting_them(
    cli: CliRunner, shell: RunningShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    with shell.client() as api:
        api.post("/api/instances", json={"appId": "com.atrium.notes"}).raise_for_status()
    for command in (
        ["ps"],
        ["theme", "list"],
        ["intent", "resolve", "-a", "os.intent.action.VIEW", "-t", "text/plain"],
    ):
        shown = cli.invoke(app, command)
        assert shown.exit_code == 0, shown.output
        assert "…" not in shown.output, (command, shown.output)


def test_logs_json_and_an_empty_log_says_so(cli: CliRunner, shell: RunningShell) -> None:
    with shell.client() as api:
        instance = api.post("/api/instances", json={"appId": "com.atrium.notes"}).json()[
            "instanceId"
        ]
    log = shell.settings.home / "run" / "logs" / f"{instance}.log"
    log.write_text("")
    empty = cli.invoke(app, ["logs", instance])
    assert empty.exit_code == 0
    assert "is empty" in empty.output
    log.write_text("one\ntwo\n")
    as_json = json.loads(cli.invoke(app, ["logs", instance, "--json"]).output)
    assert as_json == {"instanceId": instance, "lines": ["one", "two"]}
    destroyed = cli.invoke(app, ["destroy", instance])
    assert "stopped and destroyed; its runtime data is kept" in destroyed.output


def test_ps_in_80_columns_keeps_ids_and_words_whole(
    start_shell: StartShell, system_apps: Path
) -> None:
    """`atrium ps` as its own process in an 80-column terminal, with a long id, a woken provider
    and an instance in error (a long message): no line is wider than the terminal, every id is
    whole on one line with its state, and every word of the columns shown is whole; a column
    that does not fit is named below the table, not squeezed into strips."""
    fault = system_apps / LONG_ID_FAULT
    shutil.copytree(TESTS_DIR / "apps" / "test.fault.exitsearly", fault)
    manifest = json.loads((fault / "app.manifest.json").read_text())
    (fault / "app.manifest.json").write_text(json.dumps({**manifest, "id": LONG_ID_FAULT}))
    # its last words reach the instance's error: text, never markup for the terminal
    server = (fault / "server.py").read_text()
    (fault / "server.py").write_text(server.replace('if __name__ == "__main__":\n', MARKUP_LINE, 1))
    shell = start_shell()
    with shell.client() as api:
        assert api.get("/api/data/notes/notes").status_code == 200  # wakes Notes as a provider
        for app_id in ("com.atrium.viewer", "com.atrium.console", LONG_ID_FAULT):
            api.post("/api/instances", json={"appId": app_id})
        instances = api.get("/api/instances").json()
    assert any(i["error"] for i in instances), instances
    env = {**os.environ, "ATRIUM_URL": shell.url, "ATRIUM_TOKEN": shell.token, "COLUMNS": "80"}
    shown = subprocess.run(
        [sys.executable, "-m", "atrium", "ps"], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80, shown.stdout
    header = next(line for line in lines if "instance" in line)
    not_shown = " ".join(line for line in lines if "not shown" in line)
    for name in ("instance", "state", "port", "scope", "uptime", "views", "role", "theme", "error"):
        below = [line for line in lines if re.match(rf"\S+ {name}: ", line)]  # an error, whole
        assert re.search(rf"\b{name}\b", header + " " + not_shown) or below, (name, shown.stdout)
    words = set(re.findall(r"[^\s│┃]+", shown.stdout))  # split at spaces and rules
    for instance in instances:
        row = next((line for line in lines if instance["instanceId"] in line), None)
        assert row is not None, (instance["instanceId"], shown.stdout)
        assert re.search(rf"\b{instance['state']}\b", row), (instance["state"], row)
        for word in (instance["error"] or "").split():  # in the table or under it: whole
            assert word in words or len(word) > 26, (word, shown.stdout)
    assert "[/bold] [red]not markup" in shown.stdout
