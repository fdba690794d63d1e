"""The keeper: a tiny parent between the shell and an app started by the ``process`` runner.

Run as a script (``python -I -S keeper.py <shell pid> <lock fd> <uid> <gid> -- <argv…>``, stdlib
only, no ``atrium`` import), it makes "nothing outlives the shell" hold without namespaces:

- it is the *child subreaper* of everything below it (``PR_SET_CHILD_SUBREAPER``): a grandchild
  that double-forks and calls ``setsid`` is re-parented to the keeper, not to init, so it stays
  findable as a descendant;
- it asks the kernel for SIGTERM when the shell's spawning thread dies (``PR_SET_PDEATHSIG``),
  even by SIGKILL, and then SIGKILLs every descendant and exits;
- when the app exits (or is stopped), whatever it left behind is SIGKILLed before the keeper
  exits with the app's status (a signal death is re-raised on the keeper, so the shell reads it
  as ``-N`` like any child);
- it holds the data folder's ``flock`` (inherited descriptor) for as long as anything of the app
  runs, so one data folder never serves two instances at once;
- as root it starts the app under the app's own uid/gid with no supplementary groups.

A SIGTERM while the shell lives is passed on to the app's processes (a polite stop by hand).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _signal_all(sig: int) -> None:
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def main(args: list[str]) -> None:
    shell, lock_fd, uid, gid = (int(a) for a in args[:4])
    command = args[5:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def on_term(signum: int, frame: object) -> None:
        _signal_all(signal.SIGKILL if os.getppid() != shell else signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != shell:
        sys.exit(1)  # the shell died before the kernel could tell us
    app = os.fork()
    if app == 0:
        _exec_app(libc, command, lock_fd, uid, gid)
    status = 0
    while True:
        try:
            pid, got = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == app:
            status = got
            app = -1
        if app == -1:
            _signal_all(signal.SIGKILL)  # leftovers of an app that ended
    _exit_like(status)


def _exec_app(libc: ctypes.CDLL, command: list[str], lock_fd: int, uid: int, gid: int) -> None:
    """In the forked child: become the app (its uid as root; dies with the keeper)."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if lock_fd >= 0:
            os.close(lock_fd)
        if uid >= 0:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.execvp(command[0], command)  # noqa: S606 - the app's own argv, no shell
    except OSError as err:
        sys.stderr.write(f"atrium keeper: cannot execute {command[0]!r}: {err}\n")
    os._exit(127)


def _exit_like(status: int) -> None:
    """Exit as the app did: the same code, or death by the same signal."""
    if os.WIFSIGNALED(status):
        died_of = os.WTERMSIG(status)
        if died_of not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(died_of, signal.SIG_DFL)
        os.kill(os.getpid(), died_of)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
