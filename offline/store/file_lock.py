"""One `App` per database file: an exclusive lock held beside the file for as long as the app is open.

Two apps on one file (a desktop window and a command-line script, or two `create_app` calls in one process)
would share a node id but number their operations separately: the second one's writes collide with the
first one's. The lock makes the second open fail at once with a clear error instead.

The lock is ``flock`` on ``<database>.lock`` (SQLite's own locks on the database file are POSIX record
locks, which ``flock`` does not interfere with); ``msvcrt.locking`` on Windows. It is released when the app
closes or its process ends, however it ends. In a browser (Pyodide) the page's worker already holds a Web
Lock for the database, and there is no other process: nothing is locked there.
"""

from __future__ import annotations

import os
import sys
from typing import IO

from offline.core.errors import STORAGE_ERROR, OfflineError


class FileLock:
    """An exclusive, non-blocking lock on ``path + ".lock"``."""

    def __init__(self, database_path: str) -> None:
        self.path = database_path + ".lock"
        self._file: IO[bytes] | None = None

    def acquire(self) -> None:
        if sys.platform == "emscripten":
            return
        handle = open(self.path, "a+b")  # noqa: SIM115 - held open for the life of the app
        try:
            if sys.platform == "win32":
                import msvcrt

                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
            else:
                import fcntl

                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            database = self.path.removesuffix(".lock")
            raise OfflineError(
                f"the local database {database!r} is already open in another app or process; close that one "
                "first, or give this app another path (one app per database file)",
                STORAGE_ERROR,
                {"path": database, "reason": "locked"},
            ) from exc
        self._file = handle

    def release(self) -> None:
        handle, self._file = self._file, None
        if handle is not None:
            handle.close()  # closing the descriptor releases the lock

    def __repr__(self) -> str:
        return f"FileLock({self.path!r}, held={self._file is not None}, pid={os.getpid()})"
