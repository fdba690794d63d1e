"""Every user's own user scope: its git repository and the install pipeline working on it.

The bootstrap admin's user scope is ``scopes/users/<ATRIUM_USER>/`` as it always was; any other
user's is ``scopes/users/<id>/``, created (``git init``) the first time that user needs it, and
loaded at start when its folder exists (decisions.md "Users: scopes"). The system and global scopes
are shared: every user's pipeline holds the same global repository object (one lock) and the same
per-app operation locks.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping

from atrium.distribution.install import recover
from atrium.distribution.pipeline import Distribution
from atrium.git import ScopeRepo
from atrium.registry import AppRegistry, UserApps
from atrium.scopes import Scope, ScopeLayout

#: builds one user's pipeline from their layout, repositories and view of the registry
DistFactory = Callable[[ScopeLayout, Mapping[Scope, ScopeRepo], UserApps], Distribution]


class UserScopes:
    """Each user's repositories and install pipeline, made on first use."""

    def __init__(
        self,
        layout: ScopeLayout,
        registry: AppRegistry,
        admin_repos: Mapping[Scope, ScopeRepo],
        admin_dist: Distribution,
        make_dist: DistFactory,
    ) -> None:
        self._layout = layout
        self._registry = registry
        self._repos: dict[str, Mapping[Scope, ScopeRepo]] = {layout.user: admin_repos}
        self._dists: dict[str, Distribution] = {layout.user: admin_dist}
        self._make_dist = make_dist
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        #: called with a user id once that removed account's scope is unloaded: what was built
        #: from it (provider tables, intent indexes) goes too, since the id may be reused
        self.on_forget: list[Callable[[str], None]] = []

    def layout_of(self, user: str) -> ScopeLayout:
        """``user``'s layout: where their user scope is (``layout.user`` names it)."""
        return dataclasses.replace(self._layout, user=user)

    def repos(self, user: str) -> Mapping[Scope, ScopeRepo] | None:
        """``user``'s repositories (global and their user scope), when opened already."""
        return self._repos.get(user)

    def dist(self, user: str | None) -> Distribution:
        """``user``'s pipeline when opened (their scope holds nothing otherwise), else the
        bootstrap admin's (for reading the shared scopes' records)."""
        return self._dists.get(user or self._layout.user) or self._dists[self._layout.user]

    async def open(self, user: str) -> Distribution:
        """``user``'s install pipeline; on first use, their user scope's repository is opened
        (created when missing), interrupted operations in it are finished or undone, and the
        registry loads it."""
        if (dist := self._dists.get(user)) is not None:
            return dist
        async with self._lock:
            if (dist := self._dists.get(user)) is not None:
                return dist
            admin = self._repos[self._layout.user]
            layout = self.layout_of(user)
            repos = {
                Scope.GLOBAL: admin[Scope.GLOBAL],
                Scope.USER: ScopeRepo(layout.root(Scope.USER), admin[Scope.GLOBAL].guard),
            }
            await repos[Scope.USER].open()
            await recover(layout, repos, (Scope.USER,))
            if user in self._registry.users():
                await self._registry.rescan([Scope.USER], user)  # found at start: after recovery
            else:
                await self._registry.ensure_user(user)
            dist = self._make_dist(layout, repos, UserApps(self._registry, user))
            dist.data.belong_to(user)  # (never the bootstrap admin: theirs is open from start)
            self._repos[user] = repos
            self._dists[user] = dist
            return dist

    async def open_found(self, exists: Callable[[str], bool]) -> None:
        """At start: open (recover, load) each user scope found on disk whose account
        ``exists``; the folder of an account removed is nobody's and is forgotten, unwatched
        (adding the id again sets it aside in lost+found)."""
        for user in self._registry.users():
            if exists(user):
                await self.open(user)
            else:
                await self.forget(user)

    def forgetter(self, exists: Callable[[str], bool]) -> Callable[[str], None]:
        """A users-store ``on_change`` callback: when the changed account no longer ``exists``
        (removed, not only disabled: its id may be reused), forget its scope."""

        def changed(user: str) -> None:
            if not exists(user):
                task = asyncio.get_running_loop().create_task(self.forget(user))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        return changed

    async def forget(self, user: str) -> None:
        """``user``'s account is gone: drop their pipeline and repositories and let the registry
        unload and stop watching their scope, so a new account under the same id opens a fresh
        one (the old folder is set aside in lost+found). The bootstrap admin's stay."""
        if user == self._layout.user:
            return
        async with self._lock:
            self._dists.pop(user, None)
            self._repos.pop(user, None)
            await self._registry.forget_user(user)
            for forget in self.on_forget:
                forget(user)
