"""Publish an app directory as a git tag or an OCI artifact, as an async generator of progress events.

docs/api.md "Publishing": not gated by permissions; git uses the
user's git configuration (credentials, identity), OCI the Docker config. ``Publisher.plan`` checks
everything that can be checked before anything moves (the directory, its manifest, the target and the
tag), so a route can answer those errors with their own status; ``Publisher.run`` then yields
``publish.progress {message}`` … ``publish.done {ref, installCommand, followCommand, id, version,
digest}`` and
mirrors them on the bus (``dist:publish.progress``, ``dist:publish.done``, ``dist:publish.complete``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, TypeAlias
from urllib.parse import unquote

from atrium.distribution import artifact, signing
from atrium.distribution.oci import list_tags, move_tag, push_app
from atrium.distribution.pins import newer_tags, tag_version
from atrium.distribution.refs import DEFAULT_TAG, TAG_RE, GitRef, OciRef, parse_ref
from atrium.distribution.signatures import push_signature
from atrium.errors import BadRef, FetchFailed, InvalidRequest, UpstreamFailed
from atrium.events import (
    PUBLISH_DONE,
    PUBLISH_PROGRESS,
    DistPublishComplete,
    DistPublishDone,
    DistPublishProgress,
    Payload,
)
from atrium.files import write_atomic
from atrium.git import GitError, run_git
from atrium.manifest import Manifest

_LOGGER = logging.getLogger(__name__)
GIT_SCHEMES: Final = ("git://", "git+https://", "git+file://", "file://", "https://")
FALLBACK_IDENTITY: Final = ("-c", "user.name=Atrium", "-c", "user.email=atrium@localhost")

PublishEvent: TypeAlias = dict[str, Any]
#: called with each bus event's payload (the API wires it to ``shell.bus.emit``)
PublishHook: TypeAlias = Callable[[Payload], object]
Target: TypeAlias = OciRef | GitRef


@dataclass(frozen=True, slots=True)
class _Published:
    """The last item of a publish's steps: the manifest digest (OCI) or the tagged commit (git)."""

    digest: str
    #: the install command that follows updates (the pushed branch, the moving tag)
    follow: str | None = None


@dataclass(frozen=True, slots=True)
class PublishPlan:
    """A checked publish request: the app, where it goes and under which tag."""

    app_dir: Path
    manifest: Manifest
    target: Target
    #: the signing key (an ECDSA P-256 private key, PEM) when the publish is signed
    sign_key: bytes | None = None

    @property
    def ref(self) -> str:
        return str(self.target)

    @property
    def install_command(self) -> str:
        return f"atrium install {self.target}"


def parse_target(to: str, tag: str) -> Target:
    """``to`` with ``tag``: an OCI repository (``oci://host/repo`` or ``host/repo``, no tag) or a git
    repository (``git://…``, ``git+https://…``, ``git+file://…``, ``file://…`` or an absolute path).
    """
    to = to.strip()
    if not TAG_RE.fullmatch(tag) or ".." in tag or tag.endswith((".", ".lock")):
        raise InvalidRequest(
            f"{tag!r} is not a tag: letters, digits, '_', '.', '-' (at most 128, not starting "
            "with '.' or '-', no '..')"
        )
    if to.startswith("/"):
        return GitRef(Path(to).as_uri(), tag)
    if to.startswith(GIT_SCHEMES):
        url = "git+" + to if to.startswith(("file://", "https://")) else to
        ref = parse_ref(url)
        if not isinstance(ref, GitRef) or ref.ref is not None:
            raise InvalidRequest(f"{to!r}: give the tag with `tag`, not as '#…' in the target")
        return GitRef(ref.url, tag)
    if "://" in to and not to.startswith("oci://"):
        raise BadRef(to, "a publish target is an OCI repository or a git repository")
    rest = to.removeprefix("oci://")
    path = rest.partition("/")[2]
    if ":" in path or "@" in path:
        raise InvalidRequest(f"{to!r}: give the tag with `tag`, not in the target")
    ref = parse_ref(f"oci://{rest}:{tag}")
    if not isinstance(ref, OciRef):  # pragma: no cover - an oci:// ref always parses as OciRef
        raise BadRef(to, "not an OCI repository")
    return ref


