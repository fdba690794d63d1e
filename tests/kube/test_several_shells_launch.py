"""A launch among several shells (docs/decisions.md "Several shells: app origins from the
database"): two real shells on one PostgreSQL database and one namespace of the fake cluster
(tests/kube/conftest.py says why a fake). A host page's calls reach any shell behind the load
balancer: the call after a launch, a view of the new instance, may reach the other shell, which
knows the instance by its row only."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.kube.test_several_shells_origins import PROBE, SLOW, StartShell, kube_shells

__all__ = ["kube_shells"]


def test_a_view_asked_of_the_other_shell_right_after_a_launch_is_made(
    kube_shells: StartShell,
) -> None:
    """The launch answers once its row says `started`. It answered when the instance was
    started in memory, its row written a moment later by the shell's row writer: a view asked
    of the other shell meanwhile read the row `creating` and was refused (409 not_serving).
    Here every row write of shell 1 takes a while, as on a loaded database."""
    one, two = kube_shells("one"), kube_shells("two")
    rows: Any = one.shell.lifecycle.rows
    write = rows._write

    async def slow(*args: Any) -> None:
        await asyncio.sleep(0.3)
        await write(*args)

    rows._write = slow
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        launched = api.post("/api/instances", json={"appId": PROBE})
        assert launched.status_code == 200, launched.text
        iid = launched.json()["instanceId"]
        made = api_two.post(f"/api/instances/{iid}/views", json={"path": "/boot"})
        assert made.status_code == 200, made.text
