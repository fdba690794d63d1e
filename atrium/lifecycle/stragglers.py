"""What a killed shell's runs left running, found by the lock files they hold and ended at start.

Every run holds the ``flock`` of its instance's lock file in the home's ``run/locks``
(`runners.process.instance_lock`) for as long as anything of it runs: the keeper, or bwrap's
sandbox (``--sync-fd``). Everything a run starts dies with the shell, but one window stays open:
a bwrap killed in its first milliseconds (and a ``kill -9`` of the shell at that moment), before
its sandbox asked to die with its parent, leaves that sandbox running with its namespaces, and
still holding the lock. The next shell on the home ends such processes before it launches
anything (`end_stragglers`), so the instance starts again and its network goes with them.

A holder is found by its open descriptor, never by ``/proc/locks``: the pid there is the process
that took the lock (the shell, long gone, or a stranger by now), not the sandbox that holds the
descriptor it inherited. ``/proc/locks`` only says whether a lock file is locked at all, so a
start with nothing left reads no other process's descriptors.

What is ended: a process (in any pid namespace below the shell's) holding, through a descriptor
with the lock on it, a regular file of this home's ``run/locks`` (same device and inode), and
every process below it; never this process nor anything below it; nothing at all while another
process holds ``run/serve.lock`` (a live shell on the home, whose runs those are). Each process
is pinned with a pidfd and checked again before the signal, so a pid reused in between is never
signalled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from atrium.lifecycle.runners.process import ProcStat, descendants, locks_dir, read_stat

_LOGGER = logging.getLogger(__name__)

#: how long the start waits for the ended processes to be gone (their namespaces with them)
WAIT_SECONDS: Final = 5.0

FileKey = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Straggler:
    """A process holding one of the home's lock files, and those below it."""

    holder: ProcStat
    lock: Path
    below: tuple[ProcStat, ...]

    def words(self) -> str:
        return f"pid {self.holder.pid} ({command_of(self.holder.pid)}) holding {self.lock.name}" + (
            f" and {len(self.below)} process(es) below it" if self.below else ""
        )


def command_of(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in argv if a)[:160] or "?"


def lock_files(folder: Path) -> dict[FileKey, Path]:
    """The regular files of ``folder`` by (device, inode); none when it does not exist."""
    found: dict[FileKey, Path] = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for entry in entries:
        with contextlib.suppress(OSError):
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(info.st_mode):
                found[(info.st_dev, info.st_ino)] = Path(entry.path)
    return found


def flocked_inodes() -> set[int]:
    """The inodes ``/proc/locks`` shows an flock held on (any device; a pre-check only)."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return set()
    inodes: set[int] = set()
    for line in text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 24893 fe:00:2147560 0 EOF" ("1: -> FLOCK …" is a waiter)
        if len(fields) > 5 and fields[1] == "FLOCK":
            with contextlib.suppress(ValueError):
                inodes.add(int(fields[5].rsplit(":", 1)[1]))
    return inodes


def held_by(pid: int, files: dict[FileKey, Path]) -> Path | None:
    """The first of ``files`` process ``pid`` holds the flock of through a descriptor."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        names = [entry.name for entry in fds.iterdir()]
    except OSError:  # gone, or another user's and this shell is not root: not ours
        return None
    for name in names:
        try:
            info = (fds / name).stat()
            if (info.st_dev, info.st_ino) not in files:
                continue
            fdinfo = Path(f"/proc/{pid}/fdinfo/{name}").read_text()
        except OSError:
            continue
        if any(line.startswith("lock:") and " FLOCK " in line for line in fdinfo.splitlines()):
            return files[(info.st_dev, info.st_ino)]
    return None


def _pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def holders(files: dict[FileKey, Path], spare: set[int]) -> dict[int, Path]:
    """The processes (but ``spare``) holding the flock of one of ``files``."""
    if not files or not {ino for _, ino in files} & flocked_inodes():
        return {}
    found: dict[int, Path] = {}
    for pid in _pids():
        if pid not in spare and (lock := held_by(pid, files)) is not None:
            found[pid] = lock
    return found


def own_processes() -> set[int]:
    """This process and every process below it: never a straggler."""
    me = os.getpid()
    return {me, *(s.pid for s in descendants(me))}


def find(home: Path, serve_lock: Path) -> tuple[list[Straggler], str | None]:
    """The stragglers of ``home``'s killed shell, or why none may be ended now."""
    locks = lock_files(locks_dir(home))
    if not {ino for _, ino in locks} & flocked_inodes():
        return [], None  # the usual start: none of the home's lock files is locked
    spare = own_processes()
    try:
        info = serve_lock.stat()
        serving = holders({(info.st_dev, info.st_ino): serve_lock}, spare)
    except FileNotFoundError:
        serving = {}
    if serving:
        return [], f"process {min(serving)} holds {serve_lock}: a shell still runs on this home"
    found: list[Straggler] = []
    for pid, lock in sorted(holders(locks, spare).items()):
        holder = read_stat(pid)
        if holder is not None:
            below = tuple(s for s in descendants(pid) if s.pid not in spare)
            found.append(Straggler(holder, lock, below))
    return found, None


def _pin(process: ProcStat) -> int | None:
    """A pidfd of ``process`` if it is still that process (same start time), else None."""
    try:
        fd = os.pidfd_open(process.pid)
    except OSError:
        return None
    now = read_stat(process.pid)
    if now is None or now.start != process.start or now.state == "Z":
        os.close(fd)
        return None
    return fd


def end(stragglers: Iterable[Straggler], wait: float = WAIT_SECONDS) -> list[str]:
    """SIGKILL each straggler and those below it, each pinned first and its holder checked again
    (it still holds the lock file); wait (at most ``wait`` s) until they are gone. What was
    ended, in words."""
    pinned: list[int] = []
    ended: list[str] = []
    try:
        for straggler in stragglers:
            fd = _pin(straggler.holder)
            if fd is None:
                continue
            if held_by(straggler.holder.pid, lock_files(straggler.lock.parent)) is None:
                os.close(fd)
                continue
            words = straggler.words()  # before the kill: its command line goes with it
            pinned.append(fd)
            for process in straggler.below:
                if (below := _pin(process)) is not None:
                    pinned.append(below)
            ended.append(words)
        for fd in pinned:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        _wait_gone(pinned, wait)
    finally:
        for fd in pinned:
            os.close(fd)
    return ended


def _wait_gone(pidfds: list[int], seconds: float) -> None:
    """Until every pidfd reads as exited (a pidfd polls readable once its process ended)."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    left = set(pidfds)
    deadline = time.monotonic() + seconds
    while left and (remaining := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(remaining * 1000):
            left.discard(fd)
            poller.unregister(fd)
    if left:
        _LOGGER.warning("%d ended process(es) of a killed shell are not gone yet", len(left))


def end_stragglers(home: Path, serve_lock: Path) -> list[str]:
    """End what a killed shell of ``home`` left running (see the module docstring); what was
    ended, in words, also logged. Blocking (reads ``/proc``); called at start, before anything
    is launched and before the network's sweep, which then removes what their networks left."""
    stragglers, refused = find(home, serve_lock)
    if refused is not None:
        _LOGGER.warning("not ending stragglers of a killed shell: %s", refused)
        return []
    ended = end(stragglers)
    for words in ended:
        _LOGGER.warning("ended what a killed shell left running: %s", words)
    return ended


__all__ = ["Straggler", "end_stragglers", "find"]
