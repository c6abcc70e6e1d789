"""The auth client's HTTP under Pyodide: the browser's ``fetch`` (through ``pyodide.http.pyfetch``).

A page's Web Worker has no sockets, so httpx cannot work there; ``fetch`` can, and it is what the browser
lets a page use anyway (its network rules, CORS, offline mode). Picked automatically by
`offline.auth.http.default_sender` when ``sys.platform == "emscripten"``.

An auth server on another origin than the page must allow it with CORS, and list ``Retry-After`` in
``Access-Control-Expose-Headers`` for the client to see how long a rate limit holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .http import Headers, HttpResponse, HttpUnreachable

Fetch = Callable[..., Awaitable[Any]]


def _pyfetch() -> Fetch:  # pragma: no cover - runs only under Pyodide
    from pyodide.http import pyfetch  # type: ignore[import-not-found, unused-ignore]

    fetch: Fetch = pyfetch
    return fetch


class FetchSender:
    """`HttpSender` over ``fetch``; ``fetch`` defaults to ``pyodide.http.pyfetch`` (tests pass their own).

    Redirects are not followed (as with httpx): the auth routes never redirect, and a redirect to another
    host would carry the password there.
    """

    def __init__(self, fetch: Fetch | None = None) -> None:
        self._fetch = fetch

    async def send(
        self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str], timeout: float
    ) -> HttpResponse:
        fetch = self._fetch or _pyfetch()
        options: dict[str, Any] = {
            "method": method,
            "headers": dict(headers),
            "redirect": "manual",
            "cache": "no-store",
            # Bearer tokens, not cookies: no credentials keeps cross-origin servers' CORS simple.
            "credentials": "omit",
        }
        if body is not None:
            options["body"] = body.decode("utf-8")
        try:
            # Cancelling pyfetch aborts the browser's request, so a timeout does not leave it running.
            async with asyncio.timeout(timeout):
                response = await fetch(url, **options)
                content = bytes(await response.bytes())
        except TimeoutError:
            raise HttpUnreachable(f"no answer within {timeout:g} s") from None
        except Exception as exc:  # fetch rejects (a JsException / AbortError) only when no answer came
            raise HttpUnreachable(f"{type(exc).__name__}: {exc}") from None
        if getattr(response, "type", None) == "opaqueredirect":
            raise HttpUnreachable(
                "the server answered with a redirect, which the auth client does not follow; use the final "
                "address as server_url"
            )
        raw = response.headers
        return HttpResponse(int(response.status), Headers(dict(raw).items()), content)


__all__ = ["FetchSender"]
