"""`atrium serve`: the only command that imports the API; writes token and URL, prints the login.

A configuration problem (ConfigError: a refused setting, an unusable home, a home another shell
holds, a port that cannot be bound, a damaged KV file or scope repository) is printed as
``atrium serve: <problem>`` lines on stderr, exit status 2, no traceback, and nothing is written
to ``run/token`` or ``run/url``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, NoReturn

import typer
import uvloop

from atrium.files import write_atomic
from atrium.identity import MIN_TOKEN_LENGTH, new_token
from atrium.settings import ConfigError, HomeLock, Settings, prepare_home


def serve(
    home: Annotated[Path | None, typer.Option(help="data directory [env ATRIUM_HOME]")] = None,
    host: Annotated[str | None, typer.Option(help="bind address [127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option(help="port, 0 for any free one [7070]")] = None,
    app_domain: Annotated[
        str | None, typer.Option(help="domain of app origins [localhost]")
    ] = None,
    system_apps: Annotated[
        Path | None, typer.Option(help="system apps directory [bundled]")
    ] = None,
    user: Annotated[str | None, typer.Option(help="user id of the user scope [default]")] = None,
    index_url: Annotated[str | None, typer.Option(help="URL of the app index")] = None,
    runner: Annotated[
        str | None, typer.Option(help="auto, process, bwrap or kubernetes [auto]")
    ] = None,
    heartbeat_seconds: Annotated[float | None, typer.Option(help="SSE heartbeat [15]")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning [info]")] = None,
    migrate: Annotated[
        bool, typer.Option("--migrate", help="first migrate the database to this shell's schema")
    ] = False,
) -> None:
    """Start the shell (CLI flags > ATRIUM_* environment > defaults)."""
    try:
        settings = Settings.load(
            home=home,
            host=host,
            port=port,
            app_domain=app_domain,
            system_apps=system_apps,
            user=user,
            index_url=index_url,
            runner=runner,
            heartbeat_seconds=heartbeat_seconds,
            log_level=log_level,
        )
        token = _user_token(settings)
        # a home in use is named before the port (the second shell would often ask for the same
        # one); a home that has no run/ yet holds no shell, and is created only after the bind
        lock = HomeLock.claim(settings) if settings.run_dir.is_dir() else None
        # bound before anything is written: a port in use leaves a new home uncreated
        # the server (and with it SQLAlchemy) loads when the shell starts, not when `--help`
        # lists this command
        from atrium.api.server import ShellServer, settle_heap

        server = ShellServer(settings, token)
        prepare_home(settings)
        lock = lock or HomeLock.claim(settings)
        if migrate:
            _migrate(settings)
        # the home is ours now: a URL left by a shell killed before it could remove it is stale
        settings.url_path.unlink(missing_ok=True)
    except ConfigError as err:
        _refuse(err)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    url_path = server.settings.url_path

    def ready() -> None:
        """The shell is open: only now the token and URL are written and the login printed.
        A shell that took the bootstrap token another shell of its database keeps there knows
        only its hash (`atrium.users.bootstrap`): it prints no link, and this home's own token
        file, no longer the token, goes."""
        known: str | None = server.app.state.shell.user_auth.token
        if known is not None:
            write_atomic(server.settings.token_path, known + "\n")
        else:
            server.settings.token_path.unlink(missing_ok=True)
        write_atomic(url_path, server.url + "\n")
        typer.echo(f"Atrium {server.url} (home {settings.home})")
        if known is not None:
            typer.echo(f"Open the host page: {server.url}/login?token={known}")
        else:
            typer.echo(
                "Open the host page: with the login link of the shell that set the bootstrap "
                "token these shells share (its home's run/token holds the token; ATRIUM_TOKEN "
                "given alike to every shell prints it on each)"
            )
        settle_heap()

    try:
        uvloop.run(server.serve(ready))
    except ConfigError as err:  # found while opening the shell: a damaged KV file or scope repo
        _refuse(err)
    finally:
        if url_path.exists() and url_path.read_text().strip() == server.url:
            url_path.unlink()
        lock.release()


def _migrate(settings: Settings) -> None:
    """`atrium db upgrade` before serving (SQLAlchemy and Alembic imported only then); a schema
    newer than this shell knows is refused (ConfigError) and left as it is."""
    from atrium.state.migrate import upgrade_now

    name, before, after = upgrade_now(settings.state_url)
    typer.echo(
        f"Database {name}: schema version {after}" + (f" (was {before})" if before != after else "")
    )


def _refuse(err: ConfigError) -> NoReturn:
    """Each problem as one ``atrium serve: …`` line on stderr, exit status 2, no traceback."""
    for problem in err.problems:
        typer.echo(f"atrium serve: {problem}", err=True)
    raise typer.Exit(2) from None


def _user_token(settings: Settings) -> str:
    """ATRIUM_TOKEN (already checked by Settings), else the one the last start wrote to
    ``run/token``, else a new random one. Kept across restarts so that a bookmarked login link and
    the sign-ins it made keep working; setting ``ATRIUM_TOKEN`` (or deleting the file) replaces
    it, and a new token ends the link sign-ins of the old one. On PostgreSQL this is only the
    shell's candidate: the shells of the database share the one stored there, which only
    ``ATRIUM_TOKEN`` replaces (`atrium.users.bootstrap`)."""
    if settings.token:
        return settings.token.get_secret_value()
    try:
        kept = settings.token_path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        kept = ""
    # a damaged or foreign file is not a token: a fresh one replaces it
    return kept if len(kept) >= MIN_TOKEN_LENGTH and kept.isprintable() else new_token()
