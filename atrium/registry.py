"""The app registry: scans the three scopes, masks by priority, watches the disk.

An app directory dropped into or removed from a scope's apps folder by hand appears or
disappears within milliseconds (watchfiles, inotify). The registry publishes `app:installed` /
`app:removed` only when its view changes, so the install pipeline calling `rescan` and the watcher
firing a moment later announce a change once (docs/api.md "Event stream"). An invalid manifest is a listed
problem, never a crash.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import watchfiles

from atrium.bus import EventBus
from atrium.errors import ManifestInvalid
from atrium.events import AppInstalled, AppRemoved, Payload
from atrium.manifest import MANIFEST_FILE, Manifest, parse_manifest
from atrium.permissions import GrantChange, PermissionWords, migrate_grants, permission_owner
from atrium.scopes import BY_PRIORITY, Scope, ScopeLayout
from atrium.users.model import USER_ID

_LOGGER = logging.getLogger(__name__)
MAX_MANIFEST_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class AppCopy:
    """One app directory in one scope: a valid manifest, or the problems that keep it out."""

    id: str
    scope: Scope
    path: Path
    manifest: Manifest | None
    problems: tuple[Mapping[str, str], ...] = ()
    #: what reading its manifest did to grants in an older shell's KV form (the file is unchanged)
    grant_changes: tuple[GrantChange, ...] = ()

    @property
    def is_valid(self) -> bool:
        return self.manifest is not None


@dataclass(frozen=True, slots=True)
class AppView:
    """An app as `GET /api/apps` shows it: the visible copy and the lower scopes it masks."""

    copy: AppCopy
    masks: tuple[Scope, ...] = field(default=())

    def wire(self, record: Mapping[str, Any] | None = None) -> dict[str, Any]:
        m = self.copy.manifest
        return {
            "id": self.copy.id,
            "name": m.name if m else None,
            "version": m.version if m else None,
            "icon": m.icon if m else None,
            "description": m.description if m else None,
            "scope": self.copy.scope.value,
            "path": str(self.copy.path),
            "masks": [s.value for s in self.masks],
            "themeStrategy": m.theme_strategy.value if m else None,
            "record": record,
            "problems": [dict(p) for p in self.copy.problems],
        }


def read_copy(scope: Scope, path: Path) -> AppCopy:
    """Read and validate one app directory; every failure becomes a problem entry."""
    manifest_path = path / MANIFEST_FILE
    try:
        if manifest_path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"{MANIFEST_FILE} is larger than {MAX_MANIFEST_BYTES} bytes")
        data = json.loads(manifest_path.read_bytes())
    except FileNotFoundError:
        return _problem(scope, path, f"{MANIFEST_FILE} is missing")
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return _problem(scope, path, f"{MANIFEST_FILE} is unreadable: {err}")
    except RecursionError:
        return _problem(scope, path, f"{MANIFEST_FILE} is unreadable: nested too deeply")
    try:
        manifest = parse_manifest(data, path.name)
    except ManifestInvalid as err:
        return AppCopy(path.name, scope, path, None, tuple(err.problems))
    problems = _file_problems(path, manifest)
    if problems:
        return AppCopy(path.name, scope, path, None, problems)
    changes = tuple(migrate_grants(data["permissions"])[1]) if "permissions" in data else ()
    return AppCopy(path.name, scope, path, manifest, grant_changes=changes)


def _log_grant_changes(copy: AppCopy) -> None:
    """Say what reading a visible copy's grants in an older KV form did (a dropped one warns)."""
    for change in copy.grant_changes:
        level = logging.WARNING if change.new is None else logging.INFO
        _LOGGER.log(level, "app %s (%s): %s", copy.id, copy.scope, change.why())


