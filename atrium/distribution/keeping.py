"""An installed app's runtime data kept: a backup taken now, a backup put back, and the app
exported whole (docs/api.md "Backups" and "Export and import"). Installing an archive is an
install, so import stays with the pipeline; what the install stage backs up before it swaps goes
through `DataKeeping.snapshot` too.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from atrium.distribution.backups import (
    Backup,
    BackupStore,
    copy_checked,
    place,
    place_as,
    remove,
    replace_data,
    swap_data,
)
from atrium.distribution.exports import check_size, pack
from atrium.distribution.images import export_layout
from atrium.distribution.journal import JournalStore, faultpoint
from atrium.distribution.operations import AppLocks, in_thread, mutable, staging
from atrium.distribution.records import RecordStore
from atrium.distribution.stops import InstanceStops
from atrium.distribution.validate import runtime_folders
from atrium.errors import BackupDamaged, ExportTooLarge, NotFound, StorageFailed, StorageFull
from atrium.events import BackupFailed
from atrium.images.store import ImageStore
from atrium.scopes import Scope, ScopeLayout

_LOGGER = logging.getLogger(__name__)


class DataKeeping:
    """Backups, restore and export of one shell's installed apps."""

    def __init__(
        self,
        *,
        layout: ScopeLayout,
        records: RecordStore,
        journals: JournalStore,
        locks: AppLocks,
        stops: InstanceStops,
        scope_of: Callable[[str], Scope],
        failed: Callable[[BackupFailed], object] | None = None,
    ) -> None:
        self._layout = layout
        #: told of each snapshot that could not be written (the pipeline announces it)
        self._failed = failed
        self._records = records
        self._journals = journals
        self._locks = locks
        self._stops = stops
        #: the app's winning changeable scope, for a call that names none
        self._scope_of = scope_of
        self.backups = BackupStore(layout.backups_root, several=layout.shared)
        #: the backups of this pipeline's user's own data, whatever the app's scope: the
        #: bootstrap admin's are `backups`; another user's data of a shared app is theirs alone
        #: (``backups/users/<id>/global/<appId>/``), never in the admin's global backups
        self.own = self.backups
        #: whose instances a data operation stops (None: every one running the copy)
        self._user: str | None = None
        #: another user's runtime data folder (``scopes/users/<id>/runtime``); None: the
        #: bootstrap admin's pipeline, whose data is inside the app directories
        self._runtime: Path | None = None

    def belong_to(self, user: str) -> None:
        """Make this the pipeline of ``user``, a user other than the bootstrap admin: their user
        scope's backups are their own (`BackupStore` with ``user``), and its runtime data is
        where the lifecycle keeps that user's (`ScopeLayout.runtime_dir`), not in the app
        directory (decisions.md "Users: backups per user")."""
        root, several = self._layout.backups_root, self._layout.shared
        self.backups = BackupStore(root, user, several=several)
        self.own = BackupStore(root, user, shared=True, several=several)
        self._user = user
        self._runtime = self._layout.user_root(user) / "runtime"

    def own_home(self, scope: Scope, app_id: str) -> Path:
        """Where this pipeline's user's instances of the app in ``scope`` keep their data: a
        user other than the bootstrap admin keeps it in their own folder for any scope's app
        (`ScopeLayout.runtime_dir`)."""
        if self._runtime is not None:
            return self._runtime / scope.value / app_id
        return self.data_home(scope, app_id)

    def own_data(self, scope: Scope, app_id: str) -> list[Path]:
        """The runtime data folders of this pipeline's user's own instances of the app in
        ``scope``, a shared scope's app too (what their backup, restore and export act on)."""
        return runtime_folders(self.own_home(scope, app_id), app_id, self.own.owner(scope))

    def data_home(self, scope: Scope, app_id: str) -> Path:
        """The folder holding the app's runtime data folders (``<appId>-<n>``) in ``scope``."""
        if scope is Scope.USER and self._runtime is not None:
            return self._runtime / scope.value / app_id
        return self._layout.app_dir(scope, app_id)

    def live_data(self, scope: Scope, app_id: str) -> list[Path]:
        """The runtime data folders of this pipeline's user's instances of the app in ``scope``
        (another user's are never among them)."""
        return runtime_folders(self.data_home(scope, app_id), app_id, self.backups.owner(scope))

    @asynccontextmanager
    async def carried(
        self, scope: Scope, app_id: str, data: list[Path] | Backup | None, staged: Path
    ) -> AsyncIterator[None]:
        """Around the swap of ``staged`` (the new tree): ``data`` (a backup's folders, or an
        export's ``<appId>-<n>``) becomes the app's runtime data, replacing the live folders.
        The bootstrap admin's data is in the tree, so it is copied into ``staged`` and goes in
        with it. Another user's is in their own runtime folder: it is copied (and a backup's
        copy checked, BackupDamaged before anything is swapped) beside the tree, under their
        names, and exchanged with their live folders once the tree is in; a failed swap leaves
        their data as it was."""
        if data is None:
            yield
            return
        owner = self.backups.owner(scope)
        if owner is None or self._runtime is None:
            if isinstance(data, Backup):
                await asyncio.to_thread(copy_checked, data, staged)
            else:
                await asyncio.to_thread(place, data, staged)
            yield
            return
        copies = staged.parent / ".data"  # (no app id starts with a dot)
        await asyncio.to_thread(copies.mkdir, mode=0o700)
        if isinstance(data, Backup):  # their own backup: its folders have their names
            await asyncio.to_thread(copy_checked, data, copies)
            names = list(data.folders)
        else:
            names = await asyncio.to_thread(place_as, data, copies, app_id, owner)
        yield
        live = self.live_data(scope, app_id)
        await in_thread(replace_data, copies, names, self.data_home(scope, app_id), live)

    async def snapshot(
        self, scope: Scope, app_id: str, reason: str, *, own: bool = False
    ) -> Backup | None:
        """Back up the app's runtime data folders in ``scope`` (None when it has none): those
        that go with its tree (an install's, `live_data`), or with ``own`` this pipeline's
        user's own (`own_data`, into `own`)."""
        record = self._records.get(scope, app_id)
        folders = self.own_data(scope, app_id) if own else self.live_data(scope, app_id)
        if not folders:
            return None
        version = record.version if record else "unknown"
        store = self.own if own else self.backups
        try:
            return await in_thread(store.snapshot, scope, app_id, version, folders, reason)
        except OSError as err:
            error = StorageFull if err.errno == errno.ENOSPC else StorageFailed
            failure = error(
                f"backing up the data of {app_id} into {self.backups.root} failed, nothing was "
                f"changed: {err}",
                path=str(self.backups.root),
            )
            if self._failed is not None:
                owner = self._user or self._layout.user
                self._failed(
                    BackupFailed(app_id, scope.value, reason, failure.message, owner=owner)
                )
            raise failure from err

    def backup_of(self, scope: Scope, app_id: str, version: str) -> tuple[Backup | None, str]:
        """The newest intact backup taken while ``version`` was installed (its data as it was),
        and a note naming the newer ones of that version skipped as damaged ("" when none).
        Backups of ``version`` that are all damaged: BackupDamaged naming the newest. Blocking."""
        of_version = [
            (b, p) for b, p in self.backups.checked(scope, app_id) if b.version == version
        ]
        skipped = list(itertools.takewhile(lambda item: item[1] is not None, of_version))
        intact = of_version[len(skipped)][0] if len(skipped) < len(of_version) else None
        if intact is None and skipped:
            newest, problem = skipped[0]
            raise BackupDamaged(
                app_id,
                newest.id,
                str(problem),
                f"no intact backup of {version} is left to bring its data back; roll back with "
                "keepData: true to keep today's data with the old version",
            )
        if not skipped:
            return intact, ""
        names = ", ".join(f"{b.id} ({p})" for b, p in skipped)
        return intact, f"skipped the damaged backup(s) of {version}: {names}"

    async def backup(self, app_id: str, scope: Scope | None = None) -> Backup:
        """Snapshot the app's runtime data now; its instances stop for the copy and start again."""
        scope = mutable(scope or self._scope_of(app_id), "back up in it")
        async with self._locks.hold(app_id, "backup"):
            async with self._stops.stopped(app_id, scope, self._user):
                taken = await self.snapshot(scope, app_id, "manual", own=True)
            if taken is None:
                raise NotFound(
                    "runtime data", app_id, f"{app_id} has no runtime data in the {scope} scope yet"
                )
            # under the lock: no restore or rollback of this app is reading a backup it removes
            await in_thread(self.own.prune, scope, app_id)
        return taken

    async def restore(
        self, app_id: str, backup_id: str, scope: Scope | None = None
    ) -> dict[str, Any]:
        """Put a backup's data folders back (the current data is backed up first)."""
        scope = mutable(scope or self._scope_of(app_id), "restore in it", self._journals)
        async with self._locks.hold(app_id, "restore"):
            # checked under the lock, just before use (BackupDamaged: nothing is stopped)
            backup = await asyncio.to_thread(self.own.get, scope, app_id, backup_id)
            if backup is None:
                raise NotFound(
                    "backup", backup_id, f"{app_id} has no backup {backup_id!r} in {scope}"
                )
            async with self._stops.stopped(app_id, scope, self._user) as stopped:
                safety = await self.snapshot(scope, app_id, "restore", own=True)
                faultpoint("restore-snapshot")
                async with staging(self._layout, self._journals, scope) as path:
                    home = self.own_home(scope, app_id)
                    await in_thread(swap_data, backup, home, path)
            await in_thread(self.own.prune, scope, app_id)
        _LOGGER.info("%s: restored the data of backup %s", app_id, backup.id)
        return {
            "ok": True,
            "id": app_id,
            "scope": scope.value,
            "restored": backup.wire(),
            "backup": safety.id if safety else None,
            "stopped": stopped,
        }

    async def import_own(self, scope: Scope, app_id: str, folders: list[Path]) -> dict[str, Any]:
        """An archive's runtime data folders (``<appId>-<n>``) become this pipeline's user's own
        data of the app installed in ``scope``, whose tree stays as it is: their instances stop,
        their data is backed up first (``reason: "import"``) and replaced whole; nobody else's is
        read or touched. The caller holds the app's lock."""
        owner = self.own.owner(scope)
        async with self._stops.stopped(app_id, scope, self._user) as stopped:
            safety = await self.snapshot(scope, app_id, "import", own=True)
            async with staging(self._layout, self._journals, scope) as path:
                if owner is None:
                    await asyncio.to_thread(place, folders, path)
                    names = [folder.name for folder in folders]
                else:
                    names = await asyncio.to_thread(place_as, folders, path, app_id, owner)
                live = self.own_data(scope, app_id)
                home = self.own_home(scope, app_id)
                await in_thread(replace_data, path, names, home, live)
                aside = path.with_name(path.name + "-old")  # (the replaced folders: in `safety`)
                await asyncio.to_thread(shutil.rmtree, aside, True)
        await in_thread(self.own.prune, scope, app_id)
        _LOGGER.info("%s: imported an archive's data into the %s scope's copy", app_id, scope)
        return {
            "ok": True,
            "id": app_id,
            "scope": scope.value,
            "dataOnly": True,
            "folders": names,
            "backup": safety.id if safety else None,
            "stopped": stopped,
        }

    async def export(self, app_id: str, target: Path, scope: Scope | None = None) -> Path:
        """Write the app's archive to ``target``: its tree, record and runtime data (a backup
        taken for it, the instances stopped for the copy)."""
        scope = mutable(scope or self._scope_of(app_id), "export from it")
        record = self._records.get(scope, app_id)
        if record is None:
            raise NotFound(
                "install record", app_id, f"{app_id!r} in {scope} was placed by hand: no record"
            )
        async with self._locks.hold(app_id, "export"):
            app_dir = self._layout.app_dir(scope, app_id)
            # an archive no import takes is refused before anything stops or is copied
            # (ExportTooLarge); pack checks the backup's copy again
            live = self.own_data(scope, app_id)
            # the image the app carried goes with it (ImageNotKept when it cannot)
            image = await asyncio.to_thread(
                export_layout, app_dir, ImageStore(self._layout.home / "images")
            )
            await asyncio.to_thread(check_size, app_dir, live, app_id, image)
            async with self._stops.stopped(app_id, scope, self._user):
                taken = await self.snapshot(scope, app_id, "export", own=True)
            data = taken.data_dirs if taken else []
            try:
                await in_thread(pack, target, app_dir, data, record, app_id, image)
            except ExportTooLarge:  # grown since the check: its backup goes with it
                if taken is not None:
                    await in_thread(remove, taken.path)
                raise
            await in_thread(self.own.prune, scope, app_id)
        return target
