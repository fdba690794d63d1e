"""Settings: one frozen object read once by `atrium serve` (CLI flags > ATRIUM_* env > defaults).

A setting `atrium serve` cannot start with raises `ConfigError` before anything is opened: the
command prints each problem as one line and exits with status 2 (decisions.md "Settings and
runtime files").
"""

from __future__ import annotations

import errno
import re
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from atrium.identity import MIN_TOKEN_LENGTH

PACKAGE_DIR = Path(__file__).resolve().parent
USER_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}\Z")
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")

RunnerName = Literal["auto", "process", "bwrap"]

#: what each setting accepts, said in the one-line report of a value it refused
ACCEPTED: Final = {
    "home": "a directory path",
    "host": "an address to listen on, such as 127.0.0.1, 0.0.0.0 or ::1",
    "port": "an integer 0-65535, 0 for any free port",
    "app_domain": "a domain name",
    "system_apps": "a directory path",
    "user": "1-64 of a-z, 0-9, '_' and '-', starting with a letter or digit",
    "index_url": "a URL",
    "runner": "auto, process or bwrap",
    "heartbeat_seconds": "a number of seconds greater than 0",
    "view_grace_seconds": "a number of seconds, 0 or more",
    "header_timeout_seconds": "a number of seconds greater than 0",
    "token": f"at least {MIN_TOKEN_LENGTH} characters, or unset for a new random token",
    "log_level": ", ".join(LOG_LEVELS),
}
#: settings whose value is never repeated in a report
SECRET: Final = frozenset({"token"})


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
    #: how long a host page's views outlive its last event stream
    view_grace_seconds: float = Field(default=30.0, ge=0)
    #: how long a connection may take to send a request's line and headers before it is closed
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    token: SecretStr | None = None
    log_level: str = "info"

    @field_validator("user")
    @classmethod
    def _user_id(cls, value: str) -> str:
        if not USER_ID_RE.fullmatch(value):
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
    def kv_path(self) -> Path:
        return self.home / "kv.sqlite3"


def prepare_home(settings: Settings) -> None:
    """Create the home and its run directory and check a file can be written there, or raise
    ConfigError naming the path and what failed (before `serve` writes the token or opens a store).
    """
    home, run_dir = settings.home, settings.run_dir
    name = setting_name("home", ("home",))
    try:
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as err:
        raise ConfigError(f"{name} {str(home)!r}: cannot create {_why(run_dir, err)}") from err
    try:
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as err:
        raise ConfigError(f"{name} {str(home)!r}: cannot write in {_why(run_dir, err)}") from err


def _why(path: Path, err: OSError) -> str:
    """``<path>: <reason>``, naming the file that stands where a directory is needed."""
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        for part in (path, *path.parents):
            if part.exists() and not part.is_dir():
                return f"{path}: {part} is not a directory"
    return f"{path}: {err.strerror or err}"
