"""HTTP calls to the auth routes and the mapping of their answers to `AuthError`.

Error bodies are ``{"error": {"code", "message", "field"?}}``; the server's code and message are kept (its
messages say what to do next). Request bodies carry passwords: nothing here logs a request or puts its
body into an error.

The requests go through an `HttpSender`: httpx on CPython, the browser's ``fetch`` under Pyodide (see
`offline.auth.fetch_http`), where httpx cannot open a socket. httpx is imported only when it is used, so
``import offline.auth`` works in a browser that does not have it.
"""

from __future__ import annotations

import email.utils
import json as jsonlib
import sys
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .credentials import Credentials
from .errors import AUTH_FAILED, AUTH_UNAVAILABLE, INVALID_INPUT, RATE_LIMITED, AuthError
from .tokens import expiry_of

if TYPE_CHECKING:
    import httpx

#: JWT NumericDates are whole seconds, so a token may expire up to this much before ``expiresIn`` says.
JWT_TIME_GRANULARITY = 1.0

_STATUS_CODES = {401: AUTH_FAILED, 429: RATE_LIMITED, 400: INVALID_INPUT}


class Headers(Mapping[str, str]):
    """Response headers; names compare case-insensitively (``Retry-After`` == ``retry-after``)."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items = {name.lower(): value for name, value in items}

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class HttpResponse:
    """What the auth client reads of an answer, whichever HTTP stack fetched it."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: Headers, content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not JSON (an empty body included)."""
        return jsonlib.loads(self.content)


class HttpUnreachable(Exception):
    """The request got no HTTP answer (refused, timed out, aborted); the message names the failure only."""


class HttpSender(Protocol):
    """Sends one request and returns its answer, whatever the status; `HttpUnreachable` when none came."""

    async def send(
        self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str], timeout: float
    ) -> HttpResponse: ...


class HttpxSender:
    """`HttpSender` over httpx: a fresh `httpx.AsyncClient` per call unless one is given.

    A client per call costs a connection per call, which auth (a sign-in, a refresh every few minutes) can
    afford, and it works from any event loop: an app may call the same auth client from ``asyncio.run``
    twice. An injected client (tests, custom transports) is used as is and never closed.
    """

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self.client = client

    async def send(
        self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str], timeout: float
    ) -> HttpResponse:
        import httpx  # here, not at module level: Pyodide has no httpx (nor sockets for it)

        try:
            if self.client is not None:
                response = await self.client.request(
                    method, url, content=body, headers=dict(headers), timeout=timeout
                )
            else:
                async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
                    response = await client.request(method, url, content=body, headers=dict(headers))
        except httpx.HTTPError as exc:
            # str(exc) names the failure (refused, timed out), never the request body.
            raise HttpUnreachable(f"{type(exc).__name__}: {exc}") from None
        return HttpResponse(response.status_code, Headers(response.headers.items()), response.content)


def default_sender(http_client: httpx.AsyncClient | None = None) -> HttpSender:
    """httpx (with ``http_client`` when given) on CPython; the browser's fetch under Pyodide."""
    if http_client is None and sys.platform == "emscripten":
        from .fetch_http import FetchSender

        return FetchSender()
    return HttpxSender(http_client)


class AuthHttp:
    """Sends JSON requests to ``<base_url><path>`` through an `HttpSender` (see `default_sender`)."""

    def __init__(
        self,
        base_url: str,
        *,
        http_client: httpx.AsyncClient | None = None,
        timeout: float,
        sender: HttpSender | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.sender = sender if sender is not None else default_sender(http_client)
        self.timeout = timeout

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        bearer: str | None = None,
    ) -> HttpResponse:
        """The response when its status is 2xx; otherwise the `AuthError` it stands for is raised."""
        url = self.base_url + path
        target = url + ("?" + urllib.parse.urlencode(params) if params else "")
        headers = {"Accept": "application/json"}
        if bearer is not None:
            headers["Authorization"] = f"Bearer {bearer}"
        body = None
        if json is not None:
            body = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        try:
            response = await self.sender.send(
                method, target, body=body, headers=headers, timeout=self.timeout
            )
        except HttpUnreachable as exc:
            raise AuthError(
                f"could not reach the auth server at {url} ({exc}); check the network and the server URL, "
                "then try again",
                AUTH_UNAVAILABLE,
                {"url": url, "retriable": True},
            ) from None
        if 200 <= response.status_code < 300:
            return response
        raise error_from_response(response, url)


