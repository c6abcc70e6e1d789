"""A desktop client of the same list: native SQLite, and the same todos.py the browser runs.

    python desktop.py                 show the list (after syncing with the server)
    python desktop.py add "buy milk"  add a to-do, sync it, show the list

SYNC_URL (default ws://localhost:3001/offline-sync) is the server `offline dev` runs.
"""

from __future__ import annotations

import asyncio
import os
import sys

import todos
from schema import schema

from offline import OfflineError, create_app

SYNC_URL = os.environ.get("SYNC_URL", "ws://localhost:3001/offline-sync")


async def main(argv: list[str]) -> int:
    app = create_app(schema, sync={"url": SYNC_URL}, path=os.environ.get("DESKTOP_DB", "desktop.db"))
    try:
        if argv[:1] == ["add"] and len(argv) > 1:
            todos.add_todo(app, " ".join(argv[1:]))
        try:
            await app.sync.connect(timeout=5)
            await app.sync.wait_until_synced(10)
        except OfflineError as exc:
            print(f"not synced ({exc.message}); showing this device's copy", file=sys.stderr)
        for todo in app.todos.where({}).fetch():
            print(("[x] " if todo["done"] else "[ ] ") + todo["title"])
    finally:
        await app.sync.disconnect()
        app.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
