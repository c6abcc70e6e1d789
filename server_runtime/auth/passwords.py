"""Password hashing with argon2id (argon2-cffi), off the event loop.

Hashing is deliberately slow and memory-hungry, so it runs in a small pool of worker threads of its own
(by default cores / argon2 lanes, at least one: a burst of sign-ins must not starve the sync sessions or the
default executor), behind a bounded queue that is fair between callers' keys (``hash_queue``; a full queue
raises ``QueueFull``). Verifying against ``None`` (no such account, or an account without a password) still
verifies against a dummy hash, so an unknown email costs the same time as a wrong password.
"""

from __future__ import annotations

import os
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from offline.core.errors import OfflineError

from .hash_queue import HashQueue, QueueFull

__all__ = [
    "MAX_PASSWORD_CHARS",
    "MIN_PASSWORD_CHARS",
    "PasswordService",
    "QueueFull",
    "check_password_shape",
]

MIN_PASSWORD_CHARS = 8
#: Hashing cost grows with the input; a cap keeps one request from buying a lot of CPU.
MAX_PASSWORD_CHARS = 1024


def check_password_shape(password: object) -> str | None:
    """Why ``password`` cannot be used (None when it can). At least 8 characters, no composition rules."""
    if not isinstance(password, str):
        return "password must be a string"
    if len(password) < MIN_PASSWORD_CHARS:
        return f"password must be at least {MIN_PASSWORD_CHARS} characters long"
    if len(password) > MAX_PASSWORD_CHARS:
        return f"password must be at most {MAX_PASSWORD_CHARS} characters long"
    return None


def default_concurrency(hasher: PasswordHasher) -> int:
    """Hashing threads for this machine: each argon2 check already runs ``parallelism`` lanes on threads of
    its own, so more checks at once than cores / lanes only makes each slower (a sign-in waits for the one
    before it and then takes twice as long), without checking more passwords a second."""
    return max(1, (os.cpu_count() or 1) // max(1, hasher.parallelism))


class PasswordService:
    def __init__(
        self,
        hasher: PasswordHasher | None = None,
        *,
        concurrency: int | None = None,
        waiting: int = 8,
        per_key: int = 2,
    ) -> None:
        self.hasher = hasher or PasswordHasher()
        if concurrency is None:
            concurrency = default_concurrency(self.hasher)
        self.queue = HashQueue(concurrency, waiting=waiting, per_key=per_key)
        self._dummy: str | None = None

    def close(self) -> None:
        self.queue.close()

    async def hash(self, password: str, *, key: str = "") -> str:
        """The argon2 hash of ``password``; ``key`` (the client address) is whose share of the queue it uses."""
        return await self.queue.run(key, self.hasher.hash, password)

    async def verify(self, password_hash: str | None, password: str, *, key: str = "") -> bool:
        """True when ``password`` matches; with ``password_hash`` None, spend the same work and say False."""
        if password_hash is None:
            await self._verify(await self._dummy_hash(key), password, key)
            return False
        return await self._verify(password_hash, password, key)

    def needs_rehash(self, password_hash: str) -> bool:
        """True when the hash was made with weaker parameters than the hasher's current ones."""
        try:
            return self.hasher.check_needs_rehash(password_hash)
        except InvalidHashError:
            return False

    async def _verify(self, password_hash: str, password: str, key: str) -> bool:
        return await self.queue.run(key, self._verify_sync, password_hash, password)

    def _verify_sync(self, password_hash: str, password: str) -> bool:
        try:
            return self.hasher.verify(password_hash, password)
        except VerifyMismatchError:
            return False
        except (VerificationError, InvalidHashError) as exc:
            # A stored hash we cannot read: a corrupted row or a foreign format. Not the user's fault.
            raise OfflineError(
                "a stored password hash is not a valid argon2 hash; reset that account's password",
                "STORAGE_ERROR",
                {"field": "password_hash", "cause": type(exc).__name__},
            ) from None

    async def _dummy_hash(self, key: str) -> str:
        if self._dummy is None:
            # Same parameters as real hashes, so verifying against it costs the same.
            self._dummy = await self.hash(secrets.token_urlsafe(16), key=key)
        return self._dummy
