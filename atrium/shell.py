"""The composition root: `open_shell` opens every service in order and closes them in reverse."""

from __future__ import annotations

import asyncio
import compileall
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from atrium.bus import Event, EventBus
from atrium.dataproxy import DataProxy
from atrium.distribution import spool
from atrium.distribution.backups import BackupStore
from atrium.distribution.index import IndexClient
from atrium.distribution.install import recover
from atrium.distribution.operations import AppLocks
from atrium.distribution.pipeline import Distribution
from atrium.distribution.reach import FetchPolicy, Reach
from atrium.distribution.records import RecordStore
from atrium.distribution.stops import ChangedElsewhere
from atrium.errors import AtriumError
from atrium.events import APP_EGRESS, SCOPE_CHANGED
from atrium.git import ScopeRepo
from atrium.identity import AppTokens, UserAuth
from atrium.kv import KvStore
from atrium.launcher import Launcher
from atrium.lifecycle.egress import EgressGrants
from atrium.lifecycle.limits import ceilings_of, open_cgroups
from atrium.lifecycle.manager import LifecycleConfig, LifecycleManager
from atrium.lifecycle.network import SHELL_MARK, Network, NetworkUnavailable, open_network
from atrium.lifecycle.ports import PortAllocator
from atrium.lifecycle.presence import Presence
from atrium.lifecycle.runners import Runner, load_runner
from atrium.lifecycle.runners.bwrap import BwrapRunner
from atrium.lifecycle.runners.kubernetes import KubeSettings
from atrium.lifecycle.stragglers import end_stragglers
from atrium.monitor import UsageMonitor
from atrium.rates import SharedWrites
from atrium.registry import AppRegistry, UserApps
from atrium.scopes import Scope, ScopeLayout
from atrium.settings import Settings
from atrium.state.apptokens import SharedAppTokens
from atrium.state.clients import ClientStreams
from atrium.state.egress import EgressRevokes
from atrium.state.instances import InstanceRows
from atrium.state.key import read_key
from atrium.state.locks import Coordination
from atrium.state.scopelocks import ScopeLocks
from atrium.theme.catalogue import ThemeCatalogue
from atrium.theme.prefs import ThemeService
from atrium.upstream import UpstreamClient
from atrium.usage import Running
from atrium.users import bootstrap
from atrium.users.audit import AuditLog
from atrium.users.carry import carry_over
from atrium.users.grants import GrantStore, access_to
from atrium.users.model import Role
from atrium.users.store import UserStore
from atrium.userscopes import UserScopes

if TYPE_CHECKING:  # SQLAlchemy and Alembic load when a shell opens, not for `atrium --help`
    from atrium.state.database import Database

_LOGGER = logging.getLogger(__name__)
SDK_SOURCE = Path(__file__).resolve().parent / "sdk.py"


@dataclass(slots=True)
class Shell:
    """Every service of one running shell. Routes take what they need from it; services never do."""

    settings: Settings
    layout: ScopeLayout
    #: the shell's state (``ATRIUM_DATABASE_URL``): SQLite in the home, or PostgreSQL shared by
    #: several shells
    db: Database
    #: the instance locks and the leader among the shells on that database
    coordination: Coordination
    bus: EventBus
    kv: KvStore
    registry: AppRegistry
    repos: Mapping[Scope, ScopeRepo]
    user_auth: UserAuth
    users: UserStore
    grants: GrantStore
    audit: AuditLog
    app_tokens: AppTokens
    upstream: UpstreamClient
    lifecycle: LifecycleManager
    presence: Presence
    dataproxy: DataProxy
    launcher: Launcher
    theme: ThemeService
    dist: Distribution
    #: every user's user scope (repository, install pipeline); ``dist`` is the bootstrap admin's
    user_scopes: UserScopes
    usage: UsageMonitor
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    #: the instances' own networks (None: image apps in a loopback-only namespace behind a
    #: forwarder, contract apps on the host's network), and the isolation in words
    network: Network | None = None
    isolation: str = ""
    #: the apps' network egress: granted at install, revocable (`atrium.lifecycle.egress`)
    egress: EgressGrants | None = None
    #: the views and asks each caller made lately (several shells: `atrium.rates`)
    rates: SharedWrites = field(default_factory=SharedWrites)

    @property
    def host_origins(self) -> frozenset[str]:
        """Origins the host page may be served from (decisions.md "HTTP edge and bus")."""
        port = self.settings.port
        hosts = {"localhost", "127.0.0.1", self.settings.host}
        # an IPv6 literal is bracketed in a URL, and so in the Origin a browser sends
        return frozenset(
            f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}" for h in hosts
        )


