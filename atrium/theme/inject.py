"""Theme injection into an app's HTML for its theme strategy (docs/api.md "Injection into app pages").

Pure. A bytes scanner, not a parser (measured: parsers re-serialise the
page and corrupt it). It walks the markup from the top, passing over comments, the doctype and
bogus comments, and the content of raw-text elements (`script`, `style`, `template`, `title`, …),
and stops at the opening `<head …>` tag, or at the first tag that opens the body (`<body>`,
`<div>`, `<textarea>`, …; a parser ignores any `<head>` after it), so it never walks a body.

The snippet goes right after the `<head …>` tag; without one, after the doctype and the
`<html …>` tag, else at the very start after a BOM (decisions.md "Themes"). Either way it goes
after a `<meta charset>` that directly follows that point, so the charset declaration stays in
the first 1024 bytes. The output is the input, byte for byte, plus the snippet at one place.
"""

from __future__ import annotations

import html
import re
import zlib
from collections.abc import Callable
from functools import lru_cache
from typing import Final

from atrium.manifest import ThemeStrategy
from atrium.theme.model import ColorMode

#: the theming seam of the proxy: (body, content_type, content_encoding) → body
HtmlTransform = Callable[[bytes, str, str | None], bytes]

THEME_CSS_HREF: Final = "/_os/api/os/theme.css"
CLIENT_JS_SRC: Final = "/_os/client.js"
#: a compressed HTML body is left as it is when it inflates beyond this
MAX_INFLATED: Final = 8 << 20

_UTF8_BOM: Final = b"\xef\xbb\xbf"
_WIDE_BOMS: Final = (b"\xff\xfe", b"\xfe\xff")
_MARKUP: Final = re.compile(rb"<(?:(!--)|([!?])|(/?)([A-Za-z][^\t\n\f\r />]*))")
# the rest of a tag up to its `>`: quotes count only as attribute values (after `=`); an
# unterminated quoted value never ends the tag
_TAG_REST: Final = re.compile(rb"""(?:[^>=]++|=[\t\n\f\r ]*+(?:"[^"]*+"|'[^']*+'|(?!["'])))*+>""")
_COMMENT_END: Final = re.compile(rb"--!?>")
_CHARSET_META: Final = re.compile(
    rb"[\t\n\f\r ]*<meta[\t\n\f\r /][^<>]*charset[^<>]*>", re.IGNORECASE
)
# head content whose text is raw (no tags inside): skipped to its end tag. `textarea`, `xmp`,
# `iframe`, `noembed` are raw too but open the body, so the scan has stopped before them
_RAW_TEXT: Final = frozenset({b"script", b"style", b"template", b"title", b"noscript", b"noframes"})
# start tags that may come before or inside the head; any other (`<body>`, `<div>`, `<svg>`, …)
# opens the body, after which a parser ignores `<head>`: the scan stops there
_HEAD_CONTENT: Final = frozenset(
    {
        b"html",
        b"head",
        b"base",
        b"basefont",
        b"bgsound",
        b"link",
        b"meta",
        b"title",
        b"noscript",
        b"noframes",
        b"style",
        b"script",
        b"template",
    }
)


@lru_cache(maxsize=16)
def _end_tag(name: bytes) -> re.Pattern[bytes]:
    return re.compile(rb"</" + re.escape(name) + rb"[\t\n\f\r />]", re.IGNORECASE)


def _skip_markup(doc: bytes, m: re.Match[bytes]) -> int | None:
    """The end of a comment, doctype, bogus comment or end tag at ``m``; None: it runs to EOF."""
    start = m.start()
    if m[1]:  # <!-- … -->, with the abrupt forms <!--> and <!--->
        if doc.startswith(b">", start + 4):
            return start + 5
        if doc.startswith(b"->", start + 4):
            return start + 6
        end = _COMMENT_END.search(doc, start + 4)
        return None if end is None else end.end()
    if m[2]:  # <!doctype …>, <!…>, <?…>: up to the first `>`
        end_at = doc.find(b">", start + 2)
        return None if end_at < 0 else end_at + 1
    tail = _TAG_REST.match(doc, m.end())  # an end tag
    return None if tail is None else tail.end()


def injection_point(doc: bytes) -> int:
    """Where the snippet goes in ``doc`` (see the module docstring)."""
    start = len(_UTF8_BOM) if doc.startswith(_UTF8_BOM) else 0
    fallback = start
    seen_html = seen_doctype = False
    pos = start
    while (m := _MARKUP.search(doc, pos)) is not None:
        if m[4] is None or m[3]:
            end = _skip_markup(doc, m)
            if end is None:
                break
            if (
                m[2] == b"!"
                and not seen_doctype
                and doc[m.start() + 2 : m.start() + 9].lower() == b"doctype"
            ):
                seen_doctype = True
                fallback = max(fallback, end)
            pos = end
            continue
        tail = _TAG_REST.match(doc, m.end())
        if tail is None:
            break
        name = m[4].lower()
        if name == b"head":
            return _after_charset(doc, tail.end())
        if name not in _HEAD_CONTENT:
            break
        if name == b"html" and not seen_html:
            seen_html = True
            fallback = max(fallback, tail.end())
        pos = tail.end()
        if name in _RAW_TEXT:
            close = _end_tag(name).search(doc, pos)
            if close is None:
                break
            pos = close.start()
    return _after_charset(doc, fallback)


