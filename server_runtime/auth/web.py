"""HTTP plumbing shared by every auth route: the error answer, JSON bodies, Bearer tokens and field checks.

An error is ``{"error": {"code", "message", "field"?}}`` with ``Cache-Control: no-store``; messages say what
to do next and never quote a submitted value (it may be a password, a code or a token).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from offline.core.errors import OfflineError

from ..client_address import client_address as _client_address
from .tokens import AUTH_CONFIG

__all__ = [
    "MAX_BODY_BYTES",
    "AuthError",
    "auth_failed",
    "bearer",
    "client_address",
    "email_field",
    "invalid",
    "iso",
    "normalize_email",
    "read_body",
    "seconds_option",
    "string_field",
]

MAX_BODY_BYTES: Final = 64 * 1024

# -- errors ----------------------------------------------------------------------------------------------------


class AuthError(Exception):
    """An answer other than success: status, code and a message telling the caller what to do next."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = dict(headers or {})

    def response(self) -> Response:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return JSONResponse(
            {"error": error}, status_code=self.status, headers={"Cache-Control": "no-store", **self.headers}
        )


def invalid(field: str, message: str) -> AuthError:
    return AuthError(400, "INVALID_INPUT", message, field=field)


_AUTH_FAILED_MESSAGE: Final = (
    "the access token is missing, invalid, expired or revoked; refresh it or sign in again"
)


def auth_failed() -> AuthError:
    return AuthError(401, "AUTH_FAILED", _AUTH_FAILED_MESSAGE, headers={"WWW-Authenticate": "Bearer"})


# -- request helpers ----------------------------------------------------------------------------------------------


async def read_body(request: Request, *, required: bool = True) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise invalid("body", f"the request body is larger than {MAX_BODY_BYTES} bytes")
    if not raw.strip():
        if required:
            raise invalid("body", "send a JSON object as the request body")
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise invalid("body", "the request body is not valid JSON; send a JSON object") from None
    except RecursionError:  # thousands of nested brackets: refused, not a crash (500) of the route
        raise invalid("body", "the request body nests too deeply; send a flat JSON object") from None
    if not isinstance(value, dict):
        raise invalid("body", "the request body must be a JSON object")
    return value


def bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def normalize_email(value: object) -> str | None:
    """The email in canonical form (trimmed, lower case), or None when it is not a plausible address."""
    if not isinstance(value, str):
        return None
    email = value.strip().lower()
    if not 3 <= len(email) <= 254 or email.count("@") != 1:
        return None
    local, domain = email.split("@")
    if not local or not domain or domain.startswith(".") or domain.endswith("."):
        return None
    if any(ch.isspace() or ord(ch) < 32 for ch in email):
        return None
    return email


def email_field(body: Mapping[str, Any]) -> str:
    email = normalize_email(body.get("email"))
    if email is None:
        raise invalid("email", "email must be an email address such as name@example.com")
    return email


def string_field(body: Mapping[str, Any], name: str, *, limit: int = 4096) -> str:
    value = body.get(name)
    if value is None:
        raise invalid(name, f"{name} is required (a non-empty string)")
    if not isinstance(value, str) or not value:
        raise invalid(name, f"{name} must be a non-empty string")
    if len(value) > limit:
        raise invalid(name, f"{name} is longer than {limit} characters")
    return value


def client_address(request: Request) -> str:
    # One rule for every per-address limit: forwarding headers count only from OFFLINE_TRUSTED_PROXIES.
    return _client_address(request)


def iso(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def seconds_option(value: float | datetime.timedelta, name: str) -> int:
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 1:
        raise OfflineError(
            f"{name} must be at least 1 second (a number of seconds or a timedelta)",
            AUTH_CONFIG,
            {"field": name},
        )
    return int(seconds)
