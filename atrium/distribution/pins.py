"""Pinned installs and the newer tags of their source (docs/decisions.md "Updates that arrive").

Pure. An install is *pinned* when its ref names one fixed version: an OCI digest, an OCI tag that
reads as a version (``v1``, ``1.2.0``, ``v2.0-rc.1``), or a git tag (a git tag is meant never to
move; a branch does). Everything else follows its source: a git branch or the default branch, an
OCI tag that is no version (``latest``, ``stable``, ``edge``), an index channel. Updating a pinned
install re-resolves the pin (a re-pushed tag still arrives), and lists the *newer* version tags
of the same source so that one can be taken on purpose.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Final

import semver

from atrium.distribution.refs import GitRef, OciRef, Ref

VERSION_TAG_RE: Final = re.compile(
    r"v?(0|[1-9][0-9]*)(?:\.(0|[1-9][0-9]*))?(?:\.(0|[1-9][0-9]*))?(?:-([0-9A-Za-z.-]+))?"
)


def tag_version(tag: str) -> semver.Version | None:
    """The version a tag names (``v1`` is 1.0.0, ``v1.2`` is 1.2.0), or None."""
    found = VERSION_TAG_RE.fullmatch(tag)
    if found is None:
        return None
    major, minor, patch, pre = found.groups()
    try:
        return semver.Version(int(major), int(minor or 0), int(patch or 0), pre)
    except ValueError:
        return None


def pin_of(ref: Ref, git_tag: bool) -> str | None:
    """What ``ref`` pins the install to (a tag or a digest), None when it follows its source.
    ``git_tag``: the git ref resolved to a tag, not a branch."""
    if isinstance(ref, OciRef):
        if ref.digest:
            return ref.digest
        return ref.tag if ref.tag and tag_version(ref.tag) is not None else None
    if isinstance(ref, GitRef):
        return ref.ref if git_tag and ref.ref else None
    return None


def baseline(ref: Ref, installed_version: str) -> semver.Version | None:
    """What "newer" is measured from: the version the pinned tag names, else the installed
    manifest's version (a digest pin, a moving ref)."""
    tag = ref.tag if isinstance(ref, OciRef) and not ref.digest else None
    tag = ref.ref if isinstance(ref, GitRef) else tag
    if tag is not None and (version := tag_version(tag)) is not None:
        return version
    try:
        return semver.Version.parse(installed_version)
    except (ValueError, TypeError):
        return None


def newer_tags(tags: Iterable[str], since: semver.Version | None) -> list[str]:
    """The version tags of ``tags`` newer than ``since``, oldest first (every version tag when
    there is no baseline)."""
    found = [(v, t) for t in set(tags) if (v := tag_version(t)) is not None]
    return [t for v, t in sorted(found) if since is None or v > since]


def at_tag(ref: GitRef | OciRef, tag: str) -> GitRef | OciRef:
    """The same source at ``tag``."""
    if isinstance(ref, OciRef):
        return replace(ref, tag=tag, digest=None)
    return replace(ref, ref=tag)
