"""The Typer app `atrium`: registers every command."""

from __future__ import annotations

import typer

from atrium import __version__
from atrium.cli import commands, intents, lifecycle
from atrium.cli.serve import serve

app = typer.Typer(
    name="atrium",
    help="Atrium, an application platform shell.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(serve)
app.command()(commands.apps)
app.command()(commands.events)
for command in (lifecycle.ps, lifecycle.launch, lifecycle.stop, lifecycle.destroy, lifecycle.logs):
    app.command()(command)
app.add_typer(commands.scopes_app, name="scopes")
app.add_typer(lifecycle.tools_app, name="tools")
app.add_typer(commands.kv_app, name="kv")
app.add_typer(intents.intent_app, name="intent")


@app.command()
def version() -> None:
    """Print the CLI's version."""
    typer.echo(__version__)


def main() -> None:
    app()
