"""Async wrapper over the `git` command, and the scope repositories of the global and user scopes.

Each ScopeRepo serialises its git operations behind one lock and, on open, finishes an interrupted
init and clears the lock files (``index.lock``, ``HEAD.lock``, ``refs/**/*.lock``…) a killed git
left behind — but only once no git process works in the repository any more: every git Atrium
starts dies with the shell (``PR_SET_PDEATHSIG``), and one started by hand is waited for, so a lock
that a live git still holds is never taken from under it (issue 14 row 8).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Final, Protocol

from atrium.files import write_atomic
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
#: the scope repository's own config (`ScopeRepo.open`), and the same as ``git config`` writes
#: it into a fresh repository's ``.git/config``
CONFIG: Final = (
    ("user.name", IDENTITY[0]),
    ("user.email", IDENTITY[1]),
    ("commit.gpgsign", "false"),
)
CONFIG_SECTIONS: Final = (
    f"[user]\n\tname = {IDENTITY[0]}\n\temail = {IDENTITY[1]}\n[commit]\n\tgpgsign = false\n"
)
OBJECT_ID_RE: Final = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
#: a branch a loose ref file may hold: no ``..`` or leading dot in a part (nor, checked apart, a
#: part ending in ``.lock`` or ``.``); any other name is left to git
BRANCH_REF_RE: Final = re.compile(
    r"ref: (refs/heads/(?:[A-Za-z0-9_-][A-Za-z0-9_.-]*/)*[A-Za-z0-9_-][A-Za-z0-9_.-]*)"
)
#: what git accepts in ``.git/HEAD``: a symbolic ref under refs/, or a detached commit id
HEAD_RE: Final = re.compile(r"^(?:ref:\s*refs/\S+|[0-9a-f]{40}|[0-9a-f]{64})\s*$")
# scheme URLs, scp-like user@host:path, or an absolute path; never an option (leading '-')
REMOTE_RE: Final = re.compile(
    r"^(?:[a-z][a-z0-9+.-]*://[^\s]+|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+|/[^\s]*)$"
)


#: every git run: no fsmonitor daemon command, no hooks, no `ext::` transport (a command line in a
#: URL), whatever any config file or repository says (docs/decisions.md "Distribution safety")
NEUTRALISED: Final = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "protocol.ext.allow=never",
)
#: runs on Atrium's own repositories (scope repos) also ignore the user's global ignore and
#: attributes files, so what a commit holds does not depend on the host account
OWN_REPO: Final = ("core.excludesFile=/dev/null", "core.attributesFile=/dev/null")
#: the only GIT_* variables of the shell's environment a network git run keeps (how to reach a
#: remote); every other one (GIT_DIR, GIT_CONFIG_PARAMETERS, GIT_EXEC_PATH, …) is dropped
REMOTE_ENV: Final = frozenset(
    {"GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH"}
)
TIMEOUT_ENV: Final = "ATRIUM_GIT_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT: Final = 300.0
#: the lock files git leaves when killed mid-operation, relative to ``.git``
LOCK_FILES: Final = ("index.lock", "HEAD.lock", "config.lock", "packed-refs.lock", "shallow.lock")
PR_SET_PDEATHSIG: Final = 1


class GitError(Exception):
    """A git command failed; ``stderr`` holds its words."""

    def __init__(self, args: tuple[str, ...], code: int, stderr: str) -> None:
        super().__init__(f"git {' '.join(args)} exited {code}: {stderr.strip()}")
        self.stderr = stderr
        self.code = code


class GitTimeout(GitError):
    """A git command outlived its deadline and was killed."""

    def __init__(self, args: tuple[str, ...], seconds: float) -> None:
        words = f"git {args[0] if args else ''} did not finish within {seconds:g} s and was stopped"
        super().__init__(args, -1, words)


def git_timeout() -> float:
    """The deadline of one git run: ``ATRIUM_GIT_TIMEOUT_SECONDS``, 300 s by default."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