def _retry_after(response: HttpResponse, error: Mapping[str, Any]) -> float | None:
    header = response.headers.get("Retry-After")
    if header:
        try:
            return max(0.0, float(header))
        except ValueError:
            try:  # the HTTP-date form
                return max(0.0, email.utils.parsedate_to_datetime(header).timestamp() - time.time())
            except (TypeError, ValueError):
                pass
    value = error.get("retryAfter")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return max(0.0, float(value))
    return None


def error_from_response(response: HttpResponse, url: str) -> AuthError:
    """The `AuthError` for a non-2xx answer: the server's code and message, plus status and details."""
    status = response.status_code
    error: Mapping[str, Any] = {}
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
    code = error.get("code") if isinstance(error.get("code"), str) else None
    message = error.get("message") if isinstance(error.get("message"), str) else None
    context: dict[str, Any] = {"status": status, "url": url}
    if isinstance(error.get("field"), str):
        context["field"] = error["field"]
    if code is None:
        if status == 404:
            message = (
                f"the server has no auth route {url} (404); check server_url and that the server mounts "
                "create_auth_routes()"
            )
            code = AUTH_UNAVAILABLE
        elif status >= 500 or status not in _STATUS_CODES:
            code = AUTH_UNAVAILABLE
            context["retriable"] = status >= 500
        else:
            code = _STATUS_CODES[status]
    if code == RATE_LIMITED:
        retry_after = _retry_after(response, error)
        if retry_after is not None:
            context["retry_after"] = retry_after
    if message is None:
        message = f"the auth server answered {status} ({code}) for {url}"
    return AuthError(message, code, context)


def credentials_from_pair(body: Any, server_url: str, sent_at: float) -> Credentials:
    """Read a token-pair answer to a request sent at ``sent_at`` (local clock); AUTH_UNAVAILABLE when it is
    not the contract's shape.

    The expiry is reckoned conservatively on the local clock: from when the request was sent (the token was
    issued later), less one second because JWT times are whole seconds (a token issued at 12.9 s with a 900 s
    lifetime carries ``iat`` 12 and expires at 912, 0.9 s before ``expiresIn`` suggests). Measuring from the
    local clock, not the ``exp`` claim, keeps a skewed local clock from making tokens look fresh or stale.
    """

    def bad(what: str) -> AuthError:
        return AuthError(
            f"the auth server at {server_url} sent an unexpected token answer ({what}); check that server_url "
            "points at an offline server with auth routes",
            AUTH_UNAVAILABLE,
            {"url": server_url},
        )

    if not isinstance(body, dict):
        raise bad("not a JSON object")
    access, refresh, user = body.get("accessToken"), body.get("refreshToken"), body.get("user")
    if not isinstance(access, str) or not access:
        raise bad("no accessToken")
    if not isinstance(refresh, str) or not refresh:
        raise bad("no refreshToken")
    if not isinstance(user, dict) or not isinstance(user.get("id"), str):
        raise bad("no user id")
    expires_in = _seconds(body.get("expiresIn"))
    refresh_in = _seconds(body.get("refreshExpiresIn"))
    if expires_in is not None:
        access_expires_at: float | None = sent_at + max(0.0, expires_in - JWT_TIME_GRANULARITY)
    else:
        # No expiresIn: fall back to the token's own exp claim (server clock; may be skewed).
        access_expires_at = expiry_of(access)
    email_value = user.get("email")
    return Credentials(
        server_url=server_url,
        user={"id": user["id"], "email": email_value if isinstance(email_value, str) else None},
        access_token=access,
        refresh_token=refresh,
        access_issued_at=sent_at,
        access_expires_at=access_expires_at,
        refresh_expires_at=None
        if refresh_in is None
        else sent_at + max(0.0, refresh_in - JWT_TIME_GRANULARITY),
        device_token=body["deviceToken"] if isinstance(body.get("deviceToken"), str) else None,
    )


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)
