"""The CLI's promises that need no shell: every command takes --json (but `serve` and `dev`,
which run until stopped and print a log, and `test`, which passes pytest's own output through)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import typer.main
from typer.testing import CliRunner

from atrium.cli.main import app


def commands(group: Any, prefix: str = "") -> dict[str, Any]:
    """Every command under ``group`` by path, as click lists them (lazy ones loaded)."""
    found: dict[str, Any] = {}
    ctx = typer.Context(group)
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        path = f"{prefix} {name}".strip()
        if getattr(sub, "commands", None):
            found.update(commands(sub, path))
        else:
            found[path] = sub
    return found


def test_every_command_but_serve_dev_and_test_takes_json() -> None:
    every = commands(typer.main.get_command(app))
    assert len(every) > 30
    missing = sorted(
        path
        for path, command in every.items()
        if "--json" not in [o for p in command.params for o in getattr(p, "opts", [])]
    )
    assert missing == ["dev", "serve", "test"]


def test_keygen_json_names_the_two_files_and_the_fingerprint(tmp_path: Path) -> None:
    answer = CliRunner().invoke(app, ["keygen", "me", "--dir", str(tmp_path), "--json"])
    assert answer.exit_code == 0, answer.output
    written = json.loads(answer.output)
    assert written["privateKey"] == str(tmp_path / "me.key")
    assert written["publicKey"] == str(tmp_path / "me.pub")
    assert stat.S_IMODE((tmp_path / "me.key").stat().st_mode) == 0o600
    assert written["fingerprint"]
