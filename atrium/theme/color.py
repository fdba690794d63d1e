"""CSS colours and box-shadows: parse, validate, composite, and the WCAG 2.x contrast ratio.

Pure. Accepts what a palette may hold: hex (#rgb, #rgba, #rrggbb, #rrggbbaa), rgb()/rgba(),
hsl()/hsla() in the comma and the space syntax, the CSS named colours and ``transparent``. Glows
are box-shadow values: ``none`` or shadows of 2-4 lengths, an optional colour and ``inset``.
Anything else (``var()``, ``currentcolor``, ``color-mix()``) is refused: a palette colour must be a
concrete value so that its contrast can be computed.
"""

from __future__ import annotations

import colorsys
import math
import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Rgba:
    """An sRGB colour: channels 0-255 (not rounded), alpha 0-1."""

    r: float
    g: float
    b: float
    a: float = 1.0

    def key(self) -> tuple[int, int, int, int]:
        """The colour as a browser would store it, for equality across spellings."""

        def byte(value: float) -> int:
            return math.floor(value + 0.5)  # half up, as browsers round

        return (byte(self.r), byte(self.g), byte(self.b), byte(self.a * 255))


WHITE: Final = Rgba(255, 255, 255)
BLACK: Final = Rgba(0, 0, 0)

# CSS Color 4 named colours, as "name:rrggbb" pairs (one string keeps the table compact)
_NAMED_TABLE: Final = (
    "aliceblue:f0f8ff antiquewhite:faebd7 aqua:00ffff aquamarine:7fffd4 azure:f0ffff beige:f5f5dc "
    "bisque:ffe4c4 black:000000 blanchedalmond:ffebcd blue:0000ff blueviolet:8a2be2 brown:a52a2a "
    "burlywood:deb887 cadetblue:5f9ea0 chartreuse:7fff00 chocolate:d2691e coral:ff7f50 "
    "cornflowerblue:6495ed cornsilk:fff8dc crimson:dc143c cyan:00ffff darkblue:00008b "
    "darkcyan:008b8b darkgoldenrod:b8860b darkgray:a9a9a9 darkgreen:006400 darkgrey:a9a9a9 "
    "darkkhaki:bdb76b darkmagenta:8b008b darkolivegreen:556b2f darkorange:ff8c00 "
    "darkorchid:9932cc darkred:8b0000 darksalmon:e9967a darkseagreen:8fbc8f darkslateblue:483d8b "
    "darkslategray:2f4f4f darkslategrey:2f4f4f darkturquoise:00ced1 darkviolet:9400d3 "
    "deeppink:ff1493 deepskyblue:00bfff dimgray:696969 dimgrey:696969 dodgerblue:1e90ff "
    "firebrick:b22222 floralwhite:fffaf0 forestgreen:228b22 fuchsia:ff00ff gainsboro:dcdcdc "
    "ghostwhite:f8f8ff gold:ffd700 goldenrod:daa520 gray:808080 green:008000 greenyellow:adff2f "
    "grey:808080 honeydew:f0fff0 hotpink:ff69b4 indianred:cd5c5c indigo:4b0082 ivory:fffff0 "
    "khaki:f0e68c lavender:e6e6fa lavenderblush:fff0f5 lawngreen:7cfc00 lemonchiffon:fffacd "
    "lightblue:add8e6 lightcoral:f08080 lightcyan:e0ffff lightgoldenrodyellow:fafad2 "
    "lightgray:d3d3d3 lightgreen:90ee90 lightgrey:d3d3d3 lightpink:ffb6c1 lightsalmon:ffa07a "
    "lightseagreen:20b2aa lightskyblue:87cefa lightslategray:778899 lightslategrey:778899 "
    "lightsteelblue:b0c4de lightyellow:ffffe0 lime:00ff00 limegreen:32cd32 linen:faf0e6 "
    "magenta:ff00ff maroon:800000 mediumaquamarine:66cdaa mediumblue:0000cd mediumorchid:ba55d3 "
    "mediumpurple:9370db mediumseagreen:3cb371 mediumslateblue:7b68ee mediumspringgreen:00fa9a "
    "mediumturquoise:48d1cc mediumvioletred:c71585 midnightblue:191970 mintcream:f5fffa "
    "mistyrose:ffe4e1 moccasin:ffe4b5 navajowhite:ffdead navy:000080 oldlace:fdf5e6 olive:808000 "
    "olivedrab:6b8e23 orange:ffa500 orangered:ff4500 orchid:da70d6 palegoldenrod:eee8aa "
    "palegreen:98fb98 paleturquoise:afeeee palevioletred:db7093 papayawhip:ffefd5 "
    "peachpuff:ffdab9 peru:cd853f pink:ffc0cb plum:dda0dd powderblue:b0e0e6 purple:800080 "
    "rebeccapurple:663399 red:ff0000 rosybrown:bc8f8f royalblue:4169e1 saddlebrown:8b4513 "
    "salmon:fa8072 sandybrown:f4a460 seagreen:2e8b57 seashell:fff5ee sienna:a0522d silver:c0c0c0 "
    "skyblue:87ceeb slateblue:6a5acd slategray:708090 slategrey:708090 snow:fffafa "
    "springgreen:00ff7f steelblue:4682b4 tan:d2b48c teal:008080 thistle:d8bfd8 tomato:ff6347 "
    "turquoise:40e0d0 violet:ee82ee wheat:f5deb3 white:ffffff whitesmoke:f5f5f5 yellow:ffff00 "
    "yellowgreen:9acd32"
)
NAMED_COLORS: Final[dict[str, Rgba]] = {
    name: Rgba(int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16))
    for name, h in (pair.split(":") for pair in _NAMED_TABLE.split())
} | {"transparent": Rgba(0, 0, 0, 0.0)}

