"""Password hashes: argon2id with parameters pinned here, at most a few computed at once, off the
event loop (decisions.md "Users: passwords").

The parameters are written into every hash, so raising them later re-hashes each password at its
next good sign-in (`needs_rehash`). An unknown user is checked against a dummy hash so that a wrong
name and a wrong password take the same time.
"""

from __future__ import annotations

import asyncio
from typing import Final

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

#: OWASP's minimum for argon2id (m = 19 MiB, t = 2, p = 1); about 30 ms of CPU per hash here
TIME_COST: Final = 2
MEMORY_KIB: Final = 19 * 1024
PARALLELISM: Final = 1
#: hashes computed at once; the rest wait their turn (each holds MEMORY_KIB while it runs)
MAX_CONCURRENT: Final = 2
MIN_LENGTH: Final = 8
MAX_LENGTH: Final = 1024

_HASHER: Final = PasswordHasher(
    time_cost=TIME_COST,
    memory_cost=MEMORY_KIB,
    parallelism=PARALLELISM,
    hash_len=32,
    salt_len=16,
    type=Type.ID,
)


def password_problem(password: str) -> str | None:
    """Why ``password`` cannot be set, or None."""
    if len(password) < MIN_LENGTH:
        return f"a password needs at least {MIN_LENGTH} characters"
    if len(password) > MAX_LENGTH:
        return f"a password has at most {MAX_LENGTH} characters"
    return None


class Passwords:
    """Hash and verify with a bound on how many run at once."""

    def __init__(self, max_concurrent: int = MAX_CONCURRENT) -> None:
        self._slots = asyncio.Semaphore(max_concurrent)
        self._dummy: str | None = None

    async def hash(self, password: str) -> str:
        async with self._slots:
            return await asyncio.to_thread(_HASHER.hash, password)

    async def verify(self, stored: str | None, password: str) -> bool:
        """Whether ``password`` matches ``stored``; None (no such user or no password) still
        spends one verification, against a dummy hash, and answers False."""
        if stored is None:
            if self._dummy is None:
                self._dummy = await self.hash("not a password of anyone")
            await self._check(self._dummy, password)
            return False
        return await self._check(stored, password)

    async def _check(self, stored: str, password: str) -> bool:
        async with self._slots:
            return await asyncio.to_thread(_verify, stored, password)

    @staticmethod
    def needs_rehash(stored: str) -> bool:
        try:
            return _HASHER.check_needs_rehash(stored)
        except InvalidHashError:
            return True


def _verify(stored: str, password: str) -> bool:
    try:
        return _HASHER.verify(stored, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False
