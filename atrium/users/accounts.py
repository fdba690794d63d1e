"""What disabling or deleting an account does beyond its row: the user's instances stop, and a
deleted user's scope (with their user scope's backups) is set aside in ``lost+found``
(decisions.md "Users: accounts and sign-in", "Users: backups per user").
Nothing of a user is ever deleted from disk here."""

from __future__ import annotations

import asyncio
import errno
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from atrium.files import sync_dir
from atrium.lifecycle.instance import Instance
from atrium.scopes import backups_root

_LOGGER = logging.getLogger(__name__)


class InstanceDoor(Protocol):
    """The part of the lifecycle manager that ends instances (`DELETE /api/instances/{id}`)."""

    def all(self) -> list[Instance]: ...

    async def remove(self, instance_id: str, *, force: bool = False) -> str | None: ...


async def stop_instances_of(lifecycle: InstanceDoor, user_id: str) -> list[str]:
    """End every live instance ``user_id`` owns, through the same door as
    `DELETE /api/instances/{id}` (orderly, forced when a hook fails); their ids."""
    ids = [i.id for i in lifecycle.all() if i.owner == user_id]
    for instance_id in ids:
        problem = await lifecycle.remove(instance_id)
        if problem is not None:
            _LOGGER.info(
                "instance %s of user %s ended without its hooks: %s", instance_id, user_id, problem
            )
    return ids


def user_scope(home: Path, user_id: str, scopes: Path | None = None) -> Path:
    """``user_id``'s folder: in ``scopes`` (a scope folder of its own, ``ATRIUM_SCOPES_DIR``),
    else in the home's."""
    return (scopes or home / "scopes") / "users" / user_id


def lost_and_found(
    home: Path, user_id: str, stamp: datetime | None = None, scopes: Path | None = None
) -> Path:
    """``lost+found/users/<id>-<stamp>/``; a numbered suffix if that moment was taken. Beside
    the scopes in a scope folder of their own (``scopes/lost+found``: the same file system,
    which other shells share), else in the home."""
    moment = (stamp or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    base = (scopes if scopes is not None else home) / "lost+found" / "users"
    target = base / f"{user_id}-{moment}"
    n = 0
    while target.exists() or target.is_symlink():
        n += 1
        target = base / f"{user_id}-{moment}.{n}"
    return target


def _set_aside(home: Path, user_id: str, scopes: Path | None) -> Path | None:
    scope = user_scope(home, user_id, scopes)
    if not scope.exists() and not scope.is_symlink():
        return None
    target = lost_and_found(home, user_id, scopes=scopes)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    scope.rename(target)  # same file system: one rename, never a copy and a delete
    sync_dir(target.parent)
    sync_dir(scope.parent)
    # their user scope's backups (`BackupStore` with a user) go with it: a reused id starts
    # with none
    backups = backups_root(home, scopes) / "users" / user_id
    if backups.is_dir() and not backups.is_symlink():
        try:
            backups.rename(target / "backups")
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            # a shared scope folder on another file system: the home's lost+found keeps them
            beside = lost_and_found(home, user_id)
            beside.mkdir(parents=True, mode=0o700)
            backups.rename(beside / "backups")
        sync_dir(backups.parent)
    return target


async def set_aside_scope(home: Path, user_id: str, scopes: Path | None = None) -> Path | None:
    """Move ``scopes/users/<id>/`` to lost+found (None when the user had no scope folder);
    ``scopes``: the scope folder when it is not the home's (``ATRIUM_SCOPES_DIR``)."""
    return await asyncio.to_thread(_set_aside, home, user_id, scopes)
