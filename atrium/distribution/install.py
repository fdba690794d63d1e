"""The install stage: the staged tree goes into place atomically with its runtime data, the record
is written, the scope repository gets one commit; uninstall likewise; recovery at start.

Every step is journaled first (atrium.distribution.journal). Until the commit, a failure undoes everything
(InstallFailed: nothing changed on disk); after a crash, `recover` finishes an operation whose new
state is in place and undoes any other, so the scope always holds the old or the new version with
its data, and the scope repository is clean. Knows nothing of instances: the pipeline stops them
before and restarts them after.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from atrium.distribution.backups import PLAN_SUFFIX, finish_restore
from atrium.distribution.journal import (
    QUARANTINE_SUFFIX,
    Journal,
    JournalStore,
    Step,
    faultpoint,
    inode,
)
from atrium.distribution.records import RECORDS_DIR, InstallRecord, RecordStore
from atrium.distribution.swap import exchange, move_new
from atrium.distribution.validate import runtime_dir_re
from atrium.errors import InstallFailed, StorageFull
from atrium.files import sync_dir, touched_since
from atrium.git import GitError, ScopeRepo, run_git
from atrium.scopes import Scope, ScopeLayout

_LOGGER = logging.getLogger(__name__)
#: seconds a staging folder in a shared scope folder stays after it was last touched, before a
#: starting shell takes it for one a dead shell left (another shell may be fetching into it)
SHARED_STAGING_AGE: Final = 3600.0


@dataclass(frozen=True, slots=True)
class InstallPlan:
    """What the install stage does: put ``staged`` in place as ``record`` describes."""

    op: Literal["install", "update", "rollback"]
    staged: Path
    record: InstallRecord
    message: str
    #: move the live runtime data into the new tree (False: the staged tree already holds the
    #: data restored from a backup; the live data goes with the old tree, after its snapshot)
    move_data: bool = True

    @property
    def scope(self) -> Scope:
        return Scope(self.record.scope)


def _disk_full(err: OSError | GitError) -> bool:
    """Whether the disk was full: the errno of a write, or git's own words (it runs with
    LC_ALL=C, so they are strerror's)."""
    if isinstance(err, GitError):
        return "No space left on device" in err.stderr or "Disk quota exceeded" in err.stderr
    return err.errno in {errno.ENOSPC, errno.EDQUOT}


def app_paths(app_id: str) -> tuple[str, str]:
    """What one operation changes in the scope repository: the app directory and its record."""
    return f"apps/{app_id}", f"{RECORDS_DIR}/{app_id}.json"


async def commit_app(repo: ScopeRepo, app_id: str, message: str) -> bool:
    """Commit the app directory and record of ``app_id`` as one commit, and nothing else (another
    app's operation may be half-way in the same scope); False when they hold no change, which is
    also how recovery knows an interrupted operation was already committed."""
    async with repo.lock:
        wanted = app_paths(app_id)
        indexed = await run_git("ls-files", "-z", "--", *wanted, cwd=repo.root)
        # the last commit too: a git killed inside this commit may have staged the deletion of
        # every path already (index written, HEAD not moved); that change must still be committed
        committed = await run_git(
            "ls-tree", "-r", "--name-only", "-z", "HEAD", "--", *wanted, cwd=repo.root, check=False
        )
        present = [
            p
            for p in wanted
            if _lists(indexed, p) or await asyncio.to_thread(os.path.lexists, repo.root / p)
        ]
        known = [p for p in wanted if p in present or _lists(committed, p)]
        if not known:
            return False
        if present:  # `git add` refuses a path that is neither in the index nor on disk
            await run_git("add", "--all", "--", *present, cwd=repo.root)
        status = await run_git("status", "--porcelain", "--", *known, cwd=repo.root)
        if not status.strip():
            return False
        # the index, staged above, is the commit when it holds no other change: a commit naming
        # paths reads every path the last commit held again from disk, and fails on a file that
        # became a folder ("does not have a commit checked out")
        staged = await run_git("diff", "--cached", "--name-only", "-z", cwd=repo.root)
        others = [f for f in staged.split("\0") if f and not any(_lists(f, p) for p in known)]
        only = ["--", *known] if others else []
        await repo.fence()
        await run_git("commit", "--quiet", "-m", message, *only, cwd=repo.root)
        return True


def _lists(listing: str, path: str) -> bool:
    """Whether a NUL-separated git listing holds ``path`` or something under it."""
    return any(f == path or f.startswith(f"{path}/") for f in listing.split("\0"))


