"""The distribution service: install, update and preview as async generators of progress events,
uninstall, and the approval gate (docs/api.md "Distribution"; decisions.md "Distribution").

Each generator yields ``{"type": …, …}`` events and ends with a ``result`` event, or raises an
AtriumError (after ``permission.denied`` for a denial). Staging lives in an ``async with`` inside the
generator, so it is removed on failure, denial or an early close — consume with
``contextlib.aclosing``. The install stage itself runs to its end even if the consumer goes away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, cast

from atrium.bus import EventBus
from atrium.distribution.backups import Backup
from atrium.distribution.diff import PermissionDiff, diff_manifests, requires_approval
from atrium.distribution.exports import unpack
from atrium.distribution.fetchers import ProgressEvent, ResolvedRef, fetcher_for, verify_source
from atrium.distribution.history import HistoryEntry, app_history, extract_app, pick_target
from atrium.distribution.images import PinnedImage, egress_review, image_review, pin_image
from atrium.distribution.index import IndexClient
from atrium.distribution.install import Installer, InstallPlan, changed_files
from atrium.distribution.keeping import DataKeeping
from atrium.distribution.operations import AppLocks, mutable, run_to_completion, staging
from atrium.distribution.pins import at_tag, baseline, newer_tags
from atrium.distribution.reach import Reach
from atrium.distribution.records import InstallRecord, RecordStore, now, source_of
from atrium.distribution.refs import GitRef, LocalRef, OciRef, Ref, names_machine_files
from atrium.distribution.resolve import Resolver
from atrium.distribution.signing import Verdict, refuses
from atrium.distribution.stops import InstanceStops
from atrium.distribution.trust import read_trust
from atrium.distribution.validate import check_authority, runtime_folders, validate_staged
from atrium.egress import Ask, asked
from atrium.errors import (
    ApprovalDenied,
    ApprovalStale,
    AtriumError,
    FetchFailed,
    InvalidRequest,
    NotADevCopy,
    NotFound,
    SystemScopeImmutable,
    UntrustedArtifact,
)
from atrium.events import (
    CHECK_DONE,
    CHECK_START,
    FETCH_DONE,
    FETCH_START,
    IMPORT_CHECKED,
    INSTALL_DONE,
    INSTALL_START,
    PERMISSION_APPROVED,
    PERMISSION_DENIED,
    PERMISSION_NEEDED,
    RESOLVE_DONE,
    RESOLVE_START,
    RESULT,
    ROLLBACK_START,
    VALIDATE_DONE,
    AppRemoved,
    DevFailed,
    DevReloaded,
    DevReloading,
    DistInstallComplete,
    DistRollbackComplete,
    DistUninstallComplete,
    DistUpdateComplete,
)
from atrium.git import ScopeRepo
from atrium.images.store import ImageStore
from atrium.lifecycle.limits import Limits, effective_limits, review_words
from atrium.lifecycle.manager import LifecycleManager
from atrium.manifest import Manifest
from atrium.permissions import describe
from atrium.registry import AppCopy, UserApps
from atrium.scopes import Scope, ScopeLayout

_LOGGER = logging.getLogger(__name__)


def event(kind: str, **fields: Any) -> ProgressEvent:
    return {"type": kind, **fields}


@dataclass(frozen=True, slots=True)
class Approval:
    """The caller's answer to the permission gate (decisions.md "Distribution")."""

    auto_approve: bool = False
    #: False denies; True approves like ``auto_approve``; None has not answered
    approve: bool | None = None
    #: the digest the user saw; a source that resolves to another now is 409 approval_stale
    approved_digest: str | None = None

    @property
    def approved(self) -> bool:
        return self.auto_approve or self.approve is True

    def check(self, resolved: ResolvedRef) -> None:
        if self.approved_digest is not None and self.approved_digest != resolved.digest:
            raise ApprovalStale(self.approved_digest, resolved.digest)


def _signature(verdict: Verdict | None, changed: bool = False) -> dict[str, Any]:
    """The ``signature`` field of the review and the result (absent under policy ``off``)."""
    if verdict is None:
        return {}
    wire = verdict.wire()
    if changed:
        wire["signerChanged"] = True
    return {"signature": wire}


def _resources(manifest: Manifest, ceilings: Limits) -> dict[str, Any]:
    """What the app may use once installed, as the review shows it: the manifest's ``resources``
    capped by the administrator's ceilings (their default where it asks nothing), in numbers and
    in plain words (docs/api.md "Resource limits")."""
    asked = manifest.resources
    limits = effective_limits(
        None if asked is None else Limits(asked.memory_mib, asked.cpu_milli, asked.pids),
        ceilings,
    )
    return {
        "memoryMiB": limits.memory_mib,
        "cpuMilli": limits.cpu_milli,
        "pids": limits.pids,
        "asked": asked is not None,
        "words": review_words(limits, asked is not None),
    }


