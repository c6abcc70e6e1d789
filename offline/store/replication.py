"""What the sync engine needs from the local store beyond `apply()`: acknowledgements, refusals and the
delivery watermark. Kept apart from app.py so the write path stays small."""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from offline.core.errors import INVALID_OPERATION, OfflineError
from offline.core.frozen import thaw
from offline.core.operations import Operation, decode_value, encode_value, operation_from_text

from . import compaction
from .database import ACKED, PENDING, PENDING_OPS, REJECTED, WIRE

if TYPE_CHECKING:
    from .app import App


def delivery_watermark(app: App) -> int:
    """The highest server delivery sequence this replica has applied (0 before the first sync)."""
    with app.db.lock:
        return int(app.db.get_meta("delivery_watermark") or 0)


def states_sync_unfinished(app: App) -> bool:
    """Whether a state-based catch-up (a first sync by states, or one across a server compaction) was cut
    after some of its ``record-states`` messages: the replica then holds the states up to its watermark and
    asks for the rest by states again (`note_states_through`)."""
    with app.db.lock:
        return app.db.get_meta("states_sync_unfinished") == "1"


def note_states_through(app: App, through: int | None) -> None:
    """A ``record-states`` message was applied: with ``through`` (a message that is not the last), the
    replica holds the state of every record the server's log touched up to that delivery, so the watermark
    moves there and a cut connection resumes from it instead of from delivery 0; None (the last message,
    its horizon applied by the caller) ends the catch-up. Called after the states were stored: a cut
    between the two sends them again, which changes nothing."""
    with app.db.lock, app.db.transaction():
        if through is None:
            app.db.set_meta("states_sync_unfinished", "0")
            return
        if through > int(app.db.get_meta("delivery_watermark") or 0):
            app.db.set_meta("delivery_watermark", str(through))
        app.db.set_meta("states_sync_unfinished", "1")


def adopt_delivery_server(app: App, server_node_id: str, epoch: str | None = None) -> bool:
    """Record the server (database) whose delivery sequences the watermark counts.

    Delivery sequences are only meaningful for the database that issued them. When another one answers (an
    in-memory server restarted, a server database replaced or reset, or a server restored from a backup,
    which keeps the node id but numbers anew and says so with its ``epoch``, the handshake's
    ``deliveryEpoch``), the watermark is reset to 0 so the replica is sent everything it may see again
    (duplicates are ignored by id). Returns True on a reset.
    """
    # The node id alone while there is no epoch: replicas recorded before epochs existed reset nothing.
    return _adopt(app, "delivery_server", server_node_id if epoch is None else f"{server_node_id} {epoch}")


def _adopt(app: App, key: str, value: str) -> bool:
    """Record what this session's deliveries depend on under ``key``; when it replaces another value, the
    watermark is reset to 0 and True returned (nothing recorded yet: the first session, or a replica
    written before the key existed, resets nothing)."""
    with app.db.lock, app.db.transaction():
        known = app.db.get_meta(key)
        if known == value:
            return False
        app.db.set_meta(key, value)
        if known is None:
            return False
        app.db.set_meta("delivery_watermark", "0")
        return True


def adopt_sync_scope(app: App, filters: Mapping[str, Mapping[str, Any]]) -> bool:
    """Record the scope the server accepted for this replica (per collection, the record filter); returns
    True when it differs from the scope of its previous session.

    Then the replica had been sent only what the old scope let it see: its records outside the new scope are
    dropped (`forget_records`; its own unacknowledged writes stay, for the server to judge), and the caller
    must resync from delivery 0, or the records the new scope adds, delivered before the change, never come.
    """
    if not _adopt(app, "sync_scope", json.dumps(filters, sort_keys=True, separators=(",", ":"), default=str)):
        return False
    for collection, record_filter in filters.items():
        if collection in app.codecs and record_filter:
            forget_outside_scope(app, collection, record_filter, app.collection(collection).all().fetch())
    return True


def forget_outside_scope(
    app: App, collection: str, record_filter: Mapping[str, Any], records: Iterable[Mapping[str, Any]]
) -> list[str]:
    """`forget_records` of those ``records`` that a scope's record filter (field -> value) no longer
    admits; returns their ids."""
    outside = [
        str(record["id"])
        for record in records
        if any(record.get(name) != value for name, value in record_filter.items())
    ]
    return forget_records(app, collection, outside)


def pending_operations(app: App, exclude: Container[str] = ()) -> list[Operation]:
    """Local operations not yet acknowledged by a server, in sequence order, except the ids in ``exclude``.

    The sync engine asks after every local write and excludes what it already sent: decoding only the new
    ones keeps that cheap when many operations wait for their acknowledgement.
    """
    with app.db.lock:
        rows = app.db.conn.execute(
            f"SELECT id, {WIRE} FROM {PENDING_OPS} ORDER BY sequence_number", (app.node_id, 0)
        ).fetchall()
    return [operation_from_text(w) for i, w in rows if i not in exclude]


