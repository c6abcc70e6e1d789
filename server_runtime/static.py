"""Static frontend files with single-page-app fallback: unknown paths without a file extension get
`index.html`; nothing outside the directory is ever served (Starlette's StaticFiles checks the real path).

What a first visit downloads is mostly Pyodide (about 15 MB, 10 MB of it WebAssembly that gzip shrinks to a
third), so the build writes a gzip copy beside each file it shrinks (``name.gz``, see offline_cli.web_build)
and a client that accepts gzip gets that copy with ``Content-Encoding: gzip``: nothing is compressed per
request. Caching: a file whose name carries its content hash (``py/app.<hash>.zip``) never changes, and is
kept for good (``immutable``); every other file may change with the next build under the same name, so a
browser revalidates it with its ETag (a 304 when unchanged)."""

from __future__ import annotations

import mimetypes
import os
import re
import stat
from pathlib import Path
from typing import Any

import anyio
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import NotModifiedResponse, StaticFiles
from starlette.types import Scope

#: ``name.<hex digest>.ext``: the build names such files by their content (they never change).
_HASHED_NAME = re.compile(r"\.[0-9a-f]{8,64}\.[A-Za-z0-9]+$")
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
#: Types a system's mimetypes table may lack; the browser needs them (WebAssembly.instantiateStreaming
#: refuses a module served as anything but application/wasm; a module script needs a JavaScript type).
_TYPES = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript"}


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value allows gzip (``gzip`` or ``*`` listed without ``q=0``)."""
    allowed: dict[str, bool] = {}
    for item in accept_encoding.lower().split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if coding:
            allowed[coding] = quality > 0
    return allowed.get("gzip", allowed.get("x-gzip", allowed.get("*", False)))


def media_type(path: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    return _TYPES.get(suffix) or mimetypes.guess_type(path)[0] or "text/plain"


def cache_control(path: str) -> str:
    return IMMUTABLE if _HASHED_NAME.search(path) else REVALIDATE


class SPAStaticFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Any:
        served = path
        try:
            response = await self._file(path, scope)
        except HTTPException as exc:
            # A client-side route (no extension) falls back to the app shell; a missing asset stays a 404.
            if exc.status_code == 404 and "." not in Path(path).name and scope["method"] in ("GET", "HEAD"):
                served = "index.html"
                response = await self._file(served, scope)
            else:
                raise
        if isinstance(response, FileResponse | NotModifiedResponse):
            response.headers["cache-control"] = cache_control(served)
            # The same URL answers with gzip or not depending on the request: a cache must key on it.
            response.headers["vary"] = "Accept-Encoding"
        return response

    async def _file(self, path: str, scope: Scope) -> Response:
        if scope["method"] in ("GET", "HEAD") and accepts_gzip(
            Headers(scope=scope).get("accept-encoding", "")
        ):
            compressed = await self._compressed(path, scope)
            if compressed is not None:
                return compressed
        response: Response = await super().get_response(path, scope)
        if isinstance(response, FileResponse):
            response.headers["content-type"] = media_type(str(response.path))
        return response

    async def _compressed(self, path: str, scope: Scope) -> Response | None:
        """The gzip copy of ``path`` as its response (or a 304), if there is one at least as new as the file."""
        try:
            _, original = await anyio.to_thread.run_sync(self.lookup_path, path)
            full_path, copy = await anyio.to_thread.run_sync(self.lookup_path, path + ".gz")
        except (OSError, ValueError):
            return None  # (the plain lookup reports why)
        if not (original and copy and stat.S_ISREG(original.st_mode) and stat.S_ISREG(copy.st_mode)):
            return None
        if copy.st_mtime < original.st_mtime:
            return None  # made before the file last changed: not a copy of it
        response = FileResponse(
            full_path, stat_result=copy, media_type=media_type(path), headers={"content-encoding": "gzip"}
        )
        if self.is_not_modified(response.headers, Headers(scope=scope)):
            return NotModifiedResponse(response.headers)
        return response


def spa_static(directory: str) -> Mount:
    return Mount("/", app=SPAStaticFiles(directory=directory, html=True, check_dir=True), name="static")
