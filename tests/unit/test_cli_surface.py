"""The CLI's promises that need no shell: every command takes --json (but `serve` and `dev`,
which run until stopped and print a log)."""

from __future__ import annotations

from typing import Any

import typer.main

from atrium.cli.main import app


def commands(group: Any, prefix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, sub in getattr(group, "commands", {}).items():
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
