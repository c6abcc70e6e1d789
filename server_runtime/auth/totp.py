"""TOTP (RFC 6238, via pyotp) and recovery codes: the secrets, their storage form and code checks.

- A TOTP secret is 160 random bits (base32, as authenticator apps expect), stored sealed with AES-GCM under a
  key derived from AUTH_SECRET: a copy of the database alone does not give away anyone's second factor.
  Rotating AUTH_SECRET therefore makes existing enrolments unreadable; those users sign in with a recovery
  code, disable TOTP and enrol again.
- A code is accepted for the current 30-second step and one step either side (clock drift), and only for a
  step newer than the last accepted one, so a code cannot be replayed, not even within its window.
- Recovery codes are 80 random bits each (16 base32 characters, shown in groups of four); only their SHA-256
  is stored, which leaves nothing to guess at that size, and which does not depend on AUTH_SECRET.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Final

import pyotp
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "RECOVERY_CODE_COUNT",
    "TotpKeys",
    "hash_recovery_code",
    "new_recovery_codes",
    "normalize_code",
]

DIGITS: Final = 6
PERIOD: Final = 30
#: Steps either side of the current one that are still accepted (clock drift between phone and server).
DRIFT_STEPS: Final = 1
RECOVERY_CODE_COUNT: Final = 10
_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz234567"
_RECOVERY_CHARS: Final = 16
_SEAL_VERSION: Final = "v1"


def normalize_code(value: str) -> str:
    """A code as typed, without spaces and dashes, lower case (recovery codes) or digits (TOTP)."""
    return "".join(ch for ch in value.strip().lower() if ch not in " -")


def new_recovery_codes(count: int = RECOVERY_CODE_COUNT) -> list[str]:
    """Fresh recovery codes as shown to the user, e.g. ``k3jd-82nf-pq7a-zz4m``."""
    out = []
    for _ in range(count):
        raw = "".join(secrets.choice(_ALPHABET) for _ in range(_RECOVERY_CHARS))
        out.append("-".join(raw[i : i + 4] for i in range(0, _RECOVERY_CHARS, 4)))
    return out


def hash_recovery_code(code: str) -> str:
    return hashlib.sha256(normalize_code(code).encode("utf-8")).hexdigest()


class TotpKeys:
    """Seals TOTP secrets under a key derived from the auth secret, and checks codes."""

    def __init__(self, auth_secret: bytes, issuer: str) -> None:
        # A separate key per purpose: HMAC-SHA256 as the derivation function, keyed by the auth secret.
        self._aead = AESGCM(
            hmac.new(auth_secret, b"offline-auth/totp-secret-seal/v1", hashlib.sha256).digest()
        )
        self.issuer = issuer

    def __repr__(self) -> str:
        return f"TotpKeys(issuer={self.issuer!r})"

    @staticmethod
    def new_secret() -> str:
        return pyotp.random_base32(32)

    def seal(self, secret: str, user_id: str) -> str:
        nonce = secrets.token_bytes(12)
        # The user id is authenticated data: a sealed secret copied onto another user's row does not open.
        sealed = self._aead.encrypt(nonce, secret.encode("ascii"), user_id.encode("utf-8"))
        return f"{_SEAL_VERSION}:" + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")

    def open(self, sealed: str, user_id: str) -> str | None:
        """The secret, or None when it cannot be opened (AUTH_SECRET changed, or the row was tampered with)."""
        version, _, body = sealed.partition(":")
        if version != _SEAL_VERSION:
            return None
        try:
            raw = base64.urlsafe_b64decode(body.encode("ascii"))
            return self._aead.decrypt(raw[:12], raw[12:], user_id.encode("utf-8")).decode("ascii")
        except (InvalidTag, ValueError, binascii.Error):
            return None

    def provisioning_uri(self, secret: str, account: str) -> str:
        return pyotp.TOTP(secret, digits=DIGITS, interval=PERIOD).provisioning_uri(
            name=account, issuer_name=self.issuer
        )

    @staticmethod
    def matching_step(secret: str, code: str, now: float) -> int | None:
        """The time step ``code`` belongs to (within the drift window), or None when it matches none."""
        code = normalize_code(code)
        if len(code) != DIGITS or not code.isdigit():
            return None
        totp = pyotp.TOTP(secret, digits=DIGITS, interval=PERIOD)
        current = int(now // PERIOD)
        found: int | None = None
        # Every candidate is compared (constant work whichever step matches).
        for step in range(current - DRIFT_STEPS, current + DRIFT_STEPS + 1):
            if hmac.compare_digest(totp.generate_otp(step), code) and found is None:
                found = step
        return found
