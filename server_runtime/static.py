"""Static frontend files with single-page-app fallback: unknown paths without a file extension get
`index.html`; nothing outside the directory is ever served (Starlette's StaticFiles checks the real path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import Scope


class SPAStaticFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Any:
        try:
            return await super().get_response(path, scope)
        except HTTPException as exc:
            # A client-side route (no extension) falls back to the app shell; a missing asset stays a 404.
            if exc.status_code == 404 and "." not in Path(path).name and scope["method"] in ("GET", "HEAD"):
                return await super().get_response("index.html", scope)
            raise


def spa_static(directory: str) -> Mount:
    return Mount("/", app=SPAStaticFiles(directory=directory, html=True, check_dir=True), name="static")
