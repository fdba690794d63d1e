"""Fixture `test.sdk.echo`: an SDK provider that echoes each request, and a streamed body."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from atrium.sdk import App, HttpError, Request, Response

MAX_SIZE = 1024 * 1024 * 1024
CHUNK = 64 * 1024

app = App()


def echo(request: Request) -> dict[str, object]:
    os_headers = {
        name: value
        for name, value in request.headers.items()
        if name.lower().startswith("x-os-") and name.lower() != "x-os-shell-secret"
    }
    return {
        "method": request.method,
        "path": request.path,
        "subpath": request.subpath,
        "query": request.query,
        "bodySize": len(request.body),
        "bodySha256": hashlib.sha256(request.body).hexdigest(),
        "callerAppId": request.caller_app_id,
        "permission": request.permission,
        "headers": os_headers,
    }


def big(request: Request) -> Response:
    """``size`` bytes of ``x``, streamed; chunked when ``chunked=1``."""
    raw = request.query.get("size", "0")
    if not raw.isdigit() or int(raw) > MAX_SIZE:
        raise HttpError(400, f"size must be a whole number of bytes up to {MAX_SIZE}, not {raw!r}")
    size = int(raw)

    def chunks() -> Iterator[bytes]:
        left = size
        while left > 0:
            step = min(CHUNK, left)
            yield b"x" * step
            left -= step

    length = None if request.query.get("chunked") == "1" else size
    return Response(chunks(), content_type="application/octet-stream", length=length)


@app.route("GET", "/big")
def big_route(request: Request) -> Response:
    return big(request)


@app.route("GET", "/activities")
def activities_route(request: Request) -> dict[str, object]:
    """The `onActivityCreate` bodies of the live activities (what intents handed over)."""
    return dict(app.activities)


@app.route("*", "/whoami")
def whoami(request: Request) -> dict[str, object]:
    """A page that says who is looking: the X-Os-* headers as the app got them (each with all its
    values), the SDK's reading of them, and the Authorization header that reached the app."""
    user = request.user
    return {
        "method": request.method,
        "kind": request.kind,
        "headers": {
            name: request.headers.get_all(name)
            for name in dict.fromkeys(request.headers.keys())
            if name.lower().startswith("x-os-user")
        },
        "user": None if user is None else {"id": user.id, "name": user.name, "role": user.role},
        "authorization": request.headers.get("authorization"),
    }


@app.route("GET", "/raise")
def raise_route(request: Request) -> None:
    raise RuntimeError("echo: raised on purpose")


#: an answer that would act as whoever opens it, were the shell to let it: it reads the user's
#: installed list and changes the theme, and reports what it could do in the page's title
HOSTILE_HTML = """<!doctype html><html><head><title>inert</title></head><body>
<script>
(async () => {
  const listed = await fetch('/api/dist/installed', {credentials: 'include'});
  const selected = await fetch('/api/os/themes/select', {method: 'POST', credentials: 'include',
    headers: {'Content-Type': 'application/json'}, body: '{"colorMode": "dark"}'});
  document.title = 'ran ' + listed.status + ' ' + selected.status;
})().catch((e) => { document.title = 'ran, then ' + e.name; });
</script></body></html>"""


@app.provider("/open")
def open_entry(request: Request) -> object:
    if request.subpath == "big" and request.method in {"GET", "HEAD"}:
        return big(request)
    if request.subpath == "headers":  # each query pair comes back as a response header
        return Response("headers", headers=request.query)
    if request.subpath == "hostile.html":
        return Response(
            HOSTILE_HTML,
            content_type="text/html; charset=utf-8",
            headers={
                "Cross-Origin-Resource-Policy": "cross-origin",
                "X-Content-Type-Options": "sniff-away",
            },
        )
    return echo(request)


@app.provider("/closed")
def closed_entry(request: Request) -> dict[str, object]:
    return echo(request)


HERE = Path(__file__).resolve().parent
if (HERE / "index.html").is_file():  # copies made by the e2e tests carry a page
    app.static("/", HERE)

if __name__ == "__main__":
    app.run()
