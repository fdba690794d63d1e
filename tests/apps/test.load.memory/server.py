"""Fixture `test.load.memory`: 48 MiB held here, 32 MiB in a helper child; POST /burn spins."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from atrium.sdk import App, Request

MIB = 1 << 20
#: written byte by byte, so every page is resident (a zeroed buffer may not be)
BALLAST = b"\x01" * (48 * MIB)
HELPER = subprocess.Popen(
    [sys.executable, "-c", f"import time\nb = b'\\x01' * {32 * MIB}\ntime.sleep(1e6)"]
)
BURN_SECONDS = 3.0

app = App()


def _spin() -> None:
    end = time.monotonic() + BURN_SECONDS
    while time.monotonic() < end:
        pass


@app.route("POST", "/burn")
def burn(request: Request) -> dict[str, object]:
    threading.Thread(target=_spin, daemon=True).start()
    return {"burning": BURN_SECONDS}


if __name__ == "__main__":
    app.run()
