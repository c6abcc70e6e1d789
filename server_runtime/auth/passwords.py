"""Password hashing with argon2id (argon2-cffi), off the event loop.

Hashing is deliberately slow and memory-hungry, so it runs in a small pool of worker threads of its own,
``concurrency`` of them (a burst of sign-ins must not starve the sync sessions or the default executor), behind
a bounded queue that is fair between callers' keys (``hash_queue``; a full queue raises ``QueueFull``). Verifying against ``None`` (no such account,
or an account without a password) still verifies against a dummy hash, so an unknown email costs the same
time as a wrong password.
"""

from __future__ import annotations

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


class PasswordService:
    def __init__(
        self,
        hasher: PasswordHasher | None = None,
        *,
        concurrency: int = 2,
        waiting: int = 8,
        per_key: int = 2,
    ) -> None:
        self.hasher = hasher or PasswordHasher()
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
