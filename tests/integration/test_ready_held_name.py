"""`GET /api/ready` of a shell that reaches its database but stays cut off from it as a shell:
its shell lock (its host name and home) is held by another session, a second shell of the same
name started while it was cut off (docs/decisions.md "Several shells"). It acts on no instance
then (every move is `database_lost`), for as long as the other lives: the balancer must not send
it requests. The real shell on PostgreSQL; the other shell is a plain session holding the key."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from atrium.state.locks import lock_key
from tests.integration.conftest import RunningShell, StartShell, wait_for
from tests.integration.test_instance_locks import conninfo, other_shell, pg_url, sessions_on

pytestmark = pytest.mark.integration

__all__ = ["other_shell", "pg_url"]  # the fixtures


def test_a_shell_whose_name_another_holds_is_not_ready(
    start_shell: StartShell, pg_url: str, other_shell: psycopg.Connection[Any]
) -> None:
    shell: RunningShell = start_shell(database_url=pg_url)
    coordination = shell.shell.coordination
    key = lock_key("shell", coordination._shell_name)
    with shell.anonymous() as client:
        assert client.get("/api/ready").status_code == 200
        # the other queues for the name, then the shell's sessions end: the name is the other's
        queued = threading.Thread(
            target=other_shell.execute, args=("SELECT pg_advisory_lock(%s)", (key,))
        )
        queued.start()
        wait_for(lambda: any(not g for g, _ in sessions_on(pg_url, key)), "the other queued")
        with psycopg.connect(conninfo(pg_url), autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                (coordination.session_name,),
            )
        queued.join(30)
        wait_for(lambda: coordination._told_foreign, "the shell finding its name held")
        assert coordination.lost is not None
        refused = client.get("/api/ready")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "database_unavailable"
        # the other gone, the shell holds its name again and is ready
        other_shell.execute("SELECT pg_advisory_unlock(%s)", (key,))
        wait_for(lambda: coordination.lost is None, "the shell back")
        assert client.get("/api/ready").status_code == 200
