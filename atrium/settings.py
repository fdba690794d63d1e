"""Settings: one frozen object read once by `atrium serve` (CLI flags > ATRIUM_* env > defaults).

A setting `atrium serve` cannot start with raises `ConfigError` before anything is opened: the
command prints each problem as one line and exits with status 2 (decisions.md "Settings and
runtime files"). The home's runtime side lives here too: `prepare_home` (private modes, issue 13)
and `HomeLock` (one home, one shell, issue 14).
"""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import ipaddress
import os
import stat
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from atrium.identity import MIN_TOKEN_LENGTH
from atrium.users.model import USER_ID_RULE, valid_user_id
from atrium.users.oidc import PROVIDERS_ACCEPTED, OidcProvider, check_unique

PACKAGE_DIR = Path(__file__).resolve().parent
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")

RunnerName = Literal["auto", "process", "bwrap", "kubernetes"]

#: what each setting accepts, said in the one-line report of a value it refused
ACCEPTED: Final = {
    "home": "a directory path",
    "host": "an address to listen on, such as 127.0.0.1, 0.0.0.0 or ::1",
    "port": "an integer 0-65535, 0 for any free port",
    "app_domain": "a domain name",
    "system_apps": "a directory path",
    "user": USER_ID_RULE,
    "index_url": "a URL",
    "runner": "auto, process, bwrap or kubernetes",
    "kube_namespace": "a Kubernetes namespace name (lower case letters, digits and '-')",
    "kube_image": "a container image reference",
    "kube_config": "the path of a kubeconfig file, or unset for the in-cluster service account",
    "kube_storage_class": "a storage class name, or unset for the cluster's default",
    "kube_start_timeout_seconds": "a number of seconds greater than 0",
    "kube_shell_url": "the URL pods reach the shell at (http or https, a host pods can reach)",
    "heartbeat_seconds": "a number of seconds greater than 0",
    "usage_seconds": "a number of seconds greater than 0",
    "view_grace_seconds": "a number of seconds, 0 or more",
    "header_timeout_seconds": "a number of seconds greater than 0",
    "stall_seconds": "a number of seconds greater than 0",
    "token": f"at least {MIN_TOKEN_LENGTH} characters, or unset for a new random token",
    "log_level": ", ".join(LOG_LEVELS),
    "oidc_providers": PROVIDERS_ACCEPTED,
    "audit_retention_days": "a whole number of days, 1-36500",
    "member_fetch_hosts": "host names, addresses or networks, comma-separated",
    "trusted_proxies": "IP addresses or networks (CIDR), comma-separated; empty: none",
    "data_decisions": "a whole number, 0-1000000 (0 keeps none)",
    "app_memory_mib": "a whole number of MiB, 0-1048576 (0: no ceiling)",
    "app_pids": "a whole number of processes, 0-1000000 (0: no ceiling)",
    "app_cpu_milli": "a whole number of thousandths of a core, 0-1024000 (0: no ceiling)",
    "cgroup_parent": "the path of a delegated cgroup v2 folder",
    "app_limits": "auto (a cgroup per instance where possible, else rlimits) or rlimit",
    "app_network": "a private IPv4 network (CIDR) such as 10.213.0.0/16, or off",
    "app_network_apps": "all (contract apps under bwrap too) or images (image apps only)",
}
#: settings whose value is never repeated in a report (a provider list holds client secrets)
SECRET: Final = frozenset({"token", "oidc_providers"})


class ConfigError(Exception):
    """Settings or a runtime resource (home, listening address) `atrium serve` cannot start with.

    Not an `AtriumError`: it never reaches HTTP. ``problems`` are complete sentences naming the
    setting as the user writes it (``ATRIUM_PORT / --port``); each is printed as one line.
    """

    def __init__(self, *problems: str) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def setting_name(field: str, flags: Collection[str] = ()) -> str:
    """``ATRIUM_PORT / --port`` for a setting that is also a flag, else ``ATRIUM_TOKEN``."""
    env = f"ATRIUM_{field.upper()}"
    return f"{env} / --{field.replace('_', '-')}" if field in flags else env


