"""The sign-ins in progress are bounded: anyone may start one, so the oldest go first."""

from __future__ import annotations

from atrium.api.oidc import PendingSignIns


def test_the_store_of_sign_ins_in_progress_keeps_the_newest_up_to_its_cap() -> None:
    pending = PendingSignIns(cap=3)
    for n in range(10):
        pending.put(f"cookie-{n}", {"n": n})
    assert len(pending) == 3
    assert pending.get("cookie-0") is None
    assert pending.get("cookie-9") == {"n": 9}
    pending.drop("cookie-9")
    assert pending.get("cookie-9") is None
    assert pending.get(None) is None
