"""Notes: a system app of Atrium, written with the app SDK.

It serves its page at `/` and provides the `notes` authority: GET/POST /api/data/notes,
GET/PUT/DELETE /api/data/notes/<id>. Notes live in $OS_DATA_DIR/notes.json, written atomically.
An activity created with extras `{"text": ...}` (the CREATE_NOTE intent) adds a note and opens it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from atrium.sdk import App, HttpError, Request, Response

app = App("Notes")
THREADS = threading.Lock()
PAGE = Path(__file__).with_name("index.html").read_text()
Notes = dict[str, dict[str, str]]


def notes_file() -> Path:
    return app.data_dir / "notes.json"


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One reader-writer at a time, across threads and processes: the user's Notes and the
    headless provider instance the shell wakes share this data folder."""
    app.data_dir.mkdir(parents=True, exist_ok=True)
    with THREADS, (app.data_dir / ".notes.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def load() -> Notes:
    try:
        data = json.loads(notes_file().read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save(notes: Notes) -> None:
    """Write to a temporary file beside notes.json, then rename it over: never half a file."""
    target = notes_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".notes.json.{os.getpid()}.tmp")
    with tmp.open("w") as file:
        json.dump(notes, file)
        file.flush()
        os.fsync(file.fileno())
    tmp.replace(target)


def text_of(request: Request) -> str:
    body = request.json()
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str):
        raise HttpError(400, 'the body must be a JSON object {"text": "..."}')
    return text


def add(notes: Notes, text: str) -> dict[str, str]:
    note = {"id": os.urandom(6).hex(), "text": text}
    notes[note["id"]] = note
    save(notes)
    return note


def changed(note_id: str) -> None:
    """Tell watchers of `notes/notes` (other apps, the page itself) what changed."""
    app.notify_change(f"/notes/{note_id}")


@app.route("GET", "/")
def page(request: Request) -> Response:
    return Response.html(PAGE)


@app.provider("/notes")
def notes_entry(request: Request) -> object:
    method = "GET" if request.method == "HEAD" else request.method
    note_id = request.subpath
    with locked():
        result, written = serve(method, note_id, request)
    if written is not None:  # after the lock: a slow shell never holds up other writers
        changed(written)
    return result


def serve(method: str, note_id: str, request: Request) -> tuple[object, str | None]:
    """The answer, and the id of the note written (None for a read); the caller holds the lock."""
    notes = load()
    if not note_id:
        if method == "GET":
            return sorted(notes.values(), key=lambda n: n["id"]), None
        if method == "POST":
            note = add(notes, text_of(request))
            return (201, note), note["id"]
        raise HttpError(405, f"{method} /notes: use GET or POST", headers={"Allow": "GET, POST"})
    if note_id not in notes:
        raise HttpError(404, f"no note {note_id!r}")
    if method == "GET":
        return notes[note_id], None
    if method == "PUT":
        notes[note_id]["text"] = text_of(request)
        save(notes)
        return notes[note_id], note_id
    if method == "DELETE":
        del notes[note_id]
        save(notes)
        return {"ok": True}, note_id
    raise HttpError(
        405,
        f"{method} /notes/<id>: use GET, PUT or DELETE",
        headers={"Allow": "GET, PUT, DELETE"},
    )


@app.hook("onActivityCreate")
def open_activity(body: dict[str, Any]) -> dict[str, object]:
    extras = body.get("extras")
    text = extras.get("text") if isinstance(extras, dict) else None
    if not isinstance(text, str):
        return {"path": "/", "title": "Notes"}
    with locked():
        note = add(load(), text)
    changed(note["id"])
    first_line = text.strip().splitlines()[0][:40] if text.strip() else "new note"
    return {"path": f"/?note={note['id']}", "title": f"Note: {first_line}"}


if __name__ == "__main__":
    app.run()
