"""Registry credentials from the standard Docker config (docs/api.md "Publishing").

``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``; ``auths.<host>`` with a base64
``auth`` (``user:password``) or ``username``/``password``. Credential helpers (``credsStore``,
``credHelpers``) run other programs and are not used: a log line says so when they would apply.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

_LOGGER = logging.getLogger(__name__)
DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io")


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user name and password for one registry, and the config file they came from."""

    username: str
    password: str = field(repr=False)
    source: Path


def docker_config_file(docker_config: Path | None = None) -> Path:
    """The config file: ``docker_config`` (a file, or a directory holding config.json), else the
    ``DOCKER_CONFIG`` directory, else ``~/.docker``."""
    if docker_config is not None:
        return docker_config / "config.json" if docker_config.is_dir() else docker_config
    if env := os.environ.get("DOCKER_CONFIG"):
        return Path(env).expanduser() / "config.json"
    return Path.home() / ".docker" / "config.json"


def _host_of(key: str) -> str:
    """``https://host:port/v1/`` → ``host:port`` (keys of ``auths`` come in both forms)."""
    host = key.split("://", 1)[-1]
    return host.split("/", 1)[0].lower()


def _decode(entry: object, source: Path, registry: str) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    username, password = entry.get("username"), entry.get("password")
    if isinstance(username, str) and isinstance(password, str) and username:
        return Credentials(username, password, source)
    auth = entry.get("auth")
    if not isinstance(auth, str) or not auth:
        return None
    try:
        user, sep, secret = base64.b64decode(auth, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        _LOGGER.warning("%s: auths entry for %s is not base64 of user:password", source, registry)
        return None
    return Credentials(user, secret, source) if sep and user else None


def load_credentials(registry: str, docker_config: Path | None = None) -> Credentials | None:
    """The credentials stored for ``registry`` (``host[:port]``), or None."""
    path = docker_config_file(docker_config)
    try:
        config = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        _LOGGER.warning("ignoring the Docker config %s: %s", path, err)
        return None
    if not isinstance(config, dict):
        return None
    wanted = registry.lower()
    auths = config.get("auths")
    if isinstance(auths, dict):
        for key, entry in auths.items():
            matches = _host_of(key) == wanted or (wanted == "docker.io" and key in DOCKER_HUB_KEYS)
            if matches and (found := _decode(entry, path, registry)) is not None:
                return found
    helpers = config.get("credHelpers")
    helper = helpers.get(registry) if isinstance(helpers, dict) else None
    helper = helper or config.get("credsStore")
    if helper:
        _LOGGER.info(
            "%s names the credential helper %r for %s; Atrium does not run credential helpers, "
            "put the credentials under 'auths' (docker login --password-stdin with no helper)",
            path,
            helper,
            registry,
        )
    return None
