"""The sync server of this project.

`offline dev` runs it on SQLite and serves the built web client (dist/, from `npm run build`) on the same
port; `offline deploy` ships it. Without a `server` variable here, the runtime builds one from the
environment (PORT, DATABASE_URL, OFFLINE_SERVER_DB, OFFLINE_STATIC_DIR, ...).
"""

from schema import schema

__all__ = ["schema"]
