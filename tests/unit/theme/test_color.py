"""CSS colour and box-shadow validation, compositing and the WCAG 2.x contrast ratio."""

from __future__ import annotations

import pytest

from atrium.theme.color import Rgba, check_shadow, contrast_ratio, over, parse_color

WHITE = Rgba(255, 255, 255)
BLACK = Rgba(0, 0, 0)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("#abc", (0xAA, 0xBB, 0xCC, 255)),
        ("#abcd", (0xAA, 0xBB, 0xCC, 0xDD)),
        ("#A1B2C3", (0xA1, 0xB2, 0xC3, 255)),
        ("#a1b2c380", (0xA1, 0xB2, 0xC3, 0x80)),
        ("rgb(255, 0, 0)", (255, 0, 0, 255)),
        ("rgba(0, 0, 255, 0.5)", (0, 0, 255, 128)),
        ("rgb(100% 0% 50% / 25%)", (255, 0, 128, 64)),
        ("rgb(10 20 30)", (10, 20, 30, 255)),
        ("RGBA(300, -5, 0, 2)", (255, 0, 0, 255)),
        ("hsl(0, 100%, 50%)", (255, 0, 0, 255)),
        ("hsl(120deg 100% 25%)", (0, 128, 0, 255)),
        ("hsla(0.5turn, 50%, 50%, 0.25)", (64, 191, 191, 64)),
        ("hsl(240 100 50)", (0, 0, 255, 255)),
        ("red", (255, 0, 0, 255)),
        ("RebeccaPurple", (0x66, 0x33, 0x99, 255)),
        ("transparent", (0, 0, 0, 0)),
        ("  #fff  ", (255, 255, 255, 255)),
    ],
)
def test_accepted_colours_parse_to_browser_values(text: str, key: tuple[int, ...]) -> None:
    assert parse_color(text).key() == key


@pytest.mark.parametrize(
    "text",
    [
        "",
        "#ab",
        "#abcde",
        "#gggggg",
        "rgb(1, 2)",
        "rgb(1 2 3 4)",
        "rgb(1, 2 3)",
        "rgb(1, 2, 3) x",
        "hsl(0, 100, 50)",
        "hsl(red, 10%, 10%)",
        "var(--x)",
        "currentcolor",
        "color-mix(in srgb, red, blue)",
        "red;}body{color:red",
        "blurple",
    ],
)
def test_other_text_is_not_a_colour(text: str) -> None:
    with pytest.raises(ValueError, match="is not a CSS colour"):
        parse_color(text)


@pytest.mark.parametrize(
    "text",
    [
        "none",
        "0 0 0 3px rgba(79, 70, 229, 0.35)",
        "inset 0 1px 2px #000",
        "0 1px 3px red, 0 0 2px blue",
        "#000 0 1px 2px",
        "0 0 12px 2px hsl(200 50% 50% / 40%) inset",
        "1em -2px",
    ],
)
def test_box_shadow_values_are_accepted(text: str) -> None:
    assert check_shadow(text) == text.strip()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "3px",
        "0 0 -2px red",
        "0 0 2px red blue",
        "0 0 2px red; color: red",
        "0 0 2px var(--x)",
        "1 2 3",
        ", 0 0 red",
        "0 0 2px red,",
        "0 red 0",
        "0 0 1px 2px 3px",
        "inset inset 0 0",
        "0 0 2px rgb(1, 2, 3",
    ],
)
def test_other_text_is_not_a_box_shadow(text: str) -> None:
    with pytest.raises(ValueError, match="box-shadow"):
        check_shadow(text)


@pytest.mark.parametrize(
    ("foreground", "background", "ratio"),
    [
        ("#000000", "#ffffff", 21.0),
        ("#ffffff", "#ffffff", 1.0),
        ("#767676", "#ffffff", 4.54),  # the lightest grey that passes AA on white
        ("#777777", "#ffffff", 4.48),
        ("#595959", "#ffffff", 7.0),
        ("#ff0000", "#ffffff", 4.0),
        ("#0000ff", "#ffffff", 8.59),
    ],
)
def test_contrast_ratio_matches_known_wcag_values(
    foreground: str, background: str, ratio: float
) -> None:
    assert round(contrast_ratio(parse_color(foreground), parse_color(background)), 2) == ratio


def test_contrast_ratio_is_symmetric() -> None:
    a, b = parse_color("#336699"), parse_color("#f0e68c")
    assert contrast_ratio(a, b) == pytest.approx(contrast_ratio(b, a))


def test_translucent_text_is_laid_on_its_background_first() -> None:
    half_black = parse_color("rgba(0, 0, 0, 0.5)")
    assert over(half_black, WHITE).key() == (128, 128, 128, 255)
    assert contrast_ratio(half_black, WHITE) == pytest.approx(
        contrast_ratio(Rgba(127.5, 127.5, 127.5), WHITE)
    )


def test_a_translucent_background_is_laid_on_white() -> None:
    assert contrast_ratio(BLACK, Rgba(0, 0, 0, 0.0)) == pytest.approx(21.0)


def test_fully_transparent_on_transparent_stays_transparent() -> None:
    assert over(Rgba(1, 2, 3, 0.0), Rgba(4, 5, 6, 0.0)).a == 0
