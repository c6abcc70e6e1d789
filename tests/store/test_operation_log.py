"""The local operation log: keyed by (node, sequence number), without an index on operation ids.

Duplicates are still ignored by id, forgeries still refused, logs written with the former layout (a unique
index on the id) are rebuilt on open, and acknowledgements, refusals and stored wire texts behave as before.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from offline import OfflineError, create_app, define_schema, t
from offline.core.operations import Operation, create_operation
from offline.merge.values import compact_json
from offline.store import App
from offline.store.database import ACKED, PENDING, RECORD_INDEX, REJECTED
from offline.store.replication import mark_acknowledged, pending_wires, reject_operation
from tests.support.sql_trace import traced

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "title": t.string(),
                    "votes": t.number().merge("counter").default(0),
                }
            }
        },
    }
)

# The operation log as databases written before this layout hold it.
_OLD_LOG = """CREATE TABLE _offline_ops (
    node_id TEXT NOT NULL,
    sequence_number INTEGER NOT NULL,
    id TEXT NOT NULL UNIQUE,
    collection TEXT NOT NULL,
    record_id TEXT NOT NULL,
    hlc TEXT NOT NULL,
    wire TEXT NOT NULL,
    local INTEGER NOT NULL,
    status INTEGER NOT NULL DEFAULT 0,
    delivery INTEGER,
    PRIMARY KEY (node_id, sequence_number)
) WITHOUT ROWID"""


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    with create_app(SCHEMA, path=str(tmp_path / "app.db")) as app:
        yield app


def _remote_ops(tmp_path: Path, count: int, name: str = "other") -> list[Operation]:
    with create_app(SCHEMA, path=str(tmp_path / f"{name}.db")) as other:
        for i in range(count):
            other.todos.insert({"title": f"r{i}"})
        return other.operations()


def _log(app: App) -> list[tuple[str, int, str, int]]:
    rows = app.db.conn.execute(
        "SELECT node_id, sequence_number, id, status FROM _offline_ops ORDER BY node_id, sequence_number"
    )
    return [(str(n), int(s), str(i), int(st)) for n, s, i, st in rows]


def _indexes(path: Path) -> list[tuple[str, int, str]]:
    conn = sqlite3.connect(path)
    try:
        return [(str(r[1]), int(r[2]), str(r[3])) for r in conn.execute("PRAGMA index_list('_offline_ops')")]
    finally:
        conn.close()


def test_an_operation_log_with_a_unique_id_index_is_rebuilt_without_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    remote = _remote_ops(tmp_path, 2)
    with create_app(SCHEMA, path=str(path)) as app:
        first = app.todos.insert({"title": "kept"})
        app.apply(remote)
        before = _log(app)
        node_id = app.node_id
    # Put the log back into the former layout, rows unchanged.
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("ALTER TABLE _offline_ops RENAME TO moved")
    conn.execute(_OLD_LOG)
    conn.execute("INSERT INTO _offline_ops SELECT * FROM moved")
    conn.execute("DROP TABLE moved")
    conn.close()
    assert any(origin == "u" for _, _, origin in _indexes(path))

    with create_app(SCHEMA, path=str(path)) as app:
        assert app.node_id == node_id
        assert _log(app) == before
        assert app.todos.find_by_id(first["id"]) == first
        assert app.todos.count() == 3
        assert app.apply(remote) == []  # the same operations again: duplicates
        assert _log(app) == before
        app.todos.insert({"title": "after the upgrade"})
    indexes = _indexes(path)
    assert not any(origin == "u" for _, _, origin in indexes)
    names = {name for name, _, _ in indexes}
    assert RECORD_INDEX in names
    assert not names & {"_offline_ops_record_node", "_offline_ops_record_id", "_offline_ops_record"}


def test_a_log_indexed_by_the_whole_id_gets_the_short_key_index_on_open(tmp_path: Path) -> None:
    # A database written by the version whose record index held the whole id.
    path = tmp_path / "whole-id.db"
    remote = _remote_ops(tmp_path, 3)
    with create_app(SCHEMA, path=str(path)) as app:
        app.apply(remote)
        before = _log(app)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"DROP INDEX {RECORD_INDEX}")
    conn.execute("CREATE INDEX _offline_ops_record_node ON _offline_ops (collection, record_id, node_id, id)")
    conn.close()
    with create_app(SCHEMA, path=str(path)) as app:
        assert _log(app) == before
        names = {name for name, _, _ in _indexes(path)}
        assert RECORD_INDEX in names and "_offline_ops_record_node" not in names
        moved = [dataclasses.replace(o, sequence_number=o.sequence_number + 50) for o in remote]
        assert app.db.held_in_records(moved) == {o.id for o in remote}  # through the new index
        assert app.apply(moved) == []
        assert _log(app) == before


def test_an_operation_held_under_another_sequence_number_is_a_duplicate(tmp_path: Path, app: App) -> None:
    (remote,) = _remote_ops(tmp_path, 1)
    assert app.apply([remote]) == [remote]
    # Same content (so the same id), another sequence number: only a misbehaving peer sends this.
    moved = dataclasses.replace(remote, sequence_number=remote.sequence_number + 7)
    assert app.apply([moved]) == []
    assert [row[2] for row in _log(app)] == [remote.id]
    # Both in one batch: the first one counts.
    with create_app(SCHEMA, path=str(tmp_path / "fresh.db")) as fresh:
        assert fresh.apply([remote, moved]) == [remote]
        assert [(seq, op_id) for _, seq, op_id, _ in _log(fresh)] == [(remote.sequence_number, remote.id)]


def test_an_operation_resent_under_a_new_sequence_number_long_after_is_a_duplicate(
    tmp_path: Path, app: App
) -> None:
    """The record's merge state recognises only a bounded part of its history: the log itself finds an
    operation held under another place by its id (within its record), however old it is."""
    with create_app(SCHEMA, path=str(tmp_path / "other.db")) as other:
        record = other.todos.insert({"title": "t"})
        other.todos.update(record["id"], {"votes": 1})
        for i in range(40):
            other.todos.update(record["id"], {"title": f"t{i}"})
        ops = other.operations()
    assert len(app.apply(ops)) == len(ops)
    vote = ops[1]
    assert dict(vote.data or {}) == {"votes": 1}
    log_before = _log(app)
    moved = dataclasses.replace(vote, sequence_number=vote.sequence_number + 1_000)
    assert app.apply([moved]) == []
    assert _log(app) == log_before
    assert app.todos.find_by_id(record["id"])["votes"] == 1  # type: ignore[index]  # counted once


def test_looking_an_operation_up_by_id_and_compacting_search_the_record_index_without_sorting(
    app: App,
) -> None:
    # An id is found within its record and node by a search of the index's four columns (the fourth its
    # id's first digits; the full id is compared on the row), and compaction groups the log by record and
    # node in that index's order (no sort of the log).
    app.todos.insert({"title": "t"})
    with traced(app.db.conn) as statements:
        assert app.db.held_in_records(app.operations()) == {op.id for op in app.operations()}
        app.compact()
    lookup = next(s for s in statements if s.startswith("WITH wanted"))
    # (The traced text has the values written in.)
    plan = [row[3] for row in app.db.conn.execute("EXPLAIN QUERY PLAN " + lookup)]
    assert any(
        f"USING INDEX {RECORD_INDEX} (collection=? AND record_id=? AND node_id=? AND <expr>=?)" in step
        for step in plan
    ), plan
    fill = next(s for s in statements if f"INDEXED BY {RECORD_INDEX} GROUP BY" in s)
    plan = [row[3] for row in app.db.conn.execute("EXPLAIN QUERY PLAN " + fill)]
    assert not any("TEMP B-TREE" in step for step in plan), plan


def test_the_record_index_holds_a_short_key_of_each_id_not_the_whole_id(tmp_path: Path, app: App) -> None:
    # Every applied operation writes an entry of this index, in its record's place (not at the end): with
    # the 64-digit id in it, its pages were a quarter of what a fold wrote to the log and the file.
    ops = _remote_ops(tmp_path, 200)
    app.apply(ops)
    (payload,) = app.db.conn.execute(
        "SELECT sum(payload) FROM dbstat WHERE name = ?", (RECORD_INDEX,)
    ).fetchone()
    op = ops[0]
    whole_key = len(op.collection) + len(op.record_id) + len(op.node_id) + len(op.id)
    assert payload / len(ops) < whole_key
    # A short key finds an operation all the same, held under another place.
    moved = [dataclasses.replace(o, sequence_number=o.sequence_number + 1_000) for o in ops[:50]]
    assert app.db.held_in_records(moved) == {o.id for o in moved}
    assert app.db.held_in_records([dataclasses.replace(ops[0], id="0" * 64)]) == set()


def test_operations_with_causal_contexts_are_recognised_by_their_records_states_not_searched_by_id(
    tmp_path: Path, app: App
) -> None:
    """A received operation with a causal context is recognised by its number in its record's state (the
    clock, which a compacted record's base keeps), whatever its place: the batch does not search the log by
    id for it (a search per operation received), and a resend under a new sequence number is still a
    duplicate, before and after compaction."""
    with create_app(SCHEMA, path=str(tmp_path / "other.db")) as other:
        record = other.todos.insert({"title": "t"})
        other.todos.update(record["id"], {"votes": 1})
        for i in range(5):
            other.todos.update(record["id"], {"title": f"t{i}"})
        ops = other.operations()
    assert all(op.causal_context is not None for op in ops)
    with traced(app.db.conn) as statements:
        assert len(app.apply(ops[:1])) == 1
        assert len(app.apply(ops[1:])) == len(ops) - 1
        moved = [dataclasses.replace(op, sequence_number=op.sequence_number + 1_000) for op in ops]
        assert app.apply(moved) == []
    assert not [s for s in statements if "o.id = wanted.i" in s]
    log_before = _log(app)
    assert app.todos.find_by_id(record["id"])["votes"] == 1  # type: ignore[index]
    assert app.compact() == len(ops)
    assert app.apply(moved) == []
    assert app.todos.find_by_id(record["id"])["votes"] == 1  # type: ignore[index]  # counted once
    assert _log(app) == []
    assert len(log_before) == len(ops)


def test_an_own_refused_operation_resent_under_a_new_sequence_number_stays_out(app: App) -> None:
    """This node's refused operation is in the log but not in its record's state: a misbehaving peer
    resending it under another sequence number finds it held (searched by id), not folded in again."""
    record = app.todos.insert({"title": "mine"})
    (op,) = app.operations()
    assert op.causal_context is not None
    assert reject_operation(app, op.id, "SCOPE_VIOLATION", "no") == op
    log_before = _log(app)
    moved = dataclasses.replace(op, sequence_number=op.sequence_number + 1_000)
    assert app.apply([moved]) == []
    assert _log(app) == log_before
    assert app.todos.find_by_id(record["id"]) is None


def test_two_operations_at_one_place_in_a_batch_are_refused(tmp_path: Path, app: App) -> None:
    ops = _remote_ops(tmp_path, 2)
    rewritten = create_operation(
        {
            **{f.name: getattr(ops[1], f.name) for f in dataclasses.fields(Operation) if f.name != "id"},
            "data": {"title": "other"},
        }
    )
    with pytest.raises(OfflineError) as refused:
        app.apply([ops[0], ops[1], rewritten])
    assert refused.value.context == {"field": "sequenceNumber", "operationId": rewritten.id}
    assert _log(app) == []
    assert app.apply(ops) == ops


def test_apply_verified_stores_the_wire_texts_it_is_given(tmp_path: Path, app: App) -> None:
    ops = _remote_ops(tmp_path, 3)
    # Another key order than the store would write: the text is kept as received.
    wires = [json.dumps(dict(reversed(list(op.to_wire().items()))), separators=(",", ":")) for op in ops]
    assert app.apply_verified(ops, wires, watermark=3) == ops
    stored = dict(app.db.conn.execute("SELECT id, wire FROM _offline_ops"))
    assert [stored[op.id] for op in ops] == wires
    assert [Operation.from_wire(json.loads(w)) for w in wires] == ops
    assert app.operations() == ops
    assert app.db.get_meta("delivery_watermark") == "3"


def test_acknowledgements_and_refusals_find_operations_by_place(tmp_path: Path, app: App) -> None:
    records = [app.todos.insert({"title": f"mine {i}"}) for i in range(3)]
    own = app.operations()
    assert [seq for seq, _, _ in pending_wires(app)] == [1, 2, 3]
    assert [(op_id, wire) for _, op_id, wire in pending_wires(app, after=1)] == [
        (op.id, compact_json(op.to_wire())) for op in own[1:]
    ]
    mark_acknowledged(app, [1])
    assert [status for *_, status in _log(app)] == [ACKED, PENDING, PENDING]

    refused = reject_operation(app, own[1].id, "SCOPE_VIOLATION", "no", place=(app.node_id, 2))
    assert refused == own[1]
    assert app.todos.find_by_id(records[1]["id"]) is None
    # Without the place the log is searched by id.
    assert reject_operation(app, own[2].id, "SCOPE_VIOLATION", "no") == own[2]
    assert app.todos.find_by_id(records[2]["id"]) is None
    assert [status for *_, status in _log(app)] == [ACKED, REJECTED, REJECTED]
    assert reject_operation(app, "f" * 64, "SCOPE_VIOLATION", "no", place=(app.node_id, 1)) is None
    mark_acknowledged(app, [2, 3])  # a refusal is final
    assert [status for *_, status in _log(app)] == [ACKED, REJECTED, REJECTED]
    assert pending_wires(app) == []


def _waiting(app: App) -> list[int]:
    from offline.store.replication import pending_count, pending_operations

    seqs = [seq for seq, _, _ in pending_wires(app)]
    assert [op.sequence_number for op in pending_operations(app)] == seqs
    assert pending_count(app) == len(seqs)
    return seqs


def test_the_waiting_operations_are_the_unacknowledged_ones_whatever_the_order_of_acknowledgements(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "app.db")
    with create_app(SCHEMA, path=path) as app:
        for i in range(6):
            app.todos.insert({"title": f"mine {i}"})
        app.apply(_remote_ops(tmp_path, 2))  # others' operations never wait
        assert _waiting(app) == [1, 2, 3, 4, 5, 6]
        mark_acknowledged(app, [2, 3])  # out of order: 1 still waits
        assert _waiting(app) == [1, 4, 5, 6]
        assert [seq for seq, _, _ in pending_wires(app, after=4)] == [5, 6]
        reject_operation(app, app.operations()[0].id, "SCOPE_VIOLATION", "no", place=(app.node_id, 1))
        assert _waiting(app) == [4, 5, 6]
        mark_acknowledged(app, [4, 5, 6])
        assert _waiting(app) == []
        app.todos.insert({"title": "later"})
        assert _waiting(app) == [7]
    with create_app(SCHEMA, path=path) as app:  # kept across restarts
        assert _waiting(app) == [7]
        mark_acknowledged(app, [7])
        assert _waiting(app) == []


def test_an_acknowledgement_rolled_back_leaves_its_operations_waiting(app: App) -> None:
    for i in range(3):
        app.todos.insert({"title": f"mine {i}"})
    with pytest.raises(RuntimeError), app.db.transaction():
        mark_acknowledged(app, [1, 2])
        assert _waiting(app) == [3]
        raise RuntimeError("the caller's transaction fails")
    assert _waiting(app) == [1, 2, 3]


def test_a_log_from_before_the_start_of_waiting_operations_was_kept_finds_them_once(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with create_app(SCHEMA, path=str(path)) as app:
        for i in range(4):
            app.todos.insert({"title": f"mine {i}"})
        mark_acknowledged(app, [1, 3])
    # As earlier versions left it: a partial index of the waiting operations, no start kept.
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DELETE FROM _offline_meta WHERE key = 'pending_from'")
    conn.execute("CREATE INDEX _offline_ops_pending ON _offline_ops (node_id) WHERE status = 0")
    conn.close()

    with create_app(SCHEMA, path=str(path)) as app:
        assert app.db.get_meta("pending_from") == "2"
        assert _waiting(app) == [2, 4]
    assert "_offline_ops_pending" not in {name for name, _, _ in _indexes(path)}


def _every_reading(app: App, ops: list[Operation]) -> list[object]:
    """What each way of reading the log gives for ``ops`` (all of one record each, held by ``app``)."""
    db = app.db
    return [
        app.operations(),
        [db.load_operation(op.id) for op in ops],
        [db.load_operation(op.id, (op.collection, op.record_id)) for op in ops],
        [db.find_operation(op.id, op.node_id, op.sequence_number) for op in ops],
        [db.record_operations(op.collection, op.record_id) for op in ops],
        db.operations_after(app.node_id, 0),
        db.referenced_operations({(op.collection, op.record_id): op.id for op in ops}),
        pending_wires(app),
    ]


def test_a_log_row_holds_the_operation_id_and_node_once(tmp_path: Path, app: App) -> None:
    # The row's own columns hold the id and the node: its text leaves out what the encoder writes first, and
    # every reader gets back the text as it was sent, byte for byte.
    own = [app.todos.insert({"title": f"mine {i}"}) for i in range(2)]
    remote = _remote_ops(tmp_path, 2)
    texts = [compact_json(op.to_wire()) for op in remote]
    assert app.apply_verified(remote, texts, watermark=2) == remote
    ops = app.operations()
    assert len(own) == 2 and len(ops) == 4
    for op_id, node_id, stored in app.db.conn.execute("SELECT id, node_id, wire FROM _offline_ops"):
        whole = compact_json(next(op for op in ops if op.id == op_id).to_wire())
        assert op_id not in stored and stored.count(node_id) == whole.count(node_id) - 1, stored
        assert len(stored) <= len(whole) - len(op_id) - len(node_id), (stored, whole)
    local = [op for op in ops if op.node_id == app.node_id]
    assert [(op_id, wire) for _, op_id, wire in pending_wires(app)] == [
        (op.id, compact_json(op.to_wire())) for op in local
    ]
    readings = _every_reading(app, ops)
    app.close()
    with create_app(SCHEMA, path=str(tmp_path / "app.db")) as again:
        assert _every_reading(again, ops) == readings
        assert again.operations() == ops


def test_log_rows_written_whole_by_earlier_versions_still_read(tmp_path: Path, app: App) -> None:
    for i in range(3):
        app.todos.insert({"title": f"mine {i}"})
    remote = _remote_ops(tmp_path, 2)
    app.apply_verified(remote, [compact_json(op.to_wire()) for op in remote], watermark=2)
    ops = app.operations()
    readings = _every_reading(app, ops)
    # As earlier versions wrote every row: the whole text.
    for op in ops:
        app.db.conn.execute(
            "UPDATE _offline_ops SET wire = ? WHERE id = ?", (compact_json(op.to_wire()), op.id)
        )
    assert _every_reading(app, ops) == readings
    mark_acknowledged(app, [1, 2, 3])
    app.compact()
    assert sorted(r["title"] for r in app.todos.fetch()) == ["mine 0", "mine 1", "mine 2", "r0", "r1"]
