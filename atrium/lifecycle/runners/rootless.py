"""Image apps under a shell that is not root: bubblewrap's own namespaces and slirp4netns.

What differs from a root shell's image sandbox (`atrium.lifecycle.runners.image`):

- ids: bwrap maps one id, the image's ``User`` inside onto the shell's own uid and gid (a shell
  that is not root may map no other): an image whose processes use several ids cannot run;
- files: the image's root and the data folders are bound as the shell's user reaches them (no
  relay through a mount namespace of the shell's);
- network: bwrap's own network namespace (``--unshare-net``), held at ``--block-fd`` until the
  shell wrote its table, attached slirp4netns and started the socket maker through which its
  forwarder on the instance's loopback port reaches the image (`atrium.lifecycle.slirp`).
  Without slirp4netns or an open ``/dev/net/tun`` (`slirp_problem`) the image is refused.
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from pathlib import Path

from atrium.errors import SpawnFailed
from atrium.lifecycle.runners import SpawnSpec
from atrium.lifecycle.runners.bwrap import classify_early_exit
from atrium.lifecycle.runners.image import (
    CAPABILITIES,
    HOST_ENV,
    Forwarder,
    ImageChild,
    ImageRun,
    _child_pid,
    data_folder,
    env_args,
    make_data_folder,
    make_mount_points,
)
from atrium.lifecycle.runners.process import local_port, lock_data_dir, prepare_dirs, start_child
from atrium.lifecycle.slirp import Slirp, SocketMaker, slirp_problem


class MadeForwarder(Forwarder):
    """The shell's forwarder with the sockets of the image's network from a `SocketMaker`."""

    def __init__(self, maker: SocketMaker, port: int, label: str) -> None:
        super().__init__(-1, port, label)  # no namespace descriptor: the maker holds the way in
        self._maker = maker

    async def _inside(self) -> socket.socket:
        return await self._maker.socket()

    async def close(self) -> None:
        await super().close()
        await self._maker.close()


class SlirpChild(ImageChild):
    """An image sandbox and the slirp4netns process attached to its network, stopped once the
    sandbox is gone (an exit, a crash, a stop)."""

    slirp: Slirp | None = None

    async def _watch(self) -> None:
        try:
            await super()._watch()
        finally:
            if self.slirp is not None:
                await self.slirp.close()


def rootless_argv(
    spec: SpawnSpec, run: ImageRun, bwrap: str, fds: tuple[int, int, int, int]
) -> list[str]:
    """bwrap building the image's sandbox as the shell's user; ``fds``: info, block, lock, env."""
    info, block, lock, env = fds
    launch = run.launch
    options = [
        "--unshare-user",
        "--uid",
        str(launch.uid),
        "--gid",
        str(launch.gid),
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--info-fd",
        str(info),
        "--block-fd",
        str(block),
        "--sync-fd",
        str(lock),
        "--cap-drop",
        "ALL",
    ]
    if launch.uid == 0:
        for capability in CAPABILITIES:
            options += ["--cap-add", capability]
    options += ["--ro-bind", str(run.rootfs), "/", "--proc", "/proc", "--dev", "/dev"]
    for scratch in ("/tmp", "/run"):  # noqa: S108
        if (run.rootfs / scratch[1:]).is_dir() and not (run.rootfs / scratch[1:]).is_symlink():
            options += ["--perms", "1777" if scratch == "/tmp" else "0755", "--tmpfs", scratch]  # noqa: S108
    for path in run.data:
        options += ["--bind", str(data_folder(spec.data_dir, path)), path]
    options += ["--args", str(env)]
    options += ["--hostname", spec.instance_id[:63], "--chdir", launch.cwd]
    return [bwrap, *options, "--", *launch.argv]


async def spawn_rootless(spec: SpawnSpec, run: ImageRun, bwrap: str) -> SlirpChild:
    """The image's sandbox in a network of its own through slirp4netns (see the docstring)."""
    label = f"{spec.app_id} instance {spec.instance_id}"
    problem = slirp_problem()
    if problem is not None:
        raise SpawnFailed(
            f"cannot start {label}: image apps need a root shell or slirp4netns, and {problem}",
            app_id=spec.app_id,
            cause="mount",
        )
    # everything is the shell's own: it may hand nothing to another uid
    spec = replace(spec, user=None)
    try:
        prepare_dirs(spec)
        for path in run.data:
            make_data_folder(spec.data_dir, path)
        make_mount_points(run.rootfs, run.data)
    except OSError as err:
        raise SpawnFailed(
            f"cannot start {label}: {err.strerror or err}", app_id=spec.app_id, cause="mount"
        ) from err
    lock = lock_data_dir(spec)
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    block_r, block_w = os.pipe2(os.O_CLOEXEC)
    env_fd = env_args(run.launch.env)
    try:
        argv = rootless_argv(spec, run, bwrap, (info_w, block_r, lock, env_fd))
        process = await start_child(
            spec,
            argv,
            dict(HOST_ENV),
            label=label,
            pass_fds=(info_w, block_r, lock, env_fd),
            die_with_shell=True,
            cwd=Path("/"),
        )
    finally:
        for fd in (info_w, block_r, lock, env_fd):
            os.close(fd)
    port = local_port(spec)
    child = SlirpChild(
        process,
        host=spec.host,
        port=port,
        label=label,
        cgroup=spec.cgroup,
        log_path=spec.log_path,
    )
    try:
        pid = await _child_pid(info_r)
        child.slirp = await Slirp.attach(pid, spec.log_path)
        maker = await SocketMaker.start(pid, spec.log_path)
        forwarder = child.forwarder = MadeForwarder(maker, run.launch.port, label)
        await forwarder.start(spec.host, port)
        os.write(block_w, b"1")
    except OSError as err:
        await child.stop(0)
        raise SpawnFailed(
            f"cannot start {label}: the image's network could not be set up: {err.strerror or err}",
            app_id=spec.app_id,
            cause="mount",
        ) from err
    finally:
        os.close(info_r)
        os.close(block_w)
    return child


__all__ = ["SlirpChild", "classify_early_exit", "rootless_argv", "spawn_rootless"]
