"""An image's config (what its author set: Entrypoint, Cmd, Env, WorkingDir, ExposedPorts, User),
and what a runner needs once the manifest's ``runtime`` is laid over it.

Pure. The manifest overrides the image: ``command`` replaces the whole argv (Entrypoint and Cmd,
as a Kubernetes ``command`` without ``args`` does), ``env`` is laid over the image's Env by name,
``port`` is the manifest's (ExposedPorts is only a hint the install review may show).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import Any, Final

from atrium.manifest import ENV_NAME_RE, Runtime

#: what a container runtime sets when the image says nothing
DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_ID: Final = 65535


class ConfigInvalid(ValueError):
    """The image's config is not one the shell can run; the message says which field."""


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """The parts of an image config the shell runs by (its ``config`` object, and the platform)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    working_dir: str = ""
    exposed_ports: tuple[int, ...] = ()
    user: str = ""
    architecture: str = ""
    os: str = ""


@dataclass(frozen=True, slots=True)
class Launch:
    """What a runner starts: argv, the environment, the working folder (inside the image), the
    port the app listens on and the user (``uid``, ``gid`` inside the image)."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/"
    port: int = 0
    uid: int = 0
    gid: int = 0


def _strings(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(v, str) and "\x00" not in v for v in value
    ):
        raise ConfigInvalid(f"the image config's {name} is not a list of strings")
    return tuple(value)


def _env(value: Any) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for item in _strings(value, "Env"):
        name, equals, text = item.partition("=")
        if not equals or not ENV_NAME_RE.fullmatch(name):
            raise ConfigInvalid(f"the image config's Env entry {item[:80]!r} is not NAME=value")
        pairs.append((name, text))
    return tuple(pairs)


def _ports(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ConfigInvalid("the image config's ExposedPorts is not an object")
    ports: list[int] = []
    for key in value:
        number, _, proto = str(key).partition("/")
        if proto not in ("", "tcp", "udp") or not number.isdigit() or not 0 < int(number) < 65536:
            raise ConfigInvalid(f"the image config's ExposedPorts has {key!r} (not <port>/tcp)")
        if proto != "udp":
            ports.append(int(number))
    return tuple(sorted(set(ports)))


def parse_config(body: bytes) -> ImageConfig:
    """The runnable parts of an OCI image config (``application/vnd.oci.image.config.v1+json``)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise ConfigInvalid(f"the image config is not JSON: {err}") from err
    if not isinstance(document, dict):
        raise ConfigInvalid("the image config is not a JSON object")
    inner = document.get("config") or {}
    if not isinstance(inner, dict):
        raise ConfigInvalid("the image config's config is not an object")
    working_dir = inner.get("WorkingDir")
    user = inner.get("User")
    working_dir = "" if working_dir is None else working_dir
    user = "" if user is None else user
    if not isinstance(working_dir, str) or (working_dir and not working_dir.startswith("/")):
        raise ConfigInvalid(f"the image config's WorkingDir {working_dir!r} is not absolute")
    if not isinstance(user, str):
        raise ConfigInvalid("the image config's User is not a string")
    architecture, os_name = document.get("architecture", ""), document.get("os", "")
    return ImageConfig(
        entrypoint=_strings(inner.get("Entrypoint"), "Entrypoint"),
        cmd=_strings(inner.get("Cmd"), "Cmd"),
        env=_env(inner.get("Env")),
        working_dir=posixpath.normpath(working_dir) if working_dir else "",
        exposed_ports=_ports(inner.get("ExposedPorts")),
        user=user,
        architecture=architecture if isinstance(architecture, str) else "",
        os=os_name if isinstance(os_name, str) else "",
    )


def _table(text: str) -> dict[str, tuple[int, int]]:
    """``name:x:id:gid:...`` lines of an /etc/passwd or /etc/group, by name."""
    found: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2].isdigit():
            gid = fields[3] if len(fields) > 3 and fields[3].isdigit() else fields[2]
            found.setdefault(fields[0], (int(fields[2]), int(gid)))
    return found


def _id(value: str, table: dict[str, tuple[int, int]], what: str) -> tuple[int, int]:
    if value.isdigit():
        number = int(value)
        if number > MAX_ID:
            raise ConfigInvalid(f"the image's User names {what} {number}, beyond {MAX_ID}")
        return number, -1
    if value not in table:
        raise ConfigInvalid(
            f"the image's User names {what} {value!r}, which the image does not define"
        )
    found = table[value]
    # the image's own /etc/passwd may say anything: an id past the block is another block's
    for number in found:
        if number > MAX_ID:
            raise ConfigInvalid(
                f"the image's User names {what} {value!r}, whose id {number} in the image is "
                f"beyond {MAX_ID}"
            )
    return found


def resolve_user(user: str, passwd: str = "", group: str = "") -> tuple[int, int]:
    """``User`` (``uid``, ``name``, ``uid:gid``, ``name:group``) as ``(uid, gid)`` inside the
    image; names are read from the image's own /etc/passwd and /etc/group text."""
    if not user:
        return 0, 0
    name, colon, group_name = user.partition(":")
    uid, primary = _id(name, _table(passwd), "the user")
    if colon:
        gid, _ = _id(group_name, _table(group), "the group")
    else:
        gid = primary if primary >= 0 else uid
    return uid, gid


def image_port(config: ImageConfig, runtime: Runtime) -> int:
    """Where the image's server listens: the manifest's ``runtime.port``, else the one TCP port
    the image config's ``ExposedPorts`` names; ConfigInvalid when it names none or several."""
    if runtime.port is not None:
        return runtime.port
    if len(config.exposed_ports) == 1:
        return config.exposed_ports[0]
    if not config.exposed_ports:
        raise ConfigInvalid(
            "the manifest sets no runtime.port and the image's ExposedPorts names no TCP port: "
            "set runtime.port to where its server listens"
        )
    listed = ", ".join(str(port) for port in config.exposed_ports)
    raise ConfigInvalid(
        f"the manifest sets no runtime.port and the image's ExposedPorts names several TCP "
        f"ports ({listed}): set runtime.port to the one its page is served on"
    )


def launch(config: ImageConfig, runtime: Runtime, passwd: str = "", group: str = "") -> Launch:
    """The image's config with the manifest's ``runtime`` laid over it."""
    argv = tuple(runtime.command) if runtime.command else config.entrypoint + config.cmd
    if not argv:
        raise ConfigInvalid(
            "the image sets no Entrypoint or Cmd and the manifest's runtime.command is empty"
        )
    env = dict(config.env)
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(runtime.env)
    uid, gid = resolve_user(config.user, passwd, group)
    return Launch(
        argv=argv,
        env=env,
        cwd=config.working_dir or "/",
        port=image_port(config, runtime),
        uid=uid,
        gid=gid,
    )
