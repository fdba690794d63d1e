"""Booting an instance: its child spawned, its `/health` identity awaited, its exit watched.

`Booter` owns the runner, the port allocator and the app tokens for the lifecycle manager. It
never moves an instance along the table except `creating → error` when a spawn fails (every
`OSError` before the child runs is cause ``setup``, issue 14), and the crash watch's
`mark_crashed`, the one sanctioned bypass. The shell stops a child itself only through
`teardown`, which detaches the child from the instance first: a watched child whose instance no
longer holds it has exited because it was told to, not crashed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from atrium.egress import asked
from atrium.errors import SpawnFailed
from atrium.identity import AppTokens
from atrium.images.config import ConfigInvalid, launch
from atrium.images.store import ImageStore
from atrium.lifecycle.calls import ChildExited, HealthMismatch, wait_answers, wait_healthy
from atrium.lifecycle.instance import Instance
from atrium.lifecycle.limits import (
    Cgroups,
    InstanceCgroup,
    Limits,
    effective_limits,
    rlimit_plan,
)
from atrium.lifecycle.network import Network
from atrium.lifecycle.ports import PortAllocator, PortExhausted
from atrium.lifecycle.runners import Runner, SpawnSpec, Survivor
from atrium.lifecycle.runners.image import ImageRun, ImageRunner, image_ids, read_inside
from atrium.lifecycle.spawning import (
    app_environment,
    app_secrets,
    app_user,
    interpreter_paths,
    log_tail,
    port_answers,
    resolve_argv,
    sdk_path,
)
from atrium.lifecycle.states import InstanceState
from atrium.manifest import Manifest, Runtime
from atrium.registry import AppCopy, AppRegistry
from atrium.scopes import Scope, ScopeLayout
from atrium.settings import create_private
from atrium.upstream import UpstreamClient

_LOGGER = logging.getLogger(__name__)
S = InstanceState
STOP_GRACE: Final = 3.0
SpawnTask = Callable[[Awaitable[Any], str], "asyncio.Task[Any]"]
#: the runners whose children hold their limits on this machine (a cgroup, else rlimits)
LOCAL_RUNNERS: Final = ("process", "bwrap", "image")


@dataclass(frozen=True, slots=True)
class LifecycleConfig:
    """The slice of the settings the lifecycle needs."""

    layout: ScopeLayout
    shell_url: str
    app_host: str = "127.0.0.1"
    toolchain_dir: Path | None = None
    #: where instances get their resource limits (None: not enforced, e.g. unit tests)
    cgroups: Cgroups | None = None
    #: the instances' own networks (None: image apps behind a loopback forwarder)
    network: Network | None = None


class Booter:
    """Spawns children for instances, waits for their health identity, watches them exit."""

    def __init__(
        self,
        *,
        runner: Runner,
        registry: AppRegistry,
        upstream: UpstreamClient,
        tokens: AppTokens,
        ports: PortAllocator,
        config: LifecycleConfig,
        spawn_task: SpawnTask,
    ) -> None:
        self.runner = runner
        #: image apps run here whichever runner the shell uses for the others
        self.images = ImageRunner(network=config.network)
        self._registry = registry
        self._upstream = upstream
        self._tokens = tokens
        self._ports = ports
        self._config = config
        self._spawn_task = spawn_task

    def ports_in_use(self) -> int:
        return len(self._ports.in_use)

    @property
    def layout(self) -> ScopeLayout:
        return self._config.layout

    async def spawn(self, instance: Instance) -> None:
        """Start the child and wait for its `/health` identity; any failure → `error` and
        SpawnFailed with its cause."""
        copy = instance.source or self._registry.get(instance.app_id, instance.owner)
        if copy is None or copy.manifest is None:
            raise await self._fail(instance, "the app is no longer installed", "exited")
        instance.manifest = copy.manifest
        runtime = copy.manifest.runtime
        runner: Runner = self.runner if runtime is None else self.images
        fixed = runner.fixed_port
        try:
            port = fixed if fixed is not None else self._ports.reserve()
        except PortExhausted as err:
            raise await self._fail(instance, str(err), "port") from err
        except OSError as err:  # the probe socket: no fd left (EMFILE), issue 14
            raise await self._fail(instance, _setup_problem(err), "setup") from err
        instance.port, instance.host = port, self._config.app_host
        instance.secret = secrets.token_urlsafe(24)
        # a pod's token is valid on every shell (its calls reach any); a local server's, which
        # calls its own shell and dies with it, on this shell alone
        token = instance.token = self._tokens.issue(
            instance.app_id, instance.id, instance.owner, shared=runner.survives_shell
        )
        try:
            # on several shells: in the database before the server has it (its calls may reach
            # any shell)
            await self._tokens.stored(token)
        except Exception as err:  # any failure of the database: a setup one
            raise await self._fail(
                instance, f"its app token could not be stored: {err}", "setup"
            ) from err
        log_path = instance.log_path = self.layout.home / "run" / "logs" / f"{instance.id}.log"
        cgroup: InstanceCgroup | None = None
        try:
            spec = self._spawn_spec(instance, copy, copy.manifest, port, token, log_path)
            # a user scope's copy is that user's to grant; a shared copy's, the admins'
            holder = instance.owner if copy.scope is Scope.USER else ""
            spec = replace(spec, egress_key=(instance.app_id, holder), egress=asked(copy.manifest))
            run = None if runtime is None else self._image_run(instance, runtime)
            if run is not None:
                # an image does not speak the contract: its argv and environment are its own
                # its user is the image user's host id: its data folder is handed to that id
                # alone (the contract app's uid would take it back at every start)
                spec = replace(
                    spec,
                    argv=run.launch.argv,
                    env={},
                    secrets={},
                    ro_paths=(),
                    port=port,
                    user=run.host_user,
                )
            own_uid = spec.user is not None
            cgroup, instance.limits = self._cgroup(instance, copy.manifest, own_uid, runner)
            spec = replace(spec, limits=instance.limits, cgroup=cgroup)
            if run is not None:
                instance.child = await self.images.spawn(spec, run)
            else:
                instance.child = await self.runner.spawn(spec)
        except SpawnFailed as err:
            if cgroup is not None:
                cgroup.try_remove()
            cause = str(err.fields.get("cause", "exited"))
            raise await self._fail(instance, err.message, cause) from err
        except OSError as err:
            if cgroup is not None:
                cgroup.try_remove()
            # before the child runs (the log cannot be opened, no fd left, a full disk): the
            # instance goes to `error` with the reason, never stays in `creating`
            raise await self._fail(instance, _setup_problem(err), "setup") from err
        await self._await_health(instance, copy.manifest, port, log_path, runner)
        instance.stamp_started()
        instance.watcher = self._spawn_task(self._watch(instance), f"crash watch {instance.id}")

    def adopt(self, instance: Instance, survivor: Survivor) -> None:
        """Take over a server an earlier shell left running (``survivor``, already adopted by
        the runner): the instance keeps its token and shell secret (the server holds them), and
        its exit is watched as a spawn's is."""
        child = survivor.app
        instance.port, instance.host = child.port, child.host
        instance.secret = survivor.secret
        self._tokens.register(instance.app_id, instance.id, instance.owner, survivor.token)
        instance.token = survivor.token
        instance.child = child
        instance.stamp_started()
        instance.watcher = self._spawn_task(self._watch(instance), f"crash watch {instance.id}")

    def detach(self, instance: Instance) -> None:
        """Let go of a server that outlives the shell (its runner ``survives_shell``): it keeps
        running for the next shell to adopt; only this shell's token for it is forgotten."""
        instance.child = None
        self._tokens.forget(instance.id)
        instance.token = None

    def _image_run(self, instance: Instance, runtime: Runtime) -> ImageRun:
        """The pinned image from the store, its config with the manifest's ``runtime`` over it
        (the user named by the image's own /etc/passwd and /etc/group, read inside it)."""
        digest = runtime.digest
        image = None if digest is None else ImageStore(self.layout.home / "images").get(digest)
        if image is None:
            raise SpawnFailed(
                f"cannot start {instance.app_id!r}: its image {runtime.image} is not in the "
                "image store (install the app again to pull it)",
                app_id=instance.app_id,
                cause="image",
            )
        passwd = read_inside(image.rootfs, "etc/passwd")
        group = read_inside(image.rootfs, "etc/group")
        try:
            launched = launch(image.config, runtime, passwd, group)
        except ConfigInvalid as err:
            raise SpawnFailed(
                f"cannot start {instance.app_id!r}: {err}", app_id=instance.app_id, cause="image"
            ) from err
        owner = None if instance.owner == self.layout.user else instance.owner
        ids = image_ids(instance.app_id, owner)
        return ImageRun(image.rootfs, launched, ids, tuple(runtime.data))

    def _cgroup(
        self, instance: Instance, manifest: Manifest, own_uid: bool, runner: Runner
    ) -> tuple[InstanceCgroup | None, Limits | None]:
        """The instance's cgroup with its limits written, and the limits it reports; where the
        shell uses no cgroup, no cgroup and what rlimits hold of them (a local runner sets them
        in the child, docs/decisions.md "Resource limits: rlimits where no cgroup is
        delegated"); on a cluster runner, what its pods' resources hold; None where nothing holds
        them (no `Cgroups`)."""
        cgroups = self._config.cgroups
        if cgroups is None:
            return None, None
        asked = manifest.resources
        limits = effective_limits(
            None if asked is None else Limits(asked.memory_mib, asked.cpu_milli, asked.pids),
            cgroups.ceilings,
        )
        if runner.name not in LOCAL_RUNNERS:
            # a pod's resources hold memory and CPU; a pod has no field for a process ceiling
            # (the kubelet's podPidsLimit is the node's), so none is claimed
            return None, replace(limits, pids=None, enforcement="pod")
        if not cgroups.enforced:
            return None, rlimit_plan(limits, own_uid).holds
        return cgroups.make(instance.id, limits), replace(limits, enforcement="cgroup")

    async def _await_health(
        self, instance: Instance, manifest: Manifest, port: int, log_path: Path, runner: Runner
    ) -> None:
        child = instance.child
        if child is None:  # pragma: no cover - set by spawn just before
            raise RuntimeError(f"{instance.id} has no child")
        instance.host = child.host
        exited = asyncio.ensure_future(child.wait())
        try:
            deadline = manifest.start_timeout_ms / 1000
            if manifest.runtime is not None:
                await wait_answers(
                    self._upstream.session,
                    instance.address,
                    manifest.runtime.health.path,
                    deadline,
                    exited,
                )
            else:
                await wait_healthy(self._upstream.session, instance.address, deadline, exited)
        except ChildExited as err:
            if err.reason == "oom":
                memory = instance.limits.memory_mib if instance.limits is not None else None
                raise await self._fail(
                    instance, f"{err}: out of memory (its limit is {memory} MiB)", "oom"
                ) from err
            cause = runner.early_exit_cause(log_path, err.code)
            raise await self._fail(instance, f"{err} ({log_tail(log_path)})", cause) from err
        except HealthMismatch as err:
            raise await self._fail(instance, str(err), "identity") from err
        except TimeoutError as err:
            raise await self._fail(
                instance,
                f"/health did not answer within {manifest.start_timeout_ms} ms on port "
                f"{port}: the app must listen on OS_PORT and answer /health",
                "port"
                if not await port_answers(child.host, port, self._upstream.mark)
                else "timeout",
            ) from err
        except OSError as err:  # the shell's side of the check (EMFILE); TimeoutError is one too
            raise await self._fail(instance, _setup_problem(err), "setup") from err
        finally:
            if not exited.done():
                exited.cancel()

    def _spawn_spec(
        self,
        instance: Instance,
        copy: AppCopy,
        manifest: Manifest,
        port: int,
        token: str,
        log_path: Path,
    ) -> SpawnSpec:
        """The log file (owner-only: the runner appends to it) and what the runner needs."""
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        create_private(log_path)
        return SpawnSpec(
            app_id=instance.app_id,
            instance_id=instance.id,
            app_dir=copy.path,
            argv=resolve_argv(copy),
            env=app_environment(
                app_id=instance.app_id,
                instance_id=instance.id,
                host=self._config.app_host,
                port=port,
                shell_url=self._config.shell_url,
                sdk=sdk_path(self.layout.home),
            ),
            secrets=app_secrets(token=token, secret=instance.secret),
            owner=instance.owner,
            data_dir=instance.data_dir,
            lock_dir=instance.lock_dir,
            data_of=instance.data_of,
            # a staged version on trial runs on an empty folder, thrown away after it
            scratch_data=instance.source is not None,
            host=self._config.app_host,
            port=None if self.runner.fixed_port is not None else port,
            log_path=log_path,
            tools=tuple(manifest.tools),
            toolchain_dir=self._config.toolchain_dir,
            ro_paths=interpreter_paths(self.layout.home),
            user=app_user(
                instance.app_id,
                None if instance.owner == self.layout.user else instance.owner,
            ),
            home=self.layout.home,
        )

    async def _fail(self, instance: Instance, reason: str, cause: str) -> SpawnFailed:
        """Tear the child down, move to `error`, and return the error for the caller to raise."""
        await self.teardown(instance)
        instance.error = f"spawn failed ({cause}): {reason}"
        if instance.state is S.CREATING:
            instance.enter(S.ERROR)
        return SpawnFailed(instance.error, app_id=instance.app_id, cause=cause)

    async def _watch(self, instance: Instance) -> None:
        """Crash detection: the child's exit while the instance still holds it."""
        child = instance.child
        if child is None:
            return
        status = await child.wait()
        if instance.child is not child:  # torn down by the shell (teardown detaches it first)
            return
        _LOGGER.warning(
            "%s %s: child exited with status %s (%s)",
            instance.app_id,
            instance.id,
            status.code,
            status.reason,
        )
        self.release(instance)
        instance.child = None
        instance.mark_crashed(status.code, status.reason)

    async def teardown(self, instance: Instance) -> None:
        """Stop the child (process group, SIGTERM → SIGKILL), return its port, revoke its token."""
        child, instance.child = instance.child, None
        if child is not None:
            await child.stop(STOP_GRACE)
        self.release(instance)

    def release(self, instance: Instance) -> None:
        if instance.port is not None:
            # a fixed port was never the allocator's; an image's always is (a local runner)
            if self.runner.fixed_port is None or instance.manifest.runtime is not None:
                self._ports.release(instance.port)
            instance.port = None
        self._tokens.revoke(instance.id)
        instance.token = None


def _setup_problem(err: OSError) -> str:
    where = f" ({err.filename})" if err.filename else ""
    return f"the spawn could not be set up: {err.strerror or err}{where}"
