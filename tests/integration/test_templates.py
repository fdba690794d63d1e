"""`atrium new` (issue 18): three templates, one contract, each app's own test passing against a
real shell, and the contract check failing where an app breaks a promise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from atrium.authoring.scaffold import TEMPLATES
from atrium.cli.main import app
from atrium.testing import RunningShell, check_contract
from tests.conftest import REPO_DIR
from tests.integration.conftest import StartShell

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shell() -> Iterator[RunningShell]:
    with RunningShell() as running:
        yield running


def new(parent: Path, app_id: str, template: str) -> Path:
    answer = CliRunner().invoke(
        app, ["new", app_id, "-t", template, "--dir", str(parent), "--json"]
    )
    assert answer.exit_code == 0, answer.output
    created = json.loads(answer.output)
    assert created["path"] == str(parent / app_id)
    return Path(created["path"])


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_each_template_passes_its_own_tests_against_a_real_shell(
    tmp_path: Path, template: str
) -> None:
    """What the author runs first: `python -m pytest tests` in the new folder, as its own
    process (its own shell, the machine's best sandbox), with the app's behaviour checked too
    (provider, change notice, intent, data kept across a restart)."""
    folder = new(tmp_path, f"com.example.first-{template}", template)
    manifest = json.loads((folder / "app.manifest.json").read_text())
    assert manifest["name"] == f"First {template.title()}"
    assert manifest["entrypoint"] == list(TEMPLATES[template].entrypoint)
    assert manifest["dataProvider"]["authority"] == folder.name
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATRIUM_", "COV_", "PYTEST_"))}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout


def caller_app(system_apps: Path, app_id: str, permissions: list[str]) -> None:
    """An app that calls the shell (the test holds its token): only a manifest, it never runs."""
    (system_apps / app_id).mkdir()
    (system_apps / app_id / "entrypoint.sh").write_text("#!/bin/sh\n")
    manifest = {"id": app_id, "name": app_id, "version": "1.0.0", "permissions": permissions}
    (system_apps / app_id / "app.manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_the_add_item_intent_needs_the_write_permission(
    tmp_path: Path, template: str, start_shell: StartShell, system_apps: Path
) -> None:
    """The template promises that adding items needs `<id>.write`; its `ADD_ITEM` intent adds an
    item too, and an app's server may start intents itself: an app without the permission must
    not add items that way, one with it (and the user) may."""
    app_id = f"com.example.add-{template}"
    caller_app(system_apps, "test.caller.nobody", [])
    caller_app(system_apps, "test.caller.writer", [f"{app_id}.write"])
    running = start_shell()
    folder = new(tmp_path, app_id, template)
    intent = {
        "action": f"{app_id}.action.ADD_ITEM",
        "type": "text/plain",
        "extras": {"text": "from nobody"},
    }
    items = f"/api/data/{app_id}/items"
    with running.client(timeout=60) as user:
        body = {"ref": f"local:{folder}", "scope": "user", "autoApprove": True}
        assert user.post("/api/dist/install", json=body).json()["ok"] is True
        nobody = running.shell.app_tokens.issue(
            "test.caller.nobody", "test.caller.nobody-1", "default"
        )
        with running.client(token=nobody, timeout=60) as app_client:
            refused = app_client.post("/api/intents/start", json=intent)
            assert app_client.post(items, json={"text": "from nobody"}).status_code == 403
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["permission"]) == ("permission_denied", f"{app_id}.write")
        assert error["callerAppId"] == "test.caller.nobody"
        writer = running.shell.app_tokens.issue(
            "test.caller.writer", "test.caller.writer-1", "default"
        )
        with running.client(token=writer, timeout=60) as app_client:
            started = app_client.post(
                "/api/intents/start", json={**intent, "extras": {"text": "from the writer"}}
            )
            assert started.json()["status"] == "started", started.text
        started = user.post("/api/intents/start", json={**intent, "extras": {"text": "mine"}})
        assert started.json()["status"] == "started", started.text
        assert [i["text"] for i in user.get(items).json()] == ["from the writer", "mine"]


def break_app(folder: Path, old: str, new: str) -> None:
    server = folder / "server.py"
    text = server.read_text()
    assert old in text
    server.write_text(text.replace(old, new))


def test_an_app_that_answers_without_the_secret_fails_that_check(
    tmp_path: Path, shell: RunningShell
) -> None:
    folder = new(tmp_path, "com.example.open", "stdlib")
    break_app(
        folder,
        "if not SECRET or len(given) != 1 or not hmac.compare_digest(given[0].encode(), SECRET):",
        "if False:",
    )
    report = check_contract(folder, shell)
    assert not report.ok
    failed = [c for c in report.checks if not c.ok]
    assert [c.name for c in failed] == ["checks the secret"]
    assert "200" in failed[0].detail
    assert "FAIL checks the secret" in report.text()


def test_an_app_naming_another_identity_fails_to_start_and_the_log_is_in_the_report(
    tmp_path: Path, shell: RunningShell
) -> None:
    folder = new(tmp_path, "com.example.other", "stdlib")
    break_app(
        folder,
        '{"appId": APP_ID, "instanceId": INSTANCE_ID, "ok": True}',
        '{"appId": "com.example.someone", "instanceId": INSTANCE_ID, "ok": True}',
    )
    break_app(
        folder,
        "    server.serve_forever()",
        '    print("about to serve")\n    server.serve_forever()',
    )
    report = check_contract(folder, shell)
    assert not report.ok
    assert report.checks[-1].name == "starts"
    assert "identity" in report.checks[-1].detail
    assert "about to serve" in report.log


def test_a_hook_that_fails_and_an_invalid_folder_are_reported(
    tmp_path: Path, shell: RunningShell
) -> None:
    folder = new(tmp_path, "com.example.nopause", "python")
    break_app(
        folder,
        '@app.hook("onActivityCreate")',
        '@app.hook("onPause")\ndef no(body):\n    raise RuntimeError("no pause today")\n\n\n'
        '@app.hook("onActivityCreate")',
    )
    report = check_contract(folder, shell)
    failed = {c.name: c.detail for c in report.checks if not c.ok}
    assert "stop → stopped" in failed
    assert "hook_failed" in failed["stop → stopped"]
    assert 'the app said "onPause failed: RuntimeError: no pause today"' in failed["stop → stopped"]
    assert "no pause today" in report.log  # the traceback, from the app's log
    invalid = new(tmp_path, "com.example.invalid", "node")
    (invalid / "app.manifest.json").write_text('{"id": "com.example.invalid", "version": "x"}')
    report = check_contract(invalid, shell)
    assert [c.name for c in report.checks] == ["valid"]
    assert "semver" in report.checks[0].detail


def test_new_refuses_a_bad_id_template_or_an_existing_folder_and_writes_nothing(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    bad_id = runner.invoke(app, ["new", "Hello", "--dir", str(tmp_path)])
    assert bad_id.exit_code == 1
    assert "not an app id" in bad_id.output
    bad_template = runner.invoke(
        app, ["new", "com.example.x", "-t", "ruby", "--dir", str(tmp_path)]
    )
    assert bad_template.exit_code == 1
    assert "no template 'ruby': one of python, stdlib, node" in bad_template.output
    (tmp_path / "com.example.taken").mkdir()
    (tmp_path / "com.example.taken" / "mine.txt").write_text("keep me")
    taken = runner.invoke(app, ["new", "com.example.taken", "--dir", str(tmp_path)])
    assert taken.exit_code == 1
    assert "already exists" in taken.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["com.example.taken"]
    assert (tmp_path / "com.example.taken" / "mine.txt").read_text() == "keep me"


def test_the_sdk_reads_the_theme_and_types_a_json_object_body(
    tmp_path: Path, shell: RunningShell
) -> None:
    """`App.theme()` answers what the user's shell says; `Request.json_object()` answers 400
    naming what came instead of an object."""
    folder = new(tmp_path, "com.example.themed", "python")
    break_app(
        folder,
        "@app.provider(",
        '@app.route("GET", "/theme")\ndef theme(request: Request) -> object:\n'
        "    return app.theme()\n\n\n@app.provider(",
    )
    shell.install(folder)
    instance = shell.launch("com.example.themed")["instanceId"]
    assert shell.call("GET", f"/api/proxy/{instance}/theme") == shell.call("GET", "/api/os/theme")
    items = "/api/data/com.example.themed/items"
    for body, named in [(b"[1]", "not an array"), (b"", "not empty"), (b'"x"', "not a string")]:
        answer = shell.request("POST", items, content=body)
        assert answer.status_code == 400
        assert f"must be a JSON object, {named}" in answer.json()["error"]["message"]


def documented_errors() -> list[re.Pattern[str]]:
    """The first column of docs/authoring.md "The first errors you will meet", as patterns."""
    guide = (REPO_DIR / "docs" / "authoring.md").read_text()
    table = guide.split("## The first errors you will meet", 1)[1]
    patterns = []
    for row in table.splitlines():
        if row.startswith("| ") and "`" in row:
            quoted = row.split("`")[1]
            parts = [re.escape(p) for p in quoted.split("…")]
            patterns.append(re.compile(".*".join(parts), re.DOTALL))
    return patterns


def as_printed(answer: httpx.Response) -> str:
    error = answer.json()["error"]
    return f"{error['code']}: {error['message']}"


def test_the_first_errors_read_as_the_authors_guide_quotes_them(
    tmp_path: Path, shell: RunningShell
) -> None:
    patterns = documented_errors()
    assert len(patterns) >= 10

    def quoted(line: str) -> bool:
        return any(p.fullmatch(line) for p in patterns)

    seen = []
    identity = new(tmp_path, "com.example.errident", "stdlib")
    break_app(identity, '{"appId": APP_ID,', '{"appId": "com.example.someone",')
    exits = new(tmp_path, "com.example.errexit", "python")
    break_app(exits, "app = App()", 'app = App()\nraise SystemExit("no config file")')
    for folder in (identity, exits):
        shell.install(folder)
        seen.append(
            as_printed(shell.request("POST", "/api/instances", json={"appId": folder.name}))
        )
    hook = new(tmp_path, "com.example.errhook", "python")
    break_app(
        hook,
        '@app.hook("onActivityCreate")',
        '@app.hook("onPause")\ndef no(body):\n    raise RuntimeError("no pause today")\n\n\n'
        '@app.hook("onActivityCreate")',
    )
    shell.install(hook)
    instance = shell.launch(hook.name)["instanceId"]
    shell.act(instance, "resumed")
    seen.append(as_printed(shell.request("POST", f"/api/instances/{instance}/pause")))
    invalid = new(tmp_path, "com.example.errversion", "node")
    manifest = json.loads((invalid / "app.manifest.json").read_text())
    (invalid / "app.manifest.json").write_text(json.dumps({**manifest, "version": "zero"}))
    answer = shell.request(
        "POST", "/api/dist/install", json={"ref": f"local:{invalid}", "autoApprove": True}
    )
    assert answer.json()["error"]["code"] == "invalid_manifest"
    problem = answer.json()["error"]["problems"][0]
    assert (
        f"{problem['field']}: {problem['message']}" in (REPO_DIR / "docs/authoring.md").read_text()
    )
    for line in seen:
        assert quoted(line), f"not as docs/authoring.md quotes it: {line}"
