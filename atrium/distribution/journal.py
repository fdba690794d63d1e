"""The install journal: one JSON file per operation in ``scopes/<scope>/.journal/``, rewritten
atomically before each step, so start-up recovery can finish or undo what a crash interrupted.

Steps of an install or update (``staged`` holds the new tree, then, after the swap, the old one):

    begin    the plan is written; nothing in ``apps/`` has changed
    data     instance runtime data directories move from the old tree into the staged tree
    swap     the staged tree is exchanged with the installed one (renameat2), or moved in
    swapped  the new tree is in place; then the record is written, the commit made, the old tree
             deleted, and the journal removed

Steps of an uninstall: ``begin``, ``remove`` (the app directory moves into staging), ``removed``
(then the record is deleted, the commit made, the old tree deleted).

`ATRIUM_FAULTPOINT=<name>` (tests only) kills the process at the named point; the names are in
FAULTPOINTS. Recovery (atrium.distribution.install) decides from the disk, not the step alone: an install
whose new tree is in place (same inode) is finished, any other is undone.

Each journal file starts with a line ``sha256:<hex>`` of the JSON body after it, so a torn or
truncated write is detected, never misread. A journal that cannot be read (bad checksum, bad JSON)
cannot tell recovery what is garbage: it is renamed ``<opId>.unreadable``, its staging folder is
kept as ``<opId>.quarantined`` and the scope refuses install, update and uninstall
(``409 scope_needs_repair``) until an operator has looked (docs/api.md "Recovery").
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from atrium.files import sync_dir, write_atomic
from atrium.scopes import Scope, ScopeLayout

_LOGGER = logging.getLogger(__name__)
FAULTPOINT_ENV: Final = "ATRIUM_FAULTPOINT"
JOURNAL_DIR: Final = ".journal"
UNREADABLE_SUFFIX: Final = ".unreadable"
QUARANTINE_SUFFIX: Final = ".quarantined"
_CHECKSUM_PREFIX: Final = b"sha256:"


class JournalUnreadable(ValueError):
    """A journal whose checksum or content is wrong (a torn write, or damage on disk)."""


def encode(body: bytes) -> bytes:
    """The stored form: a checksum line, then the JSON body."""
    return _CHECKSUM_PREFIX + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def decode(data: bytes) -> bytes:
    """The JSON body of a stored journal; raises JournalUnreadable when the checksum is missing or
    wrong (every journal this shell writes has one)."""
    head, newline, body = data.partition(b"\n")
    if not newline or not head.startswith(_CHECKSUM_PREFIX):
        raise JournalUnreadable("no checksum line (torn or foreign file)")
    if hashlib.sha256(body).hexdigest().encode() != head[len(_CHECKSUM_PREFIX) :]:
        raise JournalUnreadable("checksum mismatch (torn write or damaged file)")
    return body


class Step(StrEnum):
    """A journaled step (see the module docstring)."""

    BEGIN = "begin"
    DATA = "data"
    SWAP = "swap"
    SWAPPED = "swapped"
    REMOVE = "remove"
    REMOVED = "removed"


#: where ATRIUM_FAULTPOINT may kill the process, per operation, in order
FAULTPOINTS: Final = {
    "install": ("begin", "data", "swap", "swapped", "record", "commit", "cleanup"),
    "uninstall": ("begin", "remove", "removed", "record", "commit", "cleanup"),
    # a data restore (distribution/backups.py): no journal, each folder one exchange
    "restore": ("restore-snapshot", "restore-copied", "restore-exchanged"),
    # a backup's removal (distribution/backups.py `remove`): renamed out of the listing, its
    # backup.json gone, the rest not yet
    "prune": ("prune-removing",),
}


def faultpoint(name: str) -> None:
    """Tests only: SIGKILL this process when ``ATRIUM_FAULTPOINT`` names this point."""
    if os.environ.get(FAULTPOINT_ENV) == name:
        _LOGGER.warning("ATRIUM_FAULTPOINT=%s: killing the shell", name)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


class Journal(BaseModel):
    """One operation in flight. Paths are absolute; inodes tell recovery what is where."""

    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True
    )

    op: Literal["install", "update", "rollback", "uninstall"]
    op_id: str
    app_id: str
    scope: Scope
    step: Step = Step.BEGIN
    target: Path
    staged: Path
    #: install: the staged new tree's inode; uninstall: the installed tree's inode
    inode: int
    #: install: an installed tree was there to be replaced
    replaces: bool = False
    data_dirs: list[str] = []
    record: dict[str, Any] | None = None
    old_record: dict[str, Any] | None = None
    message: str


def inode(path: Path) -> int | None:
    try:
        return path.lstat().st_ino
    except FileNotFoundError:
        return None


class JournalStore:
    """The journals of the mutable scopes. Blocking: callers run it in a thread."""

    def __init__(self, layout: ScopeLayout) -> None:
        self._layout = layout

    def directory(self, scope: Scope) -> Path:
        return self._layout.root(scope) / JOURNAL_DIR

    def path(self, scope: Scope, op_id: str) -> Path:
        return self.directory(scope) / f"{op_id}.json"

    def write(self, journal: Journal, step: Step | None = None) -> None:
        if step is not None:
            journal.step = step
        data = journal.model_dump_json(by_alias=True, indent=2).encode()
        write_atomic(self.path(journal.scope, journal.op_id), encode(data))

    def remove(self, journal: Journal) -> None:
        path = self.path(journal.scope, journal.op_id)
        path.unlink(missing_ok=True)
        if path.parent.is_dir():
            sync_dir(path.parent)

    def exists(self, scope: Scope, op_id: str) -> bool:
        return self.path(scope, op_id).exists()

    def unreadable(self, scope: Scope) -> list[Path]:
        """Journals recovery could not read: while any is left the scope needs repair."""
        directory = self.directory(scope)
        if not directory.is_dir():
            return []
        return sorted(directory.glob(f"*{UNREADABLE_SUFFIX}"))

    def pending(self, scope: Scope) -> list[Journal]:
        """Journals left by an interrupted operation. An unreadable one is renamed
        ``<opId>.unreadable`` and its staging folder quarantined (never deleted: it may hold the
        only copy of an app's runtime data). Temporary files of a write that never completed
        (``.<opId>.json.tmp``, never renamed into place) are provably garbage and removed."""
        found: list[Journal] = []
        directory = self.directory(scope)
        if not directory.is_dir():
            return found
        for tmp in directory.glob(".*.json.tmp"):
            tmp.unlink(missing_ok=True)
        for path in sorted(directory.glob("*.json")):
            try:
                found.append(Journal.model_validate_json(decode(path.read_bytes())))
            except (OSError, ValidationError, JournalUnreadable) as err:
                _LOGGER.error(
                    "cannot read the install journal %s (%s): kept as %s, its staging quarantined; "
                    "the scope needs repair",
                    path,
                    err,
                    path.with_suffix(UNREADABLE_SUFFIX).name,
                )
                path.rename(path.with_suffix(UNREADABLE_SUFFIX))
                staged = self._layout.staging_dir(scope) / path.stem
                if staged.exists():
                    staged.rename(staged.with_name(staged.name + QUARANTINE_SUFFIX))
        sync_dir(directory)
        return found
