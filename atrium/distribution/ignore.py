"""What an app folder keeps out of what it ships: `.atriumignore` (gitignore syntax) over defaults.

`atrium pack`, `atrium publish` (both through `atrium.distribution.artifact.app_files`) and the
`atrium dev` watcher read the same rule, so a test cache, a virtualenv, `node_modules`, a `.env`
file or an editor's swap file is neither shipped nor a reason to reload. Pure: the caller reads
the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import pathspec

IGNORE_FILE: Final = ".atriumignore"
#: left out of every app folder, whatever its `.atriumignore` says (it may add, or re-include
#: with `!`)
DEFAULT_IGNORED: Final = (
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".venv/",
    "venv/",
    "node_modules/",
    ".env",
    ".benchmarks/",
    "*~",
    ".*.swp",
    ".*.swo",
    "#*#",
    ".#*",
    ".idea/",
    ".vscode/",
    ".DS_Store",
)
#: names that usually hold a secret: `atrium pack` warns before shipping one
SECRET_NAMES: Final = pathspec.GitIgnoreSpec.from_lines(
    [".env", ".env.*", "id_rsa", "id_ecdsa", "id_ed25519", "*.pem", "*.key", "*.p12", "*.pfx"]
)
#: a file whose first bytes hold this is a private key, whatever its name
PRIVATE_KEY_MARK: Final = b"PRIVATE KEY"


class IgnoreRule:
    """The defaults, then the folder's own `.atriumignore` lines (later lines win, as in git)."""

    def __init__(self, own_lines: Iterable[str] = ()) -> None:
        self._spec = pathspec.GitIgnoreSpec.from_lines([*DEFAULT_IGNORED, *own_lines])

    def ignores(self, relative: str, is_dir: bool) -> bool:
        """Whether the path (posix, relative to the app folder) stays out."""
        return bool(self._spec.match_file(relative + "/" if is_dir else relative))


def likely_secret(relative: str, head: bytes) -> bool:
    """Whether a shipped file looks like a secret: its name, or a private key in ``head``."""
    return bool(SECRET_NAMES.match_file(relative)) or PRIVATE_KEY_MARK in head
