"""`atrium validate` and `atrium pack` (issue 18): every problem at once, and the layer publish
pushes, without a running shell."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atrium.cli.main import app
from tests.conftest import REPO_DIR

pytestmark = pytest.mark.integration


def notes_copy(tmp_path: Path) -> Path:
    target = tmp_path / "com.atrium.notes"
    shutil.copytree(REPO_DIR / "apps" / "com.atrium.notes", target)
    return target


def test_a_good_folder_validates_and_packs_reproducibly(tmp_path: Path) -> None:
    folder = notes_copy(tmp_path)
    (folder / ".git").mkdir()  # the author's own repository is not part of the app
    (folder / ".git" / "config").write_text("[core]\n")
    ok = CliRunner().invoke(app, ["validate", str(folder)])
    assert ok.exit_code == 0, ok.output
    assert "nothing an install would refuse" in ok.output
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    packed = CliRunner().invoke(app, ["pack", str(folder), "-o", str(first), "--json"])
    assert packed.exit_code == 0, packed.output
    assert CliRunner().invoke(app, ["pack", str(folder), "-o", str(second)]).exit_code == 0
    assert first.read_bytes() == second.read_bytes()  # reproducible
    with tarfile.open(first) as tar:
        names = tar.getnames()
    assert "com.atrium.notes/app.manifest.json" in names
    assert not any(".git" in n for n in names)
    assert json.loads(packed.output)["digest"].startswith("sha256:")


def test_every_problem_is_listed_at_once_and_nothing_is_packed(tmp_path: Path) -> None:
    folder = notes_copy(tmp_path)
    manifest = json.loads((folder / "app.manifest.json").read_text())
    manifest.update({"version": "one", "entrypoint": "missing.sh", "icon": "nope.svg"})
    (folder / "app.manifest.json").write_text(json.dumps(manifest))
    (folder / "com.atrium.notes-1").mkdir()
    (folder / "escape").symlink_to("/etc/passwd")
    answer = CliRunner().invoke(app, ["validate", str(folder), "--json"])
    assert answer.exit_code == 1
    problems = json.loads(answer.output)["problems"]
    text = json.dumps(problems)
    assert "semver" in text  # the version
    assert "reserved for an instance's runtime data" in text
    assert "escape" in text  # the link leaving the folder
    assert len(problems) >= 3
    archive = tmp_path / "x.tar.gz"
    refused = CliRunner().invoke(app, ["pack", str(folder), "-o", str(archive)])
    assert refused.exit_code == 1
    assert "not packed" in refused.output
    assert not archive.exists()


def test_pack_leaves_out_what_atriumignore_and_the_defaults_name_lists_the_rest_and_warns_of_secrets(
    tmp_path: Path,
) -> None:
    """`atrium pack` as a real process: caches, virtualenvs, `node_modules`, `.env`, editor
    files and what `.atriumignore` names stay out (a `!` line brings one back); every shipped
    file is listed, and a likely secret that is shipped is warned about."""
    folder = notes_copy(tmp_path)
    junk = [
        ".pytest_cache/v/cache/nodeids",
        ".venv/bin/python",
        "node_modules/left-pad/index.js",
        ".env",
        ".benchmarks/run.json",
        "index.html~",
        ".index.html.swp",
        ".idea/workspace.xml",
        ".vscode/settings.json",
        "notes.log",
        "drafts/one.txt",
    ]
    for name in [*junk, "keep.log", "deploy/id_rsa", "certs/server.pem", "config/signing.txt"]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x")
    (folder / "config/signing.txt").write_text("-----BEGIN EC PRIVATE KEY-----\nabc\n")
    (folder / ".atriumignore").write_text("# mine\n*.log\n!keep.log\ndrafts/\n")
    archive = tmp_path / "notes.tar.gz"
    env = {**os.environ, "COLUMNS": "200"}
    run = subprocess.run(
        [sys.executable, "-m", "atrium", "pack", str(folder), "-o", str(archive)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    with tarfile.open(archive) as tar:
        shipped = {n.removeprefix(f"{folder.name}/") for n in tar.getnames()}
    for name in junk:
        assert name not in shipped, name
    assert {"keep.log", "deploy/id_rsa", "certs/server.pem", ".atriumignore"} <= shipped
    assert "  keep.log" in run.stdout.splitlines()
    assert "  app.manifest.json" in run.stdout.splitlines()
    assert not any(n in run.stdout for n in junk)
    for secret in ("deploy/id_rsa", "certs/server.pem", "config/signing.txt"):
        assert f"warning: {secret} looks like a secret" in run.stdout, run.stdout
    assert "keep.log looks like" not in run.stdout


def test_atrium_test_runs_a_new_apps_tests_with_the_sdk_and_no_warning_wall(
    tmp_path: Path,
) -> None:
    """`atrium test FOLDER` from anywhere: the folder's tests, run by the interpreter that has
    the SDK, with the template's pytest settings (no deprecation warnings)."""
    made = subprocess.run(
        [sys.executable, "-m", "atrium", "new", "com.example.tested", "--template", "stdlib"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    folder = tmp_path / "com.example.tested"
    assert "atrium test" in (folder / "README.md").read_text()
    run = subprocess.run(
        [sys.executable, "-m", "atrium", "test", str(folder)],
        cwd=tmp_path.parent,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=300,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "2 passed" in out, out
    assert "Warning" not in out, out
    failing = folder / "tests" / "test_fails.py"
    failing.write_text("def test_fails() -> None:\n    assert False\n")
    run = subprocess.run(
        [sys.executable, "-m", "atrium", "test", str(folder), "--", "-k", "fails"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed" in run.stdout


def test_each_template_has_its_own_icon(tmp_path: Path) -> None:
    """`atrium new` per template: the app's icon is that template's, not one shared picture."""
    icons = {}
    for template in ("python", "stdlib", "node"):
        app_id = f"com.example.icon{template}"
        made = subprocess.run(
            [sys.executable, "-m", "atrium", "new", app_id, "--template", template],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert made.returncode == 0, made.stdout + made.stderr
        folder = tmp_path / app_id
        assert json.loads((folder / "app.manifest.json").read_text())["icon"] == "icon.svg"
        icon = (folder / "icon.svg").read_text()
        assert icon.startswith("<svg"), icon
        icons[template] = icon
    assert len(set(icons.values())) == 3, icons
