"""Snapshots of an app's runtime data (docs/api.md "Backups").

A backup is `$ATRIUM_HOME/backups/<scope>/<appId>/<stamp>-<version>/` holding `backup.json` and
`data/<appId>-<n>/…`, one folder per instance's runtime data. The user scope's backups there are
the bootstrap admin's; any other user's user scope keeps its own under
`$ATRIUM_HOME/backups/users/<id>/<appId>/` (decisions.md "Users: backups per user"). It is written as `<name>.partial`
and renamed when complete, so a listed backup is always whole. Files are cloned (reflink, the
`FICLONE` ioctl) where the filesystem shares blocks copy-on-write, and copied otherwise; never
hard-linked: an app that writes a file in place (SQLite does) would change its "backup" with it
(decisions.md "Backups of runtime data"). Owners and modes are kept, so a restored folder is the app's again.
Every copy goes through fdcopy.py: the app's uid may be changing its data while the shell, often
root, copies it, so nothing is opened, chmod-ed or chown-ed by a path that could be a link by then.

`backup.json` (format 2) also holds a ``sequence``, one more than any other backup of the app
and scope has (the order of backups, whatever the clock did), and ``sizes``: every regular file
under ``data/`` and its size. A backup whose files do not match it is never listed nor restored
(`damage`). A backup is removed by renaming it ``.deleting-<id>`` first, so a kill in the middle
leaves nothing listed; start-up recovery finishes the removal (decisions.md "Hardening: backups
that survive kills and clocks").

With the scopes in a folder several shells share, the backups are there too
(`atrium.scopes.backups_root`), and another shell may be writing a snapshot or removing a backup
in the same folder: a snapshot that fails removes only its own ``.partial``. A kill's
``.partial`` there goes at the app's next prune, which holds the app's operation lock among the
shells, so no snapshot of the app is under way anywhere; a starting shell, which holds no lock,
leaves it (decisions.md "Several shells: backups beside the shared data").
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from atrium.distribution import fdcopy
from atrium.distribution.journal import faultpoint
from atrium.distribution.swap import exchange, move_new
from atrium.errors import BackupDamaged, InvalidRequest
from atrium.files import sync_dir, write_atomic
from atrium.scopes import Scope

_LOGGER = logging.getLogger(__name__)

#: backups kept per app and scope (older ones go after a successful operation)
KEEP: Final = 5
#: 2 added ``sequence`` and ``sizes``; a format 1 backup is still read (ordered by its stamp
#: before every sequenced one, checked by its file count and byte total)
FORMAT: Final = 2
MANIFEST: Final = "backup.json"
#: a backup on its way out: renamed out of the listing before any of it is removed
DELETING: Final = ".deleting-"
#: a snapshot being written: ``.<name>.partial``
PARTIAL: Final = ".partial"


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
    #: the backup's place in the order of the app's backups; 0: written before there was one
    sequence: int = 0
    #: every regular file under ``data/`` (``<folder>/<path>``) and its size; None: format 1
    sizes: Mapping[str, int] | None = None

    @property
    def data_dirs(self) -> list[Path]:
        return [self.path / "data" / name for name in self.folders]

    @property
    def order(self) -> tuple[int, str]:
        """Older first: by sequence, and among backups from before sequences by their stamp."""
        return (self.sequence, self.id)

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
            "sequence": self.sequence,
        }


def copy_tree(source: Path, target: Path) -> str:
    """Copy ``source`` to the new ``target`` through descriptors only (fdcopy.py); returns
    "reflink" or "copy"."""
    return fdcopy.copy_tree(source, target).method


#: under the backups root: ``<id>/<appId>/``, each user's own user-scope backups, and
#: ``<id>/global/<appId>/`` (``system``), that user's own data of a shared app (no app id is
#: one word, so neither name is an app's)
USERS: Final = "users"


class BackupStore:
    """The backups under ``root`` (`atrium.scopes.backups_root`) seen by one user's pipeline:
    the shared scopes' and that user's user scope's. ``user`` None: the bootstrap admin's (and
    the whole store, for start-up recovery and `atrium doctor`). ``shared``: the store of that
    user's own data of the shared scopes' apps too (`DataKeeping.own`), not the bootstrap
    admin's. ``several``: other shells write in ``root`` too (the module docstring)."""

    def __init__(
        self, root: Path, user: str | None = None, *, shared: bool = False, several: bool = False
    ) -> None:
        self.root = root
        self.user = user
        self.shared = shared
        self.several = several

    def folder(self, scope: Scope, app_id: str) -> Path:
        if (owner := self.owner(scope)) is not None:
            if scope is not Scope.USER:
                return self.root / USERS / owner / scope.value / app_id
            return self.root / USERS / owner / app_id
        return self.root / scope.value / app_id

    def owner(self, scope: Scope) -> str | None:
        """Whose data folders the scope's backups hold: ``user`` for the user scope (and for
        every scope when ``shared``), else None (the bootstrap admin's, in the app
        directories)."""
        return self.user if scope is Scope.USER or self.shared else None

    def checked(self, scope: Scope, app_id: str) -> list[tuple[Backup, str | None]]:
        """Every backup of the app, newest first, each with what is wrong with its files (None:
        intact). Reads every file's size: blocking."""
        folder = self.folder(scope, app_id)
        found = []
        for path in folder.iterdir() if folder.is_dir() else []:
            backup = (
                None if path.name.startswith(".") else _read(path, scope, app_id, self.owner(scope))
            )
            if backup is not None:
                found.append((backup, damage(backup)))
        return sorted(found, key=lambda item: item[0].order, reverse=True)

    def all(self, scope: Scope, app_id: str) -> list[Backup]:
        """Complete, intact backups, newest first."""
        return [backup for backup, problem in self.checked(scope, app_id) if problem is None]

    def get(self, scope: Scope, app_id: str, backup_id: str) -> Backup | None:
        """The backup ``backup_id`` when it is one of the app's; BackupDamaged when its files
        do not match its record."""
        if "/" in backup_id or backup_id.startswith("."):
            return None
        backup = _read(self.folder(scope, app_id) / backup_id, scope, app_id, self.owner(scope))
        if backup is not None and (problem := damage(backup)) is not None:
            raise BackupDamaged(app_id, backup_id, problem)
        return backup

    def _next_sequence(self, folder: Path) -> int:
        """One more than any backup in ``folder`` has (damaged ones count: their number stays
        theirs)."""
        highest = 0
        for path in folder.iterdir():
            if path.name.startswith("."):
                continue
            try:
                number = json.loads((path / MANIFEST).read_text()).get("sequence", 0)
            except (OSError, ValueError, AttributeError):
                continue
            if type(number) is int:
                highest = max(highest, number)
        return highest + 1

    def snapshot(
        self, scope: Scope, app_id: str, version: str, data_dirs: list[Path], reason: str
    ) -> Backup:
        """Copy ``data_dirs`` (the app's runtime data folders) into a new backup, checked against
        its record once in place. One that fails leaves nothing behind (its own ``.partial``
        goes; another shell's, in a shared folder, stays). Blocking."""
        now = datetime.now(UTC)
        name = f"{now:%Y%m%dT%H%M%S%fZ}-{version}"
        partial = self.folder(scope, app_id) / f".{name}{PARTIAL}"
        try:
            backup = self._write(scope, app_id, version, data_dirs, reason, now, name)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        if (problem := damage(backup)) is not None:
            remove(backup.path)
            raise OSError(errno.EIO, f"the backup {backup.path} does not read back: {problem}")
        return backup

    def _write(
        self,
        scope: Scope,
        app_id: str,
        version: str,
        data_dirs: list[Path],
        reason: str,
        now: datetime,
        name: str,
    ) -> Backup:
        folder = self.folder(scope, app_id)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.root.chmod(0o700)
        partial = folder / f".{name}{PARTIAL}"
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
            "sequence": self._next_sequence(folder),
            "sizes": copier.sizes,
        }
        with (partial / MANIFEST).open("x") as file:
            json.dump(manifest, file)
            file.flush()
            os.fsync(file.fileno())
        sync_dir(partial)
        partial.rename(folder / name)
        sync_dir(folder)
        backup = _read(folder / name, scope, app_id, self.owner(scope))
        if backup is None:  # pragma: no cover - just written
            raise OSError(f"the backup {folder / name} cannot be read back")
        return backup

    def prune(self, scope: Scope, app_id: str, keep: int = KEEP) -> list[str]:
        """Delete every backup older than the ``keep`` newest intact ones (a damaged backup
        among those stays for the operator, and never takes an intact one's place), and stale
        partial ones; the ids removed. The caller holds the app's operation lock (among the
        shells too when they share this folder): every ``.partial`` of the app is a kill's."""
        folder = self.folder(scope, app_id)
        gone: list[str] = []
        kept = 0
        for backup, problem in self.checked(scope, app_id):
            if kept >= keep:
                gone.append(backup.id)
            elif problem is None:
                kept += 1
        for backup_id in gone:
            try:
                remove(folder / backup_id)
            except FileNotFoundError:
                pass  # another shell sharing the folder removed it first
            except OSError as err:  # out of the listing already; the next start finishes it
                _LOGGER.warning("removing the backup %s failed: %s", folder / backup_id, err)
        for stale in folder.glob(f".*{PARTIAL}") if folder.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)
        return gone

    def remove_all(self, scope: Scope, app_id: str) -> None:
        """Remove every backup of the app, and its folder (a dev copy's, when it goes): each
        backup out of the listing first, as `prune` does, so a kill leaves none listed half."""
        folder = self.folder(scope, app_id)
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            if not path.name.startswith(".") and path.is_dir() and not path.is_symlink():
                try:
                    remove(path)
                except OSError as err:  # out of the listing already; the next start finishes it
                    _LOGGER.warning("removing the backup %s failed: %s", path, err)
        shutil.rmtree(folder, ignore_errors=True)

    def _app_folders(self) -> Iterator[tuple[Scope, str | None, Path]]:
        """Every app's folder of backups, its scope and whose: each scope's (None: the
        bootstrap admin's), and each other user's own user-scope ones and own data of the
        shared scopes' apps (``<id>/global/``, ``<id>/system/``)."""
        roots: list[tuple[Scope, str | None, Path]] = [
            (scope, None, self.root / scope.value) for scope in Scope
        ]
        users = self.root / USERS
        if users.is_dir() and not users.is_symlink():
            for mine in sorted(users.iterdir()):
                roots.append((Scope.USER, mine.name, mine))
                roots += [(s, mine.name, mine / s.value) for s in Scope if s is not Scope.USER]
        shared = {s.value for s in Scope if s is not Scope.USER}
        for scope, user, root in roots:
            if not root.is_dir() or root.is_symlink():
                continue
            for folder in sorted(root.iterdir()):
                if scope is Scope.USER and user is not None and folder.name in shared:
                    continue  # that user's own data of the shared apps: a root of its own
                if folder.is_dir() and not folder.is_symlink():
                    yield scope, user, folder

    def leftovers(self) -> list[Path]:
        """Removals and snapshots a kill cut off (``.deleting-<id>``, ``.<name>.partial``). In a
        folder other shells share, a ``.partial`` may be another shell's snapshot under way: it
        is left to the app's next prune. A ``.deleting-`` is a removal decided already, which
        either shell may finish."""
        return [
            path
            for _, _, folder in self._app_folders()
            for path in sorted(folder.iterdir())
            if (
                path.name.startswith(DELETING)
                or (not self.several and path.name.startswith(".") and path.name.endswith(PARTIAL))
            )
        ]

    def recover(self) -> list[str]:
        """At start, before any operation: finish the removals and drop the partial snapshots a
        kill cut off; one line per folder. Blocking."""
        done: list[str] = []
        for path in self.leftovers():
            shutil.rmtree(path, ignore_errors=True)
            if path.name.startswith(DELETING):
                done.append(f"finished removing the backup {path}")
            else:
                done.append(f"removed the partial backup {path} (a snapshot cut off)")
            sync_dir(path.parent)
            _LOGGER.warning("%s", done[-1])
        return done

    def unusable(self) -> list[tuple[Path, str]]:
        """Folders in the backups that are not intact backups of their app and scope, and why
        (for `atrium doctor`). Blocking."""
        found: list[tuple[Path, str]] = []
        for scope, user, folder in self._app_folders():
            for path in sorted(folder.iterdir()):
                if path.name.startswith("."):
                    continue
                backup = _read(path, scope, folder.name, user)
                problem = (
                    f"no readable {MANIFEST} of {folder.name} in the {scope} scope"
                    if backup is None
                    else damage(backup)
                )
                if problem is not None and path.exists():  # (not removed meanwhile)
                    found.append((path, problem))
        return found


