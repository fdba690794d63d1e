"""One header filter for both proxy paths and both directions (RFC 9110 7.6.1 for hop-by-hop).

Inbound, a request loses its hop-by-hop headers and those its `Connection` header names, every
`X-Os-*` header (the shell sets its own), the caller's credentials (`Authorization`, the shell's
`atrium_*` cookies) and its framing (the pool sets it). Outbound, an app's page answer loses the
same hop-by-hop set, its framing and `Date` (the server adds its own): the origin is the app's.
A provider's data answer is served on an origin that is not the provider's (the host page's, or
a caller app's), so it keeps only the headers of `DATA_ANSWER`, an allow-list with a reason per
header. What differs between the data path and the page path is data: a `Rules` each.
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
#: the headers of a provider's answer that reach the caller, each with the reason it may: a data
#: answer is served on the host page's origin (or a caller app's), so a header passes only when it
#: describes the answer itself and cannot act on that origin. Everything else stops at the shell,
#: among them: `Set-Cookie`/`Set-Cookie2` (cookies on an origin not the provider's),
#: `Clear-Site-Data` (would log the user out), `Access-Control-*` (who may read is the permission
#: decision, never the provider's: with credentials another origin would read as the user),
#: `Location` and `Refresh` (would send the browser anywhere from the host origin; the provider's
#: paths are not the caller's URLs either), `Link` (preload and prefetch requests with the origin's
#: cookies), `WWW-Authenticate` (a password prompt in the host page's name, and a Basic
#: `Authorization` the browser would then send to every shell route), `Alt-Svc` and
#: `Strict-Transport-Security` (would steer the origin's connections), the provider's own
#: `Content-Security-Policy` and the reporting headers (`…-Report-Only`, `Report-To`,
#: `Reporting-Endpoints`, `NEL`: requests the browser would send from the origin), the
#: shell's own `X-Content-Type-Options`/`Cross-Origin-Resource-Policy` (see INERT), every
#: `X-Os-*` (the shell's to speak), and any header not listed (`Server`, `X-…`)
DATA_ANSWER: Final = (
    (b"content-type", "what the body is; nosniff and the sandbox below keep it inert"),
    (b"content-encoding", "how the body's bytes, passed as they are, are coded (gzip)"),
    (b"content-language", "the body's language"),
    (
        b"content-disposition",
        "inline or a download with a file name (a download leaves the origin)",
    ),
    (b"content-range", "which part a 206 answer holds"),
    (b"accept-ranges", "that ranges may be asked for"),
    (b"etag", "the validator of conditional requests (If-None-Match)"),
    (b"last-modified", "the validator of conditional requests (If-Modified-Since)"),
    (b"cache-control", "how long the provider's own data may be reused; one user's browser cache"),
    (b"expires", "the older form of Cache-Control's max-age"),
    (b"vary", "which request headers the answer depends on, so caches keep variants apart"),
    (b"retry-after", "when to try again after a 503 or 429"),
    (b"allow", "the methods a path takes, with a 405"),
)
#: the names of DATA_ANSWER, for the one lookup per header on the hot path
DATA_ANSWER_NAMES: Final = frozenset(name for name, _ in DATA_ANSWER)
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
    """What one proxy path lets through and adds beyond the common filter."""

    #: the only response headers passed on (an allow-list), or None: every header but
    #: RESPONSE_DROPPED (an app's answer on its own origin)
    response_allowed: frozenset[bytes] | None
    #: headers added to every answer
    response_added: tuple[tuple[bytes, bytes], ...]
    #: the caller's own cookies (all but the shell's `atrium_*`) reach the app
    app_cookies: bool


#: the data path: only DATA_ANSWER passes (none of it framing, hop-by-hop or `Date`), and the
#: answer is inert
DATA: Final = Rules(response_allowed=DATA_ANSWER_NAMES, response_added=INERT, app_cookies=False)
#: an app's pages on its own origin: its headers and cookies are its own, both ways
PAGE: Final = Rules(response_allowed=None, response_added=(), app_cookies=True)


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
    """The app's answer headers the caller gets, in one pass (names as the app sent them): those
    the rules allow (the data path), or all but RESPONSE_DROPPED (the page path); never those the
    `Connection` header names; then the rules' additions."""
    kept: Headers = []
    connection: list[bytes] = []
    allowed = rules.response_allowed
    for name, value in headers:
        lower = name.lower()
        if lower == b"connection":
            connection.append(value)
        elif lower in allowed if allowed is not None else lower not in RESPONSE_DROPPED:
            kept.append((name, value))
    if connection:
        named = connection_options(connection)
        if allowed is None or not named.isdisjoint(allowed):  # `keep-alive`, `close`: nothing kept
            kept = [(n, v) for n, v in kept if n.lower() not in named]
    kept.extend(rules.response_added)
    return kept