def _file_problems(path: Path, manifest: Manifest) -> tuple[Mapping[str, str], ...]:
    """Checks that need the directory: the icon and the entrypoint file exist."""
    problems: list[Mapping[str, str]] = []
    if manifest.icon and len(manifest.icon) > 3 and not (path / manifest.icon).is_file():
        problems.append({"field": "icon", "message": f"icon file {manifest.icon!r} is missing"})
    # an image app runs its image's command: it has no entrypoint file
    entrypoint = manifest.entrypoint if manifest.runtime is None else None
    if isinstance(entrypoint, str) and not (path / entrypoint).is_file():
        problems.append(
            {
                "field": "entrypoint",
                "message": f"entrypoint file {entrypoint!r} is missing",
            }
        )
    return tuple(problems)


def _problem(scope: Scope, path: Path, message: str) -> AppCopy:
    return AppCopy(path.name, scope, path, None, ({"field": "(manifest)", "message": message},))


def scan_scope(scope: Scope, apps_dir: Path) -> dict[str, AppCopy]:
    """Every app directory of one scope; files and hidden entries are junk and skipped."""
    copies: dict[str, AppCopy] = {}
    try:
        entries = sorted(apps_dir.iterdir())
    except FileNotFoundError:
        return copies
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        copies[entry.name] = read_copy(scope, entry)
    return copies


