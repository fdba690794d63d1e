"""One header filter for both proxy paths and both directions (RFC 9110 7.6.1 for hop-by-hop).

Inbound, a request loses its hop-by-hop headers and those its `Connection` header names, every
`X-Os-*` header (the shell sets its own), the caller's credentials (`Authorization`, the shell's
`atrium_*` cookies) and its framing (the pool sets it); outbound, an answer loses the same
hop-by-hop set, its framing and `Date` (the server adds its own). What differs between the data
path and the page path is data: a `Rules` each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-connection",
    }
)
#: request headers never passed on: hop-by-hop, the caller's credentials, framing (the pool sets
#: it), `Expect` (the server answers 100-continue itself)
REQUEST_DROPPED: Final = HOP_BY_HOP | {
    b"host",
    b"authorization",
    b"cookie",
    b"content-length",
    b"expect",
}
#: response headers never passed on: hop-by-hop, framing (set again for the body sent), `Date`
RESPONSE_DROPPED: Final = HOP_BY_HOP | {b"content-length", b"date"}
SHELL_COOKIE_PREFIX: Final = "atrium_"
#: what every answer of the data proxy carries, whatever the provider said: a browser that opens a
#: provider's answer (a link, a popup, the address bar) renders it as an inert document on an
#: opaque origin (no script, form, popup or plugin; nothing loaded), never sniffs another type out
#: of it, and lets no other origin embed it (`*.localhost` app pages are same-site with the host
#: page, so the user's cookie would ride on their `<img>`/`<script>` loads)
INERT: Final = (
    (b"content-security-policy", b"sandbox; default-src 'none'; form-action 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


@dataclass(frozen=True, slots=True)
class Rules:
    """What one proxy path drops and adds beyond the common filter."""

    #: response headers dropped besides RESPONSE_DROPPED
    response_dropped: frozenset[bytes]
    #: headers added to every answer
    response_added: tuple[tuple[bytes, bytes], ...]
    #: the caller's own cookies (all but the shell's `atrium_*`) reach the app
    app_cookies: bool


#: the data path: the provider plants no cookie and its answer is inert (a second CORP or nosniff
#: header would make the pair invalid, so the provider's own are dropped)
DATA: Final = Rules(
    response_dropped=frozenset(
        {b"set-cookie", b"set-cookie2", b"x-content-type-options", b"cross-origin-resource-policy"}
    ),
    response_added=INERT,
    app_cookies=False,
)
#: an app's pages on its own origin: its cookies are its own, both ways
PAGE: Final = Rules(response_dropped=frozenset(), response_added=(), app_cookies=True)


def connection_options(values: list[bytes]) -> frozenset[bytes]:
    """The header names the `Connection` header values list: hop-by-hop for this message only."""
    return frozenset(o.strip().lower() for value in values for o in value.split(b","))


def app_cookies(header: str) -> str:
    """The app's own cookies from a `Cookie` header: the shell's (`atrium_*`) are taken out."""
    kept = [
        c.strip()
        for c in header.split(";")
        if c.strip() and not c.strip().startswith(SHELL_COOKIE_PREFIX)
    ]
    return "; ".join(kept)


class Inbound:
    """A request's headers in one pass: what the shell reads, and what goes on to the app."""

    __slots__ = (
        "asserted_permission",
        "authorization",
        "chunked",
        "claimed_app_id",
        "content_length",
        "cookie",
        "forwarded",
    )

    def __init__(self, headers: Headers, rules: Rules) -> None:
        self.authorization: str | None = None
        self.cookie: str | None = None
        self.claimed_app_id: str | None = None
        self.asserted_permission: str | None = None
        self.content_length: int | None = None
        self.chunked = False
        self.forwarded: Headers = []
        connection: list[bytes] = []
        for name, value in headers:  # names arrive lower-cased from the server
            if name not in REQUEST_DROPPED and not name.startswith(b"x-os-"):
                self.forwarded.append((name, value))
            elif name == b"authorization":
                self.authorization = self.authorization or value.decode("latin-1")
            elif name == b"cookie":
                self.cookie = self.cookie or value.decode("latin-1")
            elif name == b"content-length":
                self.content_length = int(value) if value.isdigit() else None
            elif name == b"transfer-encoding":
                self.chunked = True
            elif name == b"connection":
                connection.append(value)
            elif name == b"x-os-caller-app-id":
                self.claimed_app_id = self.claimed_app_id or value.decode("latin-1")
            elif name == b"x-os-permission":
                self.asserted_permission = self.asserted_permission or value.decode("latin-1")
        if connection:
            named = connection_options(connection)
            self.forwarded = [(n, v) for n, v in self.forwarded if n not in named]
        if rules.app_cookies and self.cookie and (own := app_cookies(self.cookie)):
            self.forwarded.append((b"cookie", own.encode("latin-1")))


def outbound(headers: Headers, rules: Rules) -> Headers:
    """The app's answer headers the caller gets, in one pass (names as the app sent them): none
    of RESPONSE_DROPPED, the rules' own, or those the `Connection` header names; then the rules'
    additions. A provider's own Content-Security-Policy is kept on the data path: a browser
    enforces every policy it gets, so it can only narrow the shell's."""
    kept: Headers = []
    connection: list[bytes] = []
    for name, value in headers:
        lower = name.lower()
        if lower == b"connection":
            connection.append(value)
        elif lower not in RESPONSE_DROPPED and lower not in rules.response_dropped:
            kept.append((name, value))
    if connection:
        named = connection_options(connection)
        kept = [(n, v) for n, v in kept if n.lower() not in named]
    kept.extend(rules.response_added)
    return kept
