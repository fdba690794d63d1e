"""The selection's merge and validation rules (decisions.md "Themes"), shared by select and by
every KV write to `os`/`theme`."""

from __future__ import annotations

import pytest

from atrium.errors import InvalidRequest, NotFound
from atrium.theme.catalogue import ThemeCatalogue
from atrium.theme.model import ColorMode, ThemePrefs
from atrium.theme.prefs import check_selection

CATALOGUE = ThemeCatalogue.load(None)
CURRENT = ThemePrefs(theme_id_light="paper", theme_id_dark="fjord", color_mode=ColorMode.AUTO)


def test_a_partial_selection_keeps_the_other_fields() -> None:
    assert check_selection({"colorMode": "dark"}, CURRENT, CATALOGUE).wire() == {
        "themeIdLight": "paper",
        "themeIdDark": "fjord",
        "colorMode": "dark",
    }


def test_an_empty_selection_is_the_current_one() -> None:
    assert check_selection({}, CURRENT, CATALOGUE) == CURRENT


def test_a_full_selection_replaces_everything() -> None:
    value = {"themeIdLight": "meadow", "themeIdDark": "ember", "colorMode": "light"}
    assert check_selection(value, CURRENT, CATALOGUE).wire() == value


def test_an_unknown_theme_is_not_found() -> None:
    with pytest.raises(NotFound) as caught:
        check_selection({"themeIdDark": "no-such"}, CURRENT, CATALOGUE)
    assert caught.value.http_status == 404
    assert caught.value.fields == {"kind": "theme", "id": "no-such"}


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ({"themeIdLight": "fjord"}, "themeIdLight", "theme 'fjord' is dark; the light slot"),
        ({"themeIdDark": "paper"}, "themeIdDark", "theme 'paper' is light; the dark slot"),
        ({"colorMode": "sepia"}, "colorMode", "'sepia' is not one of light, dark, auto"),
        ({"colorMode": None}, "colorMode", "None is not one of"),
        ({"themeIdLight": 7}, "themeIdLight", "must be a theme id (a string)"),
        ({"accent": "red"}, "accent", "unknown field"),
    ],
)
def test_bad_selections_are_400_naming_the_field(
    value: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_selection(value, CURRENT, CATALOGUE)
    assert caught.value.http_status == 400
    (problem,) = caught.value.fields["problems"]
    assert problem["field"] == field
    assert words in problem["message"]


@pytest.mark.parametrize("value", [None, "paper", ["paper"]])
def test_a_selection_must_be_an_object(value: object) -> None:
    with pytest.raises(InvalidRequest, match="is an object with themeIdLight"):
        check_selection(value, CURRENT, CATALOGUE)
