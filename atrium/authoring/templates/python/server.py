"""{{APP_NAME}}: an Atrium app written with the shell's SDK (`atrium new --template python`).

The page at `/` lists items. The content provider `{{APP_ID}}` serves them to other apps:
`GET /api/data/{{APP_ID}}/items` needs `{{APP_ID}}.read`, `POST` with `{"text": "..."}` needs
`{{APP_ID}}.write`. The intent `{{APP_ID}}.action.ADD_ITEM` with extras `{"text": ...}` adds an
item and opens the page; since adding is a write, its filter in the manifest names
`{{APP_ID}}.write` too, and the shell starts it only for the user and apps holding that. Items
live in `$OS_DATA_DIR/items.json`, written atomically.

`atrium.sdk` answers `/health` and every lifecycle hook, checks the shell's secret and routes the
rest; docs/authoring.md is the contract it meets for you.
"""

from __future__ import annotations

import fcntl
import html
import json
import os
import threading
from pathlib import Path
from typing import Any

from atrium.sdk import App, HttpError, Request, Response

app = App()
PAGE = Path(__file__).with_name("index.html").read_text()
THREADS = threading.Lock()


def items_file() -> Path:
    return app.data_dir / "items.json"


def load() -> list[dict[str, str]]:
    try:
        items = json.loads(items_file().read_text())
    except (FileNotFoundError, ValueError):
        return []
    return items if isinstance(items, list) else []


def add(text: str) -> dict[str, str]:
    """Append an item: read, change, write a temporary file and rename it over the old one, under
    a lock (threads of this server, and the headless instance the shell may wake, share the file)."""
    app.data_dir.mkdir(parents=True, exist_ok=True)
    with THREADS, (app.data_dir / ".items.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        items = load()
        item = {"id": os.urandom(6).hex(), "text": text}
        items.append(item)
        tmp = items_file().with_name(f".items.json.{os.getpid()}.tmp")
        with tmp.open("w") as file:
            json.dump(items, file)
            file.flush()
            os.fsync(file.fileno())
        tmp.replace(items_file())
    app.notify_change("/items")  # after the write is durable: watchers reload
    return item


@app.route("GET", "/")
def page(request: Request) -> Response:
    # the shell names who is looking on every page request: the owner, or a user the instance
    # was shared with (`user.role` is then `viewer` or `editor`; a viewer's changes never arrive)
    user = request.user
    who = f'<p class="status" id="who">Hello, {html.escape(user.name)}</p>' if user else ""
    return Response.html(PAGE.replace("<!--os-user-->", who, 1))


@app.provider("/items")
def items(request: Request) -> object:
    if request.subpath:
        raise HttpError(404, f"no item path {request.subpath!r}: use /items")
    if request.method in ("GET", "HEAD"):
        return load()
    if request.method == "POST":
        text = request.json_object().get("text")  # not an object: 400, said so
        if not isinstance(text, str) or not text.strip():
            raise HttpError(400, 'the body must be a JSON object {"text": "..."} with some text')
        return 201, add(text)
    raise HttpError(
        405, f"{request.method} /items: use GET or POST", headers={"Allow": "GET, POST"}
    )


@app.hook("onActivityCreate")
def open_activity(body: dict[str, Any]) -> dict[str, object]:
    # extras come from whoever started the intent (`body["intent"]["callerAppId"]`, None for the
    # user): this adds an item only because the filter's permission let that caller through
    extras = body.get("extras")
    text = extras.get("text") if isinstance(extras, dict) else None
    if isinstance(text, str) and text.strip():
        add(text)
    return {"path": "/", "title": app.name}


if __name__ == "__main__":
    app.run()
