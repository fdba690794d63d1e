"""An action asked of another shell (`atrium.lifecycle.asked`) must be answered by the shell
that was asked before the balancer gives up on it: deploy/haproxy.cfg's `timeout server` for
ordinary answers ended the request at 120 s with HAProxy's own 504, while the shell still waited
up to 5 + 120 s to say `shell_timeout` with `taken: true` (the move goes on there): the caller
could not tell whether anything was done."""

from __future__ import annotations

import re

from atrium.lifecycle import asked
from tests.conftest import REPO_DIR


def _seconds(value: str) -> float:
    number, unit = re.fullmatch(r"([0-9]+)(ms|s|m|h)?", value).groups()  # type: ignore[union-attr]
    return float(number) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit or "ms"]


def test_an_asked_action_is_answered_before_the_balancer_gives_up() -> None:
    config = (REPO_DIR / "deploy" / "haproxy.cfg").read_text()
    defaults = config.split("\ndefaults\n", 1)[1].split("\nfrontend ", 1)[0]
    [server] = re.findall(r"^\s*timeout server (\S+)", defaults, flags=re.MULTILINE)
    # a second for the rest of the request (the checks, the rows, the answer)
    assert _seconds(server) >= asked.TAKE_SECONDS + asked.ANSWER_SECONDS + 1