def _problems(err: ValidationError, flags: Collection[str]) -> list[str]:
    """One line per refused value: the setting, the value (unless secret), why, what is accepted."""
    problems = []
    for error in err.errors(include_url=False):
        field = str(error["loc"][0]) if error["loc"] else "settings"
        name = setting_name(field, flags)
        if len(error["loc"]) > 1:  # inside a list of objects: which one, which key
            name += " at " + ".".join(str(part) for part in error["loc"][1:])
        if field not in SECRET and "input" in error:
            name = f"{name} {str(error['input'])!r}"
        reason = error["msg"].removeprefix("Value error, ")
        reason = reason[:1].lower() + reason[1:]
        accepted = ACCEPTED.get(field)
        problems.append(f"{name}: {reason}" + (f"; accepted: {accepted}" if accepted else ""))
    return problems


def bundled_system_apps() -> Path:
    """The system scope's apps: packaged inside the wheel, or the checkout's ``apps/`` folder."""
    packaged = PACKAGE_DIR / "system_apps"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent / "apps"


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(value: str) -> tuple[IPNetwork, ...]:
    """The networks of ``trusted_proxies``; ValueError naming the first entry that is none. An
    empty value is none; an empty entry between commas is a mistake, not "everyone"."""
    if not value.strip():
        return ()
    networks = []
    for entry in value.split(","):
        entry = entry.strip()
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or network") from None
        # an IPv4-mapped IPv6 peer is compared as the IPv4 address it maps (forwarded.py)
        mapped = network.network_address.ipv4_mapped if network.version == 6 else None
        if mapped is not None and network.prefixlen >= 96:
            network = ipaddress.ip_network(f"{mapped}/{network.prefixlen - 96}", strict=False)
        # then every client would choose its own address (::ffff:0:0/96 is 0.0.0.0/0 mapped)
        if network.prefixlen == 0:
            raise ValueError(f"{entry!r} trusts every address; name the proxies")
        networks.append(network)
    return tuple(networks)


