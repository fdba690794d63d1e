"""Commands loaded when they run: a client command (`version`, `ps`, `apps`, `kv get`, `logs`)
must not pay for importing the server, Starlette or the distribution code, which costs far more
than the command itself. Commands living in heavy modules are registered by name and module
path; their module is imported only when that command (or `--help` listing it) is called."""

from __future__ import annotations

import importlib

import click
import typer
from typer.core import TyperGroup

#: command name → "module:attribute" (a command function or a Typer sub-app)
LAZY_COMMANDS: dict[str, str] = {}


def lazy_command(name: str, target: str) -> None:
    """Register ``name`` to be loaded from ``target`` ("module:attribute") on first use."""
    LAZY_COMMANDS[name] = target


def load_command(name: str) -> click.Command:
    """Import the command ``name`` registered with `lazy_command` and build its click command."""
    module_name, attribute = LAZY_COMMANDS[name].split(":")
    target = getattr(importlib.import_module(module_name), attribute)
    # built inside a group like the root's (no completion options), then taken out of it
    holder = typer.Typer(add_completion=False)
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name)
    else:
        holder.command(name)(target)
    return typer.main.get_group(holder).commands[name]


class LazyGroup(TyperGroup):
    """The root group: knows the lazy commands by name, imports one when it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        eager = super().list_commands(ctx)
        return [*eager, *(name for name in LAZY_COMMANDS if name not in eager)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            self.commands[cmd_name] = load_command(cmd_name)
        return super().get_command(ctx, cmd_name)
