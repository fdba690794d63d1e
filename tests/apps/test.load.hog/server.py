"""Fixture `test.load.hog`: allocates past its memory limit or forks past its pids limit."""

from __future__ import annotations

import os
import signal
import time

from atrium.sdk import App, Request

MIB = 1 << 20
HELD: list[bytes] = []

app = App()


@app.route("POST", "/alloc")
def alloc(request: Request) -> dict[str, object]:
    for _ in range(int(request.query.get("mib", "1"))):
        HELD.append(b"\x01" * MIB)  # written byte by byte: every page resident
    return {"heldMiB": len(HELD)}


@app.route("POST", "/fork")
def fork(request: Request) -> dict[str, object]:
    children: list[int] = []
    failed = 0
    for _ in range(int(request.query.get("n", "1"))):
        try:
            pid = os.fork()
        except OSError:
            failed += 1
            continue
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return {"forked": len(children), "failed": failed}


if __name__ == "__main__":
    app.run()
