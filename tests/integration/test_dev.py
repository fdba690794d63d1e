"""`atrium dev` (issue 18): an author's folder as a dev copy in the user scope, reloaded on every
save, problems shown, the log followed, nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import typer

from atrium.authoring.scaffold import create
from atrium.cli.client import ShellClient
from atrium.cli.dev import DevSession
from tests.integration.conftest import RunningShell, SseReader, wait_for

pytestmark = pytest.mark.integration
APP = "com.example.devloop"


def page_of(api: httpx.Client, instance_id: str) -> str:
    return api.get(f"/api/proxy/{instance_id}/").text


def test_a_dev_copy_reloads_keeps_the_last_good_version_and_leaves_nothing(
    shell: RunningShell,
    api: httpx.Client,
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = create(tmp_path, APP, "python")
    with ShellClient(shell.url, shell.token) as client:
        session = DevSession(client, folder)
        assert session.sync()
        listed = api.get(f"/api/apps/{APP}").json()
        assert (listed["scope"], listed["record"]["dev"]) == ("user", True)
        instance = session.instance_id
        assert instance == f"{APP}-1"
        assert "<h1>Devloop</h1>" in page_of(api, instance)
        added = api.post(f"/api/data/{APP}/items", json={"text": "kept across reloads"})
        assert added.status_code == 201

        # a save: the same instance serves the new files, with its data
        index = folder / "index.html"
        index.write_text(index.read_text().replace("<h1>Devloop</h1>", "<h1>Devloop 2</h1>"))
        server = folder / "server.py"
        server.write_text(server.read_text().replace("app = App()", 'app = App()\nprint("v2 up")'))
        assert session.sync()
        assert session.instance_id == instance
        assert "<h1>Devloop 2</h1>" in page_of(api, instance)
        assert [i["text"] for i in api.get(f"/api/data/{APP}/items").json()] == [
            "kept across reloads"
        ]
        session.follow_log()
        assert f"{instance} | v2 up" in capsys.readouterr().out

        # a broken save: listed, not installed; the last good version keeps answering
        manifest = folder / "app.manifest.json"
        good = manifest.read_text()
        manifest.write_text(good.replace('"version": "0.1.0"', '"version": "zero"'))
        assert not session.sync()
        out = capsys.readouterr().out
        assert "not reloaded" in out
        assert "version: 'zero' is not a semver" in out
        assert "<h1>Devloop 2</h1>" in page_of(api, instance)

        # a save that does not start: said so, with the log; the next good save recovers
        manifest.write_text(good)
        server.write_text(server.read_text().replace('print("v2 up")', "raise SystemExit(3)"))
        assert not session.sync()
        assert "did not start" in capsys.readouterr().out
        server.write_text(server.read_text().replace("raise SystemExit(3)", 'print("v3 up")'))
        assert session.sync()
        assert "<h1>Devloop 2</h1>" in page_of(api, session.instance_id or "")

        backups = home / "backups/user" / APP
        made = api.post(f"/api/dist/backups/{APP}", json={"scope": "user"})
        assert made.status_code == 200, made.text
        assert backups.is_dir()
        assert (home / "scopes/users/default/apps" / APP).is_dir()
        session.remove()
    assert api.get(f"/api/apps/{APP}").status_code == 404
    assert not (home / "scopes/users/default/apps" / APP).exists()
    assert not backups.exists()


def test_a_dev_copy_never_replaces_an_installed_app(
    shell: RunningShell, api: httpx.Client, home: Path, tmp_path: Path
) -> None:
    folder = create(tmp_path, APP, "stdlib")
    installed = api.post(
        "/api/dist/install", json={"ref": f"local:{folder}", "scope": "user", "autoApprove": True}
    )
    assert installed.status_code == 200, installed.text
    before = (home / "scopes/users/default/apps" / APP / "server.py").read_bytes()
    (folder / "server.py").write_text(
        "# the author's new work\n" + (folder / "server.py").read_text()
    )
    with ShellClient(shell.url, shell.token) as client:
        session = DevSession(client, folder)
        with pytest.raises(typer.Exit):
            session.sync()
        session.remove()  # nothing of its own to remove: the install stays
    assert (home / "scopes/users/default/apps" / APP / "server.py").read_bytes() == before
    assert "dev" not in api.get(f"/api/apps/{APP}").json()["record"]
    refused = api.post(
        "/api/dist/install",
        json={"ref": f"local:{folder}", "scope": "global", "autoApprove": True, "dev": True},
    )
    assert refused.status_code == 400
    assert "user scope only" in refused.json()["error"]["message"]


def start_dev(
    shell: RunningShell, folder: Path, preexec_fn: Callable[[], object] | None = None
) -> subprocess.Popen[str]:
    """`atrium dev <folder>` against ``shell`` as a real process, its output one text pipe."""
    env = {**os.environ, "ATRIUM_URL": shell.url, "ATRIUM_TOKEN": shell.token, "COLUMNS": "200"}
    return subprocess.Popen(
        [sys.executable, "-m", "atrium", "dev", str(folder)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=preexec_fn,
    )


def test_atrium_dev_reloads_on_save_and_ctrl_c_removes_the_copy(
    shell: RunningShell, api: httpx.Client, tmp_path: Path
) -> None:
    """The command itself: watchfiles sees the save, and SIGINT ends it cleanly."""
    folder = create(tmp_path, APP, "node")
    proc = start_dev(shell, folder)
    assert proc.stdout is not None
    lines: list[str] = []

    def printed(words: str, times: int = 1) -> bool:
        while "".join(lines).count(words) < times:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                return False
            lines.append(line)
        return True

    try:
        assert printed("Watching"), "".join(lines)
        page = folder / "index.html"
        time.sleep(0.2)  # the watcher has started once it printed; let it settle
        # what `.atriumignore` and the defaults leave out is no reason to reload
        (folder / ".atriumignore").write_text("scratch/\n")
        assert printed("reloaded"), "".join(lines)
        for name in (".pytest_cache/v/x", "node_modules/a/b.js", ".index.html.swp", "scratch/n"):
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text("x")
        time.sleep(0.5)
        page.write_text(page.read_text().replace("<h1>Devloop</h1>", "<h1>Saved</h1>"))
        assert printed("reloaded", 2), "".join(lines)
        assert "<h1>Saved</h1>" in page_of(api, f"{APP}-1")
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    # two reloads (`.atriumignore`, the page): none for the ignored files
    assert ("".join(lines) + out).count("reloaded") == 2, "".join(lines) + out
    assert "the dev copy was removed" in "".join(lines) + out
    assert proc.returncode == 0
    wait_for(lambda: api.get(f"/api/apps/{APP}").status_code == 404, "the dev copy gone")
    assert json.loads(api.get("/api/dist/installed").text) == []


def test_an_install_or_a_rollback_over_a_dev_copy_is_never_removed_as_one(
    shell: RunningShell, api: httpx.Client, home: Path, tmp_path: Path
) -> None:
    """The author's session ends after someone installed the app over its dev copy: the install
    stays, with its data and backups; a rollback of that install stays an install too."""
    folder = create(tmp_path, APP, "python")
    with ShellClient(shell.url, shell.token) as client:
        session = DevSession(client, folder)
        assert session.sync()
        release = tmp_path / "release" / APP
        release.parent.mkdir()
        shutil.copytree(folder, release)
        manifest = json.loads((release / "app.manifest.json").read_text())
        (release / "app.manifest.json").write_text(json.dumps({**manifest, "version": "0.2.0"}))
        body = {"ref": f"local:{release}", "scope": "user", "autoApprove": True}
        assert api.post("/api/dist/install", json=body).status_code == 200
        assert "dev" not in api.get(f"/api/apps/{APP}").json()["record"]
        assert api.post(f"/api/data/{APP}/items", json={"text": "the user's"}).status_code == 201
        made = api.post(f"/api/dist/backups/{APP}", json={"scope": "user"})
        assert made.status_code == 200, made.text
        rolled = api.post(f"/api/dist/rollback/{APP}", json={"scope": "user", "keepData": True})
        assert rolled.status_code == 200, rolled.text
        assert "dev" not in api.get(f"/api/apps/{APP}").json()["record"]
        (folder / "index.html").write_text("<h1>the author's next save</h1>")
        with pytest.raises(typer.Exit):
            session.sync()
        session.remove()
    assert api.get(f"/api/apps/{APP}").status_code == 200
    assert any(
        b["id"] == made.json()["id"] for b in api.get(f"/api/dist/backups/{APP}?scope=user").json()
    )
    refused = api.delete(f"/api/dist/uninstall/{APP}", params={"scope": "user", "devOnly": "1"})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "not_a_dev_copy"


def _ignore_sigint() -> None:
    """What a shell does for a command started in the background (`atrium dev … &`): SIGINT
    ignored, and inherited so through exec."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctrl_c_ends_atrium_dev_even_when_started_with_sigint_ignored(
    shell: RunningShell, api: httpx.Client, tmp_path: Path
) -> None:
    """A process that starts with SIGINT ignored keeps it ignored (Python installs its handler
    only over the default): `atrium dev` sets its own, so Ctrl-C (SIGINT) still ends the
    session and removes the dev copy."""
    folder = create(tmp_path, APP, "node")
    proc = start_dev(shell, folder, preexec_fn=_ignore_sigint)
    assert proc.stdout is not None
    seen = ""
    try:
        while "Watching" not in seen:
            line = proc.stdout.readline()
            assert line, seen
            seen += line
        assert api.get(f"/api/apps/{APP}").status_code == 200
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out = "(still running 30 s after SIGINT)"
    finally:
        if proc.poll() is None:  # it ignored the signal: the test fails below, nothing left running
            proc.kill()
            proc.communicate()
    assert "the dev copy was removed" in seen + out, seen + out
    assert proc.returncode == 0
    wait_for(lambda: api.get(f"/api/apps/{APP}").status_code == 404, "the dev copy gone")