_NUM: Final = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_HEX_RE: Final = re.compile(r"#([0-9a-fA-F]{3,4}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})")
_FUNC_RE: Final = re.compile(r"(rgba?|hsla?)\(\s*([^()]*?)\s*\)", re.IGNORECASE)
_NUMBER_RE: Final = re.compile(_NUM)
_PERCENT_RE: Final = re.compile(rf"({_NUM})%")
_HUE_RE: Final = re.compile(rf"({_NUM})(deg|grad|rad|turn)?", re.IGNORECASE)
_LENGTH_RE: Final = re.compile(
    rf"0|({_NUM})(px|em|rem|ex|ch|lh|rlh|vw|vh|vmin|vmax|cm|mm|q|in|pt|pc)", re.IGNORECASE
)
_HUE_TURNS: Final = {"deg": 360.0, "grad": 400.0, "rad": 2 * math.pi, "turn": 1.0}
ACCEPTED_COLORS: Final = (
    "#rgb, #rgba, #rrggbb, #rrggbbaa, rgb(), rgba(), hsl(), hsla() or a CSS named colour"
)


def _clamp(value: float, high: float) -> float:
    return min(max(value, 0.0), high)


def _alpha(token: str) -> float:
    if m := _PERCENT_RE.fullmatch(token):
        return _clamp(float(m[1]) / 100, 1.0)
    if _NUMBER_RE.fullmatch(token):
        return _clamp(float(token), 1.0)
    raise ValueError(f"alpha {token!r} is not a number or a percentage")


def _arguments(body: str) -> tuple[list[str], str | None, bool]:
    """Split a colour function's arguments: (channels, alpha or None, legacy comma syntax)."""
    if "," in body:
        parts = [p.strip() for p in body.split(",")]
        if len(parts) not in (3, 4) or any(not p or " " in p for p in parts):
            raise ValueError("expected 3 or 4 comma-separated arguments")
        return parts[:3], (parts[3] if len(parts) == 4 else None), True
    channels, slash, alpha = body.partition("/")
    parts = channels.split()
    if len(parts) != 3 or (slash and len(alpha.split()) != 1):
        raise ValueError("expected 3 space-separated arguments and an optional '/ alpha'")
    return parts, (alpha.strip() if slash else None), False


def _rgb_channel(token: str) -> float:
    if m := _PERCENT_RE.fullmatch(token):
        return _clamp(float(m[1]) * 255 / 100, 255.0)
    if _NUMBER_RE.fullmatch(token):
        return _clamp(float(token), 255.0)
    raise ValueError(f"channel {token!r} is not a number or a percentage")


def _hsl(channels: list[str], legacy: bool) -> tuple[float, float, float]:
    hue = _HUE_RE.fullmatch(channels[0])
    if hue is None:
        raise ValueError(f"hue {channels[0]!r} is not an angle")
    turns = float(hue[1]) / _HUE_TURNS[(hue[2] or "deg").lower()]
    levels: list[float] = []
    for token in channels[1:]:
        if m := _PERCENT_RE.fullmatch(token):
            levels.append(_clamp(float(m[1]) / 100, 1.0))
        elif not legacy and _NUMBER_RE.fullmatch(token):
            levels.append(_clamp(float(token) / 100, 1.0))
        else:
            raise ValueError(f"saturation and lightness must be percentages, not {token!r}")
    red, green, blue = colorsys.hls_to_rgb(turns % 1.0, levels[1], levels[0])
    return red * 255, green * 255, blue * 255


