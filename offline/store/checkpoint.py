"""Copying the local database's write-ahead log back into its file, on a thread of its own.

SQLite in WAL mode appends every commit to the ``-wal`` file; every ~4 MiB the committing connection copies
those pages into the database file and syncs it (a checkpoint). That copy ran inside whichever commit crossed
the line: ~8 % of a 100,000-operation initial sync, on the thread that also decodes and applies. A checkpoint
is one SQLite call, which runs without Python's global lock, so a second connection on a thread of its own
does it in parallel: the writer's commits only append, and tell the thread to look (it looks at most every
20 ms, and once more after a burst's last commit) whether the log holds 4 MiB with some not yet copied back
(read from the WAL index, see `_due`). A PASSIVE checkpoint never waits for or blocks the writer; the writer
reuses the log from its start once a checkpoint has copied all of it, as it does after its own checkpoints.
Under sustained writes on a busy machine the thread can fall behind (it is not scheduled, or the writer
appends while it copies, so the log is never all copied and never starts over): when the log's frames in use
reach twice the threshold, the writer itself checkpoints between two commits with RESTART, which waits for the
copy to finish and starts the log over, so the log stays bounded however the thread fares. Nothing about
durability changes: the checkpointing connection syncs as the writer's ``synchronous`` setting says, and a
commit is durable once it is in the log either way.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import struct
import sys
import threading
import time
import weakref

# The log size that asks for a checkpoint: SQLite's own default (1,000 pages of 4 KiB).
CHECKPOINT_BYTES = 1000 * 4096
# The log size at which the writer stops relying on the thread and checkpoints itself (see the docstring).
BLOCKING_CHECKPOINT_BYTES = 2 * CHECKPOINT_BYTES
log = logging.getLogger("offline.store")

# iVersion of the WAL-index header SQLite writes (every version since 3.7.0).
_WAL_INDEX_VERSION = 3007000
# The thread looks at the log at most this often (a commit sets a flag; the thread is woken once an interval).
_LOOK_EVERY_S = 0.02


def supported(path: str) -> bool:
    """A checkpoint thread needs a file (not ``:memory:`` or a URI) and threads (not Pyodide's)."""
    return path != ":memory:" and not path.startswith("file:") and sys.platform != "emscripten"


class Checkpointer:
    """Checkpoints ``path``'s write-ahead log on its own connection and thread while the log is large."""

    def __init__(self, path: str, *, synchronous: str) -> None:
        self._log = path + "-wal"
        self._index = path + "-shm"
        self._checkpointed_at = 0.0
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._wake = threading.Event()
        # Set on closing: the thread ends, at once even in its pause between two looks.
        self._closed = threading.Event()
        self._next_look = 0.0
        self.checkpoints = 0  # how many ran on the thread (tests read it)
        self.blocking_checkpoints = 0  # how many the writer ran because the thread fell behind
        self._thread = threading.Thread(target=self._run, name="offline-checkpoint", daemon=True)
        self._thread.start()

    def committed(self, writer: sqlite3.Connection | None = None) -> None:
        """Called after a commit: wakes the thread to look at the log, at most every ``_LOOK_EVERY_S``.

        With the ``writer``'s connection (outside any transaction), also checkpoints on it, blocking, when
        the log has grown to ``BLOCKING_CHECKPOINT_BYTES`` without being copied back.
        """
        if not self._wake.is_set():
            # (The thread spaces its looks itself: a commit while it sleeps between two only sets the flag,
            # and the look after the interval covers it, so the last commit of a burst is never left out.)
            self._wake.set()
        now = time.monotonic()
        if now >= self._next_look:
            self._next_look = now + _LOOK_EVERY_S
            if writer is not None and self._log_bytes() >= BLOCKING_CHECKPOINT_BYTES:
                try:
                    # RESTART: copy everything (waiting for the thread's checkpoint to end) and make the
                    # next commit start the log over. Busy (a reader holds an old snapshot): next look.
                    writer.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                    self.blocking_checkpoints += 1
                except sqlite3.Error:
                    log.debug("blocking checkpoint failed; retried at the next look", exc_info=True)

    def _run(self) -> None:
        try:
            looked = 0.0
            while True:
                self._wake.wait()
                # At most one look an interval: commits meanwhile set the flag again and get the next look.
                pause = looked + _LOOK_EVERY_S - time.monotonic()
                if pause > 0:
                    self._closed.wait(pause)
                self._wake.clear()
                if self._closed.is_set():
                    return
                looked = time.monotonic()
                try:
                    if self._due():
                        busy = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0]
                        if busy:  # another checkpoint (the writer's) had the log: it did the work
                            continue
                        self.checkpoints += 1
                        self._checkpointed_at = time.monotonic()
                except (OSError, sqlite3.Error):
                    # The log is gone or busy: the next commit asks again, and closing the database
                    # checkpoints whatever is left.
                    continue
        finally:
            self._conn.close()

    def _due(self) -> bool:
        """Whether to checkpoint: the log's frames in use come to ``CHECKPOINT_BYTES`` and some are not yet
        copied into the database file (SQLite's own rule for its automatic checkpoints).

        Read from the header of the WAL index (the ``-shm`` file; its layout is documented, "WAL-index
        format" at sqlite.org/walformat.html): the last valid frame (mxFrame, offset 16), the frames already
        copied back (nBackfill, offset 96), the page size (offset 14). Once a checkpoint has copied every
        frame, the writer starts the log over at its beginning, so mxFrame counts what was written since.
        The log file's size would not do: it stays as large as the log ever was, and every look would
        checkpoint (and sync) again. Without a readable index: the file's size, at most once a second.
        """
        size = self._log_bytes()
        if size >= 0:
            return size >= CHECKPOINT_BYTES
        if time.monotonic() - self._checkpointed_at < 1.0:
            return False
        return os.path.getsize(self._log) >= CHECKPOINT_BYTES

    def _log_bytes(self) -> int:
        """Bytes of the log's frames in use when some are not copied back yet (else 0), read from the WAL
        index (see `_due`); -1 when it cannot be read."""
        try:
            with open(self._index, "rb") as index:
                header = index.read(100)
            version, page, last = struct.unpack_from("=I10xHI", header)
            (copied,) = struct.unpack_from("=I", header, 96)
        except (OSError, struct.error):
            return -1
        if version != _WAL_INDEX_VERSION:
            return -1
        if int(last) <= int(copied):
            return 0
        return int(last) * (65536 if page == 1 else int(page))

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Ask the thread to end (it closes its connection): for an owner collected without being closed."""
        self._closed.set()
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (after a checkpoint in progress ends) and close its connection."""
        self.stop()
        self._thread.join()


def start(owner: object, path: str, *, synchronous: str) -> Checkpointer | None:
    """A `Checkpointer` for the WAL-mode database ``owner`` writes at ``path``, or None where there can be
    none (see `supported`) or its connection does not open: the writer then keeps SQLite's own checkpoints.
    With one, the caller turns the writer's own off (``PRAGMA wal_autocheckpoint = 0``) and closes it before
    the writer's connection.

    Its thread also stops when ``owner`` is garbage collected without having closed it (an application that
    never closes its database must not leave a thread and a connection behind).
    """
    if not supported(path):
        return None
    try:
        checkpointer = Checkpointer(path, synchronous=synchronous)
    except sqlite3.Error:
        log.warning("%s: checkpointing in commits (no second connection)", path, exc_info=True)
        return None
    weakref.finalize(owner, checkpointer.stop)
    return checkpointer