def app_network(settings: Settings, runner: Runner) -> tuple[Network | None, str]:
    """The shell's bridge and the instances' namespaces when the shell may make them (root,
    bubblewrap, ``ATRIUM_APP_NETWORK`` not off), and the isolation image apps get, in words.
    Blocking: sweeps what stopped shells left and runs ``ip``."""
    from atrium.lifecycle.runners.bwrap import bwrap_works

    # not root: no bridge (image apps get slirp4netns, `atrium.lifecycle.slirp`; contract apps
    # share the host's network)
    if settings.app_network == "off" or os.geteuid() != 0:
        return None, "shared: ATRIUM_APP_NETWORK is off or the shell is not root"
    problem = bwrap_works()
    if problem is not None:
        return None, f"shared: {problem}"
    try:
        network = open_network(settings.app_network, settings.port)
    except (NetworkUnavailable, OSError) as err:
        _LOGGER.warning("instances get no network of their own: %s", err)
        return None, f"loopback only: {err}"
    which = "image"
    if settings.app_network_apps == "all" and isinstance(runner, BwrapRunner):
        runner.network = network  # the contract apps' sandboxes join it too
        which = "sandboxed"
    plan = network.plan
    isolation = (
        f"own network: each {which} instance in a namespace on {plan.bridge} ({plan.range}), "
        f"reaching only the shell at {plan.shell_url}"
    )
    _LOGGER.info("%s", isolation)
    return network, isolation


def close_network(network: Network | None) -> None:
    if network is not None:
        network.close()


def loopback(host: str) -> str:
    """The address apps use to reach the shell: a wildcard bind is reached on loopback."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)  # noqa: S104


def kube_settings(settings: Settings, state: str = "") -> KubeSettings | None:
    """The Kubernetes runner's slice of the settings (None for any other runner); ``state``:
    the database's key (`atrium.state.key`)."""
    if settings.runner != "kubernetes":
        return None
    from atrium.lifecycle.runners.kubernetes.render import shell_key

    return KubeSettings(
        namespace=settings.kube_namespace,
        image=settings.kube_image,
        config=settings.kube_config,
        storage_class=settings.kube_storage_class,
        start_timeout=settings.kube_start_timeout_seconds,
        shell_url=settings.kube_shell_url or f"http://{loopback(settings.host)}:{settings.port}",
        shell=shell_key(str(settings.home), settings.kube_namespace),
        state=state,
    )


def installed_at(registry: AppRegistry, layout: ScopeLayout) -> Callable[[str], datetime | None]:
    """When the visible copy of an app was first installed (its install record; None for a
    system app or one placed by hand). Blocking: reads one small file."""
    records = RecordStore(layout)

    def when(app_id: str) -> datetime | None:
        copy = registry.get(app_id)
        record = records.get(copy.scope, app_id) if copy is not None else None
        return record.installed_at if record is not None else None

    return when


def running_of(lifecycle: LifecycleManager) -> Callable[[], list[Running]]:
    """The instances with a live child, for the usage figures: the runner's pid is the root of
    the instance's process tree (the keeper, or bwrap)."""

    def running() -> list[Running]:
        return [
            Running(i.id, i.app_id, i.owner, i.child.pid)
            for i in lifecycle.all()
            # a server on another machine (a pod) has no pid here: its figures are its runner's
            if i.child is not None and i.child.status is None and i.child.pid is not None
        ]

    return running


