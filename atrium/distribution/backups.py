"""Snapshots of an app's runtime data (docs/api.md "Backups").

A backup is `$ATRIUM_HOME/backups/<scope>/<appId>/<stamp>-<version>/` holding `backup.json` and
`data/<appId>-<n>/…`, one folder per instance's runtime data. It is written as `<name>.partial`
and renamed when complete, so a listed backup is always whole. Files are cloned (reflink, the
`FICLONE` ioctl) where the filesystem shares blocks copy-on-write, and copied otherwise; never
hard-linked: an app that writes a file in place (SQLite does) would change its "backup" with it
(decisions.md "Backups of runtime data"). Owners and modes are kept, so a restored folder is the app's again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from atrium.distribution.journal import faultpoint
from atrium.distribution.swap import exchange, move_new
from atrium.files import sync_dir
from atrium.scopes import Scope

#: backups kept per app and scope (older ones go after a successful operation)
KEEP: Final = 5
FORMAT: Final = 1
MANIFEST: Final = "backup.json"
#: `FICLONE` from linux/fs.h: share the source file's blocks (btrfs, xfs, bcachefs)
FICLONE: Final = 0x40049409
NO_CLONE: Final = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS}
)


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


class _Copier:
    """Copies one tree, cloning files while the filesystem allows it."""

    def __init__(self) -> None:
        self.clone = True
        self.files = 0
        self.bytes = 0

    @property
    def method(self) -> str:
        return "reflink" if self.clone else "copy"

    def tree(self, source: Path, target: Path) -> None:
        target.mkdir()
        for entry in sorted(source.iterdir()):
            into = target / entry.name
            info = entry.lstat()
            if stat.S_ISDIR(info.st_mode):
                self.tree(entry, into)
            elif stat.S_ISLNK(info.st_mode):
                into.symlink_to(entry.readlink())
            elif stat.S_ISREG(info.st_mode):
                self.file(entry, into)
                self.files += 1
                self.bytes += info.st_size
            else:
                continue  # sockets, fifos: not data
            _own(into, info)
        _own(target, source.lstat())

    def file(self, source: Path, target: Path) -> None:
        if self.clone:
            with source.open("rb") as src, target.open("xb") as dst:
                try:
                    fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
                    return
                except OSError as err:
                    if err.errno not in NO_CLONE:
                        raise
                    self.clone = False
            target.unlink()
        shutil.copyfile(source, target, follow_symlinks=False)


def _own(path: Path, info: os.stat_result) -> None:
    """The source's mode and, when the shell may, its owner (the app's uid)."""
    if not stat.S_ISLNK(info.st_mode):
        path.chmod(stat.S_IMODE(info.st_mode))
    if os.geteuid() == 0:
        os.chown(path, info.st_uid, info.st_gid, follow_symlinks=False)


def copy_tree(source: Path, target: Path) -> str:
    """Copy ``source`` to the new ``target``; returns "reflink" or "copy"."""
    copier = _Copier()
    copier.tree(source, target)
    return copier.method


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
        copier = _Copier()
        for source in data_dirs:
            copier.tree(source, partial / "data" / source.name)
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