class Settings(BaseSettings):
    """Everything configurable about one shell. Services receive slices of it, never the whole."""

    model_config = SettingsConfigDict(env_prefix="ATRIUM_", frozen=True, extra="forbid")

    home: Path = Field(default_factory=lambda: Path.home() / ".local" / "share" / "atrium")
    host: str = "127.0.0.1"
    port: int = Field(default=7070, ge=0, le=65535)
    app_domain: str = "localhost"
    system_apps: Path = Field(default_factory=bundled_system_apps)
    user: str = "default"
    index_url: str | None = None
    runner: RunnerName = "auto"
    heartbeat_seconds: float = Field(default=15.0, gt=0)
    #: how often `system:usage` goes to the streams that take it (docs/api.md "System usage")
    usage_seconds: float = Field(default=3.0, gt=0)
    #: how long a host page's views outlive its last event stream
    view_grace_seconds: float = Field(default=30.0, ge=0)
    #: how long a connection may take to send a request's line and headers before it is closed
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    #: how long a connection may make no progress: a request body that sends nothing while the
    #: shell reads it, or a client that reads nothing of an answer waiting on it
    stall_seconds: float = Field(default=30.0, gt=0)
    token: SecretStr | None = None
    log_level: str = "info"
    #: OpenID Connect providers the sign-in page offers (docs/api.md "Sign-in with OIDC")
    oidc_providers: tuple[OidcProvider, ...] = ()
    #: how long the audit log keeps a record (docs/api.md "Audit log")
    audit_retention_days: int = Field(default=90, ge=1, le=36500)
    #: what a member's fetch may reach besides public addresses: host names, addresses and
    #: networks, comma-separated (docs/decisions.md "Users: what a member's fetch may reach")
    member_fetch_hosts: str = ""
    #: the proxies whose X-Forwarded-For the shell believes, addresses and networks
    #: comma-separated; empty, none: the client's address is the connection's (docs/security.md
    #: "The client's address")
    trusted_proxies: str = ""
    #: how many allowed data-proxy decisions are kept, 0 for none (docs/decisions.md
    #: "Data proxy: decisions kept")
    data_decisions: int = Field(default=4096, ge=0, le=1_000_000)
    #: ceilings of every instance's ``resources`` (docs/api.md "Resource limits"); 0: none
    app_memory_mib: int = Field(default=1024, ge=0, le=1_048_576)
    app_pids: int = Field(default=1024, ge=0, le=1_000_000)
    app_cpu_milli: int = Field(default=0, ge=0, le=1_024_000)
    #: a delegated cgroup v2 folder for the instances' cgroups (default: the shell's own cgroup)
    cgroup_parent: Path | None = None
    #: how instances' limits are held: ``auto`` a cgroup each where the host delegates one, else
    #: rlimits; ``rlimit`` rlimits only
    #: (docs/decisions.md "Resource limits: rlimits where no cgroup is delegated")
    app_limits: Literal["auto", "rlimit"] = "auto"
    #: the range of the instances' own networks, the shell's bridge holding its first address;
    #: ``off``: none (docs/decisions.md "Network: each instance in its own namespace")
    app_network: str = "10.213.0.0/16"
    #: which instances get one: ``all`` (image apps and contract apps under bwrap), or
    #: ``images`` (contract apps share the host's network)
    app_network_apps: Literal["images", "all"] = "all"
    #: the Kubernetes runner (docs/deploying.md "On Kubernetes"): where its pods go, the image
    #: they run (Python and the SDK), how the shell reaches the API (a kubeconfig, or unset: the
    #: pod's own service account), the data claims' storage class (unset: the cluster's default),
    #: how long a pod may take to run, and the URL pods reach the shell at (unset: its own URL)
    kube_namespace: str = Field(default="atrium", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    kube_image: str = "ghcr.io/atrium/app-python:3.11"
    kube_config: Path | None = None
    kube_storage_class: str | None = None
    kube_start_timeout_seconds: float = Field(default=120.0, gt=0)
    kube_shell_url: str | None = Field(default=None, pattern=r"^https?://")
    #: the database of the shell's state: unset, ``state.sqlite3`` in the home;
    #: ``postgresql+psycopg://…`` for several shells; a secret, as it may hold a password
    #: (docs/decisions.md "State: one interface, two databases (the first step)")
    database_url: SecretStr | None = None
    #: the folder holding the scopes (``global/``, ``users/``, ``system/``): unset,
    #: ``$ATRIUM_HOME/scopes``; several shells on one PostgreSQL database name one shared
    #: folder, mounted at the same path on each (docs/deploying.md "Several shells")
    scopes_dir: Path | None = None

    @field_validator("kube_shell_url")
    @classmethod
    def _kube_shell_url(cls, value: str | None) -> str | None:
        # where a server listens (0.0.0.0, ::) is no address a pod can reach, and the URL's host
        # becomes an accepted Host name
        if value is not None:
            host = urlsplit(value).hostname or ""
            try:
                unspecified = ipaddress.ip_address(host).is_unspecified
            except ValueError:
                unspecified = False
            if not host or unspecified:
                raise ValueError("names no address a pod can reach")
        return value

    @field_validator("runner")
    @classmethod
    def _runner(cls, value: str) -> str:
        # the Kubernetes client is an optional extra: said before anything is opened
        if value == "kubernetes" and importlib.util.find_spec("kubernetes_asyncio") is None:
            raise ValueError(
                "the kubernetes runner needs kubernetes-asyncio: pip install 'atrium[kubernetes]'"
            )
        return value

    @field_validator("member_fetch_hosts")
    @classmethod
    def _fetch_hosts(cls, value: str) -> str:
        for entry in value.split(","):
            if "/" in entry:
                ipaddress.ip_network(entry.strip(), strict=False)  # ValueError names the entry
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _trusted_proxies(cls, value: str) -> str:
        trusted_networks(value)
        return value

    @field_validator("app_network")
    @classmethod
    def _app_network(cls, value: str) -> str:
        value = value.strip()
        if value == "off":
            return value
        network = ipaddress.ip_network(value, strict=True)  # ValueError names what is wrong
        if network.version != 4 or not network.is_private or network.prefixlen > 28:
            raise ValueError("not a private IPv4 network of at least 16 addresses")
        return value

    @field_validator("user")
    @classmethod
    def _user_id(cls, value: str) -> str:
        if not valid_user_id(value):
            raise ValueError("not a user id")
        return value

    @field_validator("token")
    @classmethod
    def _token(cls, value: SecretStr | None) -> SecretStr | None:
        """Empty means unset (a new random token); anything else must be long enough."""
        if value is None or not value.get_secret_value():
            return None
        if len(value.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError("too short")
        return value

    @field_validator("oidc_providers")
    @classmethod
    def _providers(cls, value: tuple[OidcProvider, ...]) -> tuple[OidcProvider, ...]:
        return check_unique(value)

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        if value.lower() not in LOG_LEVELS:
            raise ValueError("not a log level")
        return value.lower()

    @field_validator("home", "system_apps")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("scopes_dir")
    @classmethod
    def _scopes_dir(cls, value: Path | None) -> Path | None:
        # the journals of an install name absolute paths: every shell must see the same ones
        if value is not None and not value.is_absolute():
            raise ValueError(
                "not an absolute path (mount the shared folder at the same path on every shell)"
            )
        return value

    @classmethod
    def load(cls, **flags: Any) -> Settings:
        """Build from flags given on the command line (None = not given), the env, then defaults.

        Raises ConfigError with one problem per refused value; the names of ``flags`` are the
        settings that are also command-line flags (named so in the problems).
        """
        try:
            return cls(**{k: v for k, v in flags.items() if v is not None})
        except ValidationError as err:
            raise ConfigError(*_problems(err, flags)) from None
        except SettingsError as err:  # a value the environment gives as JSON that is not JSON
            field = next((f for f in cls.model_fields if f'"{f}"' in str(err)), "settings")
            accepted = ACCEPTED.get(field, "valid JSON")
            raise ConfigError(
                f"{setting_name(field, flags)}: not valid JSON; accepted: {accepted}"
            ) from None

    @property
    def trusted_networks(self) -> tuple[IPNetwork, ...]:
        return trusted_networks(self.trusted_proxies)

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def token_path(self) -> Path:
        return self.run_dir / "token"

    @property
    def url_path(self) -> Path:
        return self.run_dir / "url"

    @property
    def lock_path(self) -> Path:
        return self.run_dir / "serve.lock"

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def kv_path(self) -> Path:
        """The KV file of an older shell: its rows move into the state database at start."""
        return self.home / "kv.sqlite3"

    @property
    def users_path(self) -> Path:
        return self.home / "users.sqlite3"

    @property
    def audit_path(self) -> Path:
        return self.home / "audit.sqlite3"

    @property
    def state_url(self) -> str:
        """``database_url``, else the SQLite file ``state.sqlite3`` in the home."""
        if self.database_url and self.database_url.get_secret_value():
            return self.database_url.get_secret_value()
        return f"sqlite+aiosqlite:///{self.home / 'state.sqlite3'}"


#: what makes an existing, non-empty directory recognisably an Atrium home (safe to make 0700)
HOME_MARKERS: Final = ("run", "scopes", "kv.sqlite3", "state.sqlite3")


def prepare_home(settings: Settings) -> None:
    """Create the home and its run directory private (0700), tighten the shell's own files left
    looser by an older shell, and check a file can be written there; or raise ConfigError naming the
    path and what failed (before `serve` writes the token or opens a store).

    An existing home is made 0700 only if it is empty or already an Atrium home: a directory
    shared with others (``ATRIUM_HOME=/tmp``) is refused rather than locked away from its users.
    """
    home, run_dir = settings.home, settings.run_dir
    name = setting_name("home", ("home",))
    existed = home.is_dir()
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as err:
        raise ConfigError(f"{name} {str(home)!r}: cannot create {_why(run_dir, err)}") from err
    if existed:
        _check_own_home(home, name)
    try:
        run_dir.mkdir(exist_ok=True, mode=0o700)
        make_private(settings)
    except OSError as err:
        raise ConfigError(f"{name} {str(home)!r}: cannot create {_why(run_dir, err)}") from err
    try:
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as err:
        raise ConfigError(f"{name} {str(home)!r}: cannot write in {_why(run_dir, err)}") from err


def _check_own_home(home: Path, name: str) -> None:
    """Refuse a home others can reach that holds anything but an Atrium home."""
    mode = stat.S_IMODE(home.stat().st_mode)
    if not mode & 0o077:
        return
    if any(True for _ in home.iterdir()) and not any((home / m).exists() for m in HOME_MARKERS):
        raise ConfigError(
            f"{name} {str(home)!r}: a directory others can open (mode {mode:04o}) that is not an "
            f"Atrium home; the home is made private (0700), so choose a directory of its own"
        )


#: modes of the shell's own files and folders; app trees and app data are never touched here
PRIVATE_DIR: Final = 0o700
PRIVATE_FILE: Final = 0o600


def make_private(settings: Settings) -> None:
    """Make the home, ``run/``, ``run/logs/``, ``cache/`` and the files the shell alone reads (token,
    URL, lock, logs, the KV database and its -wal/-shm) owner-only, in case an older shell or a
    looser umask left them readable by others (issue 13). Scope folders are left as they are: they
    lead to the app trees, whose modes are the artifact's."""
    home = settings.home
    for folder in (home, settings.run_dir, settings.logs_dir, home / "cache"):
        if folder.is_dir() and not folder.is_symlink():
            folder.chmod(PRIVATE_DIR)
    files = [
        home / f"{name}{suffix}"
        for name in ("kv.sqlite3", "users.sqlite3", "audit.sqlite3")
        for suffix in ("", "-wal", "-shm", "-journal")
    ]
    files += [
        settings.token_path,
        settings.url_path,
        settings.lock_path,
        home / "cache" / "index.json",
    ]
    if settings.logs_dir.is_dir():
        files += settings.logs_dir.iterdir()
    for path in files:
        if path.is_file() and not path.is_symlink():
            path.chmod(PRIVATE_FILE)


def create_private(path: Path) -> None:
    """Create ``path`` empty and owner-only if it does not exist (a file others must never read,
    such as an instance log or the KV database, which SQLite's -wal and -shm then copy)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE_FILE))


class HomeLock:
    """``run/serve.lock``, flock'ed for the life of one `atrium serve`: one home, one shell.

    The kernel drops the lock when the process ends however it ends (kill -9 included), so a stale
    file never blocks a restart. The descriptor is close-on-exec: app children never inherit it.
    The file holds the owner's pid, to name it to a second `serve`.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def claim(cls, settings: Settings) -> HomeLock:
        """Take the lock, or raise ConfigError naming the shell that holds it."""
        name = setting_name("home", ("home",))
        path = settings.lock_path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE_FILE)
        except OSError as err:
            raise ConfigError(
                f"{name} {str(settings.home)!r}: cannot open {_why(path, err)}"
            ) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd, settings)
            os.close(fd)
            raise ConfigError(
                f"{name} {str(settings.home)!r} is in use by {holder}: one home, one shell; stop "
                f"that shell first, or start this one with another {name}"
            ) from None
        except OSError as err:
            os.close(fd)
            raise ConfigError(
                f"{name} {str(settings.home)!r}: cannot lock {_why(path, err)}"
            ) from err
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _holder(fd: int, settings: Settings) -> str:
    """``the shell at http://localhost:7070 (pid 123)``, as far as the run files say."""
    pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
    try:
        url = settings.url_path.read_text().strip()
    except OSError:
        url = ""
    who = f"the shell at {url}" if url else "a shell still starting"
    return f"{who} (pid {pid})" if pid.isdigit() else who


def _why(path: Path, err: OSError) -> str:
    """``<path>: <reason>``, naming the file that stands where a directory is needed."""
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        for part in (path, *path.parents):
            if part.exists() and not part.is_dir():
                return f"{path}: {part} is not a directory"
    return f"{path}: {err.strerror or err}"
