"""Client address keys and the per-address rate limit, with the time given: no clock, no
sleeping. The limit per (account, address) is in the database: tests/state/test_throttle_state.py."""

from __future__ import annotations

from atrium.users.throttle import RateLimit, address_key


def test_address_keys() -> None:
    assert address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key("2001:DB8::1") == "2001:db8::/64"
    assert address_key("2001:db8::1%eth0") == "2001:db8::/64"
    assert address_key("::1") == "::/64"  # loopback: one host whatever its address
    assert address_key("") == ""
    assert address_key("not an address" * 20) == ("not an address" * 20)[:64]


def test_a_rate_limit_refuses_past_its_share_and_counts_no_refusal() -> None:
    limit = RateLimit(3, 60.0)
    assert [limit.take("10.0.0.1", float(n)) for n in range(3)] == [None, None, None]
    assert limit.take("10.0.0.1", 10.0) == 50
    assert limit.take("10.0.0.2", 10.0) is None
    # refusals are not counted: once the first event leaves the window, one more may come
    assert limit.take("10.0.0.1", 60.0) is None
    assert limit.take("10.0.0.1", 60.5) == 1


def test_a_rate_limit_remembers_a_bounded_number_of_keys() -> None:
    limit = RateLimit(1, 60.0, max_keys=10)
    for n in range(1000):
        limit.take(f"10.0.{n // 256}.{n % 256}", 0.0)
    assert len(limit) == 10