class Publisher:
    """Publishes app directories (docs/api.md "Publishing").

    ``publish_event(payload)`` receives the bus events; ``docker_config`` is the Docker config
    file or directory for registry credentials (None: ``$DOCKER_CONFIG`` or ``~/.docker``).
    """

    def __init__(
        self, publish_event: PublishHook | None = None, docker_config: Path | None = None
    ) -> None:
        self._publish_event = publish_event
        self._docker_config = docker_config

    async def plan(self, app_dir: Path, to: str, tag: str, sign: Path | None = None) -> PublishPlan:
        """Check the request: InvalidRequest, BadRef or ManifestInvalid before anything moves.
        ``sign``: the private key file to sign with (read and checked now)."""
        if not app_dir.is_absolute():
            raise InvalidRequest(f"{str(app_dir)!r} must be an absolute path")
        if not await asyncio.to_thread(app_dir.is_dir):
            raise InvalidRequest(f"{app_dir} is not a directory")
        target = parse_target(to, tag)
        manifest = await asyncio.to_thread(artifact.read_app_manifest, app_dir)
        # special files and links leaving the tree are refused now, not halfway through
        await asyncio.to_thread(lambda: list(artifact.app_files(app_dir, manifest.id)))
        if isinstance(target, OciRef):
            await asyncio.to_thread(artifact.check_artifact_size, app_dir, manifest.id)
        if isinstance(target, GitRef):
            await _check_tag_name(target)
        key = None if sign is None else await asyncio.to_thread(_read_signing_key, sign)
        return PublishPlan(app_dir, manifest, target, key)

    async def publish(self, app_dir: Path, to: str, tag: str) -> AsyncGenerator[PublishEvent, None]:
        plan = await self.plan(app_dir, to, tag)
        async for event in self.run(plan):
            yield event

    async def run(self, plan: PublishPlan) -> AsyncGenerator[PublishEvent, None]:
        """Carry out a plan; the last event is ``publish.done``. Failures raise AtriumErrors."""
        steps = self._to_oci(plan) if isinstance(plan.target, OciRef) else self._to_git(plan)
        digest: str | None = None
        follow: str | None = None
        async with contextlib.aclosing(steps) as messages:
            async for message in messages:
                if isinstance(message, _Published):
                    digest, follow = message.digest, message.follow
                    continue
                self._emit(DistPublishProgress(message, plan.ref))
                yield {"type": PUBLISH_PROGRESS, "message": message}
        done = DistPublishDone(
            plan.manifest.id, plan.manifest.version, plan.ref, plan.install_command, digest, follow
        )
        _LOGGER.info("published %s %s to %s", plan.manifest.id, plan.manifest.version, plan.ref)
        self._emit(done)
        self._emit(DistPublishComplete(plan.manifest.id, plan.ref))
        yield {"type": PUBLISH_DONE, **done.wire()}

    def _emit(self, payload: Payload) -> None:
        if self._publish_event is not None:
            self._publish_event(payload)

    async def _to_oci(self, plan: PublishPlan) -> AsyncGenerator[str | _Published, None]:
        """Progress lines of an OCI push, then the manifest digest."""
        if not isinstance(plan.target, OciRef):  # pragma: no cover - chosen by run()
            raise TypeError(plan.target)
        yield f"publishing {plan.manifest.id} {plan.manifest.version} to {plan.ref}"
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        push = asyncio.create_task(
            push_app(plan.app_dir, plan.target, self._docker_config, progress=queue.put_nowait),
            name=f"publish {plan.ref}",
        )
        push.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (message := await queue.get()) is not None:
                yield message
            digest = await push
        finally:
            if not push.done():
                push.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await push
        yield f"pushed {plan.ref} as {digest}"
        if plan.sign_key is not None:
            tag = await push_signature(plan.target, digest, plan.sign_key, self._docker_config)
            yield f"signed {digest} (the signature is the tag {tag})"
        follow = None
        async for item in self._move_latest(plan.target, digest):
            if isinstance(item, _Published):
                follow = item.follow
            else:
                yield item
        yield _Published(digest, follow)

    async def _move_latest(
        self, target: OciRef, digest: str
    ) -> AsyncGenerator[str | _Published, None]:
        """A version tag pins; ``latest`` follows (decisions.md "Updates that arrive"): it is
        moved to the new artifact unless the repository has a newer version tag already. The
        last item carries the following install command (None when ``latest`` stays elsewhere
        and does not exist)."""
        version = tag_version(target.tag or "")
        if version is None:  # `latest`, `edge`, …: the tag itself moves
            yield _Published(digest, f"atrium install {target}")
            return
        try:
            tags = await list_tags(target, self._docker_config)
        except FetchFailed as err:
            yield f"note: the tag list could not be read, so latest was not moved: {err.message}"
            yield _Published(digest, None)
            return
        latest = replace(target, tag=DEFAULT_TAG, digest=None)
        if newer_tags(tags, version):
            yield f"{target.repository} has a newer version tag; latest stays where it is"
            yield _Published(digest, f"atrium install {latest}" if DEFAULT_TAG in tags else None)
            return
        await move_tag(target, digest, DEFAULT_TAG, self._docker_config)
        yield f"moved {latest} to {digest} (installs from it follow updates)"
        yield _Published(digest, f"atrium install {latest}")

    async def _to_git(self, plan: PublishPlan) -> AsyncGenerator[str | _Published, None]:
        """Progress lines of a git publish, then the tagged commit."""
        if not isinstance(plan.target, GitRef):  # pragma: no cover - chosen by run()
            raise TypeError(plan.target)
        url, tag, app_id = plan.target.url, plan.target.ref or "", plan.manifest.id
        with tempfile.TemporaryDirectory(prefix="atrium-publish-") as tmp_name:
            tmp = Path(tmp_name)
            work = tmp / "work"
            bare = _local_path(url)
            if bare is not None and not await asyncio.to_thread(bare.exists):
                yield f"creating the bare repository {bare}"
                await _git("init", "--quiet", "--bare", "--initial-branch=main", str(bare), cwd=tmp)
            if await _git("ls-remote", "--tags", url, f"refs/tags/{tag}", cwd=tmp):
                raise InvalidRequest(f"the tag {tag!r} exists already in {url}; choose a new tag")
            branch, exists = await _target_branch(url, tmp)
            if exists:
                yield f"cloning {url} (branch {branch})"
                await _git(
                    "clone", "--quiet", "--depth=1", f"--branch={branch}", url, "work", cwd=tmp
                )
            else:
                yield f"{url} has no branch yet: starting {branch}"
                await _git("init", "--quiet", f"--initial-branch={branch}", "work", cwd=tmp)
            yield f"copying {plan.app_dir} into the repository (branch {branch})"
            await asyncio.to_thread(_replace_tree, plan.app_dir, app_id, work)
            commit = await _commit(work, f"publish {app_id} {plan.manifest.version}")
            yield f"committed {commit[:12]}; tagging {tag}"
            identity = await _identity(work)
            message = f"publish {app_id} {plan.manifest.version}"
            if plan.sign_key is None:
                await _git(*identity, "tag", "--annotate", "--message", message, tag, cwd=work)
            else:
                signer = await asyncio.to_thread(_ssh_signing_key, plan.sign_key, tmp)
                await _git(
                    *identity, "-c", "gpg.format=ssh", "-c", f"user.signingkey={signer}",
                    "tag", "--sign", "--message", message, tag, cwd=work,
                )  # fmt: skip
                yield f"signed the tag {tag} with an SSH signature"
            yield f"pushing {branch} and {tag} to {url}"
            refspecs = (f"HEAD:refs/heads/{branch}", f"refs/tags/{tag}")
            await _git("push", "--quiet", "--atomic", url, *refspecs, cwd=work)
            follow = f"atrium install {GitRef(url, branch)}"  # the branch moves, the tag pins
        if plan.target.name != app_id:
            yield (
                f"note: installs from git take the repository's name as the app's directory; "
                f"{plan.target.name!r} is not {app_id!r}, so name the repository {app_id}.git"
            )
        yield _Published(commit, follow)


