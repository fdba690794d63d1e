"""Fixture `test.fault.crashes`: exits with code 7 (or ``?code=``) shortly after POST /crash."""

from __future__ import annotations

import os
import threading

from atrium.sdk import App, HttpError, Request

EXIT_DELAY_SECONDS = 0.05  # lets the answer reach the caller first

app = App()


def crash(request: Request) -> dict[str, object]:
    raw = request.query.get("code", "7")
    if not raw.isdigit() or not 0 <= int(raw) <= 255:
        raise HttpError(400, f"code must be an exit code 0-255, not {raw!r}")
    code = int(raw)
    threading.Timer(EXIT_DELAY_SECONDS, os._exit, (code,)).start()
    return {"exitCode": code}


@app.route("POST", "/crash")
def crash_route(request: Request) -> dict[str, object]:
    return crash(request)


@app.provider("/crash")
def crash_entry(request: Request) -> dict[str, object]:
    if request.subpath == "abort":
        os._exit(9)  # dies mid-request: the caller gets no answer at all
    if request.method != "POST":
        raise HttpError(405, "POST to crash", headers={"Allow": "POST"})
    return crash(request)


if __name__ == "__main__":
    app.run()
