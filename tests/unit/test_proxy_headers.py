"""The data proxy's answer headers: an allow-list, the same in the code and in docs/api.md."""

from __future__ import annotations

from urllib.parse import unquote

from atrium.api.proxy.headers import DATA, DATA_ANSWER, INERT, PAGE, outbound
from atrium.api.proxy.pages import user_headers
from tests.conftest import REPO_DIR


def documented_kept() -> list[str]:
    api = (REPO_DIR / "docs" / "api.md").read_text()
    section = api.split("**Headers of an answer.**", 1)[1].split("Every other header", 1)[0]
    return [
        line.split("|")[1].strip().strip("`").lower()
        for line in section.splitlines()
        if line.startswith("| `")
    ]


def test_the_documented_table_is_the_allow_list() -> None:
    assert documented_kept() == [name.decode() for name, _ in DATA_ANSWER]
    assert all(reason for _, reason in DATA_ANSWER)


def test_a_data_answer_keeps_only_listed_headers_whatever_their_case() -> None:
    sent = [
        (b"Content-Type", b"application/json"),
        (b"ETAG", b'"1"'),
        (b"Clear-Site-Data", b'"cookies"'),
        (b"Access-Control-Allow-Origin", b"*"),
        (b"X-Os-App-Id", b"com.example.other"),
        (b"Content-Length", b"2"),
        (b"Date", b"Mon, 01 Jan 2024 00:00:00 GMT"),
        (b"Transfer-Encoding", b"chunked"),
    ]
    kept = outbound(sent, DATA)
    assert kept == [(b"Content-Type", b"application/json"), (b"ETAG", b'"1"'), *INERT]


def test_a_header_the_connection_header_names_stops_even_when_listed() -> None:
    sent = [(b"Connection", b"keep-alive, ETag"), (b"ETag", b'"1"'), (b"Vary", b"Accept")]
    assert outbound(sent, DATA) == [(b"Vary", b"Accept"), *INERT]


def test_an_app_page_keeps_its_own_headers() -> None:
    sent = [
        (b"Set-Cookie", b"mine=1"),
        (b"X-Foo", b"bar"),
        (b"Connection", b"x-hop"),
        (b"X-Hop", b"1"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Content-Length", b"2"),
    ]
    assert outbound(sent, PAGE) == [(b"Set-Cookie", b"mine=1"), (b"X-Foo", b"bar")]


def test_the_user_looking_is_named_in_ascii_and_the_name_decodes_back() -> None:
    for name in ("Ann Smith", "Zoë 100% «ok»", "李雷", "a\x7fb", "%41"):
        headers = dict(user_headers("ann", name, "viewer"))
        encoded = headers[b"X-Os-User-Name"]
        assert all(0x20 <= b <= 0x7E for b in encoded), name
        assert unquote(encoded.decode("ascii")) == name
    assert dict(user_headers("ann", "Ann Smith", "owner")) == {
        b"X-Os-User-Id": b"ann",
        b"X-Os-User-Name": b"Ann Smith",
        b"X-Os-User-Role": b"owner",
    }
