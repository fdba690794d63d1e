"""Theme injection: where the tags go on awkward HTML, what each strategy injects, byte identity,
and compressed bodies (docs/api.md "Injection into app pages"; decisions.md "Themes")."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atrium.manifest import ThemeStrategy
from atrium.theme.inject import (
    MAX_INFLATED,
    inject_theme,
    injection_point,
    insert_into_head,
    theme_snippet,
    transform_html,
)
from atrium.theme.model import ColorMode

SNIPPET = b"<!--INJECTED-->"
HTML = "text/html; charset=utf-8"


def injected_after(doc: bytes, marker: bytes) -> None:
    """The snippet sits right after the first ``marker`` and nothing else changed."""
    out = insert_into_head(doc, SNIPPET)
    at = doc.index(marker) + len(marker)
    assert out == doc[:at] + SNIPPET + doc[at:]


@pytest.mark.parametrize(
    ("doc", "after"),
    [
        (b"<!doctype html><html><head><title>t</title></head><body></body></html>", b"<head>"),
        (b'<html><head lang="en" data-x=\'a>b\' data-y="c>d"><title>', b'c>d">'),
        (b"<!DOCTYPE HTML><HTML><HEAD><TITLE>x</TITLE></HEAD>", b"<HEAD>"),
        (b"<html>\n<head\n  id=h\n>\n<title>", b"\n>"),
        (b"<html><head/><body>", b"<head/>"),
        (b"<!-- <head> --><html><head><title>", b"--><html><head>"),
        (b"<!--[if IE]><head><![endif]--><head class=real>", b"<head class=real>"),
        (b"<!--><head id=a>", b"<head id=a>"),
        (b"<!---><head id=a>", b"<head id=a>"),
        (b"<!-- a --!><head id=a>", b"<head id=a>"),
        (b'<script>document.write("<head>")</script><head id=a>', b"<head id=a>"),
        (b"<SCRIPT>x = '<head>'</SCRIPT ><head id=a>", b"<head id=a>"),
        (b"<style>/* <head> */</style><head id=a>", b"<head id=a>"),
        (b"<title>a <head> b</title><head id=a>", b"<head id=a>"),
        (b"<template><head></template><head id=a>", b"<head id=a>"),
        (b"<noscript><head></noscript><head id=a>", b"<head id=a>"),
        (b"<script></scripts><head></script><head id=a>", b"<head id=a>"),
        (b'<?xml version="1.0"?><html><head>', b"<head>"),
        (b"<!-- c -->\n<!DOCTYPE html>\n<html>\n<head>\n<title>", b"<head>"),
        (b"<html><link rel=icon href=x><meta name=y><base href=/><head id=a>", b"<head id=a>"),
        (b"\xef\xbb\xbf<!doctype html><head>", b"<head>"),
        (b'<head><meta charset="utf-8"><title>', b'<meta charset="utf-8">'),
        (b"<head>\n  <META CHARSET=utf-8>\n<title>", b"<META CHARSET=utf-8>"),
        (
            b'<head><meta http-equiv="Content-Type" content="text/html; charset=latin1"><x>',
            b'charset=latin1">',
        ),
        (b"<head><title>x</title><meta charset=utf-8>", b"<head>"),
    ],
)
def test_injects_right_after_the_real_head_tag(doc: bytes, after: bytes) -> None:
    injected_after(doc, after)


@pytest.mark.parametrize(
    ("doc", "at"),
    [
        (b"<!doctype html><html lang=en><body><p>hi", len(b"<!doctype html><html lang=en>")),
        (b"<!DOCTYPE html><p>no html, no head", len(b"<!DOCTYPE html>")),
        (b"<!doctype html>\n<body>", len(b"<!doctype html>")),
        (b"<html><body><header>not a head</header>", len(b"<html>")),
        (b"<html><body><p>&lt;head&gt;</p>", len(b"<html>")),
        (b"<html><body></body><head>", len(b"<html>")),
        (b"<p>just a fragment</p>", 0),
        (
            b"<!doctype html><meta charset=utf-8><title>",
            len(b"<!doctype html><meta charset=utf-8>"),
        ),
        (b"<html>\n <meta charset=utf-8><p>", len(b"<html>\n <meta charset=utf-8>")),
        (b"plain text", 0),
        (b"\xef\xbb\xbf<p>hi", 3),
        (b"\xef\xbb\xbf<!doctype html><html><body>", len(b"\xef\xbb\xbf<!doctype html><html>")),
        (b"<html><!-- <head> never closed", len(b"<html>")),
        (b"<html><script>var a = '<head>';", len(b"<html>")),
        (b"<html><textarea><head></textarea><head>", len(b"<html>")),
        (b"<html><headline>x</headline><head>", len(b"<html>")),
        (b"<html><div><head>", len(b"<html>")),
        (b"<!doctype html><title>t</title><svg><head>", len(b"<!doctype html>")),
        (b"<my-app><head>", 0),
        (b"<html><link title='<head>", len(b"<html>")),
        (b"<html><meta content='<head>'><title>", len(b"<html>")),
        (b"<html><plaintext><head>", len(b"<html>")),
        (b"<!doctype html><html><frameset>", len(b"<!doctype html><html>")),
        (b"<!--<html>--><!doctype html><p>", len(b"<!--<html>--><!doctype html>")),
    ],
)
def test_without_a_head_injects_after_doctype_and_html(doc: bytes, at: int) -> None:
    assert injection_point(doc) == at
    assert insert_into_head(doc, SNIPPET) == doc[:at] + SNIPPET + doc[at:]


def test_non_ascii_bytes_outside_the_insertion_are_untouched() -> None:
    doc = b"<html><head><title>caf\xe9 \xff\xfe\x00</title></head><body>\xc3\xa9<svg viewBox='0 0 1 1'>"
    out = insert_into_head(doc, SNIPPET)
    assert out.replace(SNIPPET, b"", 1) == doc
    assert out.count(SNIPPET) == 1


@pytest.mark.parametrize("doc", [b"", b"\xff\xfe<\x00h\x00", b"\xfe\xff\x00<\x00h"])
def test_empty_and_utf16_documents_are_left_alone(doc: bytes) -> None:
    assert insert_into_head(doc, SNIPPET) == doc


@given(
    st.lists(
        st.sampled_from(
            [
                "<head>",
                "<HEAD x='>'>",
                "<!--",
                "-->",
                "<script>",
                "</script>",
                "<title>",
                "</title>",
                "<html>",
                "<!doctype html>",
                "<body>",
                "<",
                ">",
                "'",
                '"',
                "=",
                "text",
                "\xef\xbb\xbf",
                " ",
            ]
        )
    )
)
def test_the_output_is_the_input_plus_the_snippet_at_one_place(parts: list[str]) -> None:
    doc = "".join(parts).encode()
    out = insert_into_head(doc, SNIPPET)
    if not doc:
        assert out == doc
        return
    at = injection_point(doc)
    assert 0 <= at <= len(doc)
    assert out == doc[:at] + SNIPPET + doc[at:]


def snippet(
    strategy: ThemeStrategy, mode: ColorMode = ColorMode.AUTO, theme_id: str = "paper"
) -> str:
    return theme_snippet(
        strategy, theme_id=theme_id, color_mode=mode, design_framework="paper-ui"
    ).decode()


def test_inherit_links_the_theme_css_and_the_client() -> None:
    assert snippet(ThemeStrategy.INHERIT) == (
        '<meta name="color-scheme" content="light dark">'
        '<meta name="os-theme-id" content="paper">'
        '<meta name="os-color-mode" content="auto">'
        '<meta name="os-theme-strategy" content="inherit">'
        '<link rel="stylesheet" href="/_os/api/os/theme.css">'
        '<script src="/_os/client.js"></script>'
    )


def test_themed_gets_metas_and_no_stylesheet() -> None:
    assert snippet(ThemeStrategy.THEMED, ColorMode.DARK) == (
        '<meta name="color-scheme" content="dark">'
        '<meta name="os-theme-id" content="paper">'
        '<meta name="os-color-mode" content="dark">'
        '<meta name="os-design-framework" content="paper-ui">'
    )


def test_override_gets_only_the_colour_mode() -> None:
    assert snippet(ThemeStrategy.OVERRIDE, ColorMode.LIGHT) == (
        '<meta name="os-color-mode" content="light">'
    )


def test_attribute_values_are_escaped() -> None:
    text = snippet(ThemeStrategy.THEMED, theme_id='x"><script>alert(1)</script>é')
    assert (
        '<meta name="os-theme-id" content="x&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;&#233;">'
        in text
    )
    assert text.count("<script") == 0


def test_inject_theme_combines_snippet_and_position() -> None:
    doc = b"<!doctype html><html><head><title>t</title>"
    out = inject_theme(
        doc, ThemeStrategy.OVERRIDE, theme_id="a", color_mode=ColorMode.DARK, design_framework="f"
    )
    assert (
        out
        == b'<!doctype html><html><head><meta name="os-color-mode" content="dark"><title>t</title>'
    )


PAGE = b"<!doctype html><html><head><title>t</title></head><body>" + b"x" * 5000 + b"</body></html>"
EXPECTED = insert_into_head(PAGE, SNIPPET)


def test_identity_bodies_are_injected() -> None:
    assert transform_html(PAGE, HTML, None, SNIPPET) == EXPECTED
    assert transform_html(PAGE, "TEXT/HTML", "identity", SNIPPET) == EXPECTED


def test_gzip_bodies_round_trip() -> None:
    out = transform_html(gzip.compress(PAGE), HTML, "gzip", SNIPPET)
    assert gzip.decompress(out) == EXPECTED
    assert gzip.decompress(transform_html(gzip.compress(PAGE), HTML, "x-gzip", SNIPPET)) == EXPECTED


def test_deflate_bodies_round_trip_zlib_wrapped_or_raw() -> None:
    wrapped = transform_html(zlib.compress(PAGE), HTML, "Deflate", SNIPPET)
    assert zlib.decompress(wrapped) == EXPECTED
    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    raw_body = raw.compress(PAGE) + raw.flush()
    assert zlib.decompress(transform_html(raw_body, HTML, "deflate", SNIPPET), -15) == EXPECTED


@pytest.mark.parametrize(
    ("body", "content_type", "encoding"),
    [
        (b"\x1b\x2c\x00brotli", HTML, "br"),
        (b"zstd", HTML, "zstd"),
        # mtime=0: a gzip header holds the time it was made, and the bytes name the test, which
        # must be the same in every pytest-xdist worker's collection
        (gzip.compress(PAGE, mtime=0), HTML, "gzip, br"),
        (b"not gzip at all", HTML, "gzip"),
        (gzip.compress(PAGE, mtime=0)[:-10], HTML, "gzip"),
        (gzip.compress(PAGE, mtime=0) * 2, HTML, "gzip"),
        (PAGE, "application/json", None),
        (PAGE, "application/xhtml+xml", None),
        (PAGE, "text/html; charset=UTF-16", None),
        (PAGE, 'text/html; charset="utf-32le"', None),
        (b"", HTML, None),
        (b"", HTML, "gzip"),
    ],
)
def test_other_bodies_pass_through_unchanged(
    body: bytes, content_type: str, encoding: str | None
) -> None:
    assert transform_html(body, content_type, encoding, SNIPPET) is body


def test_a_gzip_bomb_is_not_inflated() -> None:
    bomb = gzip.compress(b"<html>" + b" " * (MAX_INFLATED + 1), compresslevel=1)
    assert transform_html(bomb, HTML, "gzip", SNIPPET) is bomb
