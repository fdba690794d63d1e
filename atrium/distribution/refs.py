"""Refs: the accepted forms of what to install (decisions.md "Distribution"), parsed and printed.

Pure. ``parse_ref(str(ref)) == ref`` for every ref this module produces.

- ``oci://host[:port]/repo[:tag|@digest]`` (tag default ``latest``)
- schemeless ``host[:port]/path:tag`` or ``host[:port]/path@sha256:…`` → OCI
- schemeless ``host/user/repo[#ref]`` without a tag → git over https
- ``git://…``, ``git+https://…``, ``git+file://…``, each with an optional ``#ref``
- a bare reverse-domain app id with an optional ``@channel`` → the index
- ``local:<path>``
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, TypeAlias

from atrium.errors import BadRef
from atrium.manifest import APP_ID_RE

CHANNEL_RE: Final = re.compile(r"[a-z][a-z0-9-]{0,31}")
HOST_RE: Final = re.compile(
    r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?"
)
REPO_RE: Final = re.compile(
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)
TAG_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")
GIT_REF_RE: Final = re.compile(r"[A-Za-z0-9._/-]{1,200}")
DEFAULT_TAG: Final = "latest"


@dataclass(frozen=True, slots=True)
class OciRef:
    """An artifact in an OCI registry."""

    registry: str
    repository: str
    tag: str | None = DEFAULT_TAG
    digest: str | None = None

    def __str__(self) -> str:
        ref = f"oci://{self.registry}/{self.repository}"
        if self.digest:
            return f"{ref}@{self.digest}"
        return f"{ref}:{self.tag}" if self.tag else ref

    @property
    def name(self) -> str:
        """The last path segment of the repository."""
        return self.repository.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class GitRef:
    """A git repository and an optional branch or tag (``#ref``)."""

    url: str
    ref: str | None = None

    def __str__(self) -> str:
        prefix = "git+" if self.url.startswith(("https://", "file://")) else ""
        return f"{prefix}{self.url}" + (f"#{self.ref}" if self.ref else "")

    @property
    def name(self) -> str:
        """The repository name without `.git` (the "directory name" checked against the id)."""
        last = self.url.rstrip("/").rsplit("/", 1)[-1]
        return last.removesuffix(".git")


@dataclass(frozen=True, slots=True)
class IndexRef:
    """A bare app id, looked up in the index (channel default `stable`)."""

    app_id: str
    channel: str | None = None

    def __str__(self) -> str:
        return self.app_id + (f"@{self.channel}" if self.channel else "")


@dataclass(frozen=True, slots=True)
class LocalRef:
    """A directory on the shell's machine (absolute). An author's folder is installed as
    `atrium pack` would ship it (its `.atriumignore` over the defaults); ``whole`` takes every
    file, for a tree that is already an installed app's (an import's unpacked copy)."""

    path: str
    whole: bool = False

    def __str__(self) -> str:
        return f"local:{self.path}"


Ref: TypeAlias = OciRef | GitRef | IndexRef | LocalRef


def _split_git_fragment(raw: str, rest: str) -> tuple[str, str | None]:
    url, _, fragment = rest.partition("#")
    if not fragment:
        return url, None
    if not GIT_REF_RE.fullmatch(fragment) or ".." in fragment:
        raise BadRef(raw, f"{fragment!r} is not a branch or tag name")
    return url, fragment


def _oci(raw: str, rest: str) -> OciRef:
    host, slash, path = rest.partition("/")
    if not slash or not HOST_RE.fullmatch(host):
        raise BadRef(raw, "an OCI ref needs <host>[:port]/<repository>")
    digest = None
    tag: str | None = DEFAULT_TAG
    if "@" in path:
        path, _, digest = path.partition("@")
        if not DIGEST_RE.fullmatch(digest):
            raise BadRef(raw, f"{digest!r} is not a sha256 digest (sha256:<64 hex>)")
        tag = None
    elif ":" in path:
        path, _, tag = path.rpartition(":")
        if not TAG_RE.fullmatch(tag):
            raise BadRef(raw, f"{tag!r} is not an OCI tag")
    if not REPO_RE.fullmatch(path):
        raise BadRef(raw, f"{path!r} is not an OCI repository name (lowercase path)")
    return OciRef(host, path, tag, digest)


def _git(raw: str, url: str, ref: str | None) -> GitRef:
    scheme, sep, tail = url.partition("://")
    if not sep or not tail or any(c.isspace() for c in url) or "\x00" in url:
        raise BadRef(raw, "a git ref needs a URL such as git://host/repo.git")
    if scheme == "file":
        if not tail.startswith("/"):
            raise BadRef(raw, "a git+file ref needs an absolute path (git+file:///srv/repo.git)")
    elif (
        "/" not in tail
        or not HOST_RE.fullmatch(tail.split("/", 1)[0].rsplit("@", 1)[-1])
        or not all(tail.split("/", 1)[1].split("/"))
    ):
        raise BadRef(raw, "a git URL needs a host and a path without empty segments")
    return GitRef(url, ref)


def _local(raw: str, path: str) -> LocalRef:
    if not path.startswith("/"):
        raise BadRef(raw, "a local ref needs an absolute path (the CLI makes it absolute)")
    return LocalRef(path)


def _index(raw: str, ref: str) -> IndexRef:
    app_id, _, channel = ref.partition("@")
    if not APP_ID_RE.fullmatch(app_id):
        raise BadRef(raw, f"{app_id!r} is not a reverse-domain app id")
    if channel and not CHANNEL_RE.fullmatch(channel):
        raise BadRef(raw, f"{channel!r} is not a channel name")
    return IndexRef(app_id, channel or None)


def _schemeless(raw: str, ref: str) -> OciRef | GitRef:
    """``host/path:tag`` or ``…@digest`` is OCI; ``host/user/repo[#ref]`` is git over https."""
    path = ref.split("/", 1)[1]
    if "@" in path or ":" in path:
        return _oci(raw, ref)
    url, fragment = _split_git_fragment(raw, ref)
    segments = url.split("/")
    host = segments[0]
    if (
        len(segments) < 3
        or not all(segments)
        or not ("." in host or ":" in host or host == "localhost")
    ):
        raise BadRef(raw, "a schemeless git ref is <host>/<user>/<repo> (a host with a dot)")
    return _git(raw, f"https://{url}", fragment)


def names_machine_files(raw: str) -> bool:
    """Whether a ref names files of the machine it is resolved on (a folder, or a git
    repository reached by path): what a ref read from an archive may not do (decisions.md
    "Imports: a ref naming a machine's files"). A ref that does not parse counts as one."""
    try:
        ref = parse_ref(raw)
    except BadRef:
        return True
    if isinstance(ref, LocalRef):
        return True
    return isinstance(ref, GitRef) and not ref.url.startswith(("https://", "git://"))


def parse_ref(raw: str) -> Ref:
    """Parse ``raw`` into a Ref; BadRef names the raw ref and the accepted forms."""
    ref = raw.strip()
    if not ref:
        raise BadRef(raw, "it is empty")
    if any(ord(c) < 32 for c in ref):
        raise BadRef(raw, "it contains control characters")
    if ref.startswith("local:"):
        return _local(raw, ref.removeprefix("local:"))
    if ref.startswith("oci://"):
        return _oci(raw, ref.removeprefix("oci://"))
    for prefix, kept in (
        ("git+https://", "https://"),
        ("git+file://", "file://"),
        ("git://", "git://"),
    ):
        if ref.startswith(prefix):
            url, fragment = _split_git_fragment(raw, ref.removeprefix(prefix))
            return _git(raw, kept + url, fragment)
    if "://" in ref:
        raise BadRef(raw, f"unknown scheme {ref.split('://', 1)[0]!r}")
    return _index(raw, ref) if "/" not in ref else _schemeless(raw, ref)
