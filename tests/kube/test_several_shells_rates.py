"""The views a caller opens and the actions they ask of other shells' instances, counted per
shell (docs/decisions.md "Several shells: a rate on views and asks"): two real shells on one
PostgreSQL database and one namespace of the fake cluster (tests/kube/conftest.py says why a
fake). Each view was rows and an event every shell reads, and each ask a row, its events and
work on the pod's shell, with no bound: one caller could push every other user's events out of
the kept log and keep the other shells and the cluster busy."""

from __future__ import annotations

from atrium import rates
from atrium.rates import SharedWrites
from tests.integration.conftest import RunningShell
from tests.kube.test_several_shells_actions import requests_of
from tests.kube.test_several_shells_origins import PROBE, SLOW, kube_shells, two_kube_shells
from tests.kube.test_several_shells_views import views_of

__all__ = ["kube_shells", "two_kube_shells"]  # the fixtures, shared with the origins' tests


def test_a_caller_opens_a_bounded_number_of_views_a_minute(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    one, _ = two_kube_shells
    with one.client(timeout=SLOW) as api:
        launched = api.post("/api/instances", json={"appId": PROBE})
        assert launched.status_code == 200, launched.text
        iid = launched.json()["instanceId"]
        slug = one.shell.lifecycle.get(iid).slug
        for _ in range(rates.PER_WINDOW):
            made = api.post(f"/api/instances/{iid}/views")
            assert made.status_code == 200, made.text
        refused = api.post(f"/api/instances/{iid}/views")
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["limit"]) == ("too_many_attempts", "views")
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert error["retryAfter"] == int(refused.headers["Retry-After"])
        assert len(views_of(one.shell.settings.state_url, slug)) == rates.PER_WINDOW  # no row


def test_a_caller_asks_a_bounded_number_of_actions_of_other_shells_a_minute(
    two_kube_shells: tuple[RunningShell, RunningShell],
) -> None:
    """Two asks allowed here, not 120: 120 round trips through the other shell take seconds
    each time the suite runs; the count is the same code whatever its bound."""
    one, two = two_kube_shells
    two.shell.rates = SharedWrites(limit=2)
    url = one.shell.settings.state_url
    with one.client(timeout=SLOW) as api, two.client(one.token, timeout=SLOW) as api_two:
        launched = api.post("/api/instances", json={"appId": PROBE})
        assert launched.status_code == 200, launched.text
        iid = launched.json()["instanceId"]
        for action in ("resume", "resumed"):
            done = api_two.post(f"/api/instances/{iid}/{action}")
            assert done.status_code == 200, done.text
        refused = api_two.post(f"/api/instances/{iid}/pause")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["limit"] == "asks"
        assert len(requests_of(url, iid)) == 2  # nothing asked of shell one
        assert one.shell.lifecycle.get(iid).state.value == "resumed"
        # the other shell's own instance is acted on as before: no ask
        assert api.post(f"/api/instances/{iid}/pause").status_code == 200
