"""Settings: one frozen object read once by `atrium serve` (CLI flags > ATRIUM_* env > defaults)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PACKAGE_DIR = Path(__file__).resolve().parent
USER_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}\Z")

RunnerName = Literal["auto", "process", "bwrap"]


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
    token: SecretStr | None = None
    log_level: str = "info"

    @field_validator("user")
    @classmethod
    def _user_id(cls, value: str) -> str:
        if not USER_ID_RE.fullmatch(value):
            raise ValueError(
                "a user id is 1-64 of a-z, 0-9, '_' and '-', starting with a letter or digit"
            )
        return value

    @field_validator("home", "system_apps")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @classmethod
    def load(cls, **flags: Any) -> Settings:
        """Build from flags given on the command line (None = not given), the env, then defaults."""
        return cls(**{k: v for k, v in flags.items() if v is not None})

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
