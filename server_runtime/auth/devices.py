"""Known-device tokens: proof that this device signed in to an account before, so guesses spread over many
addresses cannot lock the owner out on a device whose address changed.

Every token pair of a user with an email carries ``deviceToken``: ``<expiry>.<signature>``, an HMAC-SHA256
(key derived from AUTH_SECRET) over the account's normalised email and the expiry, valid for ``TTL`` seconds.
A sign-in that sends a valid one for the email it signs in to is counted in a window of its own, for that
account and device (``sign_in_limits``), instead of its address's and the account's: guesses from its address
or from anywhere else do not keep the owner's device out. The token grants nothing else: it is not a
credential, and a stolen one gives its holder that one window of guesses at that one account. Stateless, so every server process sharing
AUTH_SECRET accepts it, across restarts.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Final

__all__ = ["TTL", "DeviceTokens"]

#: How long a device stays known after its last sign-in or refresh (seconds).
TTL: Final = 180 * 24 * 3600
_LABEL: Final = b"offline known-device token v1"


class DeviceTokens:
    def __init__(self, secret: bytes, *, now: Callable[[], float] | None = None) -> None:
        self._key = hmac.new(secret, _LABEL, hashlib.sha256).digest()
        self._now = now or time.time

    def __repr__(self) -> str:
        return "DeviceTokens()"

    def _signature(self, email: str, expires: int) -> str:
        message = f"{expires}\n{email}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def issue(self, email: str) -> str:
        expires = int(self._now()) + TTL
        return f"{expires}.{self._signature(email, expires)}"

    @staticmethod
    def device_id(token: str) -> str:
        """A short id of a (valid) token, to count its attempts by."""
        return hashlib.sha256(token.encode()).hexdigest()[:32]

    def valid_for(self, token: object, email: str) -> bool:
        """True when ``token`` was issued for ``email`` and has not expired."""
        if not isinstance(token, str) or len(token) > 128:
            return False
        expires_text, _, signature = token.partition(".")
        if not expires_text.isdigit() or len(expires_text) > 12:
            return False
        expires = int(expires_text)
        if expires <= self._now():
            return False
        return hmac.compare_digest(signature, self._signature(email, expires))
