"""The CLI's promises that need no shell: every command takes --json (but `serve` and `dev`,
which run until stopped and print a log)."""

from __future__ import annotations

from typing import Any

import typer.main

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


def test_every_command_but_serve_and_dev_takes_json() -> None:
    every = commands(typer.main.get_command(app))
    assert len(every) > 30
    missing = sorted(
        path
        for path, command in every.items()
        if "--json" not in [o for p in command.params for o in getattr(p, "opts", [])]
    )
    assert missing == ["dev", "serve"]
