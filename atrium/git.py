"""Async wrapper over the `git` command, and the scope repositories of the global and user scopes.

Each ScopeRepo serialises its git operations behind one lock and, on open, clears an ``index.lock``
left by a killed process (nothing of ours can be running then) and finishes an interrupted init.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path
from typing import Final

from atrium.settings import ConfigError

_LOGGER = logging.getLogger(__name__)

MARKER: Final = ".os-scope"
IDENTITY: Final = ("Atrium", "atrium@localhost")
GITIGNORE: Final = (
    "# written by Atrium: runtime data and staging are not part of the scope's history\n"
    "/.staging/\n"
    "/.journal/\n"
    "/apps/*/*-[0-9]*/\n"
)
#: what git accepts in ``.git/HEAD``: a symbolic ref under refs/, or a detached commit id
HEAD_RE: Final = re.compile(r"^(?:ref:\s*refs/\S+|[0-9a-f]{40}|[0-9a-f]{64})\s*$")
# scheme URLs, scp-like user@host:path, or an absolute path; never an option (leading '-')
REMOTE_RE: Final = re.compile(
    r"^(?:[a-z][a-z0-9+.-]*://[^\s]+|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+|/[^\s]*)$"
)


class GitError(Exception):
    """A git command failed; ``stderr`` holds its words."""

    def __init__(self, args: tuple[str, ...], code: int, stderr: str) -> None:
        super().__init__(f"git {' '.join(args)} exited {code}: {stderr.strip()}")
        self.stderr = stderr
        self.code = code


def git_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    return env


async def run_git(*args: str, cwd: Path, check: bool = True) -> str:
    proc = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=cwd,
        env=git_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if check and proc.returncode != 0:
        raise GitError(args, proc.returncode or -1, err.decode(errors="replace"))
    return out.decode(errors="replace")


def _write_private(path: Path, text: str) -> None:
    """Write a file of the shell's own, owner-only (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(text)


def head_problem(root: Path) -> str | None:
    """What is wrong with ``root/.git/HEAD``, or None when it is fine or there is no repository."""
    head = root / ".git" / "HEAD"
    if not (root / ".git").is_dir():
        return None
    try:
        text = head.read_text(errors="replace")
    except FileNotFoundError:
        return ".git/HEAD is missing"
    except OSError as err:
        return f".git/HEAD cannot be read ({err.strerror or err})"
    if not HEAD_RE.match(text):
        return ".git/HEAD is neither a branch reference nor a commit id"
    return None


def is_remote_url(url: str) -> bool:
    return bool(REMOTE_RE.fullmatch(url)) and not any(ord(c) < 32 for c in url)


class ScopeRepo:
    """The git repository behind one mutable scope (spec Scope rules 7-8)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = asyncio.Lock()

    async def open(self) -> None:
        """Create the repository on first use: ``git init``, identity, marker committed as baseline.

        A repository git cannot open stops start-up with a ConfigError naming it and the way out:
        with a garbage ``.git/HEAD`` git would not even see the repository (and would look for one
        in the folders above).
        """
        problem = head_problem(self.root)
        if problem is not None:
            raise ConfigError(
                f"the scope repository {self.root} is damaged: {problem}; write "
                f"'ref: refs/heads/main' (the branch Atrium commits to) into "
                f"{self.root / '.git' / 'HEAD'}, or restore the folder from a backup"
            )
        try:
            await self._open()
        except GitError as err:
            said = err.stderr.strip().splitlines()
            raise ConfigError(
                f"the scope repository {self.root} cannot be opened: git says "
                f"{said[-1] if said else f'exit {err.code}'!r}; repair it with git, or restore "
                f"the folder from a backup"
            ) from err

    async def _open(self) -> None:
        async with self.lock:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / "apps").mkdir(exist_ok=True)
            stale = self.root / ".git" / "index.lock"
            if stale.exists():
                _LOGGER.warning(
                    "removing a stale git lock %s left by an interrupted operation", stale
                )
                stale.unlink()
            if not (self.root / ".git").is_dir():
                await run_git("init", "--quiet", "--initial-branch=main", cwd=self.root)
            # the repository's internals, its staging, journals and records are the shell's alone
            # (issue 13); apps/ holds the app trees, whose modes stay the artifact's
            if (self.root / ".git").is_dir():
                (self.root / ".git").chmod(0o700)
            for private in (".staging", ".journal", "records"):
                (self.root / private).mkdir(mode=0o700, exist_ok=True)
                (self.root / private).chmod(0o700)
            await run_git("config", "user.name", IDENTITY[0], cwd=self.root)
            await run_git("config", "user.email", IDENTITY[1], cwd=self.root)
            await run_git("config", "commit.gpgsign", "false", cwd=self.root)
            if await self._head() is None:
                _write_private(self.root / MARKER, "Atrium scope repository\n")
                _write_private(self.root / ".gitignore", GITIGNORE)
                await run_git("add", "--", MARKER, ".gitignore", cwd=self.root)
                await run_git("commit", "--quiet", "-m", "baseline: Atrium scope", cwd=self.root)

    async def _head(self) -> str | None:
        out = await run_git("rev-parse", "--verify", "--quiet", "HEAD", cwd=self.root, check=False)
        return out.strip() or None

    async def head(self) -> str | None:
        async with self.lock:
            return await self._head()

    async def remote(self) -> str | None:
        out = await run_git("config", "--get", "remote.origin.url", cwd=self.root, check=False)
        return out.strip() or None

    async def set_remote(self, url: str) -> None:
        """Store ``origin`` in the repository's config; nothing is pushed (rule 8)."""
        async with self.lock:
            if await self.remote() is None:
                await run_git("remote", "add", "origin", url, cwd=self.root)
            else:
                await run_git("remote", "set-url", "origin", url, cwd=self.root)

    async def commit_all(self, message: str) -> str | None:
        """Commit every change under the scope as one commit; None when nothing changed."""
        async with self.lock:
            await run_git("add", "--all", cwd=self.root)
            status = await run_git("status", "--porcelain", cwd=self.root)
            if not status.strip():
                return None
            await run_git("commit", "--quiet", "-m", message, cwd=self.root)
            return await self._head()

    async def log(self) -> list[str]:
        out = await run_git("log", "--format=%s", cwd=self.root)
        return out.splitlines()