def remove(path: Path) -> None:
    """Remove the backup ``path``: renamed ``.deleting-<id>`` first (out of every listing), so a
    kill in the middle leaves no half backup listed; start-up recovery finishes the removal."""
    doomed = path.with_name(f"{DELETING}{path.name}")
    shutil.rmtree(doomed, ignore_errors=True)
    path.rename(doomed)
    sync_dir(path.parent)
    (doomed / MANIFEST).unlink(missing_ok=True)
    faultpoint("prune-removing")
    shutil.rmtree(doomed)


def file_sizes(data: Path) -> dict[str, int]:
    """Every regular file under ``data`` (a backup's ``data/``) as ``<folder>/<path>`` and its
    size; links are not followed. Blocking."""
    sizes: dict[str, int] = {}
    pending = [(data, "")]
    while pending:
        folder, prefix = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                name = f"{prefix}{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    pending.append((Path(entry.path), f"{name}/"))
                elif entry.is_file(follow_symlinks=False):
                    sizes[name] = entry.stat(follow_symlinks=False).st_size
    return sizes


def damage(backup: Backup) -> str | None:
    """What in the backup's files does not match its `backup.json`, or None: the first file
    missing, of another size or not listed (format 1: the file count and byte total). Sizes, not
    contents: reading every byte would cost each listing a full read of every backup."""
    data = backup.path / "data"
    try:
        for folder in backup.folders:
            if not (data / folder).is_dir() or (data / folder).is_symlink():
                return f"data/{folder} is missing"
        found = file_sizes(data)
    except OSError as err:
        return f"data/ cannot be read: {err}"
    if backup.sizes is None:
        files, total = len(found), sum(found.values())
        if (files, total) != (backup.files, backup.bytes):
            return (
                f"data/ holds {files} files of {total} bytes, {MANIFEST} says {backup.files} "
                f"of {backup.bytes}"
            )
        return None
    return _sizes_problem(backup.sizes, found)


