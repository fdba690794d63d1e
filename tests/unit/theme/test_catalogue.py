"""The catalogue: bundled then user themes in file-name order, bad files skipped and listed, a later
id shadowing an earlier one in place with a warning, reload."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from atrium.errors import NotFound
from atrium.theme.catalogue import BUNDLED_DIR, ThemeCatalogue
from atrium.theme.model import Tone
from tests.unit.theme.samples import palette, theme_data

BUNDLED_IDS = [t.id for t in ThemeCatalogue.load(None).themes()]


def write(directory: Path, name: str, data: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_bundled_themes_load_in_file_name_order_without_problems() -> None:
    catalogue = ThemeCatalogue.load(None)
    files = sorted(p.name for p in BUNDLED_DIR.glob("*.json"))
    assert [catalogue.source(i).name for i in BUNDLED_IDS] == files  # type: ignore[union-attr]
    assert catalogue.problems == ()
    assert catalogue.first(Tone.LIGHT).id == "atrium-light"  # type: ignore[union-attr]
    assert catalogue.first(Tone.DARK).id == "atrium-dark"  # type: ignore[union-attr]


def test_user_themes_come_after_the_bundled_ones_in_file_name_order(tmp_path: Path) -> None:
    write(tmp_path, "b.json", theme_data("zeta"))
    write(tmp_path, "a.json", theme_data("alpha"))
    catalogue = ThemeCatalogue.load(tmp_path)
    assert [t.id for t in catalogue.themes()] == [*BUNDLED_IDS, "alpha", "zeta"]


def test_a_user_theme_shadows_a_bundled_one_in_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mine = write(tmp_path, "paper.json", theme_data("paper", name="My Paper"))
    with caplog.at_level(logging.WARNING, "atrium.theme.catalogue"):
        catalogue = ThemeCatalogue.load(tmp_path)
    assert [t.id for t in catalogue.themes()] == BUNDLED_IDS
    assert catalogue.require("paper").name == "My Paper"
    assert catalogue.source("paper") == mine
    assert "theme 'paper' from" in caplog.text
    assert "shadows the one from" in caplog.text


def test_of_two_user_files_with_one_id_the_later_name_wins(tmp_path: Path) -> None:
    write(tmp_path, "10-x.json", theme_data("mine", name="Second"))
    write(tmp_path, "02-x.json", theme_data("mine", name="First"))
    assert ThemeCatalogue.load(tmp_path).require("mine").name == "Second"


def test_bad_files_are_skipped_logged_and_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = write(tmp_path, "broken.json", "{not json")
    data = theme_data("incomplete")
    del data["palette"]["border"]
    incomplete = write(tmp_path, "incomplete.json", data)
    odd = write(tmp_path, "odd.json", theme_data("odd", palette=palette(danger="#ff0000")))
    write(tmp_path, "good.json", theme_data("good"))
    with caplog.at_level(logging.WARNING, "atrium.theme.catalogue"):
        catalogue = ThemeCatalogue.load(tmp_path)
    problems = {p.file: p.message for p in catalogue.problems}
    assert set(problems) == {str(broken), str(incomplete), str(odd)}
    assert problems[str(broken)].startswith("(file): not valid JSON")
    assert problems[str(incomplete)] == "palette.border: Field required"
    assert "danger '#ff0000' (expected '#c62828')" in problems[str(odd)]
    assert catalogue.get("good") is not None
    assert catalogue.get("odd") is None
    assert [r.getMessage().split(" skipped: ")[0] for r in caplog.records] == [
        f"theme file {p}" for p in (broken, incomplete, odd)
    ]
    assert catalogue.report().wire()["count"] == len(BUNDLED_IDS) + 1


def test_hidden_and_other_files_are_ignored(tmp_path: Path) -> None:
    write(tmp_path, ".draft.json", "{")
    write(tmp_path, "notes.txt", "hello")
    (tmp_path / "dir.json").mkdir()
    catalogue = ThemeCatalogue.load(tmp_path)
    assert catalogue.problems == ()
    assert len(catalogue) == len(BUNDLED_IDS)


def test_a_missing_user_directory_is_fine(tmp_path: Path) -> None:
    assert len(ThemeCatalogue.load(tmp_path / "nowhere")) == len(BUNDLED_IDS)


def test_reload_picks_up_new_and_removed_files(tmp_path: Path) -> None:
    catalogue = ThemeCatalogue.load(tmp_path)
    path = write(tmp_path, "new.json", theme_data("new"))
    assert catalogue.reload().count == len(BUNDLED_IDS) + 1
    assert catalogue.get("new") is not None
    path.unlink()
    catalogue.reload()
    assert catalogue.get("new") is None


def test_an_unknown_id_is_not_found() -> None:
    with pytest.raises(NotFound) as caught:
        ThemeCatalogue.load(None).require("nope")
    assert caught.value.fields == {"kind": "theme", "id": "nope"}