def test_the_authors_page_hears_each_save_reloaded_or_why_not(
    shell: RunningShell, api: httpx.Client, tmp_path: Path
) -> None:
    """The author's host page learns of each save on its event stream: `dev:reloading` then
    `dev:reloaded` (the same instance ids, now on the new version), or `dev:failed` with the
    reason (a folder with problems, the last good version still serving; a version that did not
    start). Another user's stream hears none of it; their report of problems is a 404."""
    folder = create(tmp_path, APP, "stdlib")
    # closed at the end: a client left to the garbage collector warns of its socket in
    # whichever test runs then (pytest turns that into that test's failure)
    other = shell.client(shell.add_user("bob"))
    mine = SseReader(api, params={"topics": "dev:*"})
    theirs = SseReader(other, params={"topics": "dev:*"})
    with contextlib.closing(other), ShellClient(shell.url, shell.token) as client:
        session = DevSession(client, folder)
        assert session.sync()
        instance = session.instance_id
        # an event reaches a stream shortly after the call that caused it answered (its row is
        # written first): the dev install's own reload is heard before the save's is awaited
        wait_for(lambda: mine.of("dev:reloaded"), "the dev install's dev:reloaded")
        index = folder / "index.html"
        index.write_text(index.read_text().replace("<h1>Devloop</h1>", "<h1>Saved</h1>"))
        assert session.sync()
        wait_for(lambda: len(mine.of("dev:reloaded")) == 2, "the save's dev:reloaded")
        assert [e.event for e in mine.events][-2:] == ["dev:reloading", "dev:reloaded"]
        assert mine.of("dev:reloaded")[-1].data == {
            "appId": APP,
            "version": "0.1.0",
            "instanceIds": [instance],
            "type": "dev:reloaded",
        }

        manifest = folder / "app.manifest.json"
        good = manifest.read_text()
        manifest.write_text(good.replace('"version": "0.1.0"', '"version": "zero"'))
        assert not session.sync()
        wait_for(lambda: mine.of("dev:failed"), "dev:failed")
        assert "version: 'zero' is not a semver" in mine.of("dev:failed")[-1].data["message"]
        assert "<h1>Saved</h1>" in page_of(api, instance or "")

        manifest.write_text(good)
        server = folder / "server.py"
        working = server.read_text()
        server.write_text(working + "\ndef broken(:\n")
        assert not session.sync()
        wait_for(lambda: len(mine.of("dev:failed")) == 2, "a second dev:failed")
        assert mine.of("dev:failed")[-1].data["message"].startswith("did not start")

        server.write_text(working)
        assert session.sync()
        wait_for(lambda: mine.events[-1].event == "dev:reloaded", "reloaded after the fix")
        assert mine.of("dev:reloaded")[-1].data["instanceIds"] == [instance]

        refused = other.post(f"/api/dist/dev/{APP}/problems", json={"message": "x"})
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "not_found"
        session.remove()
    assert theirs.events == []


