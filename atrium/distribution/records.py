"""Install records: what was installed, from where, at which digest; one JSON file per app.

A record lives at ``scopes/<scope>/records/<appId>.json``, inside the scope's git repository, so
the commit of an install holds the app directory and its record together (decisions.md "Registry and scopes").
It sits beside ``apps/`` rather than inside the app directory: the app tree stays exactly what was
fetched (its digest can be checked again) and the registry's watcher never sees it.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import ValidationError

from atrium.distribution.refs import Ref, parse_ref
from atrium.errors import InvalidRequest
from atrium.files import sync_dir, write_atomic
from atrium.manifest import AppId
from atrium.scopes import BY_PRIORITY, Scope, ScopeLayout
from atrium.wire import WireModel

_LOGGER = logging.getLogger(__name__)
RECORDS_DIR: Final = "records"


class InstallRecord(WireModel):
    """decisions.md "Distribution": the result of a completed install, and an item of the
    installed list. ``ref`` is the ref as given (a bare id stays a bare id, so an update goes
    through the index again); ``installed_at`` survives updates."""

    #: an app id (it names folders: a record from an archive is input like any other)
    id: AppId
    version: str
    scope: Literal["global", "user"]
    source: Literal["oci", "git", "local", "index"]
    ref: str
    digest: str
    channel: str | None
    installed_at: datetime
    updated_at: datetime
    path: str
    #: set by a rollback: the version it rolled back from
    rollback_of: str | None = None
    #: a dev copy (`atrium dev`): an author's folder run in place of an install, removed with
    #: its backups when the author stops
    dev: bool = False
    #: the trusted key that signed what was installed (checked under a `warn` or `require`
    #: trust policy); None: unsigned, or not checked
    signed_by: str | None = None
    #: the tag or digest the ref pins the install to (decisions.md "Updates that arrive"); None:
    #: it follows its source (a branch, a moving tag, an index channel, a local folder)
    pinned: str | None = None
    #: an import whose archive's ref names files of a machine (`local:`, a git repository that is
    #: a path or `file://`): kept to say where it came from, never resolved here (an archive is
    #: whatever its uploader sealed; decisions.md "Imports: a ref naming a machine's files")
    detached: bool = False

    def wire(self) -> dict[str, Any]:
        """The wire form; ``rollbackOf`` only on a rollback's record, ``dev`` only when true,
        ``signedBy`` only when a trusted key signed it, ``pinned`` only on a pinned install,
        ``detached`` only when true."""
        data = super().wire()
        if data["rollbackOf"] is None:
            del data["rollbackOf"]
        if not data["dev"]:
            del data["dev"]
        if data["signedBy"] is None:
            del data["signedBy"]
        if data["pinned"] is None:
            del data["pinned"]
        if not data["detached"]:
            del data["detached"]
        return data


def source_of(record: InstallRecord) -> Ref:
    """The ref an update (and the update check) resolves: the recorded one, unless the record is
    ``detached`` (an import whose archive named a machine's files), which has none here."""
    if record.detached:
        raise InvalidRequest(
            f"{record.id!r} was imported from an archive whose ref {record.ref!r} names files of "
            "the machine it was exported from: there is no source here to update it from; "
            "install it again by ref to follow one",
            ref=record.ref,
        )
    return parse_ref(record.ref)


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class RecordStore:
    """Reads and writes the install records of the mutable scopes. Blocking but tiny files."""

    def __init__(self, layout: ScopeLayout) -> None:
        self._layout = layout

    def path(self, scope: Scope, app_id: str) -> Path:
        return self._layout.root(scope) / RECORDS_DIR / f"{app_id}.json"

    def get(self, scope: Scope, app_id: str) -> InstallRecord | None:
        """The record, or None when there is none (or it is unreadable, which is logged)."""
        if not scope.is_mutable:
            return None
        path = self.path(scope, app_id)
        try:
            return InstallRecord.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as err:
            _LOGGER.warning("ignoring the unreadable install record %s: %s", path, err)
            return None

    def put(self, record: InstallRecord) -> None:
        data = json.dumps(record.wire(), indent=2, sort_keys=True) + "\n"
        write_atomic(self.path(Scope(record.scope), record.id), data.encode())

    def delete(self, scope: Scope, app_id: str) -> None:
        path = self.path(scope, app_id)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        sync_dir(path.parent)

    def damaged(self) -> list[dict[str, str]]:
        """Record files that exist but cannot be read, as ``{id, scope, path, problem}``
        items: ``installed`` lists them rather than leaving the app out silently (issue 14)."""
        found: list[dict[str, str]] = []
        for scope in BY_PRIORITY:
            if not scope.is_mutable:
                continue
            directory = self._layout.root(scope) / RECORDS_DIR
            for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
                try:
                    InstallRecord.model_validate_json(path.read_bytes())
                except (OSError, ValidationError) as err:
                    problem = str(err).splitlines()[0]
                    found.append(
                        {
                            "id": path.stem,
                            "scope": scope.value,
                            "path": str(path),
                            "problem": problem,
                        }
                    )
        return found

    def all(self) -> list[InstallRecord]:
        """Every record, user scope first, then by id."""
        found: list[InstallRecord] = []
        for scope in BY_PRIORITY:
            if not scope.is_mutable:
                continue
            directory = self._layout.root(scope) / RECORDS_DIR
            names = sorted(p.stem for p in directory.glob("*.json")) if directory.is_dir() else []
            found.extend(r for name in names if (r := self.get(scope, name)) is not None)
        return found