def _summary(manifest: Manifest, size: int) -> dict[str, Any]:
    """The app as the install review names it: every source, a git one included (which has no
    manifest preview), gets its name, version, description, icon and size from the fetched copy."""
    return {
        "id": manifest.id,
        "name": manifest.name,
        "version": manifest.version,
        "description": manifest.description,
        "icon": manifest.icon,
        "size": size,
        # the diff says only whether a provider is added; the review names what it shares as
        "authority": manifest.data_provider.authority if manifest.data_provider else None,
    }


def _tree_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (the fetched app, what the install adds)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def same_app(app_id: str, ref: str, found: str) -> None:
    """An update replaces ``app_id`` with ``app_id``: a recorded ref that now resolves to (or
    fetches) another app is refused before anything changes (issue: a moved OCI tag must not
    install app B under A's record, or over an existing B)."""
    if found != app_id:
        raise FetchFailed(
            ref,
            f"the recorded source of {app_id!r} now holds the app {found!r}, not {app_id!r}; "
            "nothing was changed (install that app by its own ref if it is wanted)",
        )


class EgressRevokeKeeper(Protocol):
    """What the apps' egress grants hear of the pipeline (`atrium.lifecycle.egress`): a
    revoke stays over a copy put in place without an approval (a rollback, an uninstall that
    unmasks a system copy) whatever more it asks, and goes with the holder's last copy (a later
    install asks anew, and its approval is the grant)."""

    async def unapproved(self, app_id: str, holder: str, ask: Ask) -> None: ...

    async def uninstalled(self, app_id: str, holder: str) -> None: ...


