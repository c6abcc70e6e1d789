"""Several browser tabs of one app: the Python side of the tab that owns the database.

One tab's worker owns the database (a Web Lock, see the web template's tabs.js); the other tabs send their
requests to it over a BroadcastChannel. The owner serves each other tab through its own `WorkerBridge` over
the same `App` (`attach`): replies, live query changes and status go to that tab alone, in protocol 2.

When the owner closes, another tab takes the lock, opens the database from the browser's storage and replays
the requests it had sent and not seen answered. A replayed write may already be in that storage (the old
owner saved it, then closed before its reply got out): `TabRequests` makes the replay harmless. Each write
request from another tab carries a key (the tab's id and the request's id); the key and the reply are
written to the database in the same SQLite transaction as the write itself, so every copy of the database
that holds the write holds its key too, and a write whose key could not be stored is not stored either (the worker copies the file to storage only between two JavaScript
turns). A replayed key is answered with the stored reply instead of being applied again.
"""

from __future__ import annotations

import json
import sqlite3
import time

from offline.core.errors import STORAGE_ERROR, OfflineError
from offline.store import App
from offline.worker import Post, WorkerBridge

#: Keys are kept this long: a tab replays a request only while it waits for its answer, which it stops
#: doing after its timeout (a minute or two), so an hour leaves a wide margin.
KEEP_SECONDS = 3600.0
#: The table is pruned after this many new keys (not on every write).
PRUNE_EVERY = 200

_TABLE = "offline_tab_requests"
#: The stored reply of an `async def` action's key while it runs (a reply is JSON: never this text).
_RUNNING = "running"


