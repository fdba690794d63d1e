"""The git fetcher: a shallow clone (depth 1) of the resolved branch or tag, checked against the
resolved commit, without its `.git`, then the one tree check (atrium.distribution.tree). Also
`ls_remote`, which the resolver uses.

Credentials come from the user's own git configuration (credential helpers, ``insteadOf``, ssh
keys); git never prompts (``GIT_TERMINAL_PROMPT=0``, ssh in batch mode). Hooks, fsmonitor and the
``ext::`` transport are off whatever that configuration says (atrium.git.run_git).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from atrium.distribution.fetchers import ProgressEvent, ResolvedRef
from atrium.distribution.reach import UNRESTRICTED, Reach
from atrium.distribution.signing import Trust, Verdict
from atrium.distribution.tree import UnsafeTree, check_tree
from atrium.errors import FetchFailed
from atrium.git import GitError, GitTimeout, run_git

COMMIT_RE: Final = re.compile(r"[0-9a-f]{7,64}")
SSH_SIGNATURE: Final = "-----BEGIN SSH SIGNATURE-----"
NO_PROGRESS: Final[tuple[ProgressEvent, ...]] = ()


class GitCommandFailed(Exception):
    """A git command exited non-zero or ran past its deadline; the message is git's own words."""


def _reason(stderr: str, code: int) -> str:
    """git's own words: its ``fatal:``/``error:`` lines (the cause, e.g. "does not appear to be a
    git repository"), else its last lines."""
    lines = [w.strip() for w in stderr.strip().splitlines() if w.strip()]
    causes = [w for w in lines if w.startswith(("fatal:", "error:"))]
    return " ".join(causes or lines[-3:]) or f"exit {code}"


async def run_git_command(*args: str, cwd: Path | None = None) -> str:
    """Run git for a fetch through `atrium.git.run_git` (the user's configuration for remotes,
    config-driven commands neutralised, a deadline); in a private empty folder unless ``cwd``."""
    try:
        if cwd is not None:
            return await run_git(*args, cwd=cwd, user_config=True)
        with tempfile.TemporaryDirectory(prefix="atrium-git-") as empty:
            return await run_git(*args, cwd=Path(empty), user_config=True)
    except GitTimeout as err:
        raise GitCommandFailed(err.stderr) from err
    except GitError as err:
        raise GitCommandFailed(_reason(err.stderr, err.code)) from err


async def ls_remote(
    url: str, ref: str | None, reach: Reach = UNRESTRICTED
) -> tuple[str, str | None]:
    """``(commit, branch or tag)`` of ``ref`` in the repository at ``url``; without ``ref``, the
    default branch (the remote's HEAD). A tag wins over a branch of the same name."""
    commit, name, _ = await ls_remote_kind(url, ref, reach)
    return commit, name


async def ls_remote_tags(url: str, reach: Reach = UNRESTRICTED) -> list[str]:
    """The names of the repository's tags (``git ls-remote --tags --refs``)."""
    options, url = await reach.git_args(url)
    out = await run_git_command(*options, "ls-remote", "--tags", "--refs", url)
    names = (line.partition("\t")[2] for line in out.splitlines())
    return [n.removeprefix("refs/tags/") for n in names if n.startswith("refs/tags/")]


async def ls_remote_kind(
    url: str, ref: str | None, reach: Reach = UNRESTRICTED
) -> tuple[str, str | None, bool]:
    """``ls_remote`` and whether ``ref`` named a tag (a pin) rather than a branch."""
    options, url = await reach.git_args(url)
    if ref is None:
        out = await run_git_command(*options, "ls-remote", "--symref", url, "HEAD")
        branch = None
        commit = None
        for line in out.splitlines():
            left, _, name = line.partition("\t")
            if left.startswith("ref: ") and name == "HEAD":
                branch = left.removeprefix("ref: ").removeprefix("refs/heads/")
            elif name == "HEAD":
                commit = left
        if commit is None:
            raise GitCommandFailed("the repository has no default branch (HEAD)")
        return commit, branch, False
    patterns = (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}")
    out = await run_git_command(*options, "ls-remote", url, *patterns)
    found: dict[str, str] = {}
    for line in out.splitlines():
        commit, _, name = line.partition("\t")
        found[name] = commit
    for pattern in patterns:
        if pattern in found:
            return found[pattern], ref, pattern.startswith("refs/tags/")
    if COMMIT_RE.fullmatch(ref):
        raise GitCommandFailed(
            f"{ref!r} looks like a commit id, and the repository has no branch or tag of that "
            "name; a git ref (#…) names a branch or tag: tag the commit and install the tag"
        )
    raise GitCommandFailed(f"the repository has no branch or tag named {ref!r}")


