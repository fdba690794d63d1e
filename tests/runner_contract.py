"""The runner contract, one suite for every runner, tested through a real shell.

`RunnerContract` holds the test bodies; each takes a ``harness`` fixture (a `Harness`: one shell
on one runner, and what only that runner can say: how to kill an instance from outside the shell,
what it printed, what it leaves behind). A thin test module per world binds them:
``tests/integration/test_runner_contract.py`` (process, bwrap) and
``tests/kube/test_runner_contract.py`` (kubernetes, on the fake cluster). The harness is
module-scoped there: one shell per runner per module, each test launching instances of its own.

The probe (``tests/apps/test.contract.probe``) runs under ``{memoryMiB 64, pids 16}`` and does
on request what the contract needs: log a line, exit, allocate, fork, say its boot token.
"""

from __future__ import annotations

import contextlib
import secrets
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.lifecycle.limits import Cgroups, Limits, detect_cgroups
from tests.integration.conftest import RunningShell, SseReader, wait_for

PROBE = "test.contract.probe"
#: the probe's manifest limits
PROBE_MEMORY_MIB = 64
PROBE_PIDS = 16
GRACEFUL = "probe: stopped gracefully"


def cgroups_usable_here() -> str | None:
    """None when a shell here can make its cgroups, else why not (tried, not guessed: a cgroup
    v2 whose controllers cannot be handed down is detected as v2 and fails only when the shell
    makes its folder)."""
    with tempfile.TemporaryDirectory() as home:
        made = Cgroups(detect_cgroups(), Path(home), Limits(None, None, None))
        made.close()
        if made.enforced:
            return None
    return "no usable cgroup here: a local shell enforces no limits"


@dataclass
class Traces:
    """What a running instance holds on its runner, taken while it runs, to look for after."""

    instance_id: str
    found: dict[str, Any] = field(default_factory=dict)


class Harness(ABC):
    """One shell on one runner (see the module docstring)."""

    runner: str
    shell: RunningShell
    api: httpx.Client
    #: the runner's servers outlive their shell, and the next one adopts them
    survives_shell: bool = False
    #: None: the runner enforces the probe's limits here; else why it cannot (the limit cases skip)
    limits_missing: str | None = None

    @property
    def pids_missing(self) -> str | None:
        """None: the runner holds an instance to its process limit here; else why it cannot."""
        return self.limits_missing

    def launch(self, app_id: str = PROBE) -> dict[str, Any]:
        """A new instance of ``app_id``, started."""
        answer = self.api.post("/api/instances", json={"appId": app_id, "new": True})
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        assert body["state"] == "started", body
        return body

    def events(self, *topics: str) -> SseReader:
        return SseReader(self.api, {"topics": ",".join(topics)})

    @abstractmethod
    def kill_from_outside(self, instance: dict[str, Any]) -> None:
        """End the instance's server the way someone other than the shell would."""

    @abstractmethod
    def output(self, instance_id: str) -> str:
        """Everything the instance printed, still readable after it is destroyed."""

    @abstractmethod
    def traces(self, instance: dict[str, Any]) -> Traces:
        """What the running ``instance`` holds on the runner (processes, cgroup, port; pod,
        Secret, claim)."""

    @abstractmethod
    def leftovers(self, traces: Traces) -> list[str]:
        """What of ``traces`` is still there that should be gone (empty: nothing)."""

    @abstractmethod
    def kept(self, traces: Traces) -> list[str]:
        """What of ``traces`` must outlive a destroy and is gone (empty: all kept)."""

    @abstractmethod
    def restart(self) -> None:
        """Stop the shell (as its operator would) and start a new one on the same home."""


def health(api: httpx.Client, instance_id: str) -> httpx.Response:
    return api.get(f"/api/proxy/{instance_id}/health")


def crash_barrier(harness: Harness, events: SseReader, instance_id: str) -> list[dict[str, Any]]:
    """Wait for the crash of ``instance_id``, then destroy it and wait for its last state
    event: the stream is ordered and crash handling ends before destroy can run, so a second
    `app:crashed` would be in by then. The crashes of ``instance_id`` heard."""
    wait_for(
        lambda: any(e.data["instanceId"] == instance_id for e in events.of("app:crashed")),
        "the crash",
    )
    assert harness.api.delete(f"/api/instances/{instance_id}").status_code == 200
    wait_for(
        lambda: any(
            e.event == "app:state"
            and e.data["instanceId"] == instance_id
            and e.data["to"] == "installed"
            for e in events.events
        ),
        "the crashed instance's destroy",
    )
    return [e.data for e in events.of("app:crashed") if e.data["instanceId"] == instance_id]