class AppRegistry:
    """Which apps exist in which scope, which copy is visible to whom, and what is wrong with the
    rest.

    The system and global scopes are shared; every user has their own user scope
    (``scopes/users/<id>/``), so what is visible depends on the user: their user scope over global
    over system. ``user`` arguments default to the bootstrap admin (``layout.user``), the one user
    of a one-user shell. A user scope is loaded when its folder exists at start or when
    ``ensure_user`` is first called for that user.
    """

    def __init__(self, layout: ScopeLayout, bus: EventBus, *, watch: bool = True) -> None:
        self._layout = layout
        self._bus = bus
        self._watch = watch
        self._shared: dict[Scope, dict[str, AppCopy]] = {Scope.SYSTEM: {}, Scope.GLOBAL: {}}
        self._users: dict[str, dict[str, AppCopy]] = {}
        self._visible: dict[str, dict[str, AppCopy]] = {}
        #: counts the changes of what anyone sees (any scope read again, a user scope loaded or
        #: forgotten): what was decided from an older view is stale once it moves, announced or not
        self.generation = 0
        self._lock = asyncio.Lock()
        self._closing = False
        # the watcher of the folders in ``_watch_dirs``: one ``watchfiles.awatch`` loop, made
        # again when a user scope is loaded or forgotten (inotify watches fixed paths)
        self._rewatch_lock = asyncio.Lock()
        self._watch_dirs: dict[Path, tuple[Scope, str | None]] | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watching = asyncio.Event()

    async def __aenter__(self) -> Self:
        for scope in self._shared:
            self._shared[scope] = await asyncio.to_thread(
                scan_scope, scope, self._layout.apps_dir(scope)
            )
        for user in await asyncio.to_thread(self._users_on_disk):
            self._users[user] = await asyncio.to_thread(self._scan_user, user)
        for user in self._users:
            self._visible[user] = self._compute_visible(user)
        self.generation += 1
        for copy in self._visible[self._layout.user].values():
            _log_grant_changes(copy)
        await self._rewatch(at_start=True)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing = True
        async with self._rewatch_lock:
            await self._stop_watching()

    def _users_on_disk(self) -> list[str]:
        """The bootstrap admin, then every other user whose folder holds a user scope."""
        found = [self._layout.user]
        root = self._layout.users_root()
        if root.is_dir():
            found.extend(
                sorted(
                    entry.name
                    for entry in root.iterdir()
                    if entry.name != self._layout.user
                    and USER_ID.fullmatch(entry.name)
                    and (entry / "apps").is_dir()
                )
            )
        return found

    def _scan_user(self, user: str) -> dict[str, AppCopy]:
        return scan_scope(Scope.USER, self._layout.apps_dir(Scope.USER, user))

    def _user(self, user: str | None) -> str:
        return user or self._layout.user

    # -- queries --------------------------------------------------------------------------------

    @property
    def default_user(self) -> str:
        """The bootstrap admin: whose view a ``user`` of None means."""
        return self._layout.user

    def users(self) -> list[str]:
        """The users whose user scope is loaded."""
        return list(self._users)

    def get(self, app_id: str, user: str | None = None) -> AppCopy | None:
        """The copy of ``app_id`` visible to ``user`` (highest-priority valid copy), or None."""
        seen = self._visible.get(self._user(user))
        return (seen if seen is not None else self._shared_visible()).get(app_id)

    def visible(self, user: str | None = None) -> list[AppCopy]:
        """The apps ``user`` sees: their user scope over global over system."""
        seen = self._visible.get(self._user(user))
        if seen is None:
            seen = self._shared_visible()
        return [seen[k] for k in sorted(seen)]

    def _scope_copies(self, scope: Scope, user: str | None) -> Mapping[str, AppCopy]:
        if scope is Scope.USER:
            return self._users.get(self._user(user), {})
        return self._shared[scope]

    def copies(self, app_id: str, user: str | None = None) -> list[AppCopy]:
        """Every copy of ``app_id`` ``user`` can see, highest priority first."""
        return [
            copies[app_id] for s in BY_PRIORITY if app_id in (copies := self._scope_copies(s, user))
        ]

    def permission_labels(self, user: str | None = None) -> PermissionWords:
        """What words the visible apps' permissions: each app's `permissionInfo` for the
        permissions it owns, and the apps' names (for the KV permissions naming them)."""
        visible = self.visible(user)
        return PermissionWords(
            declared={
                name: (info.label, info.description, copy.id)
                for copy in visible
                if copy.manifest is not None
                for name, info in copy.manifest.permission_info.items()
                if permission_owner(name) == copy.id
            },
            app_names={c.id: c.manifest.name for c in visible if c.manifest is not None},
        )

    def count(self, scope: Scope, user: str | None = None) -> int:
        return sum(1 for c in self._scope_copies(scope, user).values() if c.is_valid)

    def views(self, user: str | None = None) -> list[AppView]:
        """Visible apps with what they mask, then every invalid copy with its problems."""
        out: list[AppView] = []
        for copy in self.visible(user):
            lower = [c.scope for c in self.copies(copy.id, user) if c.is_valid and c is not copy]
            out.append(AppView(copy, tuple(lower)))
        for scope in BY_PRIORITY:
            out.extend(
                AppView(c) for c in self._scope_copies(scope, user).values() if not c.is_valid
            )
        return out

    # -- changes --------------------------------------------------------------------------------

    async def ensure_user(self, user: str) -> None:
        """Load ``user``'s user scope (empty until something is installed there) and watch its
        apps folder from now on, as those found at start are; a no-op when it is loaded. The
        folder must exist (opening the scope's repository makes it)."""
        if user in self._users:
            return
        async with self._lock:
            if user in self._users:
                return
            self._users[user] = await asyncio.to_thread(self._scan_user, user)
            self._visible[user] = self._compute_visible(user)
            self.generation += 1
        await self._rewatch()

    async def forget_user(self, user: str) -> None:
        """Unload ``user``'s user scope and stop watching it: the account is gone and its folder
        is being set aside (what they saw is nobody's now, so nothing is announced). The
        bootstrap admin's scope stays. A later ``ensure_user`` loads the id's scope afresh."""
        if user == self._layout.user:
            return
        async with self._lock:
            if self._users.pop(user, None) is None:
                return
            self._visible.pop(user, None)
            self.generation += 1
        await self._rewatch()

    async def rescan(self, scopes: Iterable[Scope] | None = None, user: str | None = None) -> None:
        """Re-read ``scopes`` (all by default; the user scope is ``user``'s, or every loaded
        user's when ``user`` is None and ``scopes`` is None) and announce what became visible or
        went away to the users who see it. A user scope not loaded (never, or forgotten since:
        a pipeline or watcher finishing after its account was removed) is not read, so it is
        never loaded behind ``ensure_user``'s back, unwatched."""
        async with self._lock:
            wanted = set(scopes) if scopes is not None else set(Scope)
            for scope in wanted - {Scope.USER}:
                self._shared[scope] = await asyncio.to_thread(
                    scan_scope, scope, self._layout.apps_dir(scope)
                )
            if Scope.USER in wanted:
                targets = [self._user(user)] if user or scopes is not None else list(self._users)
                for target in [t for t in targets if t in self._users]:
                    self._users[target] = await asyncio.to_thread(self._scan_user, target)
            for target in self._users:
                before = self._visible.get(target, {})
                self._visible[target] = self._compute_visible(target)
                self._announce(before, self._visible[target], target)
            # after the last change (no await since): a decision made from the view before
            # it, a shared scope's read in a thread included, is stale from here on
            self.generation += 1

    def reread(self, scope: Scope, user: str | None = None) -> None:
        """Another shell wrote ``scope`` (``user``'s, for a user scope): read it again now and
        tell this shell's own listeners (the data proxy, the launcher, the pool) what became
        visible or went away, as a change here would. The streams are not told: the writing
        shell announced it to all of them. Synchronous, so that the `scope:changed` that asks
        for it reaches this shell's streams only once the scope is read (a few manifests: the
        same reads `rescan` makes in a thread). A user scope not loaded here is not read."""
        if scope is Scope.USER:
            target = self._user(user)
            if target not in self._users:
                return
            self._users[target] = self._scan_user(target)
        elif scope is Scope.GLOBAL:
            self._shared[scope] = scan_scope(scope, self._layout.apps_dir(scope))
        else:
            return
        for each in self._users:
            before = self._visible.get(each, {})
            self._visible[each] = self._compute_visible(each)
            self._announce(before, self._visible[each], each, local=True)
        self.generation += 1

    def _shared_visible(self) -> dict[str, AppCopy]:
        visible: dict[str, AppCopy] = {}
        for scope in (Scope.GLOBAL, Scope.SYSTEM):
            for app_id, copy in self._shared[scope].items():
                if copy.is_valid and app_id not in visible:
                    visible[app_id] = copy
        return visible

    def _compute_visible(self, user: str) -> dict[str, AppCopy]:
        visible = {
            app_id: copy for app_id, copy in self._users.get(user, {}).items() if copy.is_valid
        }
        for app_id, copy in self._shared_visible().items():
            visible.setdefault(app_id, copy)
        return visible

    def _announce(
        self,
        before: Mapping[str, AppCopy],
        after: Mapping[str, AppCopy],
        user: str,
        *,
        local: bool = False,
    ) -> None:
        """Tell ``user`` (and only them: the event's owner) what changed in what they see;
        ``local``: this shell's listeners only (another shell announced it)."""
        say: Callable[[Payload], object] = self._bus.tell if local else self._bus.emit
        for app_id in sorted(before.keys() - after.keys()):
            _LOGGER.info("app %s removed from scope %s for %s", app_id, before[app_id].scope, user)
            say(AppRemoved(app_id, before[app_id].scope.value, owner=user))
        for app_id in sorted(after):
            old, new = before.get(app_id), after[app_id]
            if old is None or old.scope is not new.scope or old.manifest != new.manifest:
                _LOGGER.info("app %s visible from scope %s for %s", app_id, new.scope, user)
                _log_grant_changes(new)
                say(AppInstalled(app_id, new.scope.value, owner=user))

    # -- the watcher ----------------------------------------------------------------------------

    async def _rewatch(self, *, at_start: bool = False) -> None:
        """Watch the scope folders there are now: the watcher is made again when a user scope
        was loaded or forgotten since it started (inotify watches the paths it was given, so a
        folder made later is seen only by a new watcher, and a forgotten one must be let go: a
        set-aside folder keeps its watch wherever it was moved). Changes made while no watcher
        was armed are read by the new one's first rescan."""
        if not self._watch:
            return
        async with self._rewatch_lock:
            if self._closing:
                return
            dirs = await asyncio.to_thread(self._watched)
            if dirs == self._watch_dirs:
                return
            await self._stop_watching()
            self._watch_dirs = dirs
            self._stop = asyncio.Event()
            self._watching = asyncio.Event()
            task = self._task = asyncio.create_task(
                self._watch_loop(dirs, self._stop, self._watching), name="registry watcher"
            )
            armed = asyncio.ensure_future(self._watching.wait())
            await asyncio.wait({armed, task}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            armed.cancel()
            if self._watching.is_set():
                return
            # inotify refused (its watch limit) or never armed: at start that is fatal, as it
            # always was; later, the scope works without hand edits being seen, and the next
            # change of folders tries again
            await self._stop_watching()
            problem = task.exception() if task.done() and not task.cancelled() else None
            if at_start:
                raise problem or TimeoutError("the registry watcher did not start in 10 s")
            _LOGGER.error(
                "the registry watcher did not start again (%s): hand edits in the scopes are "
                "seen at the next install or restart",
                problem or "not armed in 10 s",
            )

    async def _stop_watching(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._watch_dirs = None

    def _watched(self) -> dict[Path, tuple[Scope, str | None]]:
        dirs: dict[Path, tuple[Scope, str | None]] = {}
        for scope in self._shared:
            apps_dir = self._layout.apps_dir(scope)
            if apps_dir.is_dir():
                dirs[apps_dir] = (scope, None)
        for user in self._users:
            apps_dir = self._layout.apps_dir(Scope.USER, user)
            if apps_dir.is_dir():
                dirs[apps_dir] = (Scope.USER, user)
        return dirs

    @staticmethod
    def _scope_of(
        path: Path, dirs: Mapping[Path, tuple[Scope, str | None]]
    ) -> tuple[Scope, str | None] | None:
        """The scope (and user, for a user scope) whose listing a change at ``path`` can alter:
        an app directory itself or its manifest. Runtime data and other files inside an app are
        ignored."""
        for apps_dir, where in dirs.items():
            try:
                rel = path.relative_to(apps_dir)
            except ValueError:
                continue
            parts = rel.parts
            if len(parts) == 1 or (len(parts) == 2 and parts[1] in {MANIFEST_FILE, ""}):
                return where
            if len(parts) == 2 and not path.exists():
                return where  # a removed subtree: cheap to re-check
        return None

    async def _watch_loop(
        self,
        dirs: Mapping[Path, tuple[Scope, str | None]],
        stop: asyncio.Event,
        watching: asyncio.Event,
    ) -> None:
        if not dirs:
            watching.set()
            return

        def keep(change: watchfiles.Change, raw: str) -> bool:
            return self._scope_of(Path(raw), dirs) is not None

        async for changes in watchfiles.awatch(
            *dirs,
            watch_filter=keep,
            step=5,
            debounce=200,
            stop_event=stop,
            rust_timeout=100,
            yield_on_timeout=True,
        ):
            if not changes:
                if not watching.is_set():
                    # the first timeout proves inotify is armed; re-read what changed before that
                    watching.set()
                    await self.rescan()
                continue
            hit = {w for _, raw in changes if (w := self._scope_of(Path(raw), dirs)) is not None}
            try:
                shared = {scope for scope, user in hit if user is None}
                if shared:
                    await self.rescan(shared)
                for user in sorted({user for _, user in hit if user is not None}):
                    await self.rescan([Scope.USER], user)  # (not if forgotten since)
            except OSError:
                _LOGGER.exception("rescanning %s after a change on disk failed", sorted(hit))


class UserApps:
    """The registry as one user sees it: what the install pipeline of that user's scope works on
    (their user scope over global over system)."""

    def __init__(self, registry: AppRegistry, user: str) -> None:
        self.registry = registry
        self.user = user

    def get(self, app_id: str) -> AppCopy | None:
        return self.registry.get(app_id, self.user)

    def visible(self) -> list[AppCopy]:
        return self.registry.visible(self.user)

    def copies(self, app_id: str) -> list[AppCopy]:
        return self.registry.copies(app_id, self.user)

    def permission_labels(self) -> PermissionWords:
        return self.registry.permission_labels(self.user)

    def count(self, scope: Scope) -> int:
        return self.registry.count(scope, self.user)

    async def rescan(self, scopes: Iterable[Scope] | None = None) -> None:
        await self.registry.rescan(scopes if scopes is not None else list(Scope), self.user)