def pending_wires(app: App, after: int = 0) -> list[tuple[int, str, str]]:
    """``(sequence number, id, wire JSON)`` of the local operations not yet acknowledged by a server whose
    sequence number is above ``after``, in sequence order.

    The sync engine sends the stored wire text as it is (no decoding and encoding again) and asks only for
    what follows the last operation it sent, so a long queue of unacknowledged writes costs nothing per
    new write.
    """
    with app.db.lock:
        rows = app.db.conn.execute(
            f"SELECT sequence_number, id, {WIRE} FROM {PENDING_OPS} ORDER BY sequence_number",
            (app.node_id, after + 1),
        ).fetchall()
    return [(int(seq), str(op_id), str(wire)) for seq, op_id, wire in rows]


def pending_count(app: App) -> int:
    with app.db.lock:
        return app.db.pending_count(app.node_id)


def mark_acknowledged(app: App, sequences: Iterable[int]) -> None:
    """This node's operations with these sequence numbers were stored by the server."""
    rows = [(ACKED, app.node_id, seq, PENDING) for seq in sequences]
    if not rows:
        return
    with app.db.lock, app.db.transaction():
        app.db.conn.executemany(
            "UPDATE _offline_ops SET status = ? WHERE node_id = ? AND sequence_number = ? AND status = ?",
            rows,
        )
        app.db.advance_pending(app.node_id)
    app._grew(len(rows))


def reject_operation(
    app: App, op_id: str, code: str, message: str, *, place: tuple[str, int] | None = None
) -> Operation | None:
    """Take a refused operation out of this replica's operation set and refold its record without it.

    The operation stays in the log (status REJECTED) so it is never resent; every replica then holds the same
    set, and so the same records, as the server that refused it. What the device had written is kept in the
    rejected list (`rejected`, with the server's code and message) until `retry` or `discard`. ``place``: its
    (node id, sequence number) when the caller knows it (the log is searched by id otherwise).
    """
    app.flush()
    with app.db.lock, app.db.transaction():
        op = _find(app, op_id, place)
        if op is None or _status(app, op) == REJECTED:
            return None  # (a refusal delivered twice, or of an operation written again: see restamp)
        entry = _rejection(app, op, code, message)
        _take_out(app, [op])
        app.db.conn.execute(
            "INSERT OR REPLACE INTO _offline_rejected (operation_id, collection, record_id, type, code, message, "
            "data, rejected_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                op.id,
                op.collection,
                op.record_id,
                op.type,
                code,
                message,
                None if entry["data"] is None else _encode(entry["data"]),
                entry["rejectedAt"],
            ),
        )
    if app.events.has_listeners("sync:rejected"):
        app.events.emit("sync:rejected", operation=op, **entry)
    app.subscriptions.notify({op.collection}, op, record_ids={op.collection: {op.record_id}})
    return op


def restamp(app: App, op_id: str, *, place: tuple[str, int] | None = None, ceiling: int) -> Operation | None:
    """Write again, under a new timestamp, a local operation the server refused for its clock.

    The device stamped it before it knew the server's time (its clock runs fast). The refused operation
    leaves the operation set (status REJECTED) and its write is made again (same type, data and previous
    data, so its effect is the same) with the clock corrected and reseeded below ``ceiling`` (see
    `App.reseed_clock`); several refused in a row are written again in the order the caller gives, which is
    the order they were sent in. Returns the new operation (the refused one when it was written again
    already; None when it is not this node's to write again: the caller rejects it then).
    """
    from .app import Write

    app.flush()
    with app.batch():
        op = _find(app, op_id, place)
        if op is None or op.node_id != app.node_id or op.collection not in app.codecs:
            return None  # not ours to write again
        if _status(app, op) != PENDING:
            return op  # written again already (the same refusal delivered twice)
        _take_out(app, [op])
        app.reseed_clock(ceiling)
        write = Write(op.collection, op.record_id, op.type, _plain(op.data), _plain(op.previous_data))
        (new, _), *_ = app.commit_local([write])
    return new


def rejected(app: App) -> list[dict[str, Any]]:
    """Every operation the server refused and the user has not retried or discarded, oldest first."""
    with app.db.lock:
        rows = app.db.conn.execute(
            "SELECT operation_id, collection, record_id, code, message, data, rejected_at "
            "FROM _offline_rejected ORDER BY rejected_at, rowid"
        ).fetchall()
    return [
        {
            "operationId": str(op_id),
            "collection": str(collection),
            "recordId": str(record_id),
            "code": str(code),
            "message": str(message),
            "data": None if data is None else decode_value(json.loads(data)),
            "rejectedAt": int(at),
        }
        for op_id, collection, record_id, code, message, data, at in rows
    ]


def rejected_count(app: App) -> int:
    with app.db.lock:
        return int(app.db.conn.execute("SELECT count(*) FROM _offline_rejected").fetchone()[0])


def discard(app: App, op_id: str) -> bool:
    """Forget a refused operation (the record keeps the server's state); False when none has this id."""
    with app.db.lock, app.db.transaction():
        cursor = app.db.conn.execute("DELETE FROM _offline_rejected WHERE operation_id = ?", (op_id,))
    return cursor.rowcount > 0


