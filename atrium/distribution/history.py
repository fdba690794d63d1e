"""An app's history in a scope, read from the scope's git repository (docs/api.md "Rollback").

Every install, update, uninstall and rollback is one commit touching `apps/<id>` and
`records/<id>.json` (`install.commit_app`), so the log of those two paths is the app's history
and the record at each commit says which version it was. Extracting a commit's `apps/<id>` gives
back that version's tree without touching the index or the working tree.
"""

from __future__ import annotations

import asyncio
import errno
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from atrium.distribution.install import app_paths
from atrium.distribution.records import InstallRecord
from atrium.errors import NotFound, StorageFailed, StorageFull
from atrium.git import GitError, ScopeRepo, run_git

#: how far back `history` looks (commits touching the app)
MAX_ENTRIES: Final = 200
OPERATIONS: Final = frozenset({"install", "update", "uninstall", "rollback"})
COMMIT_RE: Final = re.compile(r"^[0-9a-f]{7,40}\Z")
SEPARATOR: Final = "\x1f"


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One commit that changed the app: what it did, and the record it left (None: removed)."""

    commit: str
    when: str
    operation: str
    message: str
    record: InstallRecord | None

    def wire(self) -> dict[str, Any]:
        record = self.record
        return {
            "commit": self.commit,
            "when": self.when,
            "operation": self.operation,
            "message": self.message,
            "version": record.version if record else None,
            "digest": record.digest if record else None,
            "ref": record.ref if record else None,
            "source": record.source if record else None,
            "rollbackOf": record.rollback_of if record else None,
        }


async def app_history(repo: ScopeRepo, app_id: str) -> list[HistoryEntry]:
    """The commits that changed ``app_id`` in the scope, newest first."""
    try:
        out = await run_git(
            "log",
            f"-n{MAX_ENTRIES}",
            f"--format=%H{SEPARATOR}%cI{SEPARATOR}%s",
            "--",
            *app_paths(app_id),
            cwd=repo.root,
        )
    except GitError:
        return []  # a repository without a commit yet
    entries = []
    for line in out.splitlines():
        commit, when, message = line.split(SEPARATOR, 2)
        word = message.split(" ", 1)[0]
        entries.append(
            HistoryEntry(
                commit,
                when,
                word if word in OPERATIONS else "other",
                message,
                await _record_at(repo, commit, app_id),
            )
        )
    return entries


async def _record_at(repo: ScopeRepo, commit: str, app_id: str) -> InstallRecord | None:
    text = await run_git("show", f"{commit}:{app_paths(app_id)[1]}", cwd=repo.root, check=False)
    if not text.strip():
        return None
    try:
        return InstallRecord.model_validate_json(text)
    except ValidationError:
        return None


def pick_target(
    entries: list[HistoryEntry], current: InstallRecord, to: str | None
) -> HistoryEntry:
    """The entry to roll back to: ``to`` as a commit (7-40 hex digits) or a version; by default
    the newest earlier version (a record whose digest differs from the current one). NotFound
    names what was looked for."""
    usable = [e for e in entries if e.record is not None]
    if to is None:
        found = next((e for e in usable if e.record and e.record.digest != current.digest), None)
        if found is None:
            raise NotFound(
                "earlier version",
                current.id,
                f"{current.id} has no earlier version in the {current.scope} scope's history "
                "to roll back to",
            )
        return found
    if COMMIT_RE.fullmatch(to):
        by_commit = [e for e in usable if e.commit.startswith(to)]
        if len(by_commit) == 1:
            return by_commit[0]
    by_version = next((e for e in usable if e.record and e.record.version == to), None)
    if by_version is None:
        raise NotFound(
            "earlier version",
            to,
            f"{current.id} has no version or commit {to!r} in the {current.scope} scope's "
            "history (see `atrium history`)",
        )
    return by_version


async def extract_app(repo: ScopeRepo, commit: str, app_id: str, into: Path) -> Path:
    """Write the app's tree as of ``commit`` into ``into`` (a staging folder) as ``into/<app_id>``,
    as a fetcher would; returns it. Neither the index nor the working tree is touched. A full
    or read-only disk is StorageFull / StorageFailed naming the staging folder (``into``'s
    parent), not a failure of git."""
    archive = into / f".{app_id}.tar"
    try:
        await run_git(
            "archive",
            "--format=tar",
            f"--output={archive}",
            commit,
            app_paths(app_id)[0],
            cwd=repo.root,
        )
    except GitError as err:
        # git runs with LC_ALL=C: these are strerror's own words
        for words, code in (
            ("No space left on device", errno.ENOSPC),
            ("Read-only file system", errno.EROFS),
        ):
            if words in err.stderr:
                raise _storage_error(OSError(code, words), into) from err
        raise

    def unpack() -> Path:
        unpacked = into / ".unpacked"
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        archive.unlink()
        target = into / app_id
        (unpacked / app_paths(app_id)[0]).rename(target)
        shutil.rmtree(unpacked)
        return target

    try:
        return await asyncio.to_thread(unpack)
    except OSError as err:
        raise _storage_error(err, into) from err


def _storage_error(err: OSError, into: Path) -> StorageFailed:
    error = StorageFull if err.errno == errno.ENOSPC else StorageFailed
    return error(
        f"writing the old version's tree into {into.parent} failed, nothing was changed: "
        f"{err.strerror or err}",
        path=str(into.parent),
    )
