"""`atrium db upgrade` / `status` and `atrium serve --migrate`, on both databases; a CLI command
that needs no database does not import SQLAlchemy."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from typer.testing import CliRunner

from atrium.cli.main import app
from atrium.state.database import Database
from atrium.state.versions import HEAD

ATRIUM = str(Path(sys.executable).with_name("atrium"))


def set_version(url: str, version: str) -> None:
    async def run() -> None:
        async with Database.open(url) as db, db.transaction() as tx:
            await tx.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": version})

    asyncio.run(run())


def test_db_upgrade_then_status(database_url: str, tmp_path: Path) -> None:
    env = {"ATRIUM_HOME": str(tmp_path / "home"), "ATRIUM_DATABASE_URL": database_url}
    runner = CliRunner()
    first = runner.invoke(app, ["db", "upgrade", "--json"], env=env)
    assert first.exit_code == 0, first.output
    answer = json.loads(first.output)
    assert (answer["from"], answer["to"]) == ("none", HEAD)
    again = runner.invoke(app, ["db", "upgrade"], env=env)
    assert again.exit_code == 0, again.output
    assert f"schema version {HEAD}, nothing to do" in again.output
    status = runner.invoke(app, ["db", "status", "--json"], env=env)
    assert json.loads(status.output)["version"] == HEAD
    set_version(database_url, "0999")
    refused = runner.invoke(app, ["db", "upgrade"], env=env)
    assert refused.exit_code == 2
    assert f"schema version 0999, newer than this shell knows (up to {HEAD})" in refused.output


def test_an_unreachable_database_is_one_line_without_its_password() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        url = f"postgresql+psycopg://atrium:hunter2@127.0.0.1:{port}/atrium"
        answer = CliRunner().invoke(app, ["db", "status"], env={"ATRIUM_DATABASE_URL": url})
    assert answer.exit_code == 2
    assert answer.output.startswith(
        f"atrium db: the database postgresql+psycopg://atrium:***@127.0.0.1:{port}/atrium "
        f"cannot be used: connection failed"
    )
    assert answer.output.count("\n") == 1
    assert "hunter2" not in answer.output


def test_the_default_database_is_a_private_file_in_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = CliRunner().invoke(app, ["db", "upgrade", "--home", str(home), "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["database"] == f"sqlite+aiosqlite:///{home}/state.sqlite3"
    assert stat.S_IMODE((home / "state.sqlite3").stat().st_mode) == 0o600


def test_serve_migrate_refuses_a_newer_schema_naming_both_versions(tmp_path: Path) -> None:
    """On the default database (`test_db_upgrade_then_status` refuses on both)."""
    home = tmp_path / "home"
    CliRunner().invoke(app, ["db", "upgrade", "--home", str(home)])
    set_version(f"sqlite+aiosqlite:///{home}/state.sqlite3", "0999")
    served = subprocess.run(
        [ATRIUM, "serve", "--home", str(home), "--port", "0", "--migrate"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert served.returncode == 2, served.stderr
    assert served.stderr.startswith("atrium serve: the database sqlite+aiosqlite:///")
    assert f"has schema version 0999, newer than this shell knows (up to {HEAD})" in served.stderr
    assert not (tmp_path / "home" / "run" / "url").exists()


def test_serve_migrate_migrates_then_serves(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with subprocess.Popen(
        [ATRIUM, "serve", "--home", str(home), "--port", "0", "--migrate"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as shell:
        try:
            assert shell.stdout is not None
            first = shell.stdout.readline()
            assert first.startswith("Database sqlite+aiosqlite:///"), first
            assert first.strip().endswith(f"schema version {HEAD} (was none)")
            assert shell.stdout.readline().startswith("Atrium http://")  # serving
        finally:
            shell.terminate()
            shell.wait(timeout=30)
    assert (
        CliRunner()
        .invoke(app, ["db", "status", "--home", str(home)])
        .output.endswith(f"schema version {HEAD} (this shell's: {HEAD})\n")
    )


def test_a_command_without_a_database_does_not_import_sqlalchemy() -> None:
    probe = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from atrium.cli.main import app\n"
        "assert CliRunner().invoke(app, ['version']).exit_code == 0\n"
        "assert CliRunner().invoke(app, ['--help']).exit_code == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('sqlalchemy', 'alembic', 'psycopg', 'aiosqlite')))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert found.stdout.strip() == "[]"


def serve_once(home: Path, database_url: str | None) -> subprocess.CompletedProcess[str]:
    """`atrium serve` on ``home`` until it prints its URL (then stopped), or until it exits."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("ATRIUM_")}
    if database_url:
        env["ATRIUM_DATABASE_URL"] = database_url
    cmd = [ATRIUM, "serve", "--home", str(home), "--port", "0"]
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if first.startswith("Atrium http://"):
            proc.terminate()
        out, err = proc.communicate(timeout=60)
        return subprocess.CompletedProcess(cmd, proc.returncode, first + out, err)


def test_serve_checks_the_schema_at_start_and_refuses_a_newer_one(
    database_url: str, tmp_path: Path
) -> None:
    """Without ``--migrate``: a shell never runs on a schema it does not know."""
    home = tmp_path / "home"
    assert (
        CliRunner()
        .invoke(
            app, ["db", "upgrade", "--home", str(home)], env={"ATRIUM_DATABASE_URL": database_url}
        )
        .exit_code
        == 0
    )
    set_version(database_url, "0999")
    served = serve_once(home, database_url)
    assert served.returncode == 2, (served.stdout, served.stderr)
    assert f"has schema version 0999, newer than this shell knows (up to {HEAD})" in served.stderr
    assert not (home / "run" / "url").exists()


def test_the_embedded_database_is_upgraded_at_start_a_shared_one_only_when_asked(
    database_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    served = serve_once(home, database_url)
    status = CliRunner().invoke(
        app,
        ["db", "status", "--home", str(home), "--json"],
        env={"ATRIUM_DATABASE_URL": database_url},
    )
    if database_url.startswith("sqlite"):
        assert served.stdout.startswith("Atrium http://"), served.stderr
        assert json.loads(status.output)["version"] == HEAD
    else:
        assert served.returncode == 2, (served.stdout, served.stderr)
        assert (
            f"has schema version none, older than this shell's {HEAD}: run `atrium db upgrade`"
            in served.stderr
        )
        assert json.loads(status.output)["version"] == "none"