def retry(app: App, op_id: str) -> dict[str, Any] | None:
    """Write a refused operation's record again, as the device had written it, as a new local operation.

    A refused delete deletes the record again; otherwise the record is inserted again when it is gone, or
    its fields that differ are updated. The entry leaves the rejected list; if the server refuses the new
    operation too, it comes back under the new operation's id. Returns the record written (None after a
    delete). Raises OfflineError when no refused operation has this id.
    """
    with app.db.lock:
        row = app.db.conn.execute(
            "SELECT collection, record_id, type, data FROM _offline_rejected WHERE operation_id = ?", (op_id,)
        ).fetchone()
    if row is None:
        raise OfflineError(
            f"no refused operation has id {op_id!r} (see app.sync.rejected())",
            INVALID_OPERATION,
            {"field": "operationId", "operationId": op_id},
        )
    collection, record_id, kind, data = str(row[0]), str(row[1]), str(row[2]), row[3]
    handle = app.collection(collection)
    written: dict[str, Any] | None = None
    with app.batch():
        current = handle.find_by_id(record_id)
        if kind == "delete" or data is None:
            if current is not None:
                handle.delete(record_id)
        else:
            record = decode_value(json.loads(data))
            fields = handle.fields
            if current is None:
                written = handle.insert(
                    {k: v for k, v in record.items() if k == "id" or (k in fields and not fields[k].is_auto)}
                )
            else:
                changes = {
                    k: v
                    for k, v in record.items()
                    if k in fields and not fields[k].is_auto and current.get(k) != v
                }
                written = handle.update(record_id, changes) if changes else current
        app.db.conn.execute("DELETE FROM _offline_rejected WHERE operation_id = ?", (op_id,))
    return written


def _find(app: App, op_id: str, place: tuple[str, int] | None) -> Operation | None:
    op = app.db.find_operation(op_id, *place) if place is not None else None
    return op if op is not None else app.db.load_operation(op_id)


def _status(app: App, op: Operation) -> int | None:
    row = app.db.conn.execute(
        "SELECT status FROM _offline_ops WHERE node_id = ? AND sequence_number = ? AND id = ?",
        (op.node_id, op.sequence_number, op.id),
    ).fetchone()
    return None if row is None else int(row[0])


def _take_out(app: App, ops: list[Operation]) -> None:
    """Mark ``ops`` refused and refold their records without them (inside the caller's transaction)."""
    for op in ops:
        app.db.conn.execute(
            "UPDATE _offline_ops SET status = ? WHERE node_id = ? AND sequence_number = ?",
            (REJECTED, op.node_id, op.sequence_number),
        )
    if any(op.node_id == app.node_id for op in ops):
        app.db.advance_pending(app.node_id)
    for collection, record_id in dict.fromkeys((op.collection, op.record_id) for op in ops):
        if collection not in app.codecs:
            continue
        # The rejected ones no longer count; a record with nothing left never existed as far as anyone
        # else knows: no tombstone, its id may be written again.
        compaction.refold_and_persist(app, collection, record_id)


def _rejection(app: App, op: Operation, code: str, message: str) -> dict[str, Any]:
    """The rejected-list entry of ``op``: its record as this device has it (with the refused write), or the
    operation's own data for a collection this replica does not hold; None for a delete."""
    data: dict[str, Any] | None = None
    if op.type != "delete":
        current = (
            app.collection(op.collection).find_by_id(op.record_id) if op.collection in app.codecs else None
        )
        data = dict(current) if current is not None else _plain(op.data)
    return {
        "operationId": op.id,
        "collection": op.collection,
        "recordId": op.record_id,
        "code": code,
        "message": message,
        "data": data,
        "rejectedAt": app._physical(),
    }


def _plain(value: Any) -> Any:
    return None if value is None else thaw(value)


def _encode(value: Any) -> str:
    return json.dumps(encode_value(value), separators=(",", ":"), sort_keys=True, default=str)


def forget_records(app: App, collection: str, record_ids: Iterable[str]) -> list[str]:
    """Drop records that left this replica's sync scope (the server moved them to someone else's).

    The server tells a replica a record left its scope (with the record's state holding its scope fields
    only, or, from servers before that, the operation that moved it), and nothing about the record after
    it: kept, the record would go stale. Its row, merge state and received operations are
    deleted (a local clean-up, not an operation: nothing is sent). This node's own operations that the server
    has not acknowledged stay, and the record is refolded from them; the server refuses them (the record
    is no longer in scope) and they are dropped then. Returns the ids of the records forgotten.
    """
    ids = list(dict.fromkeys(record_ids))
    if not ids or collection not in app.codecs:
        return []
    app.flush()
    with app.db.lock, app.db.transaction():
        conn = app.db.conn
        # What compaction kept of them goes too (its base holds the received operations).
        compaction.forget(app, collection, ids)
        for record_id in ids:
            conn.execute(
                "DELETE FROM _offline_ops WHERE collection = ? AND record_id = ? AND status != ?",
                (collection, record_id, PENDING),
            )
            compaction.refold_and_persist(app, collection, record_id)
    for listener in list(app.subscriptions.change_listeners):
        listener(collection, ids)
    app.subscriptions.notify({collection}, None, record_ids={collection: ids})
    return ids
