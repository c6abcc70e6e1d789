"""A replica built by the server: the first sync of a fresh device as one database file.

A fresh device's state-based first sync (`p.RecordStates`) costs the device one adoption per message of 500
record states; in a browser, where Python runs as WebAssembly, that is most of the time between the app being
ready and its records being shown. The server can do the same work itself, with this same library, while the
browser is still loading Python: it builds the replica the device would have built from those messages and
sends it as a SQLite file (``POST <sync path>/snapshot``, `server_runtime.snapshot`), which the device opens
as its database and then syncs by operations from the file's watermark, as after any first sync.

The functions here are the steps of a first sync by states as `SyncClient` takes them (the handshake's
bookkeeping, each message's states, the final watermark), so a replica built from a snapshot is the replica
the socket would have made. The file carries no node id: each device that opens it makes its own
(`App` does so for a database without one), so two devices given the same snapshot are two nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from offline.store import compaction, replication

if TYPE_CHECKING:
    from offline.store.app import App

#: The snapshot format a client asks for and the server writes (meta ``snapshot_format``). A new number
#: whenever the local database's layout or what a snapshot holds changes: a client of another format (an
#: older build cached in a browser) is then answered 204 and syncs over the socket.
FORMAT = 4
#: Meta key marking a database that was built as a snapshot (its value: the format).
FORMAT_KEY = "snapshot_format"
#: What a SQLite database file starts with.
SQLITE_HEADER = b"SQLite format 3\x00"


def begin(
    app: App,
    *,
    server_node_id: str,
    delivery_epoch: str | None,
    accepted_scope: Mapping[str, Mapping[str, Any]],
) -> None:
    """Record what a first handshake with this server records (`SyncClient._handshake`): the server whose
    delivery numbers the watermark counts, the scope it accepted, its node as authoritative."""
    replication.adopt_delivery_server(app, server_node_id, delivery_epoch)
    replication.adopt_sync_scope(app, scope_filters(accepted_scope))
    app.set_authoritative_nodes([server_node_id])


def scope_filters(accepted_scope: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The record filters a client keeps of a handshake's accepted scope (collections with a filter)."""
    return {name: dict(filt) for name, filt in accepted_scope.items() if isinstance(filt, Mapping) and filt}


def adopt(
    app: App,
    states: Sequence[Mapping[str, Any]],
    filters: Mapping[str, Mapping[str, Any]],
    *,
    through: int | None,
) -> None:
    """One ``record-states`` message's entries, as `SyncClient._adopt_states` stores them: each record takes
    the server's state; ``through`` (a message that is not the last) is how far the server's scan got. A
    record the state puts outside ``filters`` (it left the scope) is dropped."""

    def progress() -> None:
        replication.note_states_through(app, through)

    compaction.adopt_states(
        app,
        [(s["collection"], s["recordId"], s["state"], s["versions"]) for s in states],
        stored=progress if through is not None else None,
    )
    if filters and states:
        forget_outside(app, filters, [(str(s["collection"]), str(s["recordId"])) for s in states])


def finish(app: App, horizon: int) -> None:
    """The last message applied: the watermark moves to ``horizon`` and the catch-up by states is over."""
    app.apply_verified([], None, watermark=horizon)
    replication.note_states_through(app, None)


def forget_outside(
    app: App, filters: Mapping[str, Mapping[str, Any]], keys: Sequence[tuple[str, str]]
) -> list[str]:
    """Drop those of these records that are outside the scope ``filters`` admit; returns their ids."""
    touched: dict[str, set[str]] = {}
    for collection, record_id in keys:
        if collection in filters:
            touched.setdefault(collection, set()).add(record_id)
    gone: list[str] = []
    for collection, record_ids in touched.items():
        # One statement per chunk of ids (a state-based first sync asks this of every record it gets).
        records = app.collection(collection).all().among(record_ids)
        gone.extend(replication.forget_outside_scope(app, collection, filters[collection], records))
    return gone


def seal(app: App) -> bytes:
    """The replica ``app`` (a database in memory) as a snapshot file any device can open as its own: no node
    id (each device makes its own) and the format noted. An in-memory database has a rollback journal, so
    the file is the whole database (no ``-wal`` file to send along)."""
    app.flush()
    with app.db.lock, app.db.transaction():
        app.db.conn.execute("DELETE FROM _offline_meta WHERE key = 'node_id'")
        app.db.set_meta(FORMAT_KEY, str(FORMAT))
    return bytes(app.db.conn.serialize())
