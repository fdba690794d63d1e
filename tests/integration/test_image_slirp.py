"""An image app under a shell that is NOT root: `atrium serve` as an unprivileged uid of its own,
the busybox image in bwrap's network namespace with slirp4netns forwarding its port.

The test needs root only to stage that shell: a private mount namespace where ``/dev/net/tun``
is open to every user (Debian's udev makes it 0666; this machine has it 0600) and the
interpreter (under ``/root``) is reachable, then ``setpriv`` to the uid before ``atrium serve``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Final

import pytest

from atrium.images.store import ImageStore
from atrium.lifecycle.runners.image import _child_pid
from atrium.lifecycle.slirp import Slirp
from tests.conftest import REPO_DIR
from tests.integration.conftest import ServeProcess, running, serve_env, wait_for
from tests.integration.registry import Registry, running_registry
from tests.integration.test_app_network import reach_layers
from tests.integration.test_image_store import push_image
from tests.integration.test_origins import enter, open_view

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("slirp4netns") is None,
        reason="stages an unprivileged shell (root) and needs slirp4netns",
    ),
]

APP: Final = "test.image.slirp"
#: the shell's uid: one no one else on the machine uses
UID: Final = 61_731
CONFIG: Final[dict[str, object]] = {
    "Entrypoint": ["/bin/busybox", "httpd", "-f", "-v"],
    "Cmd": ["-p", "80", "-h", "/www"],
    "Env": ["PATH=/bin"],
    "WorkingDir": "/www",
    "ExposedPorts": {"80/tcp": {}},
    "User": "www:web",  # port 80 with no capability: any user of the image may bind it
}
#: in a private mount namespace: a tun device open to all, the interpreter reachable, then the
#: shell as ``UID`` ($1: the folder to stage in; the rest: the command)
STAGE: Final = (
    'set -e; d="$1"; shift; mknod -m 0666 "$d/tun" c 10 200; '
    'mount --bind "$d/tun" /dev/net/tun; mkdir "$d/py"; mount --bind /root "$d/py"; '
    "mount -t tmpfs -o mode=0755 tmpfs /root; mkdir /root/.pyenv; "
    'mount --bind "$d/py/.pyenv" /root/.pyenv; '
    f'exec setpriv --reuid={UID} --regid={UID} --clear-groups -- "$@"'
)


def slirps() -> list[int]:
    """The slirp4netns processes of ``UID``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and entry.stat().st_uid == UID
                and (entry / "comm").read_text().strip() == "slirp4netns"
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def owned_in_tmp() -> list[Path]:
    """What ``UID`` has in the temporary folder."""
    found = []
    for entry in Path(tempfile.gettempdir()).iterdir():
        with suppress(OSError):
            if entry.lstat().st_uid == UID:
                found.append(entry)
    return found


@contextmanager
def unprivileged_serve(
    base: Path, home: Path, system_apps: Path, stop: signal.Signals
) -> Iterator[ServeProcess]:
    env = serve_env(home, ATRIUM_SYSTEM_APPS=str(system_apps), HOME=str(base))
    proc = subprocess.Popen(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            STAGE,
            "stage",
            str(base),
            sys.executable,
            "-m",
            "atrium",
            "serve",
        ],
        env=env,
        cwd=REPO_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with running(proc, home, stop, echo=True) as served:
        yield served


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("slirp-registry")) as started:
        yield started