class Distribution:
    """Resolve → fetch → validate → permission diff → install, update and uninstall."""

    def __init__(
        self,
        *,
        layout: ScopeLayout,
        repos: Mapping[Scope, ScopeRepo],
        registry: UserApps,
        lifecycle: LifecycleManager,
        bus: EventBus,
        index: IndexClient,
        docker_config: Path | None = None,
        locks: AppLocks | None = None,
        reach: Reach | None = None,
        egress: EgressRevokeKeeper | None = None,
    ) -> None:
        """``locks``: the per-app operation locks, when the lifecycle's wakes honour them too;
        ``reach``: where this user's fetches may connect (atrium.distribution.reach);
        ``egress``: what a rollback and an uninstall tell the apps' egress grants."""
        self._layout = layout
        self._registry = registry
        self._lifecycle = lifecycle
        self._bus = bus
        self._docker_config = docker_config
        self.index = index
        self.records = RecordStore(layout)
        self.installer = Installer(layout, repos, self.records)
        self._reach = reach
        self._egress = egress
        self.resolver = Resolver(index, docker_config, reach)
        self.locks = locks or AppLocks()
        self.stops = InstanceStops(lifecycle, registry)
        #: a dev copy's instances whose start on a save failed (and were let go): the next
        #: save brings them back, under the ids the author's open tabs show
        self._dev_failed: dict[str, list[str]] = {}
        self.data = DataKeeping(
            layout=layout,
            records=self.records,
            journals=self.installer.journals,
            locks=self.locks,
            stops=self.stops,
            scope_of=self.mutable_scope_of,
            failed=bus.emit,
        )

    # -- queries --------------------------------------------------------------------------------

    def installed(self) -> list[InstallRecord]:
        return self.records.all()

    def record(self, scope: Scope, app_id: str) -> InstallRecord | None:
        return self.records.get(scope, app_id)

    def mutable_scope_of(self, app_id: str) -> Scope:
        """The winning mutable scope holding ``app_id`` (a copy, valid or not)."""
        copies = self._registry.copies(app_id)
        for copy in copies:
            if copy.scope.is_mutable:
                return copy.scope
        if copies:
            raise SystemScopeImmutable(f"change {app_id!r}, a system app")
        raise NotFound("app", app_id)

    # -- install, preview, update ---------------------------------------------------------------

    async def install(
        self, ref: Ref, scope: Scope, approval: Approval, *, dev: bool = False
    ) -> AsyncGenerator[ProgressEvent, None]:
        """``dev``: a dev copy (`atrium dev`), only in the user scope and never over an install."""
        mutable(scope, "install into it", self.installer.journals)
        if dev and scope is not Scope.USER:
            raise InvalidRequest("a dev copy lives in the user scope only")
        yield event(RESOLVE_START, ref=str(ref))
        resolved = await self.resolver.resolve(ref)
        yield event(RESOLVE_DONE, resolved=resolved.wire())
        approval.check(resolved)
        async with self.locks.hold(resolved.dir_name, "install"):
            if dev:
                self._no_install_under(resolved.dir_name, scope)
            run = self._run("install", str(ref), resolved, scope, approval, dev=dev)
            async with aclosing(run) as steps:
                async for item in steps:
                    yield item

    def _no_install_under(self, app_id: str, scope: Scope) -> None:
        """A dev copy replaces only a dev copy: an app installed (or placed by hand) in ``scope``
        stays untouched."""
        record = self.records.get(scope, app_id)
        placed = any(c.scope is scope for c in self._registry.copies(app_id))
        if placed and (record is None or not record.dev):
            raise NotADevCopy(app_id, scope.value)

    async def preview(self, ref: Ref, scope: Scope) -> AsyncGenerator[ProgressEvent, None]:
        """Resolve, fetch and validate only; the result carries the permission diff."""
        mutable(scope, "install into it", self.installer.journals)
        yield event(RESOLVE_START, ref=str(ref))
        resolved = await self.resolver.resolve(ref)
        yield event(RESOLVE_DONE, resolved=resolved.wire())
        async with staging(self._layout, self.installer.journals, scope) as path:
            async with aclosing(self._fetch(resolved, path)) as fetching:
                async for item in fetching:
                    yield item
            verdict = await self._verify(resolved, scope)
            manifest, diff = await self._check(resolved, path, scope)
            pinned = await self._image(manifest, path / resolved.dir_name, scope)
            yield event(VALIDATE_DONE, appId=manifest.id, version=manifest.version)
            note = self.data_note(manifest.id, scope)
            labels = self._registry.permission_labels()
            size = await asyncio.to_thread(_tree_bytes, path / resolved.dir_name)
            yield event(
                RESULT,
                ok=True,
                diff=diff.wire(),
                requiresApproval=requires_approval(diff) or self._new_image(pinned, scope),
                resolved=resolved.wire(),
                app=_summary(manifest, size),
                **({} if pinned is None else {"image": image_review(pinned, str(resolved.ref))}),
                **egress_review(manifest),
                permissions=[describe(name, labels) for name in diff.permissions_added],
                resources=_resources(manifest, self._lifecycle.limit_ceilings),
                **({"note": note} if note else {}),
                **_signature(verdict),
            )

    async def update(
        self, app_id: str, approval: Approval, check: bool | None = None, to: str | None = None
    ) -> AsyncGenerator[ProgressEvent, None]:
        """Re-resolve the recorded ref; the same digest is a no-op (docs/api.md "Requests"), which
        for a pinned install also lists the source's newer version tags.
        ``check``: try the new version before switching (None: when the app is running).
        ``to``: one of those newer tags, taken instead of the recorded ref (decisions.md
        "Updates that arrive")."""
        scope = mutable(self.mutable_scope_of(app_id), "update in it", self.installer.journals)
        record = self.records.get(scope, app_id)
        if record is None:
            raise NotFound(
                "install record",
                app_id,
                f"{app_id!r} in the {scope} scope has no install record (it was placed by hand), "
                "so there is no ref to update from; install it by ref instead",
            )
        async with self.locks.hold(app_id, "update"):
            ref = source_of(record)
            ref_text = record.ref
            if to is not None:
                ref = await self._newer_source(record, ref, to)
                ref_text = str(ref)
            yield event(RESOLVE_START, ref=ref_text)
            resolved = await self.resolver.resolve(ref)
            yield event(RESOLVE_DONE, resolved=resolved.wire())
            approval.check(resolved)
            same_app(app_id, ref_text, resolved.dir_name)
            restored: list[str] | None = None
            if resolved.digest == record.digest and to is None:
                # the same version, but is the installed tree still what was installed?
                restored = await changed_files(self.installer.repos[scope], app_id)
                if not restored:
                    pin = await self._pin_answer(record, ref, resolved.pinned)
                    self._bus.emit(DistUpdateComplete(app_id, None, owner=self._owner(scope)))
                    yield event(RESULT, ok=True, record=None, upToDate=True, **pin)
                    return
                _LOGGER.warning(
                    "%s in the %s scope differs from what was installed (%s): installing the "
                    "same version again",
                    app_id,
                    scope,
                    ", ".join(restored[:5]) + (" …" if len(restored) > 5 else ""),
                )
            run_update = self._run(
                "update",
                ref_text,
                resolved,
                scope,
                approval,
                app_id,
                restored=restored,
                check=check,
            )
            async with aclosing(run_update) as run:
                async for item in run:
                    yield item

    async def _pin_answer(
        self, record: InstallRecord, ref: Ref, pinned: str | None
    ) -> dict[str, Any]:
        """A pinned install's ``pinned`` and ``newerTags`` (the source's version tags newer than
        the pin), for the up-to-date answer; nothing for an install that follows its source."""
        if pinned is None or not isinstance(ref, GitRef | OciRef):
            return {}
        tags = await self.resolver.tags(ref)
        return {"pinned": pinned, "newerTags": newer_tags(tags, baseline(ref, record.version))}

    async def _newer_source(self, record: InstallRecord, ref: Ref, to: str) -> GitRef | OciRef:
        """The recorded source at the tag ``to``, which must be one of its version tags newer
        than what is installed; InvalidRequest naming ``to`` otherwise (nothing changes)."""
        if not isinstance(ref, GitRef | OciRef):
            raise InvalidRequest(
                f"{record.id!r} follows {record.ref!r}, which has no tags to choose from; "
                f"`to` ({to!r}) takes a newer tag of a git or OCI source",
                to=to,
            )
        newer = newer_tags(await self.resolver.tags(ref), baseline(ref, record.version))
        if to not in newer:
            listed = ", ".join(newer) or "none"
            raise InvalidRequest(
                f"{to!r} is not a newer version tag of {record.id!r}'s source {record.ref!r} "
                f"(newer tags: {listed}); nothing was changed",
                to=to,
                newerTags=newer,
            )
        return at_tag(ref, to)

    async def _run(
        self,
        op: Literal["install", "update"],
        ref_text: str,
        resolved: ResolvedRef,
        scope: Scope,
        approval: Approval,
        expected_id: str | None = None,
        *,
        restored: list[str] | None = None,
        check: bool | None = False,
        data: list[Path] | None = None,
        dev: bool | None = None,
        detached: bool = False,
    ) -> AsyncGenerator[ProgressEvent, None]:
        """``expected_id``: an update's app; a fetched app of another id changes nothing.
        ``restored``: an update of the same digest over a changed tree, and what had changed.
        ``check``: boot the staged version before the switch (None: when the app is running)."""
        async with staging(self._layout, self.installer.journals, scope) as path:
            async with aclosing(self._fetch(resolved, path)) as fetching:
                async for item in fetching:
                    yield item
            verdict = await self._verify(resolved, scope)
            manifest, diff = await self._check(resolved, path, scope)
            if expected_id is not None:
                same_app(expected_id, ref_text, manifest.id)
            pinned = await self._image(manifest, path / resolved.dir_name, scope)
            if pinned is not None:
                manifest = pinned.manifest
            yield event(VALIDATE_DONE, appId=manifest.id, version=manifest.version)
            signer_changed = self._signer_changed(scope, manifest.id, verdict, op)
            signed = _signature(verdict, signer_changed)
            if pinned is not None:
                signed = {**signed, "image": image_review(pinned, ref_text)}
            signed = {**signed, **egress_review(manifest)}
            new_image = self._new_image(pinned, scope)
            # a dev copy's permissions are its author's own (autoApprove, every save), but what
            # it may reach is asked like an install's: a save that widens its egress waits for
            # an answer (approve), never granted by the save alone
            unanswered = (
                self._is_dev(scope, manifest.id, dev)
                and diff.egress_added is not None
                and approval.approve is not True
            )
            if requires_approval(diff) or signer_changed or new_image or approval.approve is False:
                labels = self._registry.permission_labels()
                described = [describe(name, labels) for name in diff.permissions_added]
                yield event(
                    PERMISSION_NEEDED,
                    diff=diff.wire(),
                    resolved=resolved.wire(),
                    permissions=described,
                    **signed,
                )
                if approval.approve is False:
                    yield event(PERMISSION_DENIED, diff=diff.wire())
                    raise ApprovalDenied(manifest.id, diff.wire())
                if not approval.approved or unanswered:
                    note = self.data_note(manifest.id, scope) if op == "install" else None
                    yield event(
                        RESULT,
                        ok=False,
                        needsApproval=True,
                        diff=diff.wire(),
                        resolved=resolved.wire(),
                        permissions=described,
                        resources=_resources(manifest, self._lifecycle.limit_ceilings),
                        **({"note": note} if note else {}),
                        **signed,
                    )
                    return
                yield event(PERMISSION_APPROVED, digest=resolved.digest)
            if check or (check is None and self._is_running(manifest.id)):
                yield event(CHECK_START, appId=manifest.id, version=manifest.version)
                staged = AppCopy(manifest.id, scope, path / resolved.dir_name, manifest)
                took = await self._lifecycle.trial(staged, path / ".check-data")
                yield event(CHECK_DONE, appId=manifest.id, ms=round(took * 1000, 1))
            yield event(INSTALL_START, appId=manifest.id, scope=scope.value)
            record = self._new_record(manifest, scope, resolved, ref_text, dev, detached)
            if verdict is not None and verdict.signer is not None:
                record = record.model_copy(update={"signed_by": verdict.signer})
            plan = InstallPlan(
                op,
                path / resolved.dir_name,
                record,
                f"{op} {record.id} {record.version} ({ref_text})",
            )
            _, taken = await run_to_completion(self._install_stage(plan, data))
            yield event(INSTALL_DONE, record=record.wire())
            extra: dict[str, Any] = {} if restored is None else {"restored": restored}
            if op == "update":
                extra["backup"] = taken.id if taken else None
            if op == "install" and (note := self.data_note(manifest.id, scope)):
                extra["note"] = note
            yield event(RESULT, ok=True, record=record.wire(), **extra, **signed)

    async def _image(self, manifest: Manifest, app_dir: Path, scope: Scope) -> PinnedImage | None:
        """An image app's image pulled and pinned in the staged manifest (`pin_image`)."""
        if manifest.runtime is None:
            return None
        # the image the copy being replaced runs: the one the store gives without proof
        held = next(
            (
                c.manifest.runtime
                for c in self._registry.copies(manifest.id)
                if c.scope == scope and c.manifest is not None and c.manifest.runtime is not None
            ),
            None,
        )
        return await pin_image(
            manifest,
            app_dir,
            ImageStore(self._layout.home / "images", docker_config=self._docker_config),
            docker_config=self._docker_config,
            reach=self._reach,
            held=held,
        )

    def _new_image(self, pinned: PinnedImage | None, scope: Scope) -> bool:
        """An image app whose image is not the one the copy it replaces runs: always reviewed,
        like added permissions (another program, whatever its manifest says)."""
        if pinned is None or pinned.manifest.runtime is None:
            return False
        before = self._installed_manifest(pinned.manifest.id, scope)
        previous = None if before is None or before.runtime is None else before.runtime.digest
        return previous != pinned.manifest.runtime.digest

    async def _verify(self, resolved: ResolvedRef, scope: Scope) -> Verdict | None:
        """The fetched artifact's signature against ``scope``'s trust store (decisions.md
        "Signed apps"); None under policy ``off`` (nothing is asked of the source).
        UntrustedArtifact under ``require`` without a trusted signature, before anything moves."""
        trust = await asyncio.to_thread(read_trust, self._layout.root(scope))
        if trust.policy == "off":
            return None
        verdict = await verify_source(resolved, trust, self._docker_config, self._reach)
        if refuses(trust.policy, verdict):
            raise UntrustedArtifact(resolved.dir_name, str(resolved.ref), verdict.wire(), scope)
        return verdict

    def _signer_changed(self, scope: Scope, app_id: str, verdict: Verdict | None, op: str) -> bool:
        """An update signed by another key (or no longer signed, or newly signed) than the
        installed copy: asked like a permission change."""
        if verdict is None or op != "update":
            return False
        previous = self.records.get(scope, app_id)
        return previous is not None and previous.signed_by != verdict.signer

    def _is_dev(self, scope: Scope, app_id: str, dev: bool | None) -> bool:
        """Whether the copy this operation makes is a dev copy (None: what the replaced record
        says, as `_new_record` reads it)."""
        if dev is not None:
            return dev
        previous = self.records.get(scope, app_id)
        return bool(previous and previous.dev)

    def _is_running(self, app_id: str) -> bool:
        """Whether any instance of the app has a live child (warm-pool ones included)."""
        return any(i.child is not None for i in self._lifecycle.of_app(app_id))

    async def _fetch(
        self, resolved: ResolvedRef, path: Path
    ) -> AsyncGenerator[ProgressEvent, None]:
        yield event(FETCH_START, source=resolved.source, address=resolved.address)
        fetcher = fetcher_for(resolved, self._docker_config, self._reach)
        # every fetcher is an async generator (the contract in atrium.distribution.fetchers)
        progress = cast(AsyncGenerator[ProgressEvent, None], fetcher.fetch(resolved, path))
        async with aclosing(progress):
            async for item in progress:
                yield item
        yield event(FETCH_DONE, digest=resolved.digest)

    async def _check(
        self, resolved: ResolvedRef, path: Path, scope: Scope
    ) -> tuple[Manifest, PermissionDiff]:
        manifest = await asyncio.to_thread(validate_staged, path / resolved.dir_name, scope)
        check_authority(manifest, self._registry.visible())
        return manifest, diff_manifests(self._installed_manifest(manifest.id, scope), manifest)

    def _installed_manifest(self, app_id: str, scope: Scope) -> Manifest | None:
        """What the diff compares against: the copy being replaced, else the highest copy in a
        lower scope (the one the new copy will hide), never a copy in a higher scope: a global
        install is shared by every user and must ask for its permissions even when one user's
        copy already holds them (decisions.md "Distribution")."""
        lower = sorted(
            (c for c in self._registry.copies(app_id) if c.manifest is not None),
            key=lambda c: -c.scope.priority,
        )
        for copy in lower:
            if copy.scope.priority <= scope.priority:
                return copy.manifest
        return None

    def data_note(self, app_id: str, scope: Scope) -> str | None:
        """When another scope's copy of the app holds runtime data, say that the new copy will
        not see it (a user copy of Notes starts without the notes)."""
        for copy in self._registry.copies(app_id):
            if copy.scope is scope:
                continue
            folders = runtime_folders(self._layout.data_dir(copy.scope) / app_id, app_id)
            if folders:
                return (
                    f"{app_id} also exists in the {copy.scope} scope with data "
                    f"({len(folders)} instance folder{'s' if len(folders) > 1 else ''}); that data "
                    f"stays with that copy: the {scope} copy starts with its own"
                )
        return None

    def _new_record(
        self,
        manifest: Manifest,
        scope: Scope,
        resolved: ResolvedRef,
        ref_text: str,
        dev: bool | None = None,
        detached: bool = False,
    ) -> InstallRecord:
        """``dev`` None: what the replaced record said (an update of a dev copy stays one).
        ``detached``: an import whose ref names another machine's files (`InstallRecord`)."""
        previous = self.records.get(scope, manifest.id)
        stamp = now()
        return InstallRecord(
            id=manifest.id,
            version=manifest.version,
            scope=scope.value,
            source=resolved.source,
            ref=ref_text,
            digest=resolved.digest,
            channel=resolved.channel,
            installed_at=previous.installed_at if previous else stamp,
            updated_at=stamp,
            path=str(self._layout.app_dir(scope, manifest.id)),
            dev=dev if dev is not None else bool(previous and previous.dev),
            pinned=resolved.pinned,
            detached=detached,
        )

    async def _install_stage(
        self, plan: InstallPlan, data: list[Path] | Backup | None = None
    ) -> tuple[list[str], Backup | None]:
        """Swap the staged tree in; returns the instances stopped for it (and started again) and
        the backup of the runtime data taken before an update, a rollback or an import over an
        installed copy (once they stopped).
        ``data``: runtime data folders (an export's), or a backup whose folders (its copy
        checked against its `backup.json`: BackupDamaged, nothing swapped) replace the live data
        of this pipeline's user (`DataKeeping.carried`)."""
        app_id, scope = plan.record.id, plan.scope
        if plan.record.dev:
            self._bus.emit(DevReloading(app_id, owner=self._owner(scope)))
        stopped = await self.stops.stop_if_visible(app_id, scope, errored_too=plan.record.dev)
        if plan.record.dev:
            stopped += [i for i in self._dev_failed.pop(app_id, []) if i not in stopped]
        failed: dict[str, str] = {}
        taken: Backup | None = None
        try:
            if plan.op != "install" or data is not None:
                # an import over an installed copy replaces its data too: kept first
                reason = plan.op if plan.op != "install" else "import"
                taken = await self.data.snapshot(scope, app_id, reason)
            if data is not None:
                plan = dataclasses.replace(plan, move_data=False)
            async with self.data.carried(scope, app_id, data, plan.staged):
                await self.installer.install(plan)
        finally:
            await self._registry.rescan([scope])
            failed = await self.stops.restart(app_id, stopped)
            if plan.record.dev:
                self._dev_failed[app_id] = list(failed)
                self._dev_outcome(plan, stopped, failed)
        # only a finished operation drops old backups: a failed one never deletes any
        await asyncio.to_thread(self.data.backups.prune, scope, app_id)
        done = {
            "install": DistInstallComplete,
            "update": DistUpdateComplete,
            "rollback": DistRollbackComplete,
        }[plan.op]
        self._bus.emit(done(app_id, plan.record.wire(), owner=self._owner(scope)))
        return stopped, taken

    def require_dev_copy(self, app_id: str) -> None:
        """Anything but this user's own dev copy is answered as missing (before its body is
        read, so another user's app id answers as an unknown one whatever was sent)."""
        record = self.records.get(Scope.USER, app_id)
        if record is None or not record.dev:
            raise NotFound("dev copy", app_id)

    def dev_failed(self, app_id: str, message: str) -> None:
        """`atrium dev` found the folder of this user's dev copy wrong: `DevFailed` for their
        page."""
        self.require_dev_copy(app_id)
        self._bus.emit(DevFailed(app_id, message, owner=self._owner(Scope.USER)))

    def _dev_outcome(self, plan: InstallPlan, stopped: list[str], failed: dict[str, str]) -> None:
        """Tell the author's page how a dev copy's save went (`DevReloaded` / `DevFailed`)."""
        owner, app_id = self._owner(plan.scope), plan.record.id
        if failed:
            first = self._authors_paths(plan, next(iter(failed.values())))
            self._bus.emit(DevFailed(app_id, f"did not start: {first}", owner=owner))
        else:
            version = plan.record.version
            self._bus.emit(DevReloaded(app_id, version, stopped, owner=owner))

    def _authors_paths(self, plan: InstallPlan, text: str) -> str:
        """``text`` (an app's log) naming the author's folder a dev copy was installed from
        instead of the installed copy it runs from: the files the author edits."""
        if plan.record.source != "local":
            return text
        authors = plan.record.ref.removeprefix("local:")
        for copy in self._registry.copies(plan.record.id):
            if copy.scope is plan.scope:
                text = text.replace(f"{copy.path}/", f"{authors.rstrip('/')}/")
        return text

    def _holder(self, scope: Scope) -> str:
        """Whose egress grant a copy in ``scope`` has (`atrium.lifecycle.egress.holder_of`)."""
        return self._layout.user if scope is Scope.USER else ""

    def _owner(self, scope: Scope) -> str | None:
        """Whose events a change of ``scope`` makes: a user scope's are its user's alone, the
        shared scopes' everyone's."""
        return self._registry.user if scope is Scope.USER else None

    # -- history and rollback -------------------------------------------------------------------

    async def history(self, app_id: str, scope: Scope | None = None) -> list[HistoryEntry]:
        """The app's commits in ``scope`` (default: its winning changeable scope), newest first."""
        scope = mutable(scope or self.mutable_scope_of(app_id), "keep a history")
        return await app_history(self.installer.repos[scope], app_id)

    async def rollback(
        self,
        app_id: str,
        scope: Scope | None = None,
        to: str | None = None,
        keep_data: bool = False,
    ) -> AsyncGenerator[ProgressEvent, None]:
        """Put an earlier version back from the scope's git history, through the install journal
        (docs/api.md "Rollback")."""
        scope = mutable(
            scope or self.mutable_scope_of(app_id), "roll back in it", self.installer.journals
        )
        current = self.records.get(scope, app_id)
        if current is None:
            raise NotFound(
                "install record",
                app_id,
                f"{app_id!r} in the {scope} scope has no install record (it was placed by hand): "
                "there is no history to roll back",
            )
        async with self.locks.hold(app_id, "rollback"):
            repo = self.installer.repos[scope]
            target = pick_target(await app_history(repo, app_id), current, to)
            old = target.record
            if old is None:  # pragma: no cover - pick_target returns entries with a record
                raise NotFound("earlier version", to or app_id)
            # the old version's data, checked before anything starts (BackupDamaged when every
            # backup of it is damaged); note: the damaged newer ones skipped
            restore, note = (
                (None, "")
                if keep_data
                else await asyncio.to_thread(self.data.backup_of, scope, app_id, old.version)
            )
            yield event(
                ROLLBACK_START,
                appId=app_id,
                scope=scope.value,
                to=old.version,
                commit=target.commit,
                **{"from": current.version},
            )
            async with staging(self._layout, self.installer.journals, scope) as path:
                staged = await extract_app(repo, target.commit, app_id, path)
                manifest = await asyncio.to_thread(validate_staged, staged, scope)
                yield event(VALIDATE_DONE, appId=manifest.id, version=manifest.version)
                yield event(INSTALL_START, appId=app_id, scope=scope.value)
                record = old.model_copy(
                    update={
                        "scope": scope.value,
                        "installed_at": current.installed_at,
                        "updated_at": now(),
                        "path": str(self._layout.app_dir(scope, app_id)),
                        "rollback_of": current.version,
                        # what the copy is now, not what it was then: a rollback over an
                        # install never turns it back into a dev copy (whose removal would
                        # take the backups with it)
                        "dev": current.dev,
                    }
                )
                message = (
                    f"rollback {app_id} {old.version} (from {current.version}, "
                    f"{target.commit[:12]})"
                )
                plan = InstallPlan("rollback", staged, record, message)
                stopped, taken = await run_to_completion(self._install_stage(plan, restore))
            if self._egress is not None:
                # still under the app's lock: nothing of it started since
                await self._egress.unapproved(app_id, self._holder(scope), asked(manifest))
            yield event(INSTALL_DONE, record=record.wire())
            yield event(
                RESULT,
                ok=True,
                record=record.wire(),
                commit=target.commit,
                stopped=stopped,
                backup=taken.id if taken else None,
                dataRestored=restore.id if restore else None,
                **({"note": note} if note else {}),
            )

    # -- import ---------------------------------------------------------------------------------

    async def import_archive(
        self, archive: Path, scope: Scope, approval: Approval
    ) -> AsyncGenerator[ProgressEvent, None]:
        """Install an exported app with its data (docs/api.md "Export and import"): the archive
        is checked whole before anything is installed; the record keeps the exported ref."""
        mutable(scope, "import into it", self.installer.journals)
        async with staging(self._layout, self.installer.journals, scope) as path:
            unpacked = await asyncio.to_thread(unpack, archive, path / "import")
            yield event(IMPORT_CHECKED, appId=unpacked.record.id, version=unpacked.record.version)
            # the unpacked tree is the installed app's, every file of it
            resolved = await self.resolver.staged(LocalRef(str(unpacked.app_dir), whole=True))
            async with self.locks.hold(unpacked.record.id, "import"):
                run = self._run(
                    "install",
                    unpacked.record.ref,
                    resolved,
                    scope,
                    approval,
                    unpacked.record.id,
                    data=unpacked.data_dirs,
                    dev=False,  # an imported app is an install, whatever it replaces
                    detached=names_machine_files(unpacked.record.ref),
                )
                async with aclosing(run) as steps:
                    async for item in steps:
                        yield item

    async def import_data(self, archive: Path, scope: Scope) -> AsyncGenerator[ProgressEvent, None]:
        """An exported app's runtime data made this pipeline's user's own data of the copy
        installed in ``scope``, its tree left as it is (docs/api.md "Export and import", data
        only): how a member brings their data of a shared app back. The archive is checked whole
        first; an app not installed there is `404 not_found` and nothing changes."""
        mutable(scope, "import into it", self.installer.journals)
        async with staging(self._layout, self.installer.journals, scope) as path:
            unpacked = await asyncio.to_thread(unpack, archive, path / "import")
            app_id = unpacked.record.id
            yield event(IMPORT_CHECKED, appId=app_id, version=unpacked.record.version)
            if not any(c.scope is scope for c in self._registry.copies(app_id)):
                raise NotFound(
                    "app",
                    app_id,
                    f"{app_id!r} is not installed in the {scope} scope, nothing was changed: "
                    "importing only the data needs the app installed there",
                )
            async with self.locks.hold(app_id, "import"):
                answer = await self.data.import_own(scope, app_id, unpacked.data_dirs)
            yield event(RESULT, **answer)

    # -- uninstall ------------------------------------------------------------------------------

    async def uninstall(
        self, app_id: str, scope: Scope | None = None, *, dev_only: bool = False
    ) -> dict[str, Any]:
        """decisions.md "Distribution": ``{ok, id, scope, unmasked}``. ``dev_only``: remove it
        only while it is a dev copy (`atrium dev` ending: an install made over its copy
        meanwhile stays, `409 not_a_dev_copy`)."""
        if scope is None:
            scope = self.mutable_scope_of(app_id)
        mutable(scope, f"remove {app_id!r} from it", self.installer.journals)
        if not any(c.scope is scope for c in self._registry.copies(app_id)):
            raise NotFound("app", app_id, f"{app_id!r} is not installed in the {scope} scope")
        async with self.locks.hold(app_id, "uninstall"):
            if dev_only:
                self._no_install_under(app_id, scope)
            if scope is Scope.USER:
                self._dev_failed.pop(app_id, None)
            return await run_to_completion(self._uninstall_stage(app_id, scope))

    async def _uninstall_stage(self, app_id: str, scope: Scope) -> dict[str, Any]:
        copies = self._registry.copies(app_id)
        copy = next(c for c in copies if c.scope is scope)
        version = copy.manifest.version if copy.manifest else "(invalid)"
        record = self.records.get(scope, app_id)
        was_visible = self._registry.get(app_id) is copy
        unmasks = was_visible and any(c.is_valid and c.scope is not scope for c in copies)
        stopped = await self.stops.stop_all(app_id, scope) if was_visible else []
        try:
            async with staging(self._layout, self.installer.journals, scope) as path:
                await self.installer.uninstall(scope, app_id, path, f"uninstall {app_id} {version}")
        except AtriumError:
            await self.stops.restart(app_id, stopped)
            raise
        if record is not None and record.dev:
            # a dev copy leaves nothing behind: its backups go with it (an install's stay)
            await asyncio.to_thread(self.data.backups.remove_all, scope, app_id)
        if unmasks:
            # the registry announces the unmasked copy as installed, not the removal itself
            self._bus.emit(AppRemoved(app_id, scope.value, owner=self._owner(scope)))
        await self._registry.rescan([scope])
        if self._egress is not None:
            shared = scope is not Scope.USER
            left = [
                c for c in self._registry.copies(app_id) if (c.scope is not Scope.USER) == shared
            ]
            if not left:
                # no copy of this holder's left: the next install's approval is the grant
                await self._egress.uninstalled(app_id, self._holder(scope))
            else:
                # a shared copy unmasked (system under global): approved by no one now
                await self._egress.unapproved(app_id, self._holder(scope), asked(left[0].manifest))
        visible = self._registry.get(app_id)
        unmasked = visible.scope.value if visible else None
        self._bus.emit(
            DistUninstallComplete(app_id, scope.value, unmasked, owner=self._owner(scope))
        )
        return {"ok": True, "id": app_id, "scope": scope.value, "unmasked": unmasked}
