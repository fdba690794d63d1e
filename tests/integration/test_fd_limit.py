"""A real exhausted descriptor limit on a real `atrium serve` (issue 14 row 2): the shell's
``RLIMIT_NOFILE`` is lowered from outside (``prlimit``) to the descriptors it holds, so the next
spawn meets EMFILE before its child starts. That launch must answer ``502 spawn_failed`` with cause
``setup`` and leave its instance in ``error`` (never ``500`` nor stuck in ``creating``), the
shell must go on answering, and once the limit is raised a retry must start the same instance."""

from __future__ import annotations

import resource
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import serving

pytestmark = pytest.mark.integration
APP = "com.atrium.notes"


def _highest_fd(pid: int) -> int:
    return max(int(path.name) for path in Path(f"/proc/{pid}/fd").iterdir())


def _state(api: httpx.Client, iid: str) -> str:
    response = api.get(f"/api/instances/{iid}")
    assert response.status_code == 200, response.text
    state: str = response.json()["state"]
    return state


def test_a_spawn_at_the_fd_limit_goes_to_error_and_retries_once_raised(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with serving(home) as served, served.client() as api:  # the best runner: bwrap here
        assert api.get("/api/apps").status_code == 200  # the connection stays open (keep-alive)
        pid = served.proc.pid
        original = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        failed: dict[str, str] | None = None
        try:
            # the limit counts descriptor numbers: holes below the highest are used first, so
            # launch until the spawn meets EMFILE (each launch that succeeds fills holes)
            for _ in range(30):
                ceiling = _highest_fd(pid) + 1
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (ceiling, original[1]))
                response = api.post("/api/instances", json={"appId": APP, "new": True})
                assert response.status_code in (200, 502), response.text
                if response.status_code == 502:
                    failed = response.json()["error"]
                    break
                resource.prlimit(pid, resource.RLIMIT_NOFILE, original)
            assert failed is not None, "no launch met the descriptor limit"
            assert failed["code"] == "spawn_failed", failed
            assert failed["cause"] == "setup", failed
            assert "Too many open files" in failed["message"], failed
            stuck = [
                i
                for i in api.get("/api/instances").json()
                if i["state"] in ("creating", "starting")
            ]
            assert stuck == []
            broken = [i for i in api.get("/api/instances").json() if i["state"] == "error"]
            assert len(broken) == 1, broken
            iid = broken[0]["instanceId"]
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, original)
        retried = api.post(f"/api/instances/{iid}/retry")
        assert retried.status_code == 200, retried.text
        assert retried.json()["state"] == "started"
        assert api.delete(f"/api/instances/{iid}").status_code == 200
        assert served.proc.poll() is None
