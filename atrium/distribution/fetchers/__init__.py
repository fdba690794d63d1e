"""Fetchers bring a resolved source into a staging directory (docs/api.md "Distribution").

The contract (every fetcher: `oci`, `git`, `local`, `index`: an image app described by its
catalogue entry):

- ``fetch(resolved, staging)`` is an async generator. It writes the app tree into
  ``staging / resolved.dir_name`` (a directory that does not exist yet; ``staging`` is on the same
  filesystem as the scope), yielding progress events as it goes: OCI yields
  ``{"type": "fetch.progress", "done": <bytes>, "total": <bytes>, "digest": <blob>}`` several
  times per blob larger than one chunk; git and local yield nothing (the pipeline itself emits
  ``fetch.start`` and ``fetch.done``).
- Failures raise ``atrium.errors.FetchFailed(ref, reason)`` (network, credentials, missing ref,
  digest mismatch, unsafe archive). A partly written tree may be left in ``staging``: the
  pipeline removes the whole staging directory.
- The fetched tree holds exactly what was resolved: ``resolved.digest`` is verified where the
  source can be (OCI blobs and manifest; git commit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from atrium.distribution.refs import Ref

if TYPE_CHECKING:
    from atrium.distribution.reach import Reach
from atrium.distribution.signing import Trust, Verdict, verify_signatures

Source = Literal["oci", "git", "local", "index"]
ProgressEvent = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ResolvedRef:
    """docs/api.md "Refs": where the source is and what it resolves to now."""

    source: Source
    #: what to fetch: the OCI ref pinned by digest, the git URL, or the local path
    address: str
    #: OCI manifest digest, git commit id, or a content hash of the local directory
    digest: str
    #: the ref as the user gave it (after index resolution for bare ids: the chosen source ref)
    ref: Ref
    #: the name the manifest id must equal (decisions.md "Distribution")
    dir_name: str
    channel: str | None = None
    #: git: the branch or tag to clone
    git_ref: str | None = None
    manifest_preview: Mapping[str, Any] | None = None
    #: the tag or digest the install is pinned to; None: it follows its source
    #: (atrium.distribution.pins)
    pinned: str | None = None
    #: index: the app tree the shell writes for an image entry, file by file
    tree: Mapping[str, bytes] | None = None

    def wire(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "address": self.address,
            "digest": self.digest,
            "channel": self.channel,
            "ref": str(self.ref),
            "manifestPreview": dict(self.manifest_preview) if self.manifest_preview else None,
        }


class Fetcher(Protocol):
    """Fetches one kind of source (see the module docstring for the contract)."""

    def fetch(self, resolved: ResolvedRef, staging: Path) -> AsyncIterator[ProgressEvent]: ...


def fetcher_for(
    resolved: ResolvedRef, docker_config: Path | None = None, reach: Reach | None = None
) -> Fetcher:
    """The fetcher of ``resolved.source``; imported on demand so one back-end's dependencies
    never load for another."""
    if resolved.source == "local":
        from atrium.distribution.fetchers.local import LocalFetcher

        return LocalFetcher()
    if resolved.source == "git":
        from atrium.distribution.fetchers.git import GitFetcher

        return GitFetcher(reach)
    if resolved.source == "index":
        from atrium.distribution.fetchers.index import IndexFetcher

        return IndexFetcher()
    from atrium.distribution.fetchers.oci import OciFetcher

    return OciFetcher(docker_config, reach)


async def verify_source(
    resolved: ResolvedRef,
    trust: Trust,
    docker_config: Path | None = None,
    reach: Reach | None = None,
) -> Verdict:
    """What the source says about who signed ``resolved.digest``, judged by ``trust``'s keys: an
    OCI artifact's cosign-style signatures, a git tag's SSH signature; a local folder carries
    none (decisions.md "Signed apps")."""
    if resolved.source == "oci":
        from atrium.distribution.fetchers.oci import oci_ref
        from atrium.distribution.signatures import fetch_signatures

        found = await fetch_signatures(oci_ref(resolved), resolved.digest, docker_config, reach)
        return verify_signatures(found, resolved.digest, trust.public_keys())
    if resolved.source == "git":
        from atrium.distribution.fetchers.git import verify_tag

        return await verify_tag(resolved, trust, reach)
    if resolved.source == "index":
        return Verdict("unsigned", reason="an image app described by the catalogue is not signed")
    return Verdict("unsigned", reason="a local folder carries no signature")