def test_an_image_under_a_shell_that_is_not_root_has_a_network_of_its_own(
    registry: Registry,
) -> None:
    digest, _ = asyncio.run(push_image(registry, "apps/slirp", "1", reach_layers(), CONFIG))
    base = Path(tempfile.mkdtemp(prefix="atrium-slirp-test-"))
    try:
        base.chmod(0o755)
        home, system_apps = base / "home", base / "apps"
        asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/slirp", digest))
        (system_apps / APP).mkdir(parents=True)
        manifest = {
            "id": APP,
            "version": "1.0.0",
            "name": "Busybox reach",
            "runtime": {
                "image": f"{registry.host}/apps/slirp@{digest}",
                "port": 80,
                "health": {"path": "/"},
            },
        }
        (system_apps / APP / "app.manifest.json").write_text(json.dumps(manifest))
        for folder in (home, system_apps):
            subprocess.run(["chown", "-R", f"{UID}:{UID}", str(folder)], check=True)
        home.chmod(0o700)
        # a service of the host's on its loopback: the image must not reach it
        with (
            socket.create_server(("127.0.0.1", 0)) as listener,
            unprivileged_serve(base, home, system_apps, signal.SIGKILL) as served,
            served.client(timeout=30) as api,
        ):
            instance, url = open_view(api, APP)
            assert instance["state"] in ("started", "resumed"), instance
            listed = api.get(f"/api/instances/{instance['instanceId']}").json()
            assert listed["network"] == "slirp4netns", listed
            client, _ = enter(served, url)  # type: ignore[arg-type]
            with closing(client):

                def reach(target: str) -> str:
                    answer = client.get(f"/cgi-bin/reach?{target}")
                    assert answer.status_code == 200, answer.text
                    return answer.text.strip()

                assert reach("127.0.0.1:80") == "reached"  # its own loopback
                port = listener.getsockname()[1]
                assert reach(f"10.0.2.2:{port}") == "blocked"  # the host's loopback via slirp
                assert reach(f"127.0.0.1:{port}") == "blocked"
                assert reach("10.0.2.3:53") == "blocked"  # slirp's DNS: the outside
                outside = served.url.split("//")[1].split(":")[0]
                assert reach(f"{outside}:{served.url.rsplit(':', 1)[1]}") == "blocked"
            assert len(slirps()) == 1
            # another process of the host at the instance's loopback port is not served
            with socket.create_connection(("127.0.0.1", listed["port"]), timeout=5) as other:
                other.sendall(b"GET / HTTP/1.0\r\n\r\n")
                with suppress(ConnectionResetError):  # closed unread: a reset
                    assert other.recv(100) == b""
            # stopped: its slirp4netns ends with it
            assert api.delete(f"/api/instances/{instance['instanceId']}").status_code == 200
            wait_for(lambda: not slirps(), "slirp4netns to end with the instance")
            again, _ = open_view(api, APP)
            assert again["state"] in ("started", "resumed"), again
            wait_for(lambda: len(slirps()) == 1, "the new instance's slirp4netns")
            # kill -9 of the shell: nothing of the instance's network is left
            served.proc.kill()
            served.proc.wait()
            wait_for(lambda: not slirps(), "slirp4netns to end with the shell")
            assert owned_in_tmp() == []  # the API socket's folder neither
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_the_shell_enters_a_sandboxs_network_only_once_its_ids_are_mapped(tmp_path: Path) -> None:
    """bwrap that is not setuid gives the sandbox's pid (``--info-fd``) before its child mapped
    the ids of its user namespace: the shell entering it then was no one there, and writing the
    table and the low ports failed ("Permission denied"; seen under load, one start in a few).
    Here the maps are held back (``--userns-block-fd``) until the shell has tried."""
    info_r, info_w = os.pipe()
    hold_r, hold_w = os.pipe()
    block_r, block_w = os.pipe()
    bwrap = [
        *("bwrap", "--unshare-user", "--unshare-net", "--unshare-pid", "--die-with-parent"),
        *("--info-fd", str(info_w), "--userns-block-fd", str(hold_r), "--block-fd", str(block_r)),
        *("--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"),
    ]
    sandbox = subprocess.Popen(bwrap, pass_fds=(info_w, hold_r, block_r))
    for fd in (info_w, hold_r, block_r):
        os.close(fd)

    async def attach() -> None:
        pid = await _child_pid(info_r)
        attaching = asyncio.create_task(Slirp.attach(pid, tmp_path / "log"))
        done, _ = await asyncio.wait({attaching}, timeout=0.3)
        assert not done, attaching.result()  # it waits for the maps
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{pid}/{name}").write_text("0 0 1\n")
        os.write(hold_w, b"1")
        slirp = await asyncio.wait_for(attaching, 10)  # the table and the low ports written
        await slirp.close()

    try:
        asyncio.run(attach())
        os.write(block_w, b"1")
        assert sandbox.wait(timeout=10) == 0
    finally:
        for fd in (info_r, hold_w, block_w):
            os.close(fd)
        sandbox.kill()
        sandbox.wait()


def test_doctor_says_which_network_an_unprivileged_shell_gives_images() -> None:
    base = Path(tempfile.mkdtemp(prefix="atrium-slirp-doctor-"))
    try:
        base.chmod(0o755)
        (base / "home").mkdir()
        os.chown(base / "home", UID, UID)
        done = subprocess.run(
            [
                "unshare",
                "-m",
                "sh",
                "-c",
                STAGE,
                "stage",
                str(base),
                sys.executable,
                "-m",
                "atrium",
                "doctor",
            ],
            env=serve_env(base / "home", HOME=str(base)),
            cwd=REPO_DIR,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        network = next(line for line in done.stdout.splitlines() if line.startswith("network:"))
        assert "slirp4netns" in network, done.stdout + done.stderr
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