def test_a_traceback_in_dev_names_the_authors_own_folder(
    shell: RunningShell,
    api: httpx.Client,
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The app runs from its installed copy; the log `atrium dev` shows, and the reason the
    author's page gets, name the files the author edits instead."""
    folder = create(tmp_path, APP, "python")
    mine = SseReader(api, params={"topics": "dev:failed"})
    installed = home / "scopes/users/default/apps" / APP
    with ShellClient(shell.url, shell.token) as client:
        session = DevSession(client, folder)
        assert session.sync()
        capsys.readouterr()
        server = folder / "server.py"
        server.write_text(server.read_text().replace("app = App()", "app = App()\n1 / 0"))
        assert not session.sync()
        session.follow_log()
        out = capsys.readouterr().out
        assert f'File "{folder}/server.py"' in out, out
        assert str(installed) not in out
        wait_for(lambda: mine.of("dev:failed"), "dev:failed")
        message = mine.of("dev:failed")[-1].data["message"]
        assert f"{folder}/server.py" in message, message
        assert str(installed) not in message, message
        session.remove()


def test_an_install_that_asks_for_nothing_says_so_and_without_a_terminal_says_to_add_yes(
    shell: RunningShell, api: httpx.Client, tmp_path: Path
) -> None:
    """`atrium install` of a new app that asks for no permission (it offers a provider and an
    intent): the review says so in words; with no terminal to answer on and no `--yes`, the
    command says to add it, and nothing is installed."""
    folder = create(tmp_path, APP, "stdlib")
    env = {**os.environ, "ATRIUM_URL": shell.url, "ATRIUM_TOKEN": shell.token, "COLUMNS": "200"}
    run = subprocess.run(
        [sys.executable, "-m", "atrium", "install", f"local:{folder}", "--scope", "user"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "asks for no permissions; it offers" in out, out
    assert "--yes" in out, out
    assert api.get(f"/api/apps/{APP}").status_code == 404


def test_what_atriumignore_leaves_out_never_reaches_the_dev_copy(
    shell: RunningShell, api: httpx.Client, home: Path, tmp_path: Path
) -> None:
    """`atrium dev` on a folder holding what `.atriumignore` and the defaults leave out (a
    virtualenv whose interpreter is a link out of the folder, `node_modules`, a test cache, a
    `.env` with a secret, the author's scratch notes): the dev copy is installed without them,
    as `atrium pack` would ship it, and a save of one of them reloads nothing."""
    folder = create(tmp_path, APP, "stdlib")
    (folder / ".atriumignore").write_text("scratch/\nnotes.txt\n")
    left_out = {
        ".env": "API_KEY=the-authors-secret\n",
        "notes.txt": "todo\n",
        "scratch/draft.html": "<h1>draft</h1>",
        "node_modules/left-pad/index.js": "module.exports = 1\n",
        ".pytest_cache/v/cache/lastfailed": "{}",
        ".venv/pyvenv.cfg": "home = /usr/bin\n",
    }
    for name, text in left_out.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    (folder / ".venv/bin").mkdir()
    (folder / ".venv/bin/python").symlink_to(sys.executable)  # a link out: never shipped
    installed = home / "scopes/users/default/apps" / APP
    proc = start_dev(shell, folder)
    assert proc.stdout is not None
    lines: list[str] = []

    def printed(words: str, times: int = 1) -> bool:
        while "".join(lines).count(words) < times:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                return False
            lines.append(line)
        return True

    try:
        assert printed("Watching"), "".join(lines)
        assert "installed as a dev copy" in "".join(lines), "".join(lines)
        shipped = sorted(p.relative_to(installed).as_posix() for p in installed.rglob("*"))
        for name in [*left_out, ".venv", "node_modules", ".pytest_cache", "scratch"]:
            assert name not in shipped, shipped
        assert {"app.manifest.json", "index.html", ".atriumignore"} <= set(shipped), shipped

        time.sleep(0.2)  # the watcher has started once it printed; let it settle
        for name in (".env", "notes.txt", "scratch/draft.html", "node_modules/left-pad/index.js"):
            (folder / name).write_text("changed")
        time.sleep(0.5)
        page = folder / "index.html"
        page.write_text(page.read_text().replace("<h1>Devloop</h1>", "<h1>Saved</h1>"))
        assert printed("reloaded"), "".join(lines)
        assert "<h1>Saved</h1>" in page_of(api, f"{APP}-1")
        assert not (installed / ".env").exists()
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    # one reload (the page): none for the ignored files
    assert ("".join(lines) + out).count("reloaded") == 1, "".join(lines) + out
    assert proc.returncode == 0


def test_a_dev_save_that_asks_to_reach_more_is_not_granted_without_an_answer(
    shell: RunningShell, api: httpx.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dev copy's permissions are the author's own, but what it may reach is not: a save whose
    manifest asks `network.egress` (a dependency's hook, a pulled change) is approved like an
    install's, never granted by the save alone."""
    folder = create(tmp_path, APP, "stdlib")
    manifest_file = folder / "app.manifest.json"
    with ShellClient(shell.url, shell.token) as client:
        session = DevSession(client, folder)
        assert session.sync()
        first = session.instance_id
        described = json.loads(manifest_file.read_text())
        manifest_file.write_text(json.dumps({**described, "network": {"egress": True}}))
        assert not session.sync()
        out = capsys.readouterr().out
        assert "Can reach the internet" in out, out
        listed = api.get(f"/api/apps/{APP}").json()
        assert "network" not in listed["manifest"], listed["manifest"]
        assert listed["network"]["egress"]["granted"] is False
        assert session.instance_id == first  # the last good version keeps running
        # the API says the same to any client of a dev install
        body = {"ref": f"local:{folder}", "scope": "user", "autoApprove": True, "dev": True}
        asked = api.post("/api/dist/install", json=body)
        assert asked.status_code == 200, asked.text
        assert asked.json()["needsApproval"] is True
        assert asked.json()["diff"]["egressAdded"] is True
        # the author answers: the save goes in, and the app reaches what was approved
        session.ask = lambda question: "Can reach the internet" in question
        assert session.sync()
        listed = api.get(f"/api/apps/{APP}").json()
        assert listed["manifest"]["network"] == {"egress": True}
        assert listed["network"]["egress"]["granted"] is True
        session.remove()
