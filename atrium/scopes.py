"""The three install scopes, where each keeps its apps and runtime data, and masking by priority.

Pure: paths are computed, never touched (docs/api.md "Scopes"; decisions.md
"Settings and runtime files").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final, TypeVar


class Scope(StrEnum):
    """An install scope; a higher priority masks a lower one (docs/api.md "Scopes")."""

    SYSTEM = "system"
    GLOBAL = "global"
    USER = "user"

    @property
    def priority(self) -> int:
        return PRIORITY[self]

    @property
    def is_mutable(self) -> bool:
        return self is not Scope.SYSTEM


PRIORITY: Final[Mapping[Scope, int]] = {Scope.SYSTEM: 0, Scope.GLOBAL: 1, Scope.USER: 2}
#: highest priority first: the order in which a visible app is looked up
BY_PRIORITY: Final[tuple[Scope, ...]] = (Scope.USER, Scope.GLOBAL, Scope.SYSTEM)


def backups_root(home: Path, scopes: Path | None) -> Path:
    """Where the backups of runtime data live: in the home, or beside the data they copy when
    the scopes are in a folder several shells share (``ATRIUM_SCOPES_DIR``), so that every
    shell lists and restores every backup (docs/api.md "Backups")."""
    return home / "backups" if scopes is None else scopes / "backups"


def parse_scope(value: str) -> Scope | None:
    try:
        return Scope(value)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class ScopeLayout:
    """Where each scope lives under ``$ATRIUM_HOME`` (``/data`` in docs/api.md)."""

    home: Path
    system_apps: Path
    user: str = "default"
    #: the folder holding the scopes when it is not ``home/scopes``: one folder shared by several
    #: shells (``ATRIUM_SCOPES_DIR``)
    scopes: Path | None = None

    @property
    def scopes_root(self) -> Path:
        """The folder holding ``system/``, ``global/`` and ``users/``."""
        return self.scopes if self.scopes is not None else self.home / "scopes"

    @property
    def shared(self) -> bool:
        """Whether the scopes are in a folder of their own, which other shells may share."""
        return self.scopes is not None

    def root(self, scope: Scope, user: str | None = None) -> Path:
        """The scope's directory; for global and user, its git repository. ``user``: whose user
        scope (default the bootstrap admin's, ``scopes/users/<user>``); ignored for the others."""
        match scope:
            case Scope.SYSTEM:
                return self.scopes_root / "system"
            case Scope.GLOBAL:
                return self.scopes_root / "global"
            case Scope.USER:
                return self.user_root(user or self.user)

    def apps_dir(self, scope: Scope, user: str | None = None) -> Path:
        """Install path: the system scope's apps are the platform's own ``apps/`` folder."""
        if scope is Scope.SYSTEM:
            return self.system_apps
        return self.root(scope, user) / "apps"

    def app_dir(self, scope: Scope, app_id: str, user: str | None = None) -> Path:
        return self.apps_dir(scope, user) / app_id

    @property
    def backups_root(self) -> Path:
        return backups_root(self.home, self.scopes)

    def users_root(self) -> Path:
        """The folder holding every user's own folder (``scopes/users``)."""
        return self.scopes_root / "users"

    def data_dir(self, scope: Scope) -> Path:
        """Where the scope's runtime data lives (per app, per instance beneath)."""
        return self.root(scope) / "apps"

    def runtime_dir(
        self, scope: Scope, app_id: str, instance_id: str, owner: str | None = None
    ) -> Path:
        """The instance's runtime data, mounted at ``/data`` inside the sandbox.

        The bootstrap admin's (``owner`` None or ``user``) is where it always was, beside or inside
        the app directory; any other user's lives under their own folder,
        ``scopes/users/<owner>/runtime/<scope>/<appId>/<instanceId>``, so that all of a user's
        data is in one place (moved aside whole when the user is deleted) and none of it is ever
        inside an app directory another user's instance sees (decisions.md "Users: instances
        and their data")."""
        if owner is None or owner == self.user:
            return self.data_dir(scope) / app_id / instance_id
        return self.user_root(owner) / "runtime" / scope.value / app_id / instance_id

    def user_root(self, user_id: str) -> Path:
        """A user's own folder (their user scope's repository, and their runtime data)."""
        return self.scopes_root / "users" / user_id

    def staging_dir(self, scope: Scope) -> Path:
        return self.root(scope) / ".staging"


T = TypeVar("T")


def visible(copies: Iterable[tuple[Scope, T]]) -> dict[Scope, T] | None:
    """Order the copies of one app id by priority; the first key is the winner."""
    ordered = sorted(copies, key=lambda c: -c[0].priority)
    return dict(ordered) if ordered else None


def winner(scopes: Iterable[Scope]) -> Scope | None:
    """The highest-priority scope among ``scopes``, or None."""
    return max(scopes, key=lambda s: s.priority, default=None)
