"""Fixture `test.fault.hookfails`: a hook fails while ``$OS_DATA_DIR/fail-<hook>`` exists."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from atrium.sdk import HOOKS, App, HttpError

app = App()


def failing(hook: str) -> Callable[[dict[str, Any]], Mapping[str, object] | None]:
    def answer(body: dict[str, Any]) -> Mapping[str, object] | None:
        try:
            how = (app.data_dir / f"fail-{hook}").read_text().strip()
        except FileNotFoundError:
            return None  # the SDK's default answer
        if how == "not-ok":
            return {"ok": False, "reason": f"fail-{hook} says not-ok"}
        status = int(how) if how.isdigit() else 500
        raise HttpError(status, f"{hook} fails because fail-{hook} exists")

    return answer


for name in HOOKS:
    app.hook(name)(failing(name))

if __name__ == "__main__":
    app.run()
