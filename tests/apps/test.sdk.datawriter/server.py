"""Fixture `test.sdk.datawriter`: writes and reads files in its runtime data directory."""

from __future__ import annotations

import re
from pathlib import Path

from atrium.sdk import App, HttpError, Request, Response

NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")

app = App()


def data_file(request: Request) -> Path:
    name = request.query.get("name", "")
    if not NAME_RE.fullmatch(name):
        raise HttpError(400, f"name must match {NAME_RE.pattern} (no leading dot), not {name!r}")
    return app.data_dir / name


@app.route("POST", "/write")
def write(request: Request) -> dict[str, object]:
    target = data_file(request)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(request.body)
    return {"name": target.name, "size": len(request.body), "path": str(target)}


@app.route("GET", "/read")
def read(request: Request) -> Response:
    target = data_file(request)
    try:
        return Response(target.read_bytes())
    except FileNotFoundError:
        raise HttpError(404, f"no file {target.name!r} in the data directory") from None


if __name__ == "__main__":
    app.run()
