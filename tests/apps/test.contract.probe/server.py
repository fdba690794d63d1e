"""Fixture `test.contract.probe`: what the runner contract suite asks of a running app."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import threading
import time

from atrium.sdk import App, HttpError, Request

MIB = 1 << 20
EXIT_DELAY_SECONDS = 0.05  # lets the answer reach the caller first
BOOT = secrets.token_hex(8)
HELD: list[bytes] = []
#: the lifecycle hooks this process was called with, in order
HOOKS: list[str] = []

app = App()


def _hook(name: str) -> None:
    @app.hook(name)
    def called(body: dict[str, object]) -> None:
        HOOKS.append(name)


for _name in ("onCreate", "onStart"):
    _hook(_name)


def number(request: Request, name: str, default: int, top: int) -> int:
    raw = request.query.get(name, str(default))
    if not raw.isdigit() or int(raw) > top:
        raise HttpError(400, f"{name} must be a whole number 0-{top}, not {raw!r}")
    return int(raw)


@app.route("GET", "/boot")
def boot(request: Request) -> dict[str, object]:
    return {"boot": BOOT, "pid": os.getpid(), "hooks": HOOKS}


@app.route("POST", "/log")
def log(request: Request) -> dict[str, object]:
    line = request.query.get("line", "")
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return {"logged": line}


@app.route("POST", "/exit")
def exit_(request: Request) -> dict[str, object]:
    code = number(request, "code", 3, 255)
    threading.Timer(EXIT_DELAY_SECONDS, os._exit, (code,)).start()
    return {"exitCode": code}


@app.route("POST", "/alloc")
def alloc(request: Request) -> dict[str, object]:
    for _ in range(number(request, "mib", 1, 65536)):
        HELD.append(b"\x01" * MIB)  # written byte by byte: every page resident
    return {"heldMiB": len(HELD)}


@app.route("POST", "/fork")
def fork(request: Request) -> dict[str, object]:
    children: list[int] = []
    failed = 0
    for _ in range(number(request, "n", 1, 1000)):
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


@app.route("POST", "/reach")
def reach(request: Request) -> dict[str, object]:
    """Can this app open a TCP connection to ``host:port``? (the network fence's tests)"""
    host = request.query.get("host", "")
    port = number(request, "port", 80, 65535)
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as err:
        return {"reached": False, "error": str(err)}
    return {"reached": True, "error": None}


if __name__ == "__main__":
    app.run()  # returns on SIGTERM
    sys.stdout.write("probe: stopped gracefully\n")
    sys.stdout.flush()
    sys.exit(0)