def _sizes_problem(listed: Mapping[str, int], found: Mapping[str, int]) -> str | None:
    """The first file ``listed`` (by `backup.json`) missing from ``found`` or of another size,
    else the first found file not listed; None when they agree."""
    for name, size in sorted(listed.items()):
        if name not in found:
            return f"data/{name} is missing"
        if found[name] != size:
            return f"data/{name} is {found[name]} bytes, {MANIFEST} says {size}"
    extra = sorted(set(found) - set(listed))
    return f"data/{extra[0]} is not in {MANIFEST}" if extra else None


def _sizes_of(data: dict[str, Any], folders: list[str]) -> dict[str, int] | None:
    """Format 2's ``sizes``, each path inside one of ``folders``; None for format 1."""
    if data["format"] == 1:
        return None
    if data["format"] != FORMAT or not isinstance(data["sizes"], dict):
        raise ValueError(f"unknown {MANIFEST} format {data['format']!r}")
    sizes: dict[str, int] = data["sizes"]
    inside = tuple(f"{folder}/" for folder in folders)
    for name, size in sizes.items():
        path = f"{name}/"
        if not path.startswith(inside) or "//" in path or "/./" in path or "/../" in path:
            raise ValueError(f"{name!r} is no path inside the backup's folders")
        if type(size) is not int or size < 0:
            raise ValueError(f"{name!r} has no size")
    return sizes


