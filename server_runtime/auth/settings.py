"""Auth settings a server built from the environment reads (``python -m server_runtime`` with ``AUTH_SECRET``).

``OFFLINE_AUTH_ACCESS_TTL`` and ``OFFLINE_AUTH_REFRESH_TTL`` (seconds) set the token lifetimes; every field of
``RateLimits`` can be set as ``OFFLINE_AUTH_<FIELD>`` (upper case, e.g. ``OFFLINE_AUTH_ADDRESS_ATTEMPTS=100``
for many users behind one NAT); ``OFFLINE_AUDIT_MAX_ENTRIES`` and ``OFFLINE_AUDIT_MAX_AGE_DAYS`` bound the audit
log (``audit``); ``OFFLINE_AUTH_REQUIRE_VERIFIED_EMAIL`` sets ``require_verified_email`` (``true``,
``sign-in``, ``sync``). Unset variables keep the defaults; a bad value is an error naming the variable.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from offline.core.errors import OfflineError

from .audit import AuditRetention
from .rate_limit import RateLimits, rate_limits_from
from .tokens import AUTH_CONFIG

__all__ = ["auth_options_from_environment"]

_PREFIX = "OFFLINE_AUTH_"


def _number(env: Mapping[str, str], name: str, whole: bool) -> float | int | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or (whole and not value.is_integer()):
        kind = "a positive whole number" if whole else "a positive number"
        raise OfflineError(
            f"{name} must be {kind} (got {text[:32]!r}); fix or remove it", AUTH_CONFIG, {"field": name}
        )
    return int(value) if whole else value


def auth_options_from_environment(env: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for ``create_auth_routes`` from ``OFFLINE_AUTH_*`` variables."""
    options: dict[str, Any] = {}
    for option in ("access_ttl", "refresh_ttl"):
        value = _number(env, _PREFIX + option.upper(), whole=False)
        if value is not None:
            options[option] = value
    limits: dict[str, Any] = {}
    for f in dataclasses.fields(RateLimits):
        value = _number(env, _PREFIX + f.name.upper(), whole=f.type in (int, "int"))
        if value is not None:
            limits[f.name] = value
    if limits:
        options["rate_limits"] = rate_limits_from(limits)
    retention: dict[str, Any] = {}
    for name, field, whole in (
        ("OFFLINE_AUDIT_MAX_ENTRIES", "max_entries", True),
        ("OFFLINE_AUDIT_MAX_AGE_DAYS", "max_age_days", False),
    ):
        value = _number(env, name, whole=whole)
        if value is not None:
            retention[field] = value
    if retention:
        options["audit_retention"] = AuditRetention(**retention)
    required = env.get(_PREFIX + "REQUIRE_VERIFIED_EMAIL", "").strip().lower()
    if required:
        options["require_verified_email"] = _required_checks(required)
    return options


def _required_checks(text: str) -> bool | list[str]:
    """``OFFLINE_AUTH_REQUIRE_VERIFIED_EMAIL``: true/1 (sign-in and sync), false/0, or ``sign-in``, ``sync``
    or ``sign-in,sync``."""
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(name not in ("sign-in", "sync") for name in names):
        name = _PREFIX + "REQUIRE_VERIFIED_EMAIL"
        raise OfflineError(
            f"{name} must be true, false, sign-in, sync or sign-in,sync; fix or remove it",
            AUTH_CONFIG,
            {"field": name},
        )
    return names