def not_an_admin(users: UserStore, user_id: str) -> Callable[[], bool]:
    """Asked at each fetch: is ``user_id`` (now) anything but an enabled admin?"""

    def restricted() -> bool:
        user = users.get(user_id)
        return user is None or user.role is not Role.ADMIN or user.disabled

    return restricted


def member_fetch_policy(settings: Settings) -> FetchPolicy:
    """Where a member's fetch may connect beyond public addresses: the hosts the admin listed in
    ``ATRIUM_MEMBER_FETCH_HOSTS`` (the catalogue's host is added by `index_host`)."""
    return FetchPolicy.parse(settings.member_fetch_hosts.split(","))


def index_host(index: IndexClient) -> Callable[[], str | None]:
    """The host of the store's catalogue at each fetch (``ATRIUM_INDEX_URL``'s or the one an
    admin stored), lower-case: a member's install by id reaches where its apps are listed."""

    def host() -> str | None:
        url = index.url
        name = urlsplit(url).hostname if url else None
        return name.rstrip(".") if name else None

    return host


def reread_scopes(
    registry: AppRegistry,
    user_scopes: UserScopes,
    exists: Callable[[str], bool],
    changed: ChangedElsewhere,
) -> Callable[[Event], None]:
    """A listener of every shell's `scope:changed`: another shell wrote a scope this one may
    share, so the registry reads it again (before the event reaches this shell's streams), and
    a user scope not opened here yet is opened (recovered, loaded) when its account exists.
    This shell's instances of a copy changed there are renewed (`ChangedElsewhere`)."""
    tasks: set[asyncio.Task[object]] = set()

    def heard(event: Event) -> None:
        if not event.foreign:
            return  # this shell's own write: its pipeline read the scope already
        scope = event.payload.get("scope")
        if scope == Scope.GLOBAL.value:
            registry.reread(Scope.GLOBAL)
            changed.heard()
        elif scope == Scope.USER.value and event.owner is not None:
            if event.owner in registry.users():
                registry.reread(Scope.USER, event.owner)
                changed.heard()
            elif exists(event.owner):
                task = asyncio.get_running_loop().create_task(load(event.owner))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    async def load(user: str) -> None:
        try:
            await user_scopes.open(user)
        except Exception:  # its next use opens it again, and says why
            _LOGGER.exception("opening the user scope of %r after another shell wrote it", user)

    return heard


def shell_name(settings: Settings) -> str:
    """The name a shell's instance rows carry: the same across its restarts (its machine and
    home), another for every other shell."""
    return f"{socket.gethostname()}:{settings.home}"


def take_over_pods(
    stack: AsyncExitStack,
    lifecycle: LifecycleManager,
    runner: Runner,
    db: Database,
    rows: InstanceRows | None,
    coordination: Coordination,
    tokens: AppTokens | None = None,
) -> None:
    """On PostgreSQL with the Kubernetes runner: a gone shell's pods, taken over by the leader
    (`atrium.lifecycle.takeover`), and the actions asked of this shell's pods looked for
    (`atrium.lifecycle.asked`), until the shell closes."""
    if rows is None or runner.name != "kubernetes":
        return
    from atrium.lifecycle.takeover import Takeover

    takeover = Takeover(lifecycle, runner, db, rows, coordination, tokens)  # type: ignore[arg-type]
    lifecycle.takeover = takeover
    takeover.start()
    stack.push_async_callback(takeover.close)
    if lifecycle.asked is not None:  # a pod's actions asked of it whose events it missed
        lifecycle.asked.start()
        stack.push_async_callback(lifecycle.asked.close)
    coordination.on_regain(lifecycle.let_go_of_taken)


