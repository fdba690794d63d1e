"""Validate a staged app: the manifest rules the registry applies, plus what an install adds.

`validate_staged` reads files (run it in a thread); it uses the registry's own `read_copy`, so an app
that passes here is listed as valid once it is in place. It raises ManifestInvalid with every
problem at once. `check_authority` keeps authorities unique among visible apps (409).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from atrium.errors import AuthorityConflict, ManifestInvalid
from atrium.manifest import Manifest
from atrium.registry import AppCopy, read_copy
from atrium.scopes import Scope


def runtime_dir_re(app_id: str) -> re.Pattern[str]:
    """Names of instance runtime folders inside an app directory: `<appId>-<n>`, and the lock
    folders of the headless provider instances, `<appId>-provider` (`<appId>-provider<n>` for
    the one of a shell that numbered past another's)."""
    return re.compile(rf"{re.escape(app_id)}-(?:[0-9]+|provider[0-9]*)")


def runtime_folders(app_dir: Path, app_id: str, owner: str | None = None) -> list[Path]:
    """The instances' runtime data folders of an installed app (`<appId>-<n>`), by name;
    ``owner``: those of that user's instances (`<appId>~<owner>-<n>`) instead of the bootstrap
    admin's."""
    prefix = app_id if owner is None else f"{app_id}~{owner}"
    data = re.compile(rf"{re.escape(prefix)}-[0-9]+")
    if not app_dir.is_dir():
        return []
    return sorted(p for p in app_dir.iterdir() if p.is_dir() and data.fullmatch(p.name))


def validate_staged(app_dir: Path, scope: Scope) -> Manifest:
    """The staged app's manifest; ``app_dir``'s name is the directory name the id must equal."""
    copy = read_copy(scope, app_dir)
    problems = [dict(p) for p in copy.problems]
    reserved = runtime_dir_re(app_dir.name)
    for entry in sorted(app_dir.iterdir()) if app_dir.is_dir() else []:
        if reserved.fullmatch(entry.name):
            problems.append(
                {
                    "field": "(files)",
                    "message": f"{entry.name!r} is reserved for an instance's runtime data; "
                    "rename it in the app's source",
                }
            )
    if problems or copy.manifest is None:
        raise ManifestInvalid(app_dir.name, problems)
    return copy.manifest


def check_authority(manifest: Manifest, visible: Iterable[AppCopy]) -> None:
    """An authority belongs to one app: another visible app declaring it is a conflict."""
    if manifest.data_provider is None:
        return
    authority = manifest.data_provider.authority
    for copy in visible:
        other = copy.manifest
        if copy.id == manifest.id or other is None or other.data_provider is None:
            continue
        if other.data_provider.authority == authority:
            raise AuthorityConflict(authority, copy.id)