def _after_charset(doc: bytes, at: int) -> int:
    meta = _CHARSET_META.match(doc, at)
    return meta.end() if meta else at


def insert_into_head(doc: bytes, snippet: bytes) -> bytes:
    """``doc`` with ``snippet`` at its injection point; a UTF-16 document is left as it is."""
    if not doc or doc.startswith(_WIDE_BOMS):
        return doc
    at = injection_point(doc)
    view = memoryview(doc)  # one copy of the page, not two
    return b"".join((view[:at], snippet, view[at:]))


def _meta(name: str, content: str) -> str:
    return f'<meta name="{html.escape(name)}" content="{html.escape(content)}">'


def _color_scheme(mode: ColorMode) -> str:
    return "light dark" if mode is ColorMode.AUTO else mode.value


def theme_snippet(
    strategy: ThemeStrategy,
    *,
    theme_id: str,
    color_mode: ColorMode,
    design_framework: str,
    css_href: str = THEME_CSS_HREF,
    client_src: str = CLIENT_JS_SRC,
) -> bytes:
    """The tags injected for ``strategy`` (docs/api.md "Injection into app pages"), attribute values escaped.

    `color-scheme` comes first so the page does not flash the wrong tone before its CSS loads.
    """
    if strategy is ThemeStrategy.OVERRIDE:
        parts = [_meta("os-color-mode", color_mode.value)]
    elif strategy is ThemeStrategy.THEMED:
        parts = [
            _meta("color-scheme", _color_scheme(color_mode)),
            _meta("os-theme-id", theme_id),
            _meta("os-color-mode", color_mode.value),
            _meta("os-design-framework", design_framework),
        ]
    else:
        parts = [
            _meta("color-scheme", _color_scheme(color_mode)),
            _meta("os-theme-id", theme_id),
            _meta("os-color-mode", color_mode.value),
            _meta("os-theme-strategy", strategy.value),
            f'<link rel="stylesheet" href="{html.escape(css_href)}">',
            f'<script src="{html.escape(client_src)}"></script>',
        ]
    return "".join(parts).encode("ascii", "xmlcharrefreplace")


def inject_theme(
    doc: bytes,
    strategy: ThemeStrategy,
    *,
    theme_id: str,
    color_mode: ColorMode,
    design_framework: str,
    css_href: str = THEME_CSS_HREF,
) -> bytes:
    """``doc`` with the tags of ``strategy`` injected (see `theme_snippet`, `insert_into_head`)."""
    snippet = theme_snippet(
        strategy,
        theme_id=theme_id,
        color_mode=color_mode,
        design_framework=design_framework,
        css_href=css_href,
    )
    return insert_into_head(doc, snippet)


def _is_injectable(content_type: str) -> bool:
    media, *params = (p.strip().lower() for p in content_type.split(";"))
    if media != "text/html":
        return False
    charset = next(
        (p.partition("=")[2].strip("\"' ") for p in params if p.startswith("charset=")), ""
    )
    return not charset.startswith(("utf-16", "utf-32", "ucs-2", "ucs-4"))


def _inflate(body: bytes, wbits: int) -> bytes | None:
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, MAX_INFLATED)
    except zlib.error:
        return None
    if inflater.unconsumed_tail or not inflater.eof or inflater.unused_data:
        return None  # too large, truncated, or several gzip members: leave it as sent
    return out


def _deflate(data: bytes, wbits: int) -> bytes:
    # level 1: a quarter of level 6's time on a 50 KiB page for a few per cent more bytes, on
    # what is mostly a loopback hop to the browser
    compressor = zlib.compressobj(1, zlib.DEFLATED, wbits)
    return compressor.compress(data) + compressor.flush()


def transform_html(
    body: bytes,
    content_type: str,
    content_encoding: str | None,
    snippet: bytes,
    when: Callable[[bytes], bool] | None = None,
) -> bytes:
    """Insert ``snippet`` into an HTML response body as the proxy holds it (only into a document
    ``when`` accepts, if given: it sees the inflated bytes).

    `gzip` and `deflate` bodies are inflated, injected and compressed again with the same
    encoding; other encodings (br, zstd, several), non-HTML, UTF-16/32 and empty bodies (HEAD, 304)
    are returned unchanged, as is a body that does not inflate cleanly.
    """
    if not body or not _is_injectable(content_type):
        return body
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return insert_into_head(body, snippet) if when is None or when(body) else body
    candidates: tuple[int, ...]
    if encoding in ("gzip", "x-gzip"):
        candidates = (31,)
    elif encoding == "deflate":
        candidates = (15, -15)  # zlib-wrapped as RFC 9110 says, or the raw deflate some send
    else:
        return body
    for wbits in candidates:
        inflated = _inflate(body, wbits)
        if inflated is not None:
            if when is not None and not when(inflated):
                return body
            injected = insert_into_head(inflated, snippet)
            return body if injected is inflated else _deflate(injected, wbits)
    return body