async def open_rows(
    stack: AsyncExitStack, db: Database, bus: EventBus, settings: Settings, runner: str
) -> InstanceRows | None:
    """On PostgreSQL: the instances, views and tickets every shell's app origins serve from
    (written until the lifecycle has shut down: the stack closes it after)."""
    if db.dialect != "postgresql":
        return None
    return await stack.enter_async_context(InstanceRows(db, bus, shell_name(settings), runner))


async def open_tokens(
    stack: AsyncExitStack, db: Database, bus: EventBus, settings: Settings
) -> AppTokens:
    """The app tokens; on PostgreSQL kept in the database too (written until the lifecycle has
    shut down: the stack closes them after)."""
    if db.dialect != "postgresql":
        return AppTokens()
    return await stack.enter_async_context(SharedAppTokens(db, bus, shell_name(settings)))


async def sweep_rows(rows: InstanceRows | None, adopted: set[str]) -> None:
    if rows is None:
        return
    swept = await rows.sweep(adopted)
    if swept:
        _LOGGER.info("%d instance rows of this shell's last run removed", swept)


def _backups_left_in_home(layout: ScopeLayout) -> None:
    """Backups a shell made in its home before its scopes moved to a shared folder are no longer
    listed (they stay on disk, untouched): said at every start until an operator moves them."""
    old, shared = layout.home / "backups", layout.backups_root
    if not layout.shared or old == shared:
        return
    try:
        left = any(old.iterdir())
    except OSError:
        return
    if left:
        _LOGGER.warning(
            "backups in %s are not listed: with a shared scope folder they are in %s "
            "(move the folders there, keeping their paths, with every shell stopped)",
            old,
            shared,
        )


def _follow_removals(users: UserStore, revokes: EgressRevokes) -> None:
    """A removed user's egress revokes leave memory when the removal is heard (their rows went
    in the removal's transaction)."""

    def forget(user_id: str) -> None:
        if users.get(user_id) is None:  # removed, not only disabled
            revokes.forget_holder(user_id)

    users.on_change.append(forget)


def _end_instances_of_gone_users(users: UserStore, lifecycle: LifecycleManager) -> None:
    """A user disabled or removed on another shell of the database has this shell's instances
    of theirs ended too (the shell that answered the request ends its own): a pod here would
    run on with no shell to stop it (an instance is stopped when its last view goes, and its
    owner's views went with their sign-ins), and every shell now serves a pod's data requests,
    so an account made again under that id would be served by the old one's.

    The removal or disable says so in its event (`UserStore.on_ended`): the instances this
    shell holds of the id then are ended whatever the user reads as later, since by that read
    the id may be a new account's (removed and made again meanwhile). A change heard that does
    not say so (a shell of an older version, rows gone before they were read) ends them when
    the user reads as gone or disabled."""
    ending: set[str] = set()
    #: changes heard from another shell (this shell's own request ends its own instances)
    elsewhere: set[str] = set()

    async def end(user_id: str, ids: list[str]) -> None:
        try:
            for iid in ids:
                try:
                    problem = await lifecycle.remove(iid)
                except AtriumError as err:  # already going (the request's shell, or a stop)
                    _LOGGER.debug("%s: not ended here: %s", iid, err.message)
                    continue
                _LOGGER.info(
                    "instance %s of user %s ended (account removed or disabled)%s",
                    iid,
                    user_id,
                    f" without its hooks: {problem}" if problem else "",
                )
        finally:
            ending.discard(user_id)

    def end_all(user_id: str) -> None:
        # the instances of the id now: any made later is the account's that reads as it then
        ids = [i.id for i in lifecycle.all() if i.owner == user_id]
        if not ids:
            return
        ending.add(user_id)
        lifecycle.spawn_task(end(user_id, ids), f"end the instances of {user_id}")

    def changed(user_id: str) -> None:
        if user_id not in elsewhere:
            return
        elsewhere.discard(user_id)
        user = users.get(user_id)
        if (user is not None and not user.disabled) or user_id in ending:
            return
        end_all(user_id)

    users.on_ended.append(end_all)
    users.on_heard.append(elsewhere.add)
    users.on_change.append(changed)