class TabRequests:
    """The write requests other tabs sent to this database, each applied at most once."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._added = 0
        self._running: set[str] = set()  # keys of `async def` actions running here
        with app.db.lock:
            app.db.conn.execute(
                f"CREATE TABLE IF NOT EXISTS {_TABLE} (key TEXT PRIMARY KEY, reply TEXT NOT NULL, at REAL NOT NULL)"
            )

    def stored_reply(self, key: str) -> str | None:
        row = self.app.db.conn.execute(f"SELECT reply FROM {_TABLE} WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _record(self, key: str, reply: str) -> None:
        conn = self.app.db.conn
        with self.app.db.lock, self.app.db.transaction():  # (joins the write's, when there is one)
            conn.execute(
                f"INSERT OR REPLACE INTO {_TABLE} (key, reply, at) VALUES (?, ?, ?)",
                (key, reply, time.time()),
            )
            self._added += 1
            if self._added % PRUNE_EVERY == 0:
                conn.execute(f"DELETE FROM {_TABLE} WHERE at < ?", (time.time() - KEEP_SECONDS,))

    @staticmethod
    def _method(text: str) -> object:
        try:
            request = json.loads(text)
        except ValueError:
            return None
        return request.get("method") if isinstance(request, dict) else None

    @classmethod
    def _is_write(cls, text: str) -> bool:
        return cls._method(text) in WorkerBridge.WRITES

    @classmethod
    def _is_action(cls, text: str) -> bool:
        return cls._method(text) == "call"

    def handle_now(self, bridge: WorkerBridge, key: str | None, text: str) -> tuple[bool, str] | None:
        """`WorkerBridge.handle_now` for a request another tab sent under ``key``: a write already applied
        is answered with its stored reply; a new one is applied and its key recorded, in this same turn."""
        if key is None:
            return bridge.handle_now(text)
        stored = self.stored_reply(key)
        if stored == _RUNNING:
            # An `async def` action under this key: running here (its run answers), or cut by a takeover.
            return None if key in self._running else (False, self._interrupted(bridge, text))
        if stored is not None:
            return False, stored  # it is in storage already: this database was loaded from there
        if not self._is_write(text):
            return bridge.handle_now(text)
        # The write and its key in one transaction: were the key stored apart and its write failed (a full
        # disk), the write would stay without it and the other tab's retry would apply it twice. A write that
        # fails is undone whole, the action's writes before the failure included (for another tab's request
        # an action is all or nothing), and answered with its error, no key stored: sent again, it is new.
        # (An action that catches the failure of a nested `app.batch()` itself keeps that batch's writes
        # here: a nested batch joins this one.)
        try:
            with self.app.batch():
                reply = bridge.serve_now(text)
                if reply is None:
                    return None  # an `async def` action: it waits on the loop (`handle`)
                self._record(key, reply)
        except Exception as exc:
            if isinstance(exc, sqlite3.Error):
                exc = OfflineError(
                    f"the local database could not store another tab's write, so it was not applied: {exc}",
                    STORAGE_ERROR,
                    {"path": self.app.path, "key": key},
                )
            return False, bridge.refusal_reply(text, exc)
        bridge.take_persist()  # (it changed the database: the save below stores it)
        return True, reply  # the key changed the database: the reply waits for the save

    async def handle(self, bridge: WorkerBridge, key: str | None, text: str) -> None:
        """`WorkerBridge.handle` (requests that wait on the loop) for a request sent under ``key``.

        Connect, disconnect, network and persist are harmless to repeat and are not recorded. An `async def`
        action is run at most once: it writes across several turns, between which a save may store some of
        its writes, and nothing can undo those if the owner tab closes before it ends. So its key is stored,
        marked as running, before it starts (every copy of the database holding any of its writes holds the
        mark: saves copy the whole database), and its reply replaces the mark in the save that stores its
        last writes. Sent again to this owner while it runs, the request is left to that run's reply;
        replayed to a new owner, a finished run is answered with its reply, and a run the takeover cut with
        an error saying it may have been applied in part (`_interrupted`), never run again.
        """
        if key is None:
            await bridge.handle(text)
            return
        served = self.handle_now(bridge, key, text)
        if served is not None:  # (a stored reply, or a request that does not wait after all)
            bridge._post(await bridge.settle(served))
            return
        if key in self._running:
            return  # the run under way answers it
        if not self._is_action(text):  # (connect, disconnect, network, persist: harmless to repeat)
            await bridge.handle(text)
            return
        self._running.add(key)
        try:
            self._record(key, _RUNNING)
            bridge._post(await bridge.serve(text, before_save=lambda reply: self._record(key, reply)))
        finally:
            self._running.discard(key)

    def _interrupted(self, bridge: WorkerBridge, text: str) -> str:
        """The reply to an `async def` action whose run the tab that owned the database began and never
        finished (it closed: this owner's database, loaded from storage, holds the mark of the run and
        perhaps some of its writes)."""
        try:
            request = json.loads(text)
        except ValueError:
            request = {}
        name = request.get("name") if isinstance(request, dict) else None
        return bridge.refusal_reply(
            text,
            OfflineError(
                f"the action {name!r} began in the tab that owned the local database, which closed before it "
                "ended; it may have been applied in part and was not run again (an async action writes over "
                "several steps and cannot be undone): check what it writes, then call it again if needed",
                STORAGE_ERROR,
                {"reason": "interrupted", "action": str(name)},
            ),
        )


class DurableSync:
    """Lets the sync engine send this node's operations only once they are in the browser's storage.

    The worker's JavaScript asks `saving` for the last sequence number when a save of the database starts
    and tells `saved` once it is stored. Without this, a tab could send an operation, close before storing
    it, and the next owner (or the next page load) would give the same sequence number to another write,
    which the server then refuses, taking that acknowledged write out of its record.
    """

    def __init__(self, app: App) -> None:
        self.app = app

    def saving(self) -> int:
        return self.app._seq

    def saved(self, sequence: int) -> None:
        allow = getattr(self.app.sync, "allow_through", None)
        if allow is not None and not self.app._closed:
            allow(sequence)


async def attach(owner: WorkerBridge, post: Post) -> WorkerBridge:
    """A bridge serving another tab over the owner's app: its replies, live queries and status go to
    ``post``. It runs no sync of its own (the owner's app syncs for every tab) and relays no WebAuthn
    ceremony (those run on the owner's page). `WorkerBridge.detach` ends it when that tab closes."""
    bridge = WorkerBridge(
        owner.app, post=post, persist=owner._persist, actions=owner.actions, relay_webauthn=False
    )
    await bridge.start(connect=False)
    return bridge


def open_requests(owner: WorkerBridge) -> TabRequests:
    """The owner's table of other tabs' requests (created in its database if new)."""
    if owner.app._closed:
        raise OfflineError("the app is closed", "STORAGE_ERROR", {"path": owner.app.path})
    return TabRequests(owner.app)


__all__ = ["KEEP_SECONDS", "DurableSync", "TabRequests", "attach", "open_requests"]
