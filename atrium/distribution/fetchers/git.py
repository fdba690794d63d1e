"""The git fetcher: a shallow clone (depth 1) of the resolved branch or tag, checked against the
resolved commit, without its `.git`. Also `ls_remote`, which the resolver uses.

Credentials come from the user's own git configuration (credential helpers, ``insteadOf``, ssh
keys); git never prompts (``GIT_TERMINAL_PROMPT=0``, ssh in batch mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from atrium.distribution.fetchers import ProgressEvent, ResolvedRef
from atrium.distribution.tree import UnsafeTree, check_tree
from atrium.errors import FetchFailed
from atrium.git import git_env

GIT_TIMEOUT: Final = 120.0
NO_PROGRESS: Final[tuple[ProgressEvent, ...]] = ()


class GitCommandFailed(Exception):
    """A git command exited non-zero or ran past its deadline; the message is git's own words."""


def _environment() -> dict[str, str]:
    env = git_env()
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    return env


async def run_git_command(
    *args: str, cwd: Path | None = None, deadline: float = GIT_TIMEOUT
) -> str:
    """Run git; kill it (and raise) when it outlives ``deadline`` seconds."""
    proc = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=cwd or tempfile.gettempdir(),
        env=_environment(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(deadline):
            out, err = await proc.communicate()
    except (TimeoutError, asyncio.CancelledError) as exc:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise GitCommandFailed(f"git {args[0]} did not finish within {deadline:.0f} s") from exc
    if proc.returncode != 0:
        words = err.decode(errors="replace").strip().splitlines()
        raise GitCommandFailed(" ".join(w.strip() for w in words[-3:]) or f"exit {proc.returncode}")
    return out.decode(errors="replace")


async def ls_remote(url: str, ref: str | None) -> tuple[str, str | None]:
    """``(commit, branch or tag)`` of ``ref`` in the repository at ``url``; without ``ref``, the
    default branch (the remote's HEAD). A tag wins over a branch of the same name."""
    if ref is None:
        out = await run_git_command("ls-remote", "--symref", url, "HEAD")
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
        return commit, branch
    patterns = (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}")
    out = await run_git_command("ls-remote", url, *patterns)
    found: dict[str, str] = {}
    for line in out.splitlines():
        commit, _, name = line.partition("\t")
        found[name] = commit
    for pattern in patterns:
        if pattern in found:
            return found[pattern], ref
    raise GitCommandFailed(f"the repository has no branch or tag named {ref!r}")


class GitFetcher:
    """Shallow-clones ``resolved.address`` at ``resolved.git_ref`` into staging."""

    async def fetch(self, resolved: ResolvedRef, staging: Path) -> AsyncIterator[ProgressEvent]:
        target = staging / resolved.dir_name
        args = ["-c", "advice.detachedHead=false", "clone", "--quiet", "--depth", "1"]
        args += ["--single-branch", "--no-tags"]
        if resolved.git_ref:
            args += ["--branch", resolved.git_ref]
        try:
            await run_git_command(*args, "--", resolved.address, str(target))
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
        for event in NO_PROGRESS:  # git yields no progress (spec Distribution API rule 3)
            yield event


def _strip_and_check(target: Path) -> None:
    shutil.rmtree(target / ".git")
    for gitfile in target.rglob(".git"):  # submodule links are not part of the app
        if gitfile.is_dir() and not gitfile.is_symlink():
            shutil.rmtree(gitfile)
        else:
            gitfile.unlink()
    check_tree(target)
