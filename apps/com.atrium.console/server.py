"""Console: a system app of Atrium that lists the shell's bus events live.

The page opens an EventSource on `/_os/api/events` (the shell's event stream, served on the
app's own origin); this server only serves the page.
"""

from __future__ import annotations

from pathlib import Path

from atrium.sdk import App, Request, Response

app = App("Console")
PAGE = Path(__file__).with_name("index.html").read_text()


@app.route("GET", "/")
def page(request: Request) -> Response:
    return Response.html(PAGE)


if __name__ == "__main__":
    app.run()