async def changed_files(repo: ScopeRepo, app_id: str) -> list[str]:
    """Paths in the app's installed tree that differ from its commit (edited, deleted or added by
    hand, or damaged), scope-relative; runtime data folders are ignored by git and never listed."""
    async with repo.lock:
        out = await run_git(
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--no-renames",
            "--",
            app_paths(app_id)[0],
            cwd=repo.root,
        )
    return sorted(item[3:] for item in out.split("\0") if item)


class Installer:
    """Moves trees into and out of the mutable scopes; one operation per app at a time (the
    pipeline's lock)."""

    def __init__(
        self, layout: ScopeLayout, repos: Mapping[Scope, ScopeRepo], records: RecordStore
    ) -> None:
        self._layout = layout
        self._repos = repos
        self._records = records
        self.journals = JournalStore(layout)

    @property
    def repos(self) -> Mapping[Scope, ScopeRepo]:
        return self._repos

    # -- install ----------------------------------------------------------------------------------

    async def install(self, plan: InstallPlan) -> None:
        """Raises InstallFailed (after undoing every step) when the disk or git fails. The
        scope's one writer meanwhile (`ScopeRepo.writing`), which first finishes or undoes what
        a writer that died left (its journals)."""
        async with self._repos[plan.scope].writing():
            await self._recover_dead_writers(plan.scope)
            await self._install(plan)

    async def _install(self, plan: InstallPlan) -> None:
        scope, app_id = plan.scope, plan.record.id
        old = self._records.get(scope, app_id)
        journal = Journal(
            op=plan.op,
            op_id=plan.staged.parent.name,
            app_id=app_id,
            scope=scope,
            target=self._layout.app_dir(scope, app_id),
            staged=plan.staged,
            inode=plan.staged.stat().st_ino,
            record=plan.record.wire(),
            old_record=old.wire() if old else None,
            message=plan.message,
        )
        try:
            await asyncio.to_thread(self._swap_in, journal, plan.move_data)
            await asyncio.to_thread(self._keep_old_record, journal)
            await asyncio.to_thread(self._records.put, plan.record)
            faultpoint("record")
            await commit_app(self._repos[scope], app_id, plan.message)
            faultpoint("commit")
        except (OSError, GitError) as err:
            _LOGGER.warning("install of %s into %s failed, undoing it: %s", app_id, scope, err)
            await self._undo_or_leave(journal, err)
            raise InstallFailed(app_id, str(err)) from err
        await asyncio.to_thread(self._clean_up, journal)

    def _swap_in(self, journal: Journal, move_data: bool = True) -> None:
        target, staged = journal.target, journal.staged
        journal.replaces = inode(target) is not None
        self.journals.write(journal, Step.BEGIN)
        faultpoint("begin")
        if journal.replaces and move_data:
            reserved = runtime_dir_re(journal.app_id)
            journal.data_dirs = sorted(
                p.name for p in target.iterdir() if p.is_dir() and reserved.fullmatch(p.name)
            )
            self.journals.write(journal, Step.DATA)
            for name in journal.data_dirs:
                (target / name).rename(staged / name)
                faultpoint("data")  # the first move: a crash half-way through the data
            faultpoint("data")
        self.journals.write(journal, Step.SWAP)
        faultpoint("swap")
        target.parent.mkdir(parents=True, exist_ok=True)
        if journal.replaces:
            exchange(staged, target)
        else:
            move_new(staged, target)
        sync_dir(target.parent)
        sync_dir(staged.parent)
        faultpoint("swapped")
        self.journals.write(journal, Step.SWAPPED)

    # -- uninstall --------------------------------------------------------------------------------

    async def uninstall(self, scope: Scope, app_id: str, staging: Path, message: str) -> None:
        """Move the app directory (with its runtime data) out, delete its record, commit; as
        the scope's one writer, like `install`."""
        async with self._repos[scope].writing():
            await self._recover_dead_writers(scope)
            await self._uninstall(scope, app_id, staging, message)

    async def _uninstall(self, scope: Scope, app_id: str, staging: Path, message: str) -> None:
        target = self._layout.app_dir(scope, app_id)
        target_inode = inode(target)
        if target_inode is None:
            raise InstallFailed(app_id, f"{target} does not exist")
        old = self._records.get(scope, app_id)
        journal = Journal(
            op="uninstall",
            op_id=staging.name,
            app_id=app_id,
            scope=scope,
            target=target,
            staged=staging / app_id,
            inode=target_inode,
            old_record=old.wire() if old else None,
            message=message,
        )
        try:
            await asyncio.to_thread(self._move_out, journal)
            await asyncio.to_thread(self._keep_old_record, journal)
            await asyncio.to_thread(self._records.delete, scope, app_id)
            faultpoint("record")
            await commit_app(self._repos[scope], app_id, message)
            faultpoint("commit")
        except (OSError, GitError) as err:
            _LOGGER.warning("uninstall of %s from %s failed, undoing it: %s", app_id, scope, err)
            await self._undo_or_leave(journal, err)
            if _disk_full(err):
                root = self._layout.root(scope)
                raise StorageFull(
                    f"removing {app_id!r} failed for want of space in {root}, nothing was "
                    f"changed: {err}",
                    path=str(root),
                ) from err
            raise InstallFailed(app_id, str(err)) from err
        await asyncio.to_thread(self._clean_up, journal)

    def _move_out(self, journal: Journal) -> None:
        self.journals.write(journal, Step.BEGIN)
        faultpoint("begin")
        self.journals.write(journal, Step.REMOVE)
        faultpoint("remove")
        journal.target.rename(journal.staged)
        sync_dir(journal.target.parent)
        faultpoint("removed")
        self.journals.write(journal, Step.REMOVED)

    # -- finishing and undoing --------------------------------------------------------------------

    @staticmethod
    def is_done(journal: Journal) -> bool:
        """Whether the operation's new state is in place (decided from inodes on disk)."""
        if journal.op == "uninstall":
            return inode(journal.target) != journal.inode  # moved out (and maybe deleted)
        return inode(journal.target) == journal.inode

    def _clean_up(self, journal: Journal) -> None:
        shutil.rmtree(journal.staged, ignore_errors=True)
        faultpoint("cleanup")
        self.journals.remove(journal)

    async def _finish(self, journal: Journal) -> None:
        """Roll forward an operation whose new state is in place."""
        if journal.op == "uninstall":
            await asyncio.to_thread(self._records.delete, journal.scope, journal.app_id)
        elif journal.record is not None:
            record = InstallRecord.model_validate(journal.record)
            await asyncio.to_thread(self._records.put, record)
        await commit_app(self._repos[journal.scope], journal.app_id, journal.message)
        await asyncio.to_thread(self._clean_up, journal)

    def _old_record_copy(self, journal: Journal) -> Path:
        """Where the old record waits during an operation: in the operation's staging folder (same
        filesystem), so putting it back is a rename that needs no new disk space."""
        return journal.staged.parent / "record.old.json"

    def _keep_old_record(self, journal: Journal) -> None:
        """Hard-link the old record aside before the new one replaces it (or uninstall deletes it):
        undo renames it back instead of writing it again (issue 14: the undo's rewrite hit the
        same full disk)."""
        current = self._records.path(journal.scope, journal.app_id)
        if journal.old_record is not None and current.exists():
            os.link(current, self._old_record_copy(journal))

    def _record_is_old(self, journal: Journal) -> bool:
        """Whether the record on disk is still the old one (the failure came before it was
        replaced): then the undo writes nothing."""
        current = self._records.get(journal.scope, journal.app_id)
        return (current.wire() if current else None) == journal.old_record

    async def _undo_or_leave(self, journal: Journal, cause: BaseException) -> None:
        """Undo; if even that fails, leave the journal for recovery at the next start and say so
        (the operation's answer is still install_failed with the cause)."""
        try:
            await self._undo(journal)
        except (OSError, GitError) as err:
            _LOGGER.error(
                "undoing %s of %s failed too (%s, after %s); recovery finishes it at the next start",
                journal.op,
                journal.app_id,
                err,
                cause,
            )

    async def _undo(self, journal: Journal) -> None:
        """Put the old state back: old tree, its runtime data, its record, a clean git index."""
        await asyncio.to_thread(self._undo_disk, journal)
        repo = self._repos[journal.scope]
        async with repo.lock:
            paths = app_paths(journal.app_id)
            await run_git("reset", "--quiet", "--", *paths, cwd=repo.root, check=False)
        await asyncio.to_thread(self.journals.remove, journal)

    def _undo_disk(self, journal: Journal) -> None:
        target, staged = journal.target, journal.staged
        if journal.op == "uninstall":
            if inode(staged) == journal.inode and inode(target) is None:
                staged.rename(target)
        elif inode(target) == journal.inode:
            if journal.replaces:
                exchange(staged, target)
            else:
                target.rename(staged)
        for name in journal.data_dirs:
            if (staged / name).is_dir() and not (target / name).exists():
                (staged / name).rename(target / name)
        kept = self._old_record_copy(journal)
        if journal.step in {Step.SWAPPED, Step.REMOVED} and kept.exists():
            kept.replace(self._records.path(journal.scope, journal.app_id))
        elif journal.step in {Step.SWAPPED, Step.REMOVED} and not self._record_is_old(journal):
            if journal.old_record is not None:
                self._records.put(InstallRecord.model_validate(journal.old_record))
            else:
                self._records.delete(journal.scope, journal.app_id)
        sync_dir(target.parent)

    # -- recovery at start ------------------------------------------------------------------------

    async def recover(self, scopes: tuple[Scope, ...] = (Scope.GLOBAL, Scope.USER)) -> list[str]:
        """Finish or undo every interrupted operation, then clear staging; returns what was done,
        one line per operation (for the log). Runs before the registry's first scan of
        ``scopes`` (a user scope first opened later recovers alone: never the live global one)."""
        done: list[str] = []
        for scope in scopes:
            repo = self._repos[scope]
            # the other shells are told only when a journal changed the repository
            async with repo.writing(announce=False):
                recovered = await self._recover_dead(scope)
                if recovered:
                    repo.changed()
                done += recovered
                done += await asyncio.to_thread(self._finish_restores, scope)
                await asyncio.to_thread(self._clear_staging, scope)
        return done

    async def _recover_dead_writers(self, scope: Scope) -> None:
        """Before a write among shells (a guarded repository): what another shell killed in the
        middle of a write left. One shell alone (SQLite) recovers at start only, as before."""
        if self._repos[scope].guard is not None:
            await self._recover_dead(scope)

    async def _recover_dead(self, scope: Scope) -> list[str]:
        """Finish or undo each operation whose journal is in ``scope``. Only while holding the
        scope's writer lock: every live writer then has ended, so a journal found is a dead
        writer's (a shell killed in the middle, here or on another machine sharing the scope)."""
        done: list[str] = []
        for journal in await asyncio.to_thread(self.journals.pending, scope):
            finished = self.is_done(journal)
            try:
                if finished:
                    await self._finish(journal)
                else:
                    await self._undo(journal)
            except (OSError, GitError):
                _LOGGER.exception("recovering %s of %s failed", journal.op, journal.app_id)
                continue
            verb = "finished" if finished else "undone"
            line = (
                f"{journal.op} of {journal.app_id} in {scope} interrupted at {journal.step}: {verb}"
            )
            _LOGGER.warning("%s", line)
            done.append(line)
        return done

    def _finish_restores(self, scope: Scope) -> list[str]:
        """Restores a kill cut between two folders' exchanges, completed (`finish_restore`)."""
        staging = self._layout.staging_dir(scope)
        done = []
        for plan in sorted(staging.glob(f"*{PLAN_SUFFIX}")) if staging.is_dir() else []:
            try:
                done.append(finish_restore(plan))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                _LOGGER.exception("finishing the interrupted restore of %s failed", plan)
                continue
            _LOGGER.warning("%s", done[-1])
        return done

    def _clear_staging(self, scope: Scope) -> None:
        """Remove what operations left in staging without a journal. In a scope folder other
        shells share, another shell may be fetching into staging now (a fetch is not a write of
        the scope, and holds no lock): only what nobody touched for `SHARED_STAGING_AGE` s goes
        (an operation under way touches its folder every `operations.STAGING_TOUCH_EVERY` s)."""
        staging = self._layout.staging_dir(scope)
        if not staging.is_dir():
            return
        oldest = time.time() - SHARED_STAGING_AGE if self._layout.shared else None
        for entry in staging.iterdir():
            # a quarantined folder belongs to an unreadable journal: only an operator may judge it
            if entry.name.endswith(QUARANTINE_SUFFIX):
                continue
            if oldest is not None and touched_since(entry, oldest):
                continue
            if not self.journals.exists(scope, entry.name):
                shutil.rmtree(entry, ignore_errors=True)


async def recover(
    layout: ScopeLayout,
    repos: Mapping[Scope, ScopeRepo],
    scopes: tuple[Scope, ...] = (Scope.GLOBAL, Scope.USER),
) -> list[str]:
    """Start-up recovery of the mutable ``scopes`` (see `Installer.recover`)."""
    return await Installer(layout, repos, RecordStore(layout)).recover(scopes)
