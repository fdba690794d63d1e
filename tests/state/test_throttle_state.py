"""The sign-in limit per (account, address) in the state database, on SQLite and PostgreSQL, with
the time given: no clock, no sleeping. Two throttles on one database are two shells."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from atrium.state.database import Database
from atrium.state.schema import sign_in_failures
from atrium.users.throttle import ADDRESS_LIMIT, LIMIT, WINDOW, Refused, SignInThrottle


class Peeked(Exception):
    """Ends an attempt's block: nothing is counted."""


async def retry_after(
    throttle: SignInThrottle, account: str, address: str, now: float
) -> int | None:
    """The seconds an attempt at ``now`` would be told to wait, without counting it."""
    refused = await refusal(throttle, account, address, now)
    return None if refused is None else refused.seconds


async def refusal(
    throttle: SignInThrottle, account: str, address: str, now: float
) -> Refused | None:
    """What an attempt at ``now`` would be told, without counting it."""
    try:
        async with throttle.attempt(account, address, now) as refused:
            raise Peeked(refused)
    except Peeked as peeked:
        found: Refused | None = peeked.args[0]
        return found


async def fail(
    throttle: SignInThrottle, times: int, at: float, account: str = "bob", address: str = "10.0.0.1"
) -> None:
    for _ in range(times):
        async with throttle.attempt(account, address, at) as wait:
            assert wait is None


async def rows(db: Database) -> int:
    async with db.connect() as conn:
        return int(
            (
                await conn.execute(sa.select(sa.func.count()).select_from(sign_in_failures))
            ).scalar_one()
        )


async def test_the_fifth_failure_limits_the_pair_until_the_oldest_leaves_the_window(
    db: Database,
) -> None:
    throttle = SignInThrottle(db)
    await fail(throttle, LIMIT - 1, 100.0)
    assert await retry_after(throttle, "bob", "10.0.0.1", 100.0) is None
    await fail(throttle, 1, 110.0)
    assert await retry_after(throttle, "bob", "10.0.0.1", 110.0) == 50
    assert await retry_after(throttle, "bob", "10.0.0.1", 159.5) == 1
    async with throttle.attempt("bob", "10.0.0.1", 140.0) as refused:
        assert refused == Refused(20, "account")  # a refused attempt is not counted
    assert await retry_after(throttle, "bob", "10.0.0.1", 100.0 + WINDOW) is None


async def test_every_shell_of_one_database_counts_the_pair_together(db: Database) -> None:
    one, two = SignInThrottle(db), SignInThrottle(db)
    await fail(one, LIMIT, 0.0)
    assert await retry_after(two, "bob", "10.0.0.1", 1.0) == 59


async def test_attempts_made_at_once_are_counted_one_after_another(
    db: Database, database_url: str
) -> None:
    """Two shells (two engines) checking one pair at once: each check and count is one
    transaction under the pair's lock, so no more than the limit get through."""
    async with Database.open(database_url) as other:
        throttles = [SignInThrottle(db), SignInThrottle(other)]

        async def attempt(n: int) -> Refused | None:
            async with throttles[n % 2].attempt("bob", "10.0.0.1", 5.0) as refused:
                return refused

        waits = await asyncio.gather(*(attempt(n) for n in range(3 * LIMIT)))
    assert waits.count(None) == LIMIT


async def test_only_the_pair_is_limited_and_a_success_forgets_it(db: Database) -> None:
    throttle = SignInThrottle(db)
    await fail(throttle, LIMIT, 0.0)
    assert await retry_after(throttle, "bob", "10.0.0.1", 1.0) is not None
    assert await retry_after(throttle, "bob", "10.0.0.2", 1.0) is None
    assert await retry_after(throttle, "carol", "10.0.0.1", 1.0) is None
    await throttle.succeeded("bob", "10.0.0.1")
    assert await retry_after(throttle, "bob", "10.0.0.1", 1.0) is None
    assert await rows(db) == LIMIT  # the address's own count stays: a success is a sign-in too


async def test_spraying_names_keeps_the_table_bounded(db: Database) -> None:
    throttle = SignInThrottle(db, max_rows=20, address_limit=1000)
    for n in range(100):
        await fail(throttle, 1, n / 100, account=f"name{n}")
    assert await rows(db) <= 20
    await fail(throttle, LIMIT, 1.0)
    assert await retry_after(throttle, "bob", "10.0.0.1", 2.0) is not None  # the newest stay
    # an attempt after the window leaves only itself: every pair's old rows went
    await fail(throttle, 1, 1.0 + WINDOW, account="late")
    assert await rows(db) == 2  # its failure and its address's count


async def test_a_long_name_is_remembered_cut(db: Database) -> None:
    throttle = SignInThrottle(db)
    await fail(throttle, LIMIT, 0.0, "x" * 10_000)
    assert await retry_after(throttle, "x" * 64, "10.0.0.1", 1.0) is not None


async def test_ipv6_addresses_of_one_64_prefix_share_one_count(db: Database) -> None:
    """One host given a /64 has 2^64 addresses: counted one by one, each would bring five fresh
    guesses. The prefix is the unit an IPv6 network hands out, so it is what is counted."""
    throttle = SignInThrottle(db)
    for n in range(LIMIT):
        await fail(throttle, 1, 0.0, address=f"2001:db8:1:2::{n + 1:x}")
    assert await retry_after(throttle, "bob", "2001:db8:1:2:ffff:ffff:ffff:ffff", 1.0) is not None
    assert await retry_after(throttle, "bob", "2001:db8:1:3::1", 1.0) is None  # another /64
    assert await retry_after(throttle, "carol", "2001:db8:1:2::1", 1.0) is None
    # IPv4 by its full address, IPv4-mapped IPv6 as the IPv4 it maps
    await fail(throttle, LIMIT, 0.0)
    assert await retry_after(throttle, "bob", "::ffff:10.0.0.1", 1.0) is not None
    assert await retry_after(throttle, "bob", "::ffff:10.0.0.2", 1.0) is None


async def test_one_address_has_a_share_of_sign_ins_whatever_the_names_on_every_shell(
    db: Database,
) -> None:
    """Spraying one password over many names never meets a pair's limit: the address has its
    own, counted in the database, so spread over two shells it is no larger."""
    one, two = SignInThrottle(db), SignInThrottle(db)
    for n in range(ADDRESS_LIMIT):
        await fail((one, two)[n % 2], 1, float(n), account=f"user{n}")
    assert await refusal(one, "bob", "10.0.0.1", 40.0) == Refused(20, "address")
    assert await refusal(two, "carol", "10.0.0.1", 40.0) == Refused(20, "address")
    assert await refusal(two, "bob", "10.0.0.2", 40.0) is None  # another address
    # a success does not give the address its share back; the window does, one by one
    await one.succeeded("user0", "10.0.0.1")
    assert await refusal(one, "bob", "10.0.0.1", 40.0) is not None
    assert await refusal(one, "bob", "10.0.0.1", WINDOW + 0.5) is None


async def test_the_pair_is_named_before_the_address(db: Database) -> None:
    """An attempt both limits refuse is told the pair's (that account from this address)."""
    throttle = SignInThrottle(db, address_limit=LIMIT)
    await fail(throttle, LIMIT, 0.0)
    assert await refusal(throttle, "bob", "10.0.0.1", 1.0) == Refused(59, "account")
    assert await refusal(throttle, "carol", "10.0.0.1", 1.0) == Refused(59, "address")
