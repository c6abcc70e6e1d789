"""Server entry of the example app: `offline dev examples/todo` serves it on SQLite.

Defining only `schema` lets the runtime build the server from the environment (PORT, DATABASE_URL,
OFFLINE_SERVER_DB, OFFLINE_ADMIN_TOKEN, ...). Define `server = create_production_server(...)` to take over.
"""

from schema import schema

__all__ = ["schema"]
