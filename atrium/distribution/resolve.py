"""The resolver: a Ref becomes a ResolvedRef with a real digest (docs/api.md "Refs").

- local: a content hash of the directory (its own top-level `.git`, `.hg`, … skipped) after the
  tree check;
- git: the commit of the branch or tag (`git ls-remote`), the remote's HEAD by default;
- OCI: the manifest digest from the registry;
- a bare id: the index entry's channel (`stable` by default), OCI preferred over git; an image
  entry (one with `runtime`): a hash of the app tree the shell makes from it.

The "directory name" the manifest id must equal (decisions.md "Distribution"): the local
directory's name, the git repository's name without `.git`, the OCI artifact's title (its top-level
folder), or the index id.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from atrium.distribution.fetchers import ResolvedRef
from atrium.distribution.fetchers.git import GitCommandFailed, ls_remote_kind, ls_remote_tags
from atrium.distribution.index import (
    DEFAULT_CHANNEL,
    IndexClient,
    IndexEntry,
    git_source,
    oci_source,
    tree_digest,
)
from atrium.distribution.pins import pin_of
from atrium.distribution.reach import UNRESTRICTED, Reach
from atrium.distribution.refs import GitRef, IndexRef, LocalRef, OciRef, Ref
from atrium.distribution.tree import UnsafeTree, check_tree, content_hash, ignore_rule
from atrium.errors import FetchFailed, NotFound, PermissionDenied
from atrium.manifest import MANIFEST_FILE

_LOGGER = logging.getLogger(__name__)
TITLE_ANNOTATION = "org.opencontainers.image.title"


def source_for(entry: IndexEntry, channel: str | None) -> tuple[OciRef | GitRef, str | None]:
    """The source ref of an index entry for ``channel`` (docs/api.md "Refs")."""
    name = channel or DEFAULT_CHANNEL
    sources = entry.sources
    if sources is None:  # pragma: no cover - an image entry is resolved without a source
        raise NotFound("index entry", entry.id, f"the index entry {entry.id!r} has no sources")
    chosen = entry.channels.get(name)
    if chosen is None:
        if channel is not None or entry.channels:
            known = ", ".join(sorted(entry.channels)) or "none"
            raise NotFound(
                "channel",
                f"{entry.id}@{name}",
                f"the index entry {entry.id!r} has no channel {name!r} (channels: {known})",
            )
        # an entry without channels: the OCI source's latest tag, else the default branch
        if sources.oci is not None:
            return oci_source(sources.oci.ref), None
        assert sources.git is not None  # noqa: S101 - IndexEntry requires one source
        git = git_source(sources.git.ref)
        return replace(git, ref=sources.git.default_branch), None
    if chosen.oci_tag and sources.oci is not None:
        oci = oci_source(sources.oci.ref)
        return replace(oci, tag=chosen.oci_tag, digest=None), name
    if chosen.git_tag and sources.git is not None:
        return replace(git_source(sources.git.ref), ref=chosen.git_tag), name
    raise NotFound(
        "channel",
        f"{entry.id}@{name}",
        f"channel {name!r} of {entry.id!r} names no tag for a source the entry has",
    )


def _read_preview(directory: Path) -> Mapping[str, Any] | None:
    try:
        data = json.loads((directory / MANIFEST_FILE).read_bytes())
    except (OSError, ValueError, RecursionError):  # (validation names the problem)
        return None
    return data if isinstance(data, dict) else None


def _hash_local(directory: Path, whole: bool) -> tuple[str, Mapping[str, Any] | None]:
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory} is not a directory on the shell's machine")
    # what the author's `.atriumignore` (and the defaults) leave out is neither checked, hashed
    # nor copied: a virtualenv's link to its interpreter, `node_modules`, a `.env`
    rule = None if whole else ignore_rule(directory)
    check_tree(directory, skip_top_vcs=True, rule=rule)  # refused before anything is fetched
    return content_hash(directory, rule), _read_preview(directory)


def _oci_dir_name(ref: OciRef, info: Mapping[str, Any]) -> str:
    annotations = info.get("annotations")
    if isinstance(annotations, dict) and isinstance(annotations.get(TITLE_ANNOTATION), str):
        return str(annotations[TITLE_ANNOTATION])
    if isinstance(info.get("id"), str):
        return str(info["id"])
    return ref.name


class Resolver:
    """Resolves refs; bare ids go through the index."""

    def __init__(
        self, index: IndexClient, docker_config: Path | None = None, reach: Reach | None = None
    ) -> None:
        self._index = index
        self._docker_config = docker_config
        self._reach = reach or UNRESTRICTED

    async def resolve(self, ref: Ref) -> ResolvedRef:
        """Raises FetchFailed when the source cannot be reached or has no such ref, NotFound for
        an id or channel the index does not know."""
        match ref:
            case LocalRef():
                if self._reach.restricted():
                    # an install record's ref too (an import keeps the archive's, which its
                    # uploader wrote): a member's pipeline never reads a path of the machine
                    raise PermissionDenied(
                        f"{str(ref)[:300]!r} is a path on the shell's machine: only an admin "
                        "may install or update from one (local: or git+file:)"
                    )
                return await self._local(ref)
            case GitRef():
                return await self._git(ref, ref.name, None)
            case OciRef():
                return await self._oci(ref, None, None)
            case IndexRef():
                entry = await self._index.entry(ref.app_id)
                if entry.runtime is not None:
                    return self._image_entry(entry, ref)
                source, channel = source_for(entry, ref.channel)
                # a bare id follows its channel, whatever tag the channel names today
                if isinstance(source, OciRef):
                    found = await self._oci(source, entry.id, channel)
                else:
                    found = await self._git(source, entry.id, channel)
                return replace(found, pinned=None)

    def _image_entry(self, entry: IndexEntry, ref: IndexRef) -> ResolvedRef:
        """An image app described by its entry: the tree the shell makes from it, by its hash
        (an entry that changes is an update)."""
        if ref.channel is not None:
            raise NotFound(
                "channel",
                str(ref),
                f"the index entry {entry.id!r} is an image app without channels: install it by "
                f"its id ({entry.id})",
            )
        tree = entry.app_tree()
        return ResolvedRef(
            source="index",
            address=self._index.url or "",
            digest=tree_digest(tree),
            ref=ref,
            dir_name=entry.id,
            manifest_preview=entry.manifest(),
            tree=tree,
        )

    async def staged(self, ref: LocalRef) -> ResolvedRef:
        """A tree the shell itself put on its disk (an import's unpacked archive), whoever's
        pipeline this is: never a path a request named."""
        return await self._local(ref)

    async def tags(self, ref: GitRef | OciRef) -> list[str]:
        """The tags of ``ref``'s source (git: ``ls-remote --tags``; OCI: the registry's tag
        list), fetched under the same reach as a resolve; FetchFailed when unreadable."""
        if isinstance(ref, OciRef):
            from atrium.distribution.oci import list_tags

            return await list_tags(ref, self._docker_config, self._reach)
        try:
            return await ls_remote_tags(ref.url, self._reach)
        except GitCommandFailed as err:
            raise FetchFailed(str(ref), str(err)) from err

    async def _local(self, ref: LocalRef) -> ResolvedRef:
        directory = Path(ref.path)
        try:
            digest, preview = await asyncio.to_thread(_hash_local, directory, ref.whole)
        except UnsafeTree as err:
            raise FetchFailed(str(ref), f"unsafe directory content: {err}") from err
        except NotADirectoryError as err:
            raise FetchFailed(str(ref), str(err)) from err
        except OSError as err:
            raise FetchFailed(str(ref), f"reading {directory} failed: {err}") from err
        return ResolvedRef(
            source="local",
            address=str(directory),
            digest=digest,
            ref=ref,
            dir_name=directory.name,
            manifest_preview=preview,
        )

    async def _git(self, ref: GitRef, dir_name: str, channel: str | None) -> ResolvedRef:
        try:
            commit, git_ref, is_tag = await ls_remote_kind(ref.url, ref.ref, self._reach)
        except GitCommandFailed as err:
            raise FetchFailed(str(ref), str(err)) from err
        return ResolvedRef(
            source="git",
            address=ref.url,
            digest=commit,
            ref=ref,
            dir_name=dir_name,
            channel=channel,
            git_ref=git_ref,
            pinned=pin_of(ref, is_tag),
        )

    async def _oci(self, ref: OciRef, dir_name: str | None, channel: str | None) -> ResolvedRef:
        from atrium.distribution.oci import resolve_oci

        digest, info = await resolve_oci(ref, self._docker_config, self._reach)
        info = info if isinstance(info, dict) else {}
        title = info.get("id")
        if dir_name is not None and isinstance(title, str) and title != dir_name:
            raise FetchFailed(
                str(ref),
                f"the artifact is the app {title!r}, not {dir_name!r} (the index entry's id)",
            )
        preview = info if "id" in info and "version" in info else None
        return ResolvedRef(
            source="oci",
            address=f"oci://{ref.registry}/{ref.repository}@{digest}",
            digest=digest,
            ref=ref,
            dir_name=dir_name or _oci_dir_name(ref, info),
            channel=channel,
            manifest_preview=preview,
            pinned=pin_of(ref, False),
        )
