"""The Typer app `atrium`: registers every command."""

from __future__ import annotations

import json

import typer

from atrium import __version__
from atrium.cli import audit, commands, dist, intents, lifecycle, users
from atrium.cli.client import use_token
from atrium.cli.lazy import LazyGroup, lazy_command
from atrium.cli.publish import publish
from atrium.cli.theme import theme_app

app = typer.Typer(
    name="atrium",
    cls=LazyGroup,
    help="Atrium, an application platform shell.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
lazy_command("serve", "atrium.cli.serve:serve")
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
lazy_command("new", "atrium.cli.authoring:new")
lazy_command("dev", "atrium.cli.dev:dev")
lazy_command("validate", "atrium.cli.authoring:validate")
lazy_command("pack", "atrium.cli.authoring:pack")
lazy_command("test", "atrium.cli.authoring:run_tests")
lazy_command("publish-examples", "atrium.cli.authoring:publish_examples")
app.add_typer(commands.scopes_app, name="scopes")
app.add_typer(lifecycle.tools_app, name="tools")
app.add_typer(commands.kv_app, name="kv")
app.add_typer(intents.intent_app, name="intent")
app.add_typer(theme_app, name="theme")
app.add_typer(users.users_app, name="users")
app.add_typer(users.tokens_app, name="tokens")
lazy_command("trust", "atrium.cli.trust:trust_app")
lazy_command("service", "atrium.cli.service:service_app")
lazy_command("keygen", "atrium.cli.trust:keygen")
app.command("audit")(audit.audit)
app.command()(publish)
lazy_command("doctor", "atrium.cli.doctor:doctor")
lazy_command("kube", "atrium.cli.kube:kube_app")
lazy_command("db", "atrium.cli.db:db_app")


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