def _read_signing_key(path: Path) -> bytes:
    """The private key file's PEM, checked to be an ECDSA P-256 key (InvalidRequest if not)."""
    if not path.is_absolute():
        raise InvalidRequest(f"the signing key {str(path)!r} must be an absolute path")
    try:
        pem = path.read_bytes()[: 1 << 16]
    except OSError as err:
        raise InvalidRequest(f"the signing key {path} cannot be read: {err.strerror}") from err
    try:
        signing.load_private_key(pem)
    except signing.KeyProblem as err:
        raise InvalidRequest(f"{path}: {err}") from err
    return pem


def _ssh_signing_key(pem: bytes, folder: Path) -> Path:
    """The key as ssh-keygen signs with it: the PEM (0600) with its SSH public line beside it."""
    key_file = folder / "signing.key"
    write_atomic(key_file, pem)
    public = signing.load_private_key(pem).public_key()
    (folder / "signing.key.pub").write_text(signing.ssh_public_line(public) + "\n")
    return key_file


def _local_path(url: str) -> Path | None:
    return Path(unquote(url.removeprefix("file://"))) if url.startswith("file://") else None


async def _git(*args: str, cwd: Path) -> str:
    try:
        # the user's own git configuration (credentials, identity) for the remote and the
        # throw-away work tree; hooks and fsmonitor stay off (atrium.git.run_git)
        return await run_git(*args, cwd=cwd, user_config=True)
    except GitError as err:
        reason = err.stderr.strip() or str(err)
        raise UpstreamFailed(f"publishing failed: git {args[0]}: {reason}", reason=reason) from err


