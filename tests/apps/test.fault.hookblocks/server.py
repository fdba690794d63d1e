"""Fixture `test.fault.hookblocks`: a hook waits while ``$OS_DATA_DIR/block-<hook>`` exists."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from atrium.sdk import HOOKS, App

POLL_SECONDS = 0.02
MAX_BLOCK_SECONDS = 60.0  # a forgotten file must not hold a thread forever

app = App()


def blocking(hook: str) -> Callable[[dict[str, Any]], Mapping[str, object] | None]:
    def answer(body: dict[str, Any]) -> Mapping[str, object] | None:
        gate = app.data_dir / f"block-{hook}"
        deadline = time.monotonic() + MAX_BLOCK_SECONDS
        while gate.exists() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        return None  # the SDK's default answer

    return answer


for name in HOOKS:
    app.hook(name)(blocking(name))

if __name__ == "__main__":
    app.run()
