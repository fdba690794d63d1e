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
"""

from __future__ import annotations

import logging
import os
import signal
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from atrium.distribution.records import sync_dir, write_atomic
from atrium.scopes import Scope, ScopeLayout

_LOGGER = logging.getLogger(__name__)
FAULTPOINT_ENV: Final = "ATRIUM_FAULTPOINT"
JOURNAL_DIR: Final = ".journal"


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

    op: Literal["install", "update", "uninstall"]
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
        write_atomic(self.path(journal.scope, journal.op_id), data)

    def remove(self, journal: Journal) -> None:
        path = self.path(journal.scope, journal.op_id)
        path.unlink(missing_ok=True)
        if path.parent.is_dir():
            sync_dir(path.parent)

    def exists(self, scope: Scope, op_id: str) -> bool:
        return self.path(scope, op_id).exists()

    def pending(self, scope: Scope) -> list[Journal]:
        """Journals left by an interrupted operation; an unreadable one is logged and set aside."""
        found: list[Journal] = []
        directory = self.directory(scope)
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
            try:
                found.append(Journal.model_validate_json(path.read_bytes()))
            except (OSError, ValidationError) as err:
                _LOGGER.error("cannot read the install journal %s (%s); moved aside", path, err)
                path.rename(path.with_suffix(".unreadable"))
        return found
