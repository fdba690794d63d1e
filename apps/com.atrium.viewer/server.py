"""Viewer: a system app of Atrium that shows what an intent hands it, one activity per intent.

Each onActivityCreate keeps the activity's body (the SDK's ``app.activities``) and opens
`/activity/<activityId>`, which shows the text of ``extras.text`` escaped, an image from the
intent's ``uri`` (http, https or data:image), or else the uri and the intent as plain text.
onActivityDestroy forgets the activity.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from atrium.sdk import App, Request, Response

app = App("Viewer")
PAGE = Path(__file__).with_name("index.html").read_text()
IMAGE_SCHEMES = {"http", "https"}


def describe(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The activity's intent and extras, whichever way it was started."""
    intent, extras = body.get("intent"), body.get("extras")
    return (
        intent if isinstance(intent, dict) else {},
        extras if isinstance(extras, dict) else {},
    )


def title_of(body: dict[str, Any]) -> str:
    intent, extras = describe(body)
    if isinstance(extras.get("title"), str) and extras["title"]:
        return f"View {extras['title'][:60]}"
    uri = intent.get("uri")
    if isinstance(uri, str) and uri:
        name = unquote(urlsplit(uri).path.rstrip("/").rsplit("/", 1)[-1]) or uri
        return f"View {name[:60]}"
    kind = intent.get("type")
    return f"View {kind}" if isinstance(kind, str) and kind else "View"


def is_image_source(uri: str) -> bool:
    scheme = urlsplit(uri).scheme.lower()
    return scheme in IMAGE_SCHEMES or uri.lower().startswith("data:image/")


def render(body: dict[str, Any]) -> str:
    intent, extras = describe(body)
    kind = str(intent.get("type") or "").lower()
    uri = intent.get("uri") if isinstance(intent.get("uri"), str) else ""
    parts = [f"<h1>{html.escape(title_of(body))}</h1>"]
    if isinstance(extras.get("text"), str):
        parts.append(f'<pre class="text">{html.escape(extras["text"])}</pre>')
    elif uri and is_image_source(uri) and (kind.startswith("image/") or not kind):
        parts.append(f'<img src="{html.escape(uri)}" alt="{html.escape(uri)}">')
    elif uri:
        scheme = urlsplit(uri).scheme.lower()
        link = (
            f'<a href="{html.escape(uri)}" target="_blank" rel="noopener noreferrer">'
            f"{html.escape(uri)}</a>"
            if scheme in IMAGE_SCHEMES
            else html.escape(uri)
        )
        parts.append(f'<p class="uri">{link}</p>')
    else:
        parts.append('<p class="dim">Nothing to show.</p>')
    if intent:
        shown = json.dumps(intent, indent=2, ensure_ascii=False)
        parts.append(f"<details><summary>Intent</summary><pre>{html.escape(shown)}</pre></details>")
    return PAGE.replace("<!--content-->", "\n".join(parts))


@app.hook("onActivityCreate")
def open_activity(body: dict[str, Any]) -> dict[str, object]:
    # the SDK keeps the body in app.activities once this answers
    activity_id = str(body.get("activityId") or "")
    return {"path": f"/activity/{quote(activity_id, safe='')}", "title": title_of(body)}


@app.route("GET", "/")
def home(request: Request) -> Response:
    count = len(app.activities)
    return Response.html(
        PAGE.replace("<!--content-->", f"<h1>Viewer</h1><p class='dim'>{count} open</p>")
    )


@app.route("GET", "/activity/*")
def activity(request: Request) -> Response:
    body = app.activities.get(unquote(request.subpath))
    if body is None:
        return Response.html(
            PAGE.replace(
                "<!--content-->", "<h1>Gone</h1><p class='dim'>This activity has ended.</p>"
            ),
            404,
        )
    return Response.html(render(body))


if __name__ == "__main__":
    app.run()