class RunnerContract:
    """The contract every runner keeps (bound to a ``harness`` fixture by a test module)."""

    def test_a_spawned_instance_answers_health_with_its_identity(self, harness: Harness) -> None:
        instance = harness.launch()
        answer = health(harness.api, instance["instanceId"])
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"appId": PROBE, "instanceId": instance["instanceId"], "ok": True}

    def test_an_exit_of_its_own_is_one_crash_with_reason_exited(self, harness: Harness) -> None:
        instance_id = harness.launch()["instanceId"]
        events = harness.events("app:crashed", "app:state")
        assert harness.api.post(f"/api/proxy/{instance_id}/exit?code=3").status_code == 200
        crashes = crash_barrier(harness, events, instance_id)
        assert crashes == [
            {
                "type": "app:crashed",
                "instanceId": instance_id,
                "appId": PROBE,
                "exitCode": 3,
                "state": "started",
                "reason": "exited",
            }
        ]

    def test_a_kill_from_outside_the_shell_is_one_crash_with_reason_killed(
        self, harness: Harness
    ) -> None:
        instance = harness.launch()
        instance_id = instance["instanceId"]
        events = harness.events("app:crashed", "app:state")
        harness.kill_from_outside(instance)
        wait_for(lambda: events.of("app:crashed"), "the crash")
        error = harness.api.get(f"/api/instances/{instance_id}").json()
        assert error["state"] == "error"
        crashes = crash_barrier(harness, events, instance_id)
        assert len(crashes) == 1, crashes
        assert (crashes[0]["reason"], crashes[0]["state"]) == ("killed", "started")

    def test_a_stop_is_graceful_and_a_destroy_runs_the_apps_sigterm_handler(
        self, harness: Harness
    ) -> None:
        instance_id = harness.launch()["instanceId"]
        events = harness.events("app:crashed", "app:state")
        stopped = harness.api.post(f"/api/instances/{instance_id}/stop")
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["state"] == "stopped"
        assert health(harness.api, instance_id).status_code == 200  # stopped keeps its server
        assert harness.api.delete(f"/api/instances/{instance_id}").status_code == 200
        wait_for(lambda: GRACEFUL in harness.output(instance_id), "the SIGTERM handler's line")
        assert events.of("app:crashed") == []

    def test_logs_after_a_cursor_give_only_newer_output(self, harness: Harness) -> None:
        instance_id = harness.launch()["instanceId"]
        older, newer = f"older-{secrets.token_hex(4)}", f"newer-{secrets.token_hex(4)}"
        harness.api.post(f"/api/proxy/{instance_id}/log", params={"line": older})
        logs = f"/api/instances/{instance_id}/logs"
        first = wait_for(
            lambda: (r := harness.api.get(logs)).status_code == 200 and older in r.text and r,
            "the first line in the log",
        )
        cursor = first.headers["X-Log-End"]
        nothing = harness.api.get(logs, params={"after": cursor})
        assert nothing.status_code == 200, nothing.text
        assert older not in nothing.text
        harness.api.post(f"/api/proxy/{instance_id}/log", params={"line": newer})
        later = wait_for(
            lambda: newer in (r := harness.api.get(logs, params={"after": cursor})).text and r,
            "the newer line after the cursor",
        )
        assert older not in later.text
        assert later.headers["X-Log-End"] != cursor

    def test_past_its_memory_limit_an_instance_dies_alone_with_reason_oom(
        self, harness: Harness
    ) -> None:
        if harness.limits_missing:
            pytest.skip(harness.limits_missing)
        hog = harness.launch()
        other = harness.launch()
        assert hog["limits"]["memoryMiB"] == PROBE_MEMORY_MIB
        events = harness.events("app:crashed", "app:state")
        with contextlib.suppress(httpx.TransportError):  # it dies mid-answer: the point
            harness.api.post(f"/api/proxy/{hog['instanceId']}/alloc", params={"mib": "200"})
        wait_for(lambda: events.of("app:crashed"), "the crash")
        dead = harness.api.get(f"/api/instances/{hog['instanceId']}").json()
        assert dead["state"] == "error"
        assert "out of memory" in dead["error"]
        assert health(harness.api, other["instanceId"]).status_code == 200
        crashes = crash_barrier(harness, events, hog["instanceId"])
        assert len(crashes) == 1, crashes
        assert crashes[0]["reason"] == "oom"
        assert [e.data["instanceId"] for e in events.of("app:crashed")] == [hog["instanceId"]]

    def test_an_instance_cannot_start_more_processes_than_its_pids_limit(
        self, harness: Harness
    ) -> None:
        if harness.pids_missing:
            pytest.skip(harness.pids_missing)
        instance_id = harness.launch()["instanceId"]
        answer = harness.api.post(f"/api/proxy/{instance_id}/fork", params={"n": "40"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["failed"] > 0
        assert answer.json()["forked"] < PROBE_PIDS
        assert health(harness.api, instance_id).status_code == 200

    def test_destroy_leaves_nothing_behind(self, harness: Harness) -> None:
        instance = harness.launch()
        traces = harness.traces(instance)
        assert harness.leftovers(traces), f"nothing traced of a running instance: {traces}"
        assert harness.api.delete(f"/api/instances/{instance['instanceId']}").status_code == 200
        assert harness.leftovers(traces) == []
        assert harness.kept(traces) == []

    def test_zz_a_shell_restart_adopts_or_leaves_no_orphans(self, harness: Harness) -> None:
        """Last (it restarts the module's shell): a runner whose servers survive its shell has
        them adopted, running on without a restart; a local runner's die with it."""
        instance = harness.launch()
        instance_id = instance["instanceId"]
        boot = harness.api.get(f"/api/proxy/{instance_id}/boot").json()["boot"]
        traces = harness.traces(instance)
        harness.restart()
        listed = [i["instanceId"] for i in harness.api.get("/api/instances").json()]
        if not harness.survives_shell:
            assert instance_id not in listed
            assert harness.leftovers(traces) == []
            return
        assert instance_id in listed
        adopted = harness.api.get(f"/api/instances/{instance_id}").json()
        assert adopted["state"] == "started", adopted
        assert health(harness.api, instance_id).status_code == 200
        assert harness.api.get(f"/api/proxy/{instance_id}/boot").json()["boot"] == boot
