"""The desktop app: the same page (web/) and the same todos.py as the browser, on native SQLite.

    python desktop.py                 open the app's window (pip install 'offline[desktop]')
    python desktop.py list            print the list (after syncing with the server)
    python desktop.py add "buy milk"  add a to-do, sync it, print the list

The window syncs with BUILD_SYNC_URL when it is set (as `offline dev --desktop` does); otherwise its first
launch asks for the server's address, or runs on this computer only. The list and add commands use
SYNC_URL (default ws://localhost:3001/offline-sync) and DESKTOP_DB (default desktop.db).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import todos
from schema import schema

from offline import OfflineError, create_app

SYNC_URL = os.environ.get("SYNC_URL", "ws://localhost:3001/offline-sync")


async def command_line(argv: list[str]) -> int:
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


def window() -> int:
    from offline_desktop.project import main

    return main([str(Path(__file__).resolve().parent)])


if __name__ == "__main__":
    arguments = sys.argv[1:]
    sys.exit(asyncio.run(command_line(arguments)) if arguments[:1] in (["list"], ["add"]) else window())
