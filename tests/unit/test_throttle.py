"""The sign-in limit per (account, address), with the time given: no clock, no sleeping."""

from __future__ import annotations

from atrium.users.throttle import LIMIT, WINDOW, RateLimit, SignInThrottle, address_key


def fail(throttle: SignInThrottle, times: int, at: float, account: str = "bob") -> None:
    for _ in range(times):
        throttle.failed(account, "10.0.0.1", at)


def test_the_fifth_failure_limits_the_pair_until_the_oldest_leaves_the_window() -> None:
    throttle = SignInThrottle()
    fail(throttle, LIMIT - 1, 100.0)
    assert throttle.retry_after("bob", "10.0.0.1", 100.0) is None
    throttle.failed("bob", "10.0.0.1", 110.0)
    assert throttle.retry_after("bob", "10.0.0.1", 110.0) == 50
    assert throttle.retry_after("bob", "10.0.0.1", 159.5) == 1
    assert throttle.retry_after("bob", "10.0.0.1", 100.0 + WINDOW) is None


def test_only_the_pair_is_limited() -> None:
    throttle = SignInThrottle()
    fail(throttle, LIMIT, 0.0)
    assert throttle.retry_after("bob", "10.0.0.1", 1.0) is not None
    assert throttle.retry_after("bob", "10.0.0.2", 1.0) is None
    assert throttle.retry_after("carol", "10.0.0.1", 1.0) is None


def test_a_success_forgets_the_pair() -> None:
    throttle = SignInThrottle()
    fail(throttle, LIMIT, 0.0)
    throttle.succeeded("bob", "10.0.0.1")
    assert throttle.retry_after("bob", "10.0.0.1", 1.0) is None
    assert len(throttle) == 0


def test_spraying_names_keeps_the_memory_bounded() -> None:
    throttle = SignInThrottle(max_pairs=100)
    for n in range(1000):
        throttle.failed(f"name{n}", "10.0.0.9", float(n) / 100)
    assert len(throttle) == 100
    # a pair whose failures all left the window goes before a recent one
    throttle = SignInThrottle(max_pairs=2)
    fail(throttle, LIMIT, 0.0, "old")
    fail(throttle, LIMIT, 100.0, "bob")
    throttle.failed("new", "10.0.0.1", 101.0)
    assert throttle.retry_after("bob", "10.0.0.1", 101.0) is not None
    assert len(throttle) == 2


def test_a_long_name_is_remembered_cut() -> None:
    throttle = SignInThrottle()
    fail(throttle, LIMIT, 0.0, "x" * 10_000)
    assert throttle.retry_after("x" * 64, "10.0.0.1", 1.0) is not None


def test_ipv6_addresses_of_one_64_prefix_share_one_count() -> None:
    """One host given a /64 has 2^64 addresses: counted one by one, each would bring five fresh
    guesses. The prefix is the unit an IPv6 network hands out, so it is what is counted."""
    throttle = SignInThrottle()
    for n in range(LIMIT):
        throttle.failed("bob", f"2001:db8:1:2::{n + 1:x}", 0.0)
    assert throttle.retry_after("bob", "2001:db8:1:2:ffff:ffff:ffff:ffff", 1.0) is not None
    assert throttle.retry_after("bob", "2001:db8:1:3::1", 1.0) is None  # another /64
    assert throttle.retry_after("carol", "2001:db8:1:2::1", 1.0) is None  # another account


def test_ipv4_counts_by_full_address_and_mapped_ipv6_is_ipv4() -> None:
    throttle = SignInThrottle()
    fail(throttle, LIMIT, 0.0)
    assert throttle.retry_after("bob", "::ffff:10.0.0.1", 1.0) is not None
    assert throttle.retry_after("bob", "::ffff:10.0.0.2", 1.0) is None
    assert throttle.retry_after("bob", "10.0.0.2", 1.0) is None


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
