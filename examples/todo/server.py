"""Server entry of the example app: `offline dev examples/todo` serves it on SQLite, with the example's web page
(dist/, built by `scripts/setup.sh --run`) on the same port; `bash scripts/main.sh` does both.

Defining only `schema` lets the runtime build the server from the environment (PORT, DATABASE_URL,
OFFLINE_SERVER_DB, OFFLINE_ADMIN_TOKEN, ...). Define `server = create_production_server(...)` to take over.
"""

from schema import schema

__all__ = ["schema"]