def data_folder_re(app_id: str, user: str | None = None) -> re.Pattern[str]:
    """Names of the app's runtime data folders: `<appId>-<n>`, the bootstrap admin's; those of
    another ``user``'s instances are `<appId>~<user>-<n>` (`InstanceIndex.id_prefix`)."""
    prefix = re.escape(app_id if user is None else f"{app_id}~{user}")
    return re.compile(rf"{prefix}-[0-9]+")


def _read(path: Path, scope: Scope, app_id: str, user: str | None = None) -> Backup | None:
    """The backup in ``path``, when it is one of ``app_id`` in ``scope`` (its own record says
    so) holding data folders of ``user``'s (None: the bootstrap admin's): a folder placed there
    by other means is not taken for one. Its files are not checked here (`damage`)."""
    try:
        data = json.loads((path / MANIFEST).read_text())
        if (data["appId"], data["scope"]) != (app_id, scope.value):
            return None
        folder = data_folder_re(app_id, user)
        if not all(isinstance(f, str) and folder.fullmatch(f) for f in data["folders"]):
            return None  # only runtime data folders, never a path elsewhere
        sizes = _sizes_of(data, list(data["folders"]))
        sequence = 0 if sizes is None else data["sequence"]
        if type(sequence) is not int or (sizes is not None and sequence < 1):
            return None
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
            sequence=sequence,
            sizes=sizes,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def place(folders: list[Path], staged: Path) -> None:
    """Copy runtime data folders (a backup's, an export's) into the staged tree, by name."""
    for folder in folders:
        copy_tree(folder, staged / folder.name)


