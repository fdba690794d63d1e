"""The Typer app `atrium`: registers every command."""

from __future__ import annotations

import json

import typer

from atrium import __version__
from atrium.cli import (
    audit,
    authoring,
    commands,
    dev,
    dist,
    intents,
    lifecycle,
    service,
    trust,
    users,
)
from atrium.cli.client import use_token
from atrium.cli.doctor import doctor
from atrium.cli.publish import publish
from atrium.cli.serve import serve
from atrium.cli.theme import theme_app

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
for dist_command in (
    dist.install,
    dist.preview,
    dist.update,
    dist.uninstall,
    dist.history,
    dist.rollback,
    dist.backup,
    dist.backups,
    dist.restore,
    dist.export,
    dist.installed,
    dist.index,
):
    app.command()(dist_command)
app.command("import")(dist.import_app)
app.command()(authoring.new)
app.command()(dev.dev)
app.command()(authoring.validate)
app.command()(authoring.pack)
app.command("test")(authoring.run_tests)
app.command()(authoring.publish_examples)
app.add_typer(commands.scopes_app, name="scopes")
app.add_typer(lifecycle.tools_app, name="tools")
app.add_typer(commands.kv_app, name="kv")
app.add_typer(intents.intent_app, name="intent")
app.add_typer(theme_app, name="theme")
app.add_typer(users.users_app, name="users")
app.add_typer(users.tokens_app, name="tokens")
app.add_typer(trust.trust_app, name="trust")
app.add_typer(service.service_app, name="service")
app.command()(trust.keygen)
app.command("audit")(audit.audit)
app.command()(publish)
app.command()(doctor)


@app.callback()
def root(
    token: str | None = typer.Option(
        None,
        "--token",
        help="call the shell with this token (a personal token or the bootstrap one); "
        "default: $ATRIUM_TOKEN, else $ATRIUM_HOME/run/token",
    ),
) -> None:
    """Atrium, an application platform shell."""
    use_token(token)


@app.command()
def version(
    as_json: bool = typer.Option(False, "--json", help='print {"version": …}'),
) -> None:
    """Print the CLI's version."""
    typer.echo(json.dumps({"version": __version__}) if as_json else __version__)


def main() -> None:
    app()
