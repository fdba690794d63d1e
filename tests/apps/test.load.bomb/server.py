"""Fixture `test.load.bomb`: a fork bomb and a 10 GiB allocation on request."""

from __future__ import annotations

import os
import time

from atrium.sdk import App, Request, Response

PIECE = 16 << 20
HELD: list[bytes] = []

app = App()


def _bomb() -> None:
    """Every process forks without end; a refused fork waits 50 ms and tries again (the limit
    is what stops it, not the bomb)."""
    while True:
        try:
            os.fork()
        except OSError:
            time.sleep(0.05)


@app.route("POST", "/bomb")
def bomb(request: Request) -> dict[str, object]:
    if os.fork() == 0:
        os.setsid()  # out of the app's process group: stop() must still find it
        _bomb()
    return {"started": True}


@app.route("POST", "/alloc")
def alloc(request: Request) -> object:
    wanted = int(request.query.get("gib", "1")) << 30
    try:
        while len(HELD) * PIECE < wanted:
            HELD.append(b"\x01" * PIECE)  # written: every page resident
    except MemoryError:
        held = len(HELD) * PIECE >> 20
        HELD.clear()
        return Response.json({"refused": True, "heldMiB": held}, status=507)
    return {"heldMiB": len(HELD) * PIECE >> 20}


if __name__ == "__main__":
    app.run()
