"""Reading JWT claims on the client, without verifying the signature.

The client never trusts these claims for anything the server decides (the server verifies every token it
receives); it reads them only to learn when the access token expires and to show scope values. That is why
no crypto library is needed: the payload is base64url-encoded JSON.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any


def decode_claims(token: str) -> dict[str, Any]:
    """The payload of a compact JWT (``header.payload.signature``) as a dict; ValueError if it is not one."""
    parts = token.split(".")
    if len(parts) != 3 or not parts[1]:
        raise ValueError("not a compact JWT (expected three dot-separated parts)")
    payload = parts[1]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        # The message must not quote the token: it is a bearer secret.
        raise ValueError(f"the JWT payload is not base64url JSON ({type(exc).__name__})") from None
    if not isinstance(claims, dict):
        raise ValueError("the JWT payload is not a JSON object")
    return claims


def claims_or_empty(token: str | None) -> dict[str, Any]:
    """`decode_claims`, or {} for a missing or opaque token."""
    if not token:
        return {}
    try:
        return decode_claims(token)
    except ValueError:
        return {}


def expiry_of(token: str) -> float | None:
    """The ``exp`` claim (seconds since the epoch), or None when the token has none or is opaque."""
    exp = claims_or_empty(token).get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    return float(exp)