@asynccontextmanager
async def open_shell(settings: Settings, user_token: str) -> AsyncIterator[Shell]:
    layout = ScopeLayout(settings.home, settings.system_apps, settings.user, settings.scopes_dir)
    async with AsyncExitStack() as stack:
        from atrium.state.versions import open_checked

        # first: a database this shell cannot use stops start-up before anything else is touched
        db = await stack.enter_async_context(open_checked(settings.state_url))
        # on PostgreSQL: whether this shell leads, decided before anything once-only runs
        coordination = await stack.enter_async_context(Coordination.open(db))
        coordination.hold_shell(shell_name(settings))  # the others take over its pods once gone
        await coordination.start()
        # on PostgreSQL, every write of a scope repository holds the scope's writer lock among
        # shells and announces `scope:changed` (a shared scope folder's readers read it again)
        scope_locks = ScopeLocks(db, layout.scopes_root, shared=layout.shared)
        repos = {
            scope: ScopeRepo(layout.root(scope), scope_locks.guard)
            for scope in (Scope.GLOBAL, Scope.USER)
        }
        # the two repositories are independent, each opened by a few git runs: side by side, and
        # the first one's error (in this order) is the one start-up reports, as one after the other
        opened = await asyncio.gather(
            *(repo.open() for repo in repos.values()), return_exceptions=True
        )
        for result in opened:
            if isinstance(result, BaseException):
                raise result
        # finish or undo installs a crash interrupted, before anything reads the scopes
        await recover(layout, repos)
        # and the backup removals and snapshots a kill cut off
        await asyncio.to_thread(BackupStore(layout.backups_root, several=layout.shared).recover)
        _backups_left_in_home(layout)
        # the import uploads and exports a killed shell left in cache/ (no request runs yet)
        for line in await asyncio.to_thread(spool.sweep, settings.home):
            _LOGGER.warning("%s", line)
        # what a killed shell's runs left running (a sandbox whose bwrap died in its first
        # milliseconds), ended before anything is launched; the network's sweep (`app_network`)
        # then removes what their networks left
        await asyncio.to_thread(end_stragglers, settings.home, settings.lock_path)
        # the bus first: the users store and the grants hear other shells' changes on it
        bus = await stack.enter_async_context(EventBus(heartbeat=settings.heartbeat_seconds, db=db))
        scope_locks.bus = bus
        # an older home's users.sqlite3 and audit.sqlite3 go into the state database, once
        await carry_over(db, settings.users_path, settings.audit_path)
        users = await stack.enter_async_context(
            UserStore.open(db, bootstrap_admin=settings.user, bus=bus)
        )
        grants = await stack.enter_async_context(GrantStore.open(db, users))
        audit = await stack.enter_async_context(
            AuditLog.open(
                db, retention_days=settings.audit_retention_days, coordination=coordination
            )
        )
        await grants.forget_missing(lambda user_id: users.get(user_id) is not None)

        def forget_grants(user_id: str) -> None:
            if users.get(user_id) is None:  # removed, not only disabled
                grants.forget_user(user_id)

        users.on_change.append(forget_grants)
        # one bootstrap token for every shell of a PostgreSQL database
        user_auth = await bootstrap.settle(
            db, users, settings.user, user_token, explicit=settings.token is not None
        )
        stack.push_async_callback(bootstrap.follow(db, users, settings.user, user_auth))
        # a new bootstrap token ends the sign-ins its predecessor's login link made
        await users.end_link_sessions(keep=user_auth.link_key)
        kv = await stack.enter_async_context(
            KvStore.open(db, bus=bus, user=settings.user, moved_from=settings.kv_path)
        )
        registry = await stack.enter_async_context(
            AppRegistry(layout, bus, watch=scope_locks.watch)
        )
        catalogue = await asyncio.to_thread(ThemeCatalogue.load, settings.home / "themes")
        theme = await stack.enter_async_context(
            ThemeService(kv, bus, catalogue, users=lambda: [u.id for u in users.all()])
        )
        kv_stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        for gone in await kv.set_aside_missing(lambda u: users.get(u) is not None, kv_stamp):
            theme.forget(gone)
        kv_tasks: set[asyncio.Task[None]] = set()

        async def set_aside_kv(user_id: str) -> None:
            try:
                await kv.set_aside(user_id, datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ"))
            except Exception:  # the next start sets them aside (set_aside_missing)
                _LOGGER.exception("setting aside the KV rows of removed user %r failed", user_id)
            theme.forget(user_id)

        def forget_kv(user_id: str) -> None:
            if users.get(user_id) is None:  # removed, not only disabled: an id may be reused
                task = asyncio.get_running_loop().create_task(set_aside_kv(user_id))
                kv_tasks.add(task)
                task.add_done_callback(kv_tasks.discard)

        users.on_change.append(forget_kv)
        upstream = await stack.enter_async_context(UpstreamClient())
        # on PostgreSQL: in the database too, so that a pod's calls are its app's on any shell
        tokens = await open_tokens(stack, db, bus, settings)
        shell_url = f"http://{loopback(settings.host)}:{settings.port}"
        state = await read_key(db) if settings.runner == "kubernetes" else ""
        runner = await asyncio.to_thread(
            load_runner, settings.runner, kube_settings(settings, state)
        )
        stack.push_async_callback(runner.close)  # after the lifecycle's shutdown (LIFO)
        ceilings = ceilings_of(settings.app_memory_mib, settings.app_cpu_milli, settings.app_pids)
        cgroups = await asyncio.to_thread(
            open_cgroups, settings.home, ceilings, settings.cgroup_parent, settings.app_limits
        )
        stack.callback(cgroups.close)
        # removed after the lifecycle stopped every instance (the stack is LIFO)
        network, isolation = await asyncio.to_thread(app_network, settings, runner)
        stack.callback(close_network, network)
        # the connections to apps closed while the bridge still carries their FIN: a stopped
        # instance's socket otherwise waits in FIN_WAIT2 (a minute) and keeps its namespace
        stack.push_async_callback(upstream.close)
        # the one door to the instances' addresses: only the shell's marked connections pass
        upstream.mark = 0 if network is None else SHELL_MARK
        # before any instance starts: a revoked app's first instance gets no egress
        revokes = await EgressRevokes.open(db)
        await revokes.forget_missing()
        _follow_removals(users, revokes)
        egress = EgressGrants(revokes, registry, bus, network)
        stack.callback(bus.listen((APP_EGRESS,), egress.heard, others=True))
        # apps run with PYTHONDONTWRITEBYTECODE (their directories are read-only in the sandbox):
        # compile the SDK once here so every cold start loads its bytecode
        await asyncio.to_thread(compileall.compile_file, SDK_SOURCE, quiet=2)
        toolchain = settings.home / "toolchain" / "bin"
        toolchain.mkdir(parents=True, exist_ok=True)
        # one lock per app for the distribution's operations, which a data request's wake
        # honours: nothing of the app starts while an operation has it stopped; held among the
        # shells too when they share the scope folder (on a home of its own, an app id of one
        # shell is no app of another)
        locks = AppLocks(coordination if layout.shared else None)
        # on PostgreSQL: the instances, views and tickets every shell's app origins serve from
        rows = await open_rows(stack, db, bus, settings, runner.name)
        lifecycle = await stack.enter_async_context(
            LifecycleManager(
                runner=runner,
                registry=registry,
                bus=bus,
                upstream=upstream,
                tokens=tokens,
                ports=PortAllocator(),
                config=LifecycleConfig(
                    layout=layout,
                    shell_url=shell_url,
                    toolchain_dir=toolchain,
                    cgroups=cgroups,
                    network=network,
                ),
                operations=locks,
                may_run=lambda owner: (user := users.get(owner)) is not None and not user.disabled,
                coordination=coordination,
                rows=rows,
            )
        )
        # a view another shell made is learnt here only while its user may see the instance
        lifecycle.views.may_view = lambda instance, user_id: (
            (user := users.get(user_id)) is not None
            and not user.disabled
            and access_to(user_id, instance, grants) is not None
        )
        lifecycle.views.reread_access = grants.reread
        stack.callback(lifecycle.pool.follow_registry())
        presence = Presence(
            settings.view_grace_seconds,
            lifecycle.views.release_client,
            # on PostgreSQL a host page's stream and its views may be on any shells
            None if rows is None else ClientStreams(db, coordination, rows.shell),
            lambda: coordination.is_leader,
        )
        await presence.start()
        stack.push_async_callback(presence.close)
        dataproxy = DataProxy(registry, lifecycle, bus, settings.data_decisions)
        stack.callback(dataproxy.close)
        launcher = Launcher(registry, lifecycle, bus, kv, installed_at(registry, layout))
        stack.callback(launcher.close)
        index = IndexClient(
            settings.index_url,
            settings.home / "cache" / "index.json",
            stored_path=settings.home / "catalogue.json",
        )
        fetch_policy = member_fetch_policy(settings)

        def make_dist(
            user_layout: ScopeLayout, user_repos: Mapping[Scope, ScopeRepo], apps: UserApps
        ) -> Distribution:
            return Distribution(
                layout=user_layout,
                repos=user_repos,
                registry=apps,
                lifecycle=lifecycle,
                bus=bus,
                index=index,
                locks=locks,
                reach=Reach(
                    fetch_policy,
                    restricted=not_an_admin(users, user_layout.user),
                    index_host=index_host(index),
                ),
                egress=egress,
            )

        dist = make_dist(layout, repos, UserApps(registry, layout.user))
        user_scopes = UserScopes(layout, registry, repos, dist, make_dist)
        user_scopes.on_forget += [dataproxy.forget_user, launcher.forget_user]
        await user_scopes.open_found(lambda user_id: users.get(user_id) is not None)
        users.on_change.append(user_scopes.forgetter(lambda u: users.get(u) is not None))
        _end_instances_of_gone_users(users, lifecycle)
        stack.callback(
            bus.listen(
                (SCOPE_CHANGED,),
                reread_scopes(
                    registry,
                    user_scopes,
                    lambda u: users.get(u) is not None,
                    ChangedElsewhere(lifecycle, registry, locks),
                ),
                others=True,
            )
        )
        usage = await stack.enter_async_context(
            UsageMonitor(bus, running_of(lifecycle), settings.home, settings.usage_seconds)
        )
        # a runner whose servers outlive the shell (pods): the last shell's come back as
        # instances, with their tokens, before anything new is spawned
        adopted = await lifecycle.adopt_survivors()
        # what this shell's last run left in the instances' table and did not come back
        await sweep_rows(rows, {instance.id for instance in adopted})
        await tokens.sweep()
        take_over_pods(stack, lifecycle, runner, db, rows, coordination, tokens)
        await lifecycle.pool.fill_all()
        _LOGGER.info(
            "shell open: home %s, %d visible apps, runner %s",
            settings.home,
            len(registry.visible()),
            runner.name,
        )
        yield Shell(
            settings=settings,
            layout=layout,
            db=db,
            coordination=coordination,
            bus=bus,
            kv=kv,
            registry=registry,
            repos=repos,
            user_auth=user_auth,
            users=users,
            grants=grants,
            audit=audit,
            app_tokens=tokens,
            upstream=upstream,
            lifecycle=lifecycle,
            presence=presence,
            dataproxy=dataproxy,
            launcher=launcher,
            theme=theme,
            dist=dist,
            user_scopes=user_scopes,
            usage=usage,
            network=network,
            isolation=isolation,
            egress=egress,
        )