class GitFetcher:
    """Shallow-clones ``resolved.address`` at ``resolved.git_ref`` into staging."""

    def __init__(self, reach: Reach | None = None) -> None:
        self.reach = reach or UNRESTRICTED

    async def fetch(self, resolved: ResolvedRef, staging: Path) -> AsyncIterator[ProgressEvent]:
        target = staging / resolved.dir_name
        options, address = await self.reach.git_args(resolved.address)
        args = [*options, "-c", "advice.detachedHead=false", "clone", "--quiet", "--depth", "1"]
        args += ["--single-branch", "--no-tags"]
        if resolved.git_ref:
            args += ["--branch", resolved.git_ref]
        try:
            await run_git_command(*args, "--", address, str(target), cwd=staging)
            head = await run_git_command("rev-parse", "HEAD", cwd=target)
        except GitCommandFailed as err:
            raise FetchFailed(str(resolved.ref), str(err)) from err
        if head.strip() != resolved.digest:
            raise FetchFailed(
                str(resolved.ref),
                f"the source moved while fetching: resolved {resolved.digest}, cloned "
                f"{head.strip()}; try again",
            )
        try:
            await asyncio.to_thread(_strip_and_check, target)
        except UnsafeTree as err:
            raise FetchFailed(str(resolved.ref), f"unsafe repository content: {err}") from err
        for event in NO_PROGRESS:  # git yields no progress (docs/api.md "Progress events")
            yield event


def _strip_and_check(target: Path) -> None:
    """The clone's own `.git` is ours, not the app's: removed. Anything else the one tree check
    refuses (a committed `.hg/`, a link chain that leaves) fails the fetch."""
    shutil.rmtree(target / ".git")
    check_tree(target)


async def verify_tag(resolved: ResolvedRef, trust: Trust, reach: Reach | None = None) -> Verdict:
    """Who signed the tag ``resolved.git_ref`` (SSH signatures, ``gpg.format=ssh``, with an
    allowed-signers file written from ``trust``): ``signed`` by a trusted key's name when the tag
    is an annotated tag on ``resolved.digest`` whose signature a trusted key verifies. A branch,
    a lightweight or unsigned tag is ``unsigned``; a signed tag no trusted key verifies is
    ``unknown_signer``; a signed tag on another commit ``invalid``."""
    ref = str(resolved.ref)
    tag = resolved.git_ref
    if not tag:
        return Verdict("unsigned", reason="a default branch carries no signature; install a tag")
    with tempfile.TemporaryDirectory(prefix="atrium-verify-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            # a member's fetch: checked and pinned again (the name may answer otherwise now)
            options, address = await (reach or UNRESTRICTED).git_args(resolved.address)
            await run_git_command("init", "--quiet", "--bare", "repo", cwd=tmp)
            repo = tmp / "repo"
            fetched = await run_git_command(
                *options, "ls-remote", "--tags", address, f"refs/tags/{tag}", cwd=repo
            )
            if not fetched.strip():
                return Verdict("unsigned", reason=f"{tag!r} is a branch, not a signed tag")
            await run_git_command(
                *options, "fetch", "--quiet", "--depth=1", "--no-tags", address,
                f"+refs/tags/{tag}:refs/tags/{tag}", cwd=repo,
            )  # fmt: skip
            kind = await run_git_command("cat-file", "-t", f"refs/tags/{tag}", cwd=repo)
            if kind.strip() != "tag":
                return Verdict("unsigned", reason=f"{tag!r} is a lightweight tag")
            body = await run_git_command("cat-file", "tag", f"refs/tags/{tag}", cwd=repo)
            target = await run_git_command("rev-parse", f"refs/tags/{tag}^{{commit}}", cwd=repo)
        except GitCommandFailed as err:
            raise FetchFailed(ref, f"reading the tag {tag!r}: {err}") from err
        if SSH_SIGNATURE not in body:
            return Verdict("unsigned", reason=f"the tag {tag!r} is not signed")
        if target.strip() != resolved.digest:
            return Verdict("invalid", reason=f"the tag {tag!r} no longer names {resolved.digest}")
        for key in trust.keys:
            # one allowed-signers file per key: git's exit status alone says which key signed
            signers = tmp / f"allowed_signers.{key.name}"
            await asyncio.to_thread(signers.write_text, Trust(keys=[key]).allowed_signers())
            try:
                await run_git(
                    "-c", "gpg.format=ssh", "-c", f"gpg.ssh.allowedSignersFile={signers}",
                    "verify-tag", f"refs/tags/{tag}", cwd=repo,
                )  # fmt: skip
            except GitError:
                continue
            return Verdict("signed", key.name)
    return Verdict("unknown_signer", reason="no trusted key verifies the tag's signature")