def copied_problem(backup: Backup, copied: fdcopy.Copied) -> str | None:
    """What in a copy of the backup's data does not match its `backup.json` (as `damage` words
    it), or None. The copy is what gets used, so it is the copy that is checked: a file of the
    backup that went or changed after the backup's own check is caught here."""
    if backup.sizes is None:
        if (copied.files, copied.bytes) == (backup.files, backup.bytes):
            return None
        return (
            f"its copy holds {copied.files} files of {copied.bytes} bytes, {MANIFEST} says "
            f"{backup.files} of {backup.bytes}"
        )
    return _sizes_problem(backup.sizes, copied.sizes)


def copy_checked(backup: Backup, staged: Path) -> None:
    """Copy each of the backup's data folders into ``staged`` (by name) and check the copy
    against its `backup.json`: BackupDamaged when they differ (``staged`` then holds the copy,
    which goes with the staging folder)."""
    copied = fdcopy.Copied()
    for name in backup.folders:
        fdcopy.copy_tree(backup.path / "data" / name, staged / name, into=copied, prefix=name)
    if (problem := copied_problem(backup, copied)) is not None:
        raise BackupDamaged(backup.app_id, backup.id, problem)


#: beside a restore's staging folder (`.staging/<opId>.restore.json`) while its exchanges run
PLAN_SUFFIX: Final = ".restore.json"


def swap_data(backup: Backup, app_dir: Path, staging_dir: Path) -> None:
    """The backup's folders, copied whole and checked against its record (BackupDamaged, the live
    data untouched, when they differ), each replace the live one in one exchange (the live one
    lands in the staging folder, which goes when the operation ends).

    One exchange per folder, so a kill between two would leave some folders restored and the
    others not, the old ones in staging (removed at start): a mix of two states. Before the first
    exchange a plan names each folder and the inode of its checked copy; `finish_restore` at
    start-up (or an exchange that fails here) completes the set from it."""
    copy_checked(backup, staging_dir)
    faultpoint("restore-copied")
    exchange_in(staging_dir, list(backup.folders), app_dir)


