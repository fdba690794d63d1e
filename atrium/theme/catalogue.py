"""The theme catalogue: bundled themes, then the user's `$ATRIUM_HOME/themes/*.json`.

Each directory is read in file-name order and every file is validated at load; a bad file is
skipped with a warning and listed in `problems`. A later theme with an existing id shadows the
earlier one in place, with a warning (decisions.md "Themes"). A theme whose semantic colours
differ from the first loaded theme of its tone is refused (docs/api.md "Themes"). `reload` builds
a new catalogue and swaps it in as one assignment, so it may run in a worker thread.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from atrium.errors import NotFound
from atrium.theme.model import Theme, ThemeInvalid, Tone, parse_theme, validate_catalogue

_LOGGER = logging.getLogger(__name__)

BUNDLED_DIR: Final = Path(__file__).resolve().parent / "themes"
MAX_THEME_BYTES: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class CatalogueProblem:
    """A theme file that was skipped, and why."""

    file: str
    message: str

    def wire(self) -> dict[str, str]:
        return {"file": self.file, "message": self.message}


@dataclass(frozen=True, slots=True)
class CatalogueReport:
    """What a (re)load found: the number of themes and the files skipped."""

    count: int
    problems: tuple[CatalogueProblem, ...]

    def wire(self) -> dict[str, Any]:
        return {"count": self.count, "problems": [p.wire() for p in self.problems]}


@dataclass(frozen=True, slots=True)
class _Contents:
    themes: Mapping[str, Theme] = field(default_factory=dict)
    sources: Mapping[str, Path] = field(default_factory=dict)
    problems: tuple[CatalogueProblem, ...] = ()


def _read_theme(path: Path) -> Theme:
    """One theme file; ThemeInvalid (or OSError) with the reason when it cannot be used."""
    if path.stat().st_size > MAX_THEME_BYTES:
        raise ThemeInvalid([f"(file): larger than {MAX_THEME_BYTES} bytes"])
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as err:
        raise ThemeInvalid([f"(file): not valid JSON: {err}"]) from err
    return parse_theme(data)


def _theme_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(
        (p for p in directory.glob("*.json") if not p.name.startswith(".") and p.is_file()),
        key=lambda p: p.name,
    )


def _load(directories: Sequence[Path]) -> _Contents:
    themes: dict[str, Theme] = {}
    sources: dict[str, Path] = {}
    problems: list[CatalogueProblem] = []
    reference: dict[Tone, Theme] = {}
    for path in (p for d in directories for p in _theme_files(d)):
        try:
            theme = _read_theme(path)
            first = reference.setdefault(theme.tone, theme)
            if mismatch := validate_catalogue([first, theme]):
                raise ThemeInvalid(mismatch)
        except (OSError, ThemeInvalid) as err:
            message = str(err)
            _LOGGER.warning("theme file %s skipped: %s", path, message)
            problems.append(CatalogueProblem(str(path), message))
            continue
        if theme.id in themes:
            _LOGGER.warning(
                "theme %r from %s shadows the one from %s", theme.id, path, sources[theme.id]
            )
        themes[theme.id] = theme
        sources[theme.id] = path
    return _Contents(themes, sources, tuple(problems))


class ThemeCatalogue:
    """The loaded themes in catalogue order (bundled first, then the user's; file-name order)."""

    def __init__(self, user_dir: Path | None, bundled_dir: Path = BUNDLED_DIR) -> None:
        self._directories = (bundled_dir, *((user_dir,) if user_dir is not None else ()))
        self._contents = _Contents()

    @classmethod
    def load(cls, user_dir: Path | None, bundled_dir: Path = BUNDLED_DIR) -> ThemeCatalogue:
        catalogue = cls(user_dir, bundled_dir)
        catalogue.reload()
        return catalogue

    def reload(self) -> CatalogueReport:
        """Read every directory again (blocking file I/O) and swap the result in."""
        contents = _load(self._directories)
        self._contents = contents
        _LOGGER.info(
            "theme catalogue: %d themes, %d files skipped",
            len(contents.themes),
            len(contents.problems),
        )
        return self.report()

    def report(self) -> CatalogueReport:
        contents = self._contents
        return CatalogueReport(len(contents.themes), contents.problems)

    @property
    def problems(self) -> tuple[CatalogueProblem, ...]:
        return self._contents.problems

    def __len__(self) -> int:
        return len(self._contents.themes)

    def themes(self) -> list[Theme]:
        return list(self._contents.themes.values())

    def get(self, theme_id: str) -> Theme | None:
        return self._contents.themes.get(theme_id)

    def require(self, theme_id: str) -> Theme:
        """The theme ``theme_id``; NotFound (404, kind `theme`) when there is none."""
        theme = self._contents.themes.get(theme_id)
        if theme is None:
            raise NotFound("theme", theme_id)
        return theme

    def source(self, theme_id: str) -> Path | None:
        """The file the theme was read from."""
        return self._contents.sources.get(theme_id)

    def first(self, tone: Tone) -> Theme | None:
        """The first theme of ``tone`` in catalogue order (the default for that slot)."""
        return next((t for t in self._contents.themes.values() if t.tone is tone), None)
