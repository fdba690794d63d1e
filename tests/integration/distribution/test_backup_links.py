"""The root shell's copy of an app's data acts through no link (docs/security.md boundary 7),
through the real shell running as root, with a racing process of the app's uid.

The shell stops an app's instances for a backup, so the app itself is not running while its
data is copied; what races here is a process of the app's uid started by the test beside the
shell (a child the app left behind, a second instance of the same uid under the process
runner: anything holding the app's uid can write its data folder while the root shell copies
it). It watches the data folder with inotify (`IN_OPEN` names each folder as the copier opens
it) and swaps, over and over, the file in that folder and the next folder itself with symlinks
to a root-owned 0600 file (and its folder) outside the app's data, each swap one
`renameat2(RENAME_EXCHANGE)`, so every name always exists.

A copier that checks a path and then acts on it by path copies the host file's bytes into the
backup, or sets the host file's mode to the app file's (6777) through the link it has just
copied. The copier must do neither, and every backup completes: it looks each entry up once and
copies what it found, so a racing app has no gap to win (when the copier looked again at an entry
that had changed, a few times, a shell slower than the racer under load failed all five).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.integration.distribution.conftest import MakeApp, installed_ok

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the attack needs a root shell and an app uid"),
]

APP = "com.example.racer"
FOLDERS = 1000
RUNS = 5
SECRET = b"host-secret-7f3a9c-never-in-a-backup"

#: the app's process: lays out the data (as the app would), then races the copier until killed
RACER = r"""
import ctypes, os, struct, sys

host, count = sys.argv[1], int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
AT_FDCWD, RENAME_EXCHANGE, IN_OPEN, IN_NONBLOCK = -100, 2, 0x20, 0o4000

if not os.path.exists("d0000"):
    for i in range(count):
        d = f"d{i:04d}"
        os.mkdir(d)
        with open(f"{d}/f", "wb") as file:
            file.write(b"app data")
        os.chmod(f"{d}/f", 0o6777)
        os.symlink(f"{host}/f", f"{d}/f.l")
        os.symlink(host, f"{d}.l")

names = {}
for i in range(count):
    d = f"d{i:04d}"
    names[i] = ((f"{d}/f".encode(), f"{d}/f.l".encode()), (d.encode(), f"{d}.l".encode()))

def exchange(pair):
    libc.renameat2(AT_FDCWD, pair[0], AT_FDCWD, pair[1], RENAME_EXCHANGE)

watch = libc.inotify_init1(IN_NONBLOCK)
assert watch >= 0 and libc.inotify_add_watch(watch, b".", IN_OPEN) >= 0
print("ready", flush=True)
current = 0
while True:
    try:
        events = os.read(watch, 1 << 16)
    except BlockingIOError:
        events = b""
    at = 0
    while at < len(events):
        _, _, _, size = struct.unpack_from("iIII", events, at)
        name = events[at + 16 : at + 16 + size].rstrip(b"\0")
        at += 16 + size
        if name[:1] == b"d" and name[1:5].isdigit():
            current = int(name[1:5])
    for i in (current, current + 1):
        if i < count:
            exchange(names[i][0])
    if current + 1 < count:
        exchange(names[current + 1][1])
"""


def _host_file(tmp_path: Path) -> Path:
    """A root-owned folder (0700) holding a root-owned 0600 file of secret bytes named ``f``."""
    host = tmp_path / "host"
    host.mkdir(mode=0o700)
    secret = host / "f"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    return secret


def _state(path: Path) -> tuple[int, int, int]:
    info = path.lstat()
    return info.st_mode, info.st_uid, info.st_gid


def _leaks(root: Path) -> list[str]:
    """Every file under ``root`` (links not followed) that holds the secret bytes."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink() and SECRET in path.read_bytes():
                found.append(str(path.relative_to(root)))
    return found


def test_a_racing_app_cannot_make_a_backup_act_through_a_link(
    api: httpx.Client, make_app: MakeApp, home: Path, tmp_path: Path
) -> None:
    installed_ok(api, f"local:{make_app(APP)}")
    instance = api.post("/api/instances", json={"appId": APP}).json()["instanceId"]
    data = home / "scopes/global/apps" / APP / instance
    uid, gid = data.stat().st_uid, data.stat().st_gid
    assert uid != 0
    secret = _host_file(tmp_path)
    before = {path: _state(path) for path in (secret, secret.parent)}
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python is not None
    answers = []
    for _ in range(RUNS):
        # cwd is entered before the uid changes: the app's uid need not reach the test's folders
        racer = subprocess.Popen(
            [python, "-c", RACER, str(secret.parent), str(FOLDERS)],
            cwd=data,
            user=uid,
            group=gid,
            extra_groups=[],
            stdout=subprocess.PIPE,
        )
        with racer:
            try:
                assert racer.stdout is not None
                assert racer.stdout.readline() == b"ready\n"
                answer = api.post(f"/api/dist/backups/{APP}")
            finally:
                racer.kill()
        answers.append(answer.status_code)
        assert answer.status_code == 200, answer.text
        assert {path: _state(path) for path in before} == before, answers
        assert _leaks(home / "backups") == [], answers
        assert _leaks(home / "scopes") == [], answers
    assert answers == [200] * RUNS
