"""`atrium service install`: a systemd unit that runs `atrium serve` for real (docs/decisions.md
"Running it for real")."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from atrium.files import write_atomic
from atrium.settings import Settings

service_app = typer.Typer(help="Run the shell as a systemd service.", no_args_is_help=True)

UNIT_NAME = "atrium.service"
SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
SYSTEM_HOME = Path("/var/lib/atrium")
#: what `User=` may say, unquoted: a user name as systemd takes it (no `%` specifier, no space,
#: no leading `-`), or a numeric uid. An empty `User=` would mean root.
RUN_AS_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10}")


@service_app.callback()
def service() -> None:
    """Run the shell as a systemd service (one command, `install`, kept a group to grow)."""


def _refuse(problem: str) -> NoReturn:
    typer.echo(f"atrium service install: {problem}", err=True)
    raise typer.Exit(2)


def atrium_command() -> list[str]:
    """The absolute command that starts this installation's `atrium`: the script next to the
    interpreter (a virtualenv or pipx), else the one on PATH, else ``python -m atrium``."""
    beside = Path(sys.executable).parent / "atrium"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside.absolute())]
    found = shutil.which("atrium")
    if found:
        return [str(Path(found).absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "atrium"]


def quote(word: str) -> str:
    """One word of a unit file line: double-quoted, `\\` and `"` escaped, `%` (a specifier)
    doubled. A newline cannot be said in a unit line and is refused earlier."""
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def unit_text(command: list[str], home: Path, *, system: bool, run_as: str | None) -> str:
    """The unit. Restart on failure only: a clean stop (SIGTERM, exit 0) stays stopped. The
    shell gets SIGTERM alone (KillMode=mixed) and stops its apps itself within its grace; the
    rest of the group is killed after TimeoutStopSec. No RestrictNamespaces, PrivateUsers or
    seccomp mount filter: bubblewrap makes namespaces and mounts for every app."""
    lines = [
        "[Unit]",
        "Description=Atrium app platform shell",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(quote(word) for word in [*command, "serve"]),
        "Environment=" + quote(f"ATRIUM_HOME={home}"),
        "Restart=on-failure",
        "RestartSec=2",
        "KillMode=mixed",
        "TimeoutStopSec=30",
    ]
    if system:
        lines += [
            # root gives each app a uid of its own (its data folders stay its own); another
            # user runs every app as that user, confined by the sandbox alone
            f"User={run_as or 'root'}",
            "NoNewPrivileges=yes",
            "PrivateTmp=yes",
            "ProtectSystem=full",
            "ProtectKernelModules=yes",
            "ProtectControlGroups=yes",
            "UMask=0077",
        ]
    lines += ["", "[Install]", f"WantedBy={'multi-user.target' if system else 'default.target'}"]
    return "\n".join(lines) + "\n"


def _default_home(system: bool) -> Path:
    """`/var/lib/atrium` for the machine's unit; `atrium serve`'s own default for a user's."""
    if system:
        return SYSTEM_HOME
    home: Path = Settings.model_fields["home"].get_default(call_default_factory=True)
    return home


def _check_words(command: list[str], home: Path, run_as: str | None) -> None:
    """Refuse what a unit line cannot hold as the one literal word it must be."""
    if any("\n" in word or "\r" in word for word in [*command, str(home), run_as or ""]):
        _refuse("a path or user name with a line break cannot be written in a unit")
    if run_as is not None and not RUN_AS_RE.fullmatch(run_as):
        _refuse(
            f"--run-as {run_as!r} is not a user name systemd takes (letters, digits, '_', '.', "
            "'-', starting with a letter or '_') nor a numeric uid"
        )
    for word in [*command, str(home)]:
        try:
            word.encode()
        except UnicodeEncodeError:
            _refuse(f"{word!r} is not UTF-8, and a unit file is UTF-8")


@service_app.command("install")
def install(
    user: Annotated[bool, typer.Option("--user", help="A unit of your own (the default).")] = False,
    system: Annotated[
        bool, typer.Option("--system", help="A unit of the machine's (as root).")
    ] = False,
    print_only: Annotated[
        bool, typer.Option("--print", help="Print the unit instead of writing it.")
    ] = False,
    home: Annotated[
        Path | None,
        typer.Option(
            envvar="ATRIUM_HOME",
            help="The shell's home (default: serve's, or /var/lib/atrium with --system).",
        ),
    ] = None,
    unit_dir: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            help="Where to write the unit (default: ~/.config/systemd/user or /etc/systemd/system).",
        ),
    ] = None,
    run_as: Annotated[
        str | None,
        typer.Option("--run-as", help="With --system: the user it runs as (default root)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print what was written (or the unit) as JSON.")
    ] = False,
) -> None:
    """Write a systemd unit that runs `atrium serve`, and say how to enable it."""
    if user and system:
        _refuse("--user and --system: choose one")
    if run_as is not None and not system:
        _refuse("--run-as is for --system units; a --user unit runs as you")
    home = (home or _default_home(system)).expanduser().absolute()
    command = atrium_command()
    _check_words(command, home, run_as)
    text = unit_text(command, home, system=system, run_as=run_as)
    manager = "systemctl" if system else "systemctl --user"
    enable = f"{manager} daemon-reload && {manager} enable --now atrium"
    if print_only:
        if as_json:
            typer.echo(json.dumps({"unit": text, "home": str(home), "enable": enable}))
        else:
            typer.echo(text, nl=False)
        return
    if unit_dir is None:
        unit_dir = SYSTEM_UNIT_DIR if system else Path.home() / ".config" / "systemd" / "user"
    path = unit_dir.expanduser().absolute() / UNIT_NAME
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
        path.chmod(0o644)
    except OSError as err:
        _refuse(f"cannot write {path}: {err.strerror or err}")
    if as_json:
        typer.echo(json.dumps({"path": str(path), "home": str(home), "enable": enable}))
        return
    typer.echo(f"Wrote {path} (home {home})")
    typer.echo(f"Enable and start it: {enable}")
    if not system:
        typer.echo("To keep it running after you log out: loginctl enable-linger")
    typer.echo(f"The login link: {'journalctl' if system else 'journalctl --user'} -u atrium")
