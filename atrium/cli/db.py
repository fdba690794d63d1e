"""`atrium db`: the shell's database (ATRIUM_DATABASE_URL, else ``state.sqlite3`` in the home): its
schema version, and the migrations to this shell's. Loaded lazily: SQLAlchemy and Alembic are
imported only by these commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from atrium.settings import ConfigError, Settings

db_app = typer.Typer(
    help="The shell's database: schema version and migrations.", no_args_is_help=True
)

Home = Annotated[Path | None, typer.Option(help="data directory [env ATRIUM_HOME]")]
Json = Annotated[bool, typer.Option("--json", help="print the answer as JSON")]


def _url(home: Path | None) -> str:
    return Settings.load(home=home).state_url


def _refuse(err: ConfigError) -> NoReturn:
    for problem in err.problems:
        typer.echo(f"atrium db: {problem}", err=True)
    raise typer.Exit(2) from None


@db_app.command()
def upgrade(home: Home = None, as_json: Json = False) -> None:
    """Migrate the database to this shell's schema (nothing to do when it is there already)."""
    from atrium.state.migrate import upgrade_now

    try:
        name, before, after = upgrade_now(_url(home))
    except ConfigError as err:
        _refuse(err)
    if as_json:
        typer.echo(json.dumps({"database": name, "from": before, "to": after}))
    elif before == after:
        typer.echo(f"{name}: schema version {after}, nothing to do")
    else:
        typer.echo(f"{name}: schema version {before} → {after}")


@db_app.command()
def status(home: Home = None, as_json: Json = False) -> None:
    """The database's schema version and this shell's."""
    from atrium.state.migrate import status_now

    try:
        name, found, known = status_now(_url(home))
    except ConfigError as err:
        _refuse(err)
    if as_json:
        typer.echo(json.dumps({"database": name, "version": found, "shellVersion": known}))
    else:
        typer.echo(f"{name}: schema version {found} (this shell's: {known})")