def parse_color(text: str) -> Rgba:
    """The colour ``text`` names; ValueError (naming the accepted forms) when it is not one."""
    value = text.strip()
    try:
        if m := _HEX_RE.fullmatch(value):
            digits = m[1] if len(m[1]) > 4 else "".join(c * 2 for c in m[1])
            channels = [int(digits[i : i + 2], 16) for i in range(0, len(digits), 2)]
            alpha = channels[3] / 255 if len(channels) == 4 else 1.0
            return Rgba(channels[0], channels[1], channels[2], alpha)
        if m := _FUNC_RE.fullmatch(value):
            parts, alpha_token, legacy = _arguments(m[2])
            alpha = 1.0 if alpha_token is None else _alpha(alpha_token)
            if m[1].lower().startswith("rgb"):
                red, green, blue = (_rgb_channel(p) for p in parts)
            else:
                red, green, blue = _hsl(parts, legacy)
            return Rgba(red, green, blue, alpha)
        if (named := NAMED_COLORS.get(value.lower())) is not None:
            return named
    except ValueError as err:
        raise ValueError(f"{text!r} is not a CSS colour: {err}") from err
    raise ValueError(f"{text!r} is not a CSS colour; accepted: {ACCEPTED_COLORS}")


def _split_top_level(text: str, separator: str) -> list[str]:
    """Split on ``separator`` outside parentheses (whitespace when ``separator`` is " ")."""
    parts: list[str] = []
    depth, current = 0, ""
    for char in text:
        depth += (char == "(") - (char == ")")
        if depth < 0:
            raise ValueError("unbalanced parentheses")
        if depth == 0 and (char.isspace() if separator == " " else char == separator):
            parts.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError("unbalanced parentheses")
    parts.append(current)
    return [p.strip() for p in parts if separator != " " or p.strip()]


def _check_one_shadow(shadow: str) -> None:
    tokens = _split_top_level(shadow, " ")
    lengths: list[int] = []
    colors = insets = 0
    for index, token in enumerate(tokens):
        if token.lower() == "inset":
            insets += 1
        elif m := _LENGTH_RE.fullmatch(token):
            lengths.append(index)
            if len(lengths) == 3 and m[1] is not None and float(m[1]) < 0:
                raise ValueError(f"the blur radius {token!r} must not be negative")
        else:
            parse_color(token)
            colors += 1
    if not 2 <= len(lengths) <= 4 or lengths != list(range(lengths[0], lengths[0] + len(lengths))):
        raise ValueError(
            f"{shadow!r} needs 2-4 adjacent lengths (offset-x offset-y [blur [spread]])"
        )
    if colors > 1 or insets > 1:
        raise ValueError(f"{shadow!r} has more than one colour or 'inset'")


def check_shadow(text: str) -> str:
    """Validate a CSS box-shadow value; returns it stripped, or raises ValueError."""
    value = text.strip()
    if value.lower() == "none":
        return value
    if not value or any(c in value for c in ";{}<>\\\"'"):
        raise ValueError(f"{text!r} is not a box-shadow value")
    try:
        for shadow in _split_top_level(value, ","):
            if not shadow:
                raise ValueError("an empty shadow between commas")
            _check_one_shadow(shadow)
    except ValueError as err:
        raise ValueError(f"{text!r} is not a box-shadow value: {err}") from err
    return value


def over(top: Rgba, below: Rgba) -> Rgba:
    """``top`` composited onto ``below`` (source-over)."""
    alpha = top.a + below.a * (1 - top.a)
    if alpha == 0:
        return Rgba(0, 0, 0, 0.0)

    def mix(t: float, b: float) -> float:
        return (t * top.a + b * below.a * (1 - top.a)) / alpha

    return Rgba(mix(top.r, below.r), mix(top.g, below.g), mix(top.b, below.b), alpha)


def relative_luminance(color: Rgba) -> float:
    """WCAG 2.x relative luminance of an opaque colour (alpha ignored)."""

    def linear(channel: float) -> float:
        c = channel / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * linear(color.r) + 0.7152 * linear(color.g) + 0.0722 * linear(color.b)


def contrast_ratio(foreground: Rgba, background: Rgba) -> float:
    """WCAG 2.x contrast ratio, 1-21. A translucent background is first laid on white, then a
    translucent foreground on the background, as a browser would paint them."""
    base = over(background, WHITE)
    top = over(foreground, base)
    lighter, darker = sorted((relative_luminance(top), relative_luminance(base)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)
