"""The last word on every path under ``/__offline``: a method the path does not take gets 405 with ``Allow``,
and a path no operational route knows gets 404, instead of falling through to the static page's SPA fallback
(which would answer a ``GET /__offline/compact`` with the app's ``index.html`` and 200). A route's path with a
trailing slash is redirected (308) to the path without it.

Starlette lets a later route that matches the path and the method (the static ``Mount("/")``) win over an
earlier one that matches only the path, so the wrong-method answer has to come from a route placed between the
operational routes and the static page; it reads the allowed methods from the routes themselves, so a new
operational route is covered without listing it here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Match, NoMatchFound, Route
from starlette.types import Receive, Scope, Send

PREFIX = "/__offline"


def under_prefix(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def allowed_methods(routes: Sequence[BaseRoute], path: str) -> set[str] | None:
    """The methods the HTTP routes matching ``path`` take together; None if any takes every method, an
    empty set if none matches the path."""
    allowed: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.path_regex.match(path):
            if route.methods is None:
                return None
            allowed |= route.methods
    return allowed


class OperationalFallback(BaseRoute):
    """Matches every HTTP request under ``/__offline`` that no operational route answered in full."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self.routes = [r for r in routes if isinstance(r, Route) and under_prefix(r.path)]

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and under_prefix(scope["path"]):
            return Match.FULL, {}
        return Match.NONE, {}

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        raise NoMatchFound(name, path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        response = self.answer(request)
        await response(scope, receive, send)

    def answer(self, request: Request) -> Response:
        path = request.scope["path"]
        if path.endswith("/") and path != PREFIX + "/":
            # ``/__offline/status/``: the route without the slash, as a web server would (308 keeps the
            # method and body, so a POST is redirected as a POST). Relative: right behind a proxy too.
            bare = path.rstrip("/")
            if under_prefix(bare) and allowed_methods(self.routes, bare) != set():
                query = request.scope.get("query_string", b"").decode("latin-1")
                location = bare + ("?" + query if query else "")
                return RedirectResponse(location, status_code=308, headers={"Cache-Control": "no-store"})
        allowed = allowed_methods(self.routes, path)
        if allowed:
            methods = ", ".join(sorted(allowed))
            return _error(
                405,
                "METHOD_NOT_ALLOWED",
                f"{path} takes {methods}, not {request.method}",
                {"Allow": methods},
            )
        return _error(404, "NOT_FOUND", f"no operational endpoint at {path}")


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    # The shape of the other operational endpoints' errors (status, compact, backup).
    body = {"error": code, "message": message}
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store", **(headers or {})})