def exchange_in(staging_dir: Path, names: list[str], app_dir: Path) -> None:
    """Each folder ``names`` of ``staging_dir`` (whole copies) replaces its live namesake in
    ``app_dir`` in one exchange, under a plan `finish_restore` completes after a kill."""
    plan = staging_dir.with_name(staging_dir.name + PLAN_SUFFIX)
    copies = {name: (staging_dir / name).lstat().st_ino for name in names}
    write_atomic(plan, json.dumps({"appDir": str(app_dir), "folders": copies}))
    sync_dir(plan.parent)
    for name in names:
        _swap_in(staging_dir / name, app_dir / name)
        sync_dir(app_dir)
        faultpoint("restore-exchanged")
    plan.unlink()
    sync_dir(plan.parent)


def owned_name(name: str, app_id: str, owner: str | None) -> str:
    """A runtime data folder's name (``<appId>-<n>`` or ``<appId>~<user>-<n>``) as ``owner``'s
    instance of the same number names it (None: the bootstrap admin's, ``<appId>-<n>``): an
    export holds folders of the first shape whoever made it, and an import gives them to the
    importing user."""
    number = name.rpartition("-")[2]
    return f"{app_id}-{number}" if owner is None else f"{app_id}~{owner}-{number}"


#: the longest file name (bytes) a Linux file system takes
NAME_MAX: Final = 255


def place_as(folders: list[Path], target: Path, app_id: str, owner: str) -> list[str]:
    """Copy runtime data folders (an export's, ``<appId>-<n>``) into ``target`` as ``owner``'s
    (``<appId>~<owner>-<n>``); their new names."""
    names = [owned_name(folder.name, app_id, owner) for folder in folders]
    for name in names:
        if len(name.encode()) > NAME_MAX:  # (`<appId>-<n>` fitted; the user's id lengthens it)
            raise InvalidRequest(
                f"cannot import this archive, nothing was changed: its data folder number "
                f"{name.rpartition('-')[2][:20]}… is too long for a folder of {owner}'s"
            )
    for folder, name in zip(folders, names, strict=True):
        copy_tree(folder, target / name)
    return names


def replace_data(copies: Path, names: list[str], home: Path, live: list[Path]) -> None:
    """Make the folders ``names`` of ``copies`` the live data in ``home``: the live folders
    (``live``) of other names are set aside in ``copies``' staging, and each of ``names``
    exchanges with its live namesake (`exchange_in`). What a rollback or an import does to the
    data of a user whose data is not in the app's tree."""
    aside = copies.with_name(copies.name + "-old")
    aside.mkdir(exist_ok=True)
    for folder in live:
        if folder.name not in names:
            folder.rename(aside / folder.name)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    sync_dir(home)
    exchange_in(copies, names, home)


def _swap_in(copy: Path, live: Path) -> None:
    if live.exists():
        exchange(copy, live)
    else:
        move_new(copy, live)


def finish_restore(plan: Path) -> str:
    """Complete the restore a kill interrupted between its exchanges: every folder whose live
    copy is not yet the checked one (its inode) is exchanged with it, then the plan goes. The
    copies were whole and checked before the plan was written, so forward is the one state."""
    data = json.loads(plan.read_text())
    app_dir = Path(data["appDir"])
    staging_dir = plan.with_name(plan.name.removesuffix(PLAN_SUFFIX))
    swapped = []
    for name, inode in data["folders"].items():
        live, copy = app_dir / name, staging_dir / name
        if live.exists() and live.lstat().st_ino == inode:
            continue
        if copy.exists() and copy.lstat().st_ino == inode:
            _swap_in(copy, live)
            sync_dir(app_dir)
            swapped.append(name)
    plan.unlink()
    sync_dir(plan.parent)
    return f"restore into {app_dir} interrupted between its folders: finished {swapped or 'none'}"