def git_env(*, user_config: bool = False, ceiling: Path | None = None) -> dict[str, str]:
    """The environment of a git run. Without ``user_config`` git reads no system or global
    configuration at all (only the repository's own, which Atrium writes); with it (fetching from
    and publishing to remotes) the user's own configuration stays, for credential helpers,
    ``insteadOf`` and ssh settings. Either way the shell's GIT_* variables are dropped (bar the
    few in REMOTE_ENV for remotes), git never prompts and ssh runs in batch mode."""
    keep = REMOTE_ENV if user_config else frozenset()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in keep}
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    if user_config:
        env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    else:
        env.update(
            {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ATTR_NOSYSTEM": "1"}
        )
    if ceiling is not None:
        # a repository above the working folder (a stray /tmp/.git) is never discovered, so
        # never configures the run
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    return env


async def run_git(
    *args: str,
    cwd: Path,
    check: bool = True,
    user_config: bool = False,
    deadline: float | None = None,
) -> str:
    """Run ``git <args>`` in ``cwd``: the one way Atrium runs git.

    Always with NEUTRALISED config on the command line (it wins over every config file and is
    passed on to the git processes git starts, e.g. in an embedded repository); without
    ``user_config`` also with OWN_REPO and no system or global config (see `git_env`). Killed
    after ``deadline`` seconds (default `git_timeout()`), raising GitTimeout; a non-zero exit
    raises GitError when ``check``.
    """
    config = NEUTRALISED if user_config else NEUTRALISED + OWN_REPO
    options = [item for pair in config for item in ("-c", pair)]
    seconds = deadline if deadline is not None else git_timeout()
    proc = _spawn(
        ["git", *options, *args], cwd, git_env(user_config=user_config, ceiling=cwd.parent)
    )
    try:
        async with asyncio.timeout(seconds):
            out, err = await _communicate(proc)
    except (TimeoutError, asyncio.CancelledError) as exc:
        _kill(proc)
        await asyncio.shield(_reaped(proc))
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise GitTimeout(args, seconds) from exc
    finally:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    if check and proc.returncode != 0:
        raise GitError(args, proc.returncode or -1, err.decode(errors="replace"))
    return out.decode(errors="replace")


#: run by ``sh`` between setpriv (which asked for the death signal) and git: exits 1 when the
#: shell (``$0``) is no longer its parent, i.e. it died before the kernel could be told
_STILL_PARENT: Final = 'test "$PPID" = "$0" || exit 1; exec "$@"'


@functools.cache
def _setpriv() -> str | None:
    """util-linux's ``setpriv`` when it has ``--pdeathsig`` (2.33 and later), else None."""
    found = shutil.which("setpriv")
    if found is None:
        return None
    try:
        usage = subprocess.run(  # noqa: S603 (our own fixed argv)
            [found, "--help"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if "--pdeathsig" in usage.stdout else None


def _spawn(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` (git) in a session of its own, set to be SIGKILLed when the shell dies.

    The death signal is asked for by ``setpriv --pdeathsig`` and the parent checked by ``sh``
    before git is executed: without a ``preexec_fn`` Python starts the child with vfork, about a
    millisecond, where forking the whole shell to run Python in the child costs 10-15 ms and
    blocked the event loop meanwhile (docs/decisions.md "Faster shell start"). Without a
    setpriv that knows ``--pdeathsig``, the `_dies_with` ``preexec_fn`` does the same.
    """
    # a missing git is FileNotFoundError here as from any exec, not sh's words
    program = shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if program is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    argv = [program, *argv[1:]]
    setpriv = _setpriv()
    options: dict[str, Any] = {}
    if setpriv is not None:
        guard = ["sh", "-c", _STILL_PARENT, str(os.getpid())]
        argv = [setpriv, "--pdeathsig", "KILL", "--", *guard, *argv]
    else:
        options["preexec_fn"] = _dies_with(os.getpid())
    return subprocess.Popen(  # noqa: S603 (argv: git and Atrium's own options)
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **options,
    )


async def _communicate(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """Read ``proc``'s stdout and stderr to their end on the running loop, then wait for it."""
    loop = asyncio.get_running_loop()
    pipes = {pipe.fileno(): bytearray() for pipe in (proc.stdout, proc.stderr) if pipe is not None}
    open_fds = set(pipes)
    ended = loop.create_future()

    def readable(fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError as err:
            data = b""
            if not ended.done():
                ended.set_exception(err)
        if data:
            pipes[fd] += data
            return
        loop.remove_reader(fd)
        open_fds.discard(fd)
        if not open_fds and not ended.done():
            ended.set_result(None)

    for fd in pipes:
        os.set_blocking(fd, False)
        loop.add_reader(fd, readable, fd)
    try:
        await ended
    finally:
        for fd in open_fds:
            loop.remove_reader(fd)
    await _reaped(proc)
    out, err = pipes.values()
    return bytes(out), bytes(err)


async def _reaped(proc: subprocess.Popen[bytes]) -> None:
    """Wait, without blocking the loop, until ``proc`` has exited, and reap it."""
    if proc.poll() is not None:
        return
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # a kernel before 5.3
        await asyncio.to_thread(proc.wait)
        return
    try:
        exited = loop.create_future()

        def gone() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, gone)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)
    proc.wait()


def _dies_with(shell: int) -> Callable[[], None]:
    """A ``preexec_fn`` asking the kernel to SIGKILL the child when the shell dies, even by
    SIGKILL: a git of a killed shell never goes on writing a repository the next shell owns."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != shell:  # the shell died before the kernel could be told
            os._exit(1)

    return preexec


def git_processes(root: Path) -> list[tuple[int, str]]:
    """Live git processes working in ``root`` (their current folder is in it): pid and command."""
    found: list[tuple[int, str]] = []
    mine = os.getpid()
    where = root.resolve()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == mine:
            continue
        try:
            if not (entry / "comm").read_text().startswith("git"):
                continue
            cwd = (entry / "cwd").readlink()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd == where or where in cwd.parents:
            found.append((int(entry.name), command.strip()))
    return found


async def _await_no_git(root: Path, seconds: float) -> None:
    """Wait until no git works in ``root``; refuse start-up naming the one that outlives ``seconds``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    told = False
    while running := git_processes(root):
        if loop.time() >= end:
            pid, command = running[0]
            raise ConfigError(
                f"a git process (pid {pid}: {command!r}) is still working in the scope repository "
                f"{root} after {seconds:g} s; let it finish or stop it, then start Atrium again"
            )
        if not told:
            _LOGGER.warning("waiting for git (pid %d) to finish in %s", running[0][0], root)
            told = True
        await asyncio.sleep(0.1)


def _clear_stale_locks(git_dir: Path) -> None:
    refs = git_dir / "refs"
    found = [git_dir / name for name in LOCK_FILES]
    found += sorted(refs.rglob("*.lock")) if refs.is_dir() else []
    for stale in found:
        if stale.exists():
            _LOGGER.warning("removing a stale git lock %s left by an interrupted operation", stale)
            stale.unlink()


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


def read_head(git_dir: Path) -> str | None:
    """The commit id HEAD names when the files say so plainly: ``HEAD`` holds an id, or
    ``ref: refs/heads/<branch>`` whose loose ref file holds one. None when that is not the case
    (the caller asks git then)."""
    try:
        head = (git_dir / "HEAD").read_text(encoding="ascii").strip()
        if OBJECT_ID_RE.fullmatch(head):
            return head
        branch = BRANCH_REF_RE.fullmatch(head)
        if (
            branch is None
            or ".." in branch[1]
            or any(p.endswith((".lock", ".")) for p in branch[1].split("/"))
        ):
            return None
        commit = (git_dir / branch[1]).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return commit if OBJECT_ID_RE.fullmatch(commit) else None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill git and what it started (ssh, a remote helper): they share its process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


def is_remote_url(url: str) -> bool:
    return bool(REMOTE_RE.fullmatch(url)) and not any(ord(c) < 32 for c in url)


#: a check that the writer lock is still held (raises when it may not be: `DatabaseLost`)
Fence = Callable[[], Awaitable[None]]


class WriteGuard(Protocol):
    """Holds a scope's writer lock among shells (atrium.state.scopelocks): entered for the whole
    of one write, giving the check to run before each change is committed."""

    def hold(
        self, root: Path, announce: Callable[[], bool]
    ) -> AbstractAsyncContextManager[Fence]: ...


class ScopeRepo:
    """The git repository behind one mutable scope (docs/api.md "Scopes").

    ``lock`` serialises git runs; `writing` makes one write (an install's swap, record and
    commit, a trust store or remote, a recovery) the only one in the scope: in this shell, and,
    with a ``guard`` (several shells on one PostgreSQL database), among all shells."""

    def __init__(self, root: Path, guard: WriteGuard | None = None) -> None:
        self.root = root
        self.lock = asyncio.Lock()
        self.guard = guard
        self._writer = asyncio.Lock()
        self._fence: Fence | None = None
        self._announce = False

    @contextlib.asynccontextmanager
    async def writing(self, *, announce: bool = True) -> AsyncIterator[None]:
        """Be the scope's one writer for the block (not reentrant: one block per write);
        ``announce``: whether the other shells are told the scope changed when the block ends
        (not when it was only opened, or recovered nothing, unless `changed` says otherwise)."""
        async with self._writer:
            if self.guard is None:
                yield
                return
            self._announce = announce
            async with self.guard.hold(self.root, lambda: self._announce) as fence:
                self._fence = fence
                try:
                    yield
                finally:
                    self._fence = None

    def changed(self) -> None:
        """Within `writing`: the scope changed, tell the other shells when the write ends."""
        self._announce = True

    async def fence(self) -> None:
        """Before a change is committed: raises (`DatabaseLost`) when the writer lock may have
        been lost since it was taken; nothing without a guard."""
        if self._fence is not None:
            await self._fence()

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
        # under the writer lock: the lock files cleared here may be another shell's, sharing
        # the folder, in the middle of a write (its git runs are not in this machine's /proc)
        async with self.writing(announce=False), self.lock:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / "apps").mkdir(exist_ok=True)
            if (self.root / ".git").is_dir():
                await _await_no_git(self.root, git_timeout())
                _clear_stale_locks(self.root / ".git")
            fresh = not (self.root / ".git").is_dir()
            if fresh:
                await run_git("init", "--quiet", "--initial-branch=main", cwd=self.root)
            # the repository's internals, its staging, journals and records are the shell's alone
            # (issue 13); apps/ holds the app trees, whose modes stay the artifact's
            if (self.root / ".git").is_dir():
                (self.root / ".git").chmod(0o700)
            for private in (".staging", ".journal", "records"):
                (self.root / private).mkdir(mode=0o700, exist_ok=True)
                (self.root / private).chmod(0o700)
            await self._configure(fresh)
            # a repository git has just made has no commit: no need to ask (one git run less)
            if fresh or await self._head() is None:
                write_atomic(self.root / MARKER, "Atrium scope repository\n")
                write_atomic(self.root / ".gitignore", GITIGNORE)
                await run_git("add", "--", MARKER, ".gitignore", cwd=self.root)
                await run_git("commit", "--quiet", "-m", "baseline: Atrium scope", cwd=self.root)

    async def _configure(self, fresh: bool) -> None:
        """Make the repository's own config hold CONFIG. Git just wrote a fresh repository's
        ``.git/config`` (its ``[core]`` section alone): the sections are appended there as
        ``git config`` writes them. Otherwise one git run reads the three values and only those
        that differ (or are set more than once) are set, by git, as they always were."""
        if fresh:
            with (self.root / ".git" / "config").open("a", encoding="utf-8") as config:
                config.write(CONFIG_SECTIONS)
            return
        pattern = "^(" + "|".join(re.escape(key) for key, _ in CONFIG) + ")$"
        out = await run_git(
            "config", "--local", "-z", "--get-regexp", pattern, cwd=self.root, check=False
        )
        found: dict[str, list[str]] = {}
        for item in filter(None, out.split("\0")):
            key, _, value = item.partition("\n")
            found.setdefault(key, []).append(value)
        for key, value in CONFIG:
            if found.get(key) != [value]:
                await run_git("config", key, value, cwd=self.root)

    async def _head(self) -> str | None:
        """The commit HEAD names, or None before the first commit. Read from ``.git`` when HEAD
        is the plain case git writes (a branch whose loose ref file holds a commit id, or a
        detached id), as ``rev-parse --verify HEAD`` answers it (neither checks that the commit
        exists); anything else (packed refs, an unborn branch, another ref format) asks git."""
        if (commit := read_head(self.root / ".git")) is not None:
            return commit
        out = await run_git("rev-parse", "--verify", "--quiet", "HEAD", cwd=self.root, check=False)
        return out.strip() or None

    async def head(self) -> str | None:
        async with self.lock:
            return await self._head()

    async def remote(self) -> str | None:
        out = await run_git("config", "--get", "remote.origin.url", cwd=self.root, check=False)
        return out.strip() or None

    async def set_remote(self, url: str) -> None:
        """Store ``origin`` in the repository's config; nothing is pushed (docs/api.md "Scopes")."""
        async with self.writing(), self.lock:
            await self.fence()
            if await self.remote() is None:
                await run_git("remote", "add", "origin", url, cwd=self.root)
            else:
                await run_git("remote", "set-url", "origin", url, cwd=self.root)

    async def commit_all(self, message: str) -> str | None:
        """Commit every change under the scope as one commit; None when nothing changed."""
        async with self.writing(), self.lock:
            await run_git("add", "--all", cwd=self.root)
            status = await run_git("status", "--porcelain", cwd=self.root)
            if not status.strip():
                return None
            await self.fence()
            await run_git("commit", "--quiet", "-m", message, cwd=self.root)
            return await self._head()

    async def log(self) -> list[str]:
        out = await run_git("log", "--format=%s", cwd=self.root)
        return out.splitlines()
