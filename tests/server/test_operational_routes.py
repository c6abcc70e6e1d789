"""Every path under ``/__offline`` answers for itself, with and without a static page (whose SPA fallback
answers unknown paths with ``index.html``): a method a route does not take gets 405 with ``Allow``, an
unknown path 404, never the page. The routes come from the running app's route table (user administration
included), so a route added later is covered without touching this test."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from starlette.routing import Route

from server_runtime import create_production_server, create_sqlite_server_store
from server_runtime.auth import create_auth_routes
from server_runtime.server import ProductionServer
from tests.server.test_operational import ALL_TOKENS, SCHEMA

INDEX = "<!doctype html><title>app shell</title>"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
SECRET = "route-table-test-secret-0123456789abcdef"


def operational_paths(server: ProductionServer) -> dict[str, set[str]]:
    """Each /__offline route's path (parameters filled in) -> the methods its routes take together."""
    taken: dict[str, set[str]] = {}
    for route in server.app.routes:
        if isinstance(route, Route) and route.path.startswith("/__offline"):
            path = route.path.replace("{user_id}", "u-1")
            assert "{" not in path, f"fill in the parameters of {route.path}"
            assert route.methods is not None, route.path
            taken.setdefault(path, set()).update(route.methods)
    return taken


@pytest.mark.parametrize("with_page", [False, True], ids=["no-page", "static-page"])
def test_every_operational_route_refuses_other_methods_and_unknown_paths_are_404(
    tmp_path: Path, with_page: bool
) -> None:
    static = None
    if with_page:
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "index.html").write_text(INDEX)
        static = str(tmp_path / "site")

    async def scenario() -> None:
        store = create_sqlite_server_store(str(tmp_path / "server.db"))
        await store.set_schema(SCHEMA)
        server = create_production_server(
            store=store,
            port=0,
            host="127.0.0.1",
            static_dir=static,
            operational_auth=ALL_TOKENS,
            auth_routes=create_auth_routes(secret=SECRET),
        )
        url = await server.start()
        try:
            paths = operational_paths(server)
            # The ones the issue names, and user administration's: the table is the real one.
            assert paths["/__offline/compact"] == {"POST"}
            assert paths["/__offline/backup/export"] == {"POST"}
            assert paths["/__offline/users/u-1/disable"] == {"POST"}
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                for path, taken in sorted(paths.items()):
                    for method in METHODS:
                        if method in taken:
                            continue
                        answer = await http.request(method, path)
                        assert answer.status_code == 405, (method, path, answer.status_code, answer.text)
                        assert set(answer.headers["allow"].split(", ")) == taken, (method, path)
                        assert INDEX not in answer.text
                        if method != "HEAD":
                            assert answer.json()["error"] == "METHOD_NOT_ALLOWED", (method, path)
                            assert path in answer.json()["message"]
                for unknown in ("/__offline/nope", "/__offline/backup", "/__offline/users/u-1/nothing"):
                    for method in ("GET", "POST"):
                        answer = await http.request(method, unknown)
                        assert answer.status_code == 404, (method, unknown, answer.status_code)
                        assert answer.json()["error"] == "NOT_FOUND" and unknown in answer.json()["message"]
                # A trailing slash on a route's path: redirected to the path without it (308 keeps the method
                # and body), whatever the method, the query string kept; the dashboard answers at both.
                for path, taken in sorted(paths.items()):
                    if path in ("/__offline", "/__offline/"):
                        continue
                    for method in sorted(taken | {"GET"}):
                        answer = await http.request(method, path + "/?q=1")
                        assert answer.status_code == 308, (method, path, answer.status_code, answer.text)
                        assert answer.headers["location"] == path + "?q=1", (method, path)
                        assert INDEX not in answer.text
                login = await http.get("/__offline/login/", follow_redirects=True)
                assert login.status_code == 200 and str(login.url).endswith("/__offline/login")
                for unknown in ("/__offline/nope/", "/__offline/users/u-1/nothing/"):
                    assert (await http.get(unknown)).status_code == 404, unknown
                # Outside /__offline the page still answers client-side routes.
                if with_page:
                    shell = await http.get("/__offline-lookalike/route")
                    assert shell.status_code == 200 and shell.text == INDEX
                # The routes still answer the methods they take.
                assert (await http.get("/__offline/login")).status_code == 200
                assert (await http.get("/health")).status_code == 200
        finally:
            await server.stop()
            await store.close()

    asyncio.run(scenario())