async def _check_tag_name(target: GitRef) -> None:
    try:
        await run_git("check-ref-format", f"refs/tags/{target.ref}", cwd=Path("/"))
    except GitError as err:
        raise InvalidRequest(f"{target.ref!r} is not a valid git tag name") from err


async def _target_branch(url: str, cwd: Path) -> tuple[str, bool]:
    """The branch to publish on and whether it exists: the remote's HEAD branch, else ``main``,
    ``master`` or its first branch; ``main`` for a repository without branches."""
    heads = [
        line.split("refs/heads/", 1)[1]
        for line in (await _git("ls-remote", "--heads", url, cwd=cwd)).splitlines()
        if "refs/heads/" in line
    ]
    symref = await _git("ls-remote", "--symref", url, "HEAD", cwd=cwd)
    head = next(
        (
            line.split("refs/heads/", 1)[1].split()[0]
            for line in symref.splitlines()
            if line.startswith("ref: refs/heads/")
        ),
        None,
    )
    for candidate in (head, "main", "master", *heads):
        if candidate in heads:
            return candidate, True
    return "main", False


async def _identity(work: Path) -> tuple[str, ...]:
    """The user's git identity, or Atrium's when the user has none configured."""
    email = await run_git("config", "user.email", cwd=work, check=False, user_config=True)
    return () if email.strip() else FALLBACK_IDENTITY


async def _commit(work: Path, message: str) -> str:
    await _git("add", "--all", cwd=work)
    if (await _git("status", "--porcelain", cwd=work)).strip():
        await _git(*await _identity(work), "commit", "--quiet", "--message", message, cwd=work)
    return (await _git("rev-parse", "HEAD", cwd=work)).strip()


def _replace_tree(app_dir: Path, app_id: str, work: Path) -> None:
    """Make ``work``'s tree exactly the app tree (blocking; run it in a thread)."""
    for entry in work.iterdir():
        if entry.name == ".git":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for source in artifact.app_files(app_dir, app_id):
        dest = work / source.relative_to(app_dir)
        if source.is_symlink():
            dest.symlink_to(source.readlink())
        elif source.is_dir():
            dest.mkdir()
        else:
            shutil.copy2(source, dest)
