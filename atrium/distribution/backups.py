"""Snapshots of an app's runtime data (docs/api.md "Backups").

A backup is `$ATRIUM_HOME/backups/<scope>/<appId>/<stamp>-<version>/` holding `backup.json` and
`data/<appId>-<n>/…`, one folder per instance's runtime data. It is written as `<name>.partial`
and renamed when complete, so a listed backup is always whole. Files are cloned (reflink, the
`FICLONE` ioctl) where the filesystem shares blocks copy-on-write, and copied otherwise; never
hard-linked: an app that writes a file in place (SQLite does) would change its "backup" with it
(decisions.md "Backups of runtime data"). Owners and modes are kept, so a restored folder is the app's again.
Every copy goes through fdcopy.py: the app's uid may be changing its data while the shell, often
root, copies it, so nothing is opened, chmod-ed or chown-ed by a path that could be a link by then.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from atrium.distribution import fdcopy
from atrium.distribution.journal import faultpoint
from atrium.distribution.swap import exchange, move_new
from atrium.files import sync_dir
from atrium.scopes import Scope

#: backups kept per app and scope (older ones go after a successful operation)
KEEP: Final = 5
FORMAT: Final = 1
MANIFEST: Final = "backup.json"


@dataclass(frozen=True, slots=True)
class Backup:
    """One complete snapshot."""

    id: str
    path: Path
    app_id: str
    scope: str
    version: str
    created_at: str
    folders: tuple[str, ...]
    files: int
    bytes: int
    method: str
    reason: str

    @property
    def data_dirs(self) -> list[Path]:
        return [self.path / "data" / name for name in self.folders]

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "appId": self.app_id,
            "scope": self.scope,
            "version": self.version,
            "createdAt": self.created_at,
            "folders": list(self.folders),
            "files": self.files,
            "bytes": self.bytes,
            "method": self.method,
            "reason": self.reason,
        }


def copy_tree(source: Path, target: Path) -> str:
    """Copy ``source`` to the new ``target`` through descriptors only (fdcopy.py); returns
    "reflink" or "copy"."""
    return fdcopy.copy_tree(source, target).method


class BackupStore:
    """The backups under ``root`` (`$ATRIUM_HOME/backups`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, scope: Scope, app_id: str) -> Path:
        return self.root / scope.value / app_id

    def all(self, scope: Scope, app_id: str) -> list[Backup]:
        """Complete backups, newest first."""
        folder = self.folder(scope, app_id)
        found = []
        for path in sorted(folder.iterdir(), reverse=True) if folder.is_dir() else []:
            backup = _read(path, scope, app_id)
            if backup is not None:
                found.append(backup)
        return found

    def get(self, scope: Scope, app_id: str, backup_id: str) -> Backup | None:
        if "/" in backup_id or backup_id.startswith("."):
            return None
        return _read(self.folder(scope, app_id) / backup_id, scope, app_id)

    def snapshot(
        self, scope: Scope, app_id: str, version: str, data_dirs: list[Path], reason: str
    ) -> Backup:
        """Copy ``data_dirs`` (the app's runtime data folders) into a new backup. Blocking."""
        now = datetime.now(UTC)
        name = f"{now:%Y%m%dT%H%M%S%fZ}-{version}"
        folder = self.folder(scope, app_id)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.root.chmod(0o700)
        partial = folder / f".{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        (partial / "data").mkdir(parents=True)
        # sizes keyed <folder>/<path>, relative to the backup's data/
        copier = fdcopy.Copied()
        for source in data_dirs:
            target = partial / "data" / source.name
            fdcopy.copy_tree(source, target, into=copier, prefix=source.name)
        manifest = {
            "format": FORMAT,
            "appId": app_id,
            "scope": scope.value,
            "version": version,
            "createdAt": now.isoformat().replace("+00:00", "Z"),
            "folders": [p.name for p in data_dirs],
            "files": copier.files,
            "bytes": copier.bytes,
            "method": copier.method,
            "reason": reason,
        }
        with (partial / MANIFEST).open("x") as file:
            json.dump(manifest, file)
            file.flush()
            os.fsync(file.fileno())
        sync_dir(partial)
        partial.rename(folder / name)
        sync_dir(folder)
        backup = _read(folder / name, scope, app_id)
        if backup is None:  # pragma: no cover - just written
            raise OSError(f"the backup {folder / name} cannot be read back")
        return backup

    def prune(self, scope: Scope, app_id: str, keep: int = KEEP) -> list[str]:
        """Delete all but the ``keep`` newest backups (and stale partial ones); their ids."""
        folder = self.folder(scope, app_id)
        gone = [b.id for b in self.all(scope, app_id)[keep:]]
        for backup_id in gone:
            shutil.rmtree(folder / backup_id)
        for stale in folder.glob(".*.partial") if folder.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)
        return gone


def _read(path: Path, scope: Scope, app_id: str) -> Backup | None:
    """The backup in ``path``, when it is one of ``app_id`` in ``scope`` (its own record says
    so): a folder placed there by other means is not taken for one."""
    try:
        data = json.loads((path / MANIFEST).read_text())
        if (data["appId"], data["scope"]) != (app_id, scope.value):
            return None
        folder = re.compile(rf"{re.escape(str(data['appId']))}-[0-9]+")
        if not all(isinstance(f, str) and folder.fullmatch(f) for f in data["folders"]):
            return None  # only runtime data folders, never a path elsewhere
        return Backup(
            id=path.name,
            path=path,
            app_id=str(data["appId"]),
            scope=str(data["scope"]),
            version=str(data["version"]),
            created_at=str(data["createdAt"]),
            folders=tuple(str(f) for f in data["folders"]),
            files=int(data["files"]),
            bytes=int(data["bytes"]),
            method=str(data["method"]),
            reason=str(data["reason"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def place(folders: list[Path], staged: Path) -> None:
    """Copy runtime data folders (a backup's, an export's) into the staged tree, by name."""
    for folder in folders:
        copy_tree(folder, staged / folder.name)


def swap_data(backup: Backup, app_dir: Path, staging_dir: Path) -> None:
    """Each of the backup's folders replaces the live one in one exchange (the live one lands
    in the staging folder, which goes when the operation ends)."""
    for name in backup.folders:
        copy_tree(backup.path / "data" / name, staging_dir / name)
        faultpoint("restore-copied")
        if (app_dir / name).exists():
            exchange(staging_dir / name, app_dir / name)
        else:
            move_new(staging_dir / name, app_dir / name)
        sync_dir(app_dir)
        faultpoint("restore-exchanged")
