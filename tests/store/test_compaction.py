"""Device compaction (`app.compact()`): acknowledged operations leave the local log; records, repeats,
refusals, rebuilds, restarts and exports keep working as if they were still there."""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offline import OfflineError, create_app, define_schema, op, t
from offline.core.operations import Operation
from offline.merge.engine import MergeEngine
from offline.store import App, compaction
from offline.store.compaction import adopt_states
from offline.store.database import PENDING, PENDING_FROM_KEY, REJECTED, STATE_BASE
from offline.store.replication import (
    forget_records,
    mark_acknowledged,
    pending_operations,
    reject_operation,
    rejected,
    restamp,
)
from tests.merge._support import SCHEMA, FakeClock, canonical
from tests.merge.test_convergence_properties import local_write, snapshot
from tests.support.sql_trace import traced

NOTES = define_schema(
    {
        "version": 1,
        "collections": {
            "notes": {
                "fields": {
                    "body": t.string().optional(),
                    "votes": t.number().merge("counter").default(0),
                    "tags": t.array(t.string()).default([]),
                }
            }
        },
    }
)


def log_statuses(app: App) -> list[int]:
    with app.db.lock:
        return [int(r[0]) for r in app.db.conn.execute("SELECT status FROM _offline_ops")]


def own_ops(app: App) -> list[Operation]:
    return [o for o in app.operations() if o.node_id == app.node_id]


def acknowledge_all(app: App) -> None:
    mark_acknowledged(app, [o.sequence_number for o in own_ops(app)])


def test_compact_drops_acknowledged_and_received_operations_and_keeps_the_records(tmp_path: Path) -> None:
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    note = source.notes.insert({"body": "shared"})
    for _ in range(5):
        source.notes.update(note["id"], {"votes": op.increment(1)})
    device.apply(source.operations())  # received: acknowledged by definition
    mine = device.notes.insert({"body": "mine"})
    device.notes.update(mine["id"], {"votes": op.increment(2)})
    acknowledge_all(device)
    pending = device.notes.insert({"body": "not yet sent"})
    refused = device.notes.insert({"body": "refused"})
    reject_operation(device, own_ops(device)[-1].id, "SCOPE_VIOLATION", "not yours")
    before = device.notes.fetch()

    assert device.compact() == 6 + 2
    assert sorted(log_statuses(device)) == [PENDING, REJECTED]  # the unacknowledged and the refused stay
    assert device.notes.fetch() == before
    assert device.compact() == 0
    assert [e["recordId"] for e in rejected(device)] == [refused["id"]]
    assert [o.record_id for o in own_ops(device)] == [pending["id"]]
    assert device.notes.find_by_id(note["id"])["votes"] == 5
    device.close()
    source.close()


def test_an_operation_received_again_after_compaction_is_not_folded_twice(tmp_path: Path) -> None:
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    note = source.notes.insert({"body": "counted", "tags": ["a"]})
    for _ in range(3):
        source.notes.update(note["id"], {"votes": op.increment(1)})
    history = source.operations()
    device.apply(history)
    assert device.compact() == 4
    # A batch resent after a lost acknowledgement, a resync from delivery 0, a peer's overlapping export.
    assert device.apply(history) == []
    assert device.apply(list(reversed(history))) == []
    assert device.notes.find_by_id(note["id"])["votes"] == 3
    # What comes after still folds on the compacted state.
    source.notes.update(note["id"], {"votes": op.increment(10), "tags": op.append("b")})
    device.apply(source.operations())
    assert device.notes.find_by_id(note["id"]) == source.notes.find_by_id(note["id"])
    # After a restart too.
    device.close()
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    assert device.apply(source.operations()) == []
    assert device.notes.find_by_id(note["id"])["votes"] == 13
    device.close()
    source.close()


def test_numbering_and_clock_continue_after_the_last_operations_were_dropped(tmp_path: Path) -> None:
    clock = FakeClock()
    path = str(tmp_path / "d.db")
    device = create_app(NOTES, path=path, now=clock, compact_after=None)
    for n in range(4):
        device.notes.insert({"body": f"n{n}"})
    last = own_ops(device)[-1]
    acknowledge_all(device)
    assert device.compact() == 4
    device.close()
    clock.ms -= 60_000  # the device's clock went back meanwhile
    device = create_app(NOTES, path=path, now=clock, compact_after=None)
    device.notes.insert({"body": "after"})
    [new] = own_ops(device)
    assert new.sequence_number == last.sequence_number + 1  # never a number of a dropped operation
    assert new.timestamp > last.timestamp  # the clock never goes back behind what it issued
    assert device.version_vector[device.node_id] == new.sequence_number
    device.close()


def test_a_refusal_after_compaction_refolds_on_the_compacted_state(tmp_path: Path) -> None:
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    note = device.notes.insert({"body": "v1", "tags": ["a"]})
    device.notes.update(note["id"], {"votes": op.increment(4), "tags": op.append("b")})
    acknowledge_all(device)
    assert device.compact() == 2
    device.notes.update(note["id"], {"votes": op.increment(100), "body": "v2", "tags": op.remove("a")})
    reject_operation(device, own_ops(device)[-1].id, "CONSTRAINT_VIOLATION", "no")
    record = device.notes.find_by_id(note["id"])
    assert (record["body"], record["votes"], record["tags"]) == ("v1", 4, ["a", "b"])
    device.close()


def test_a_clock_drift_retry_after_compaction_keeps_the_compacted_state(tmp_path: Path) -> None:
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    note = device.notes.insert({"body": "v1"})
    device.notes.update(note["id"], {"votes": op.increment(4)})
    acknowledge_all(device)
    device.compact()
    device.notes.update(note["id"], {"votes": op.increment(1)})
    refused = own_ops(device)[-1]
    again = restamp(device, refused.id, ceiling=refused.timestamp.wall_time + 1)
    assert again is not None and again.id != refused.id
    assert device.notes.find_by_id(note["id"])["votes"] == 5
    device.close()


def test_rebuild_and_a_new_authoritative_node_start_from_the_compacted_state(tmp_path: Path) -> None:
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    kept = device.notes.insert({"body": "compacted", "tags": ["x"]})
    device.notes.update(kept["id"], {"votes": op.increment(3)})
    gone = device.notes.insert({"body": "deleted"})
    device.notes.delete(gone["id"])
    acknowledge_all(device)
    device.compact()
    device.notes.update(kept["id"], {"votes": op.increment(1)})  # pending, on top
    before = device.notes.fetch()
    device.rebuild()
    assert device.notes.fetch() == before
    device.set_authoritative_nodes(["some-server-node"])
    assert device.notes.fetch() == before
    assert device.notes.find_by_id(gone["id"]) is None
    device.close()


def test_forgetting_a_compacted_record_forgets_its_compacted_state(tmp_path: Path) -> None:
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    note = source.notes.insert({"body": "moves away"})
    source.notes.update(note["id"], {"votes": op.increment(2)})
    device.apply(source.operations())
    device.compact()
    forget_records(device, "notes", [note["id"]])
    assert device.notes.find_by_id(note["id"]) is None
    # Back in scope later: its whole history is sent again and folds from nothing, once.
    device.apply(source.operations())
    assert device.notes.find_by_id(note["id"])["votes"] == 2
    device.close()
    source.close()


def test_export_after_compaction_sends_what_is_kept_and_peers_converge(tmp_path: Path) -> None:
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    peer = create_app(NOTES, path=":memory:", compact_after=None)
    note = device.notes.insert({"body": "a"})
    peer.apply(device.operations())
    acknowledge_all(device)
    device.compact()
    device.notes.update(note["id"], {"votes": op.increment(2)})
    assert [o.type for o in device.operations(after=peer.version_vector)] == ["update"]
    peer.apply(device.operations(after=peer.version_vector))
    assert peer.notes.fetch() == device.notes.fetch()
    device.close()
    peer.close()


def test_compaction_runs_on_its_own_past_compact_after(tmp_path: Path) -> None:
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=5)
    note = source.notes.insert({"body": "busy"})
    for _ in range(3):
        source.notes.update(note["id"], {"votes": op.increment(1)})
    device.apply(source.operations())
    assert len(log_statuses(device)) == 4  # not yet
    for _ in range(3):
        source.notes.update(note["id"], {"votes": op.increment(1)})
    device.apply(source.operations())
    assert log_statuses(device) == []
    assert device.notes.find_by_id(note["id"])["votes"] == 6
    # Own writes count once acknowledged (pending ones are never dropped).
    for _ in range(6):
        device.notes.update(note["id"], {"votes": op.increment(1)})
    assert log_statuses(device) == [PENDING] * 6
    acknowledge_all(device)
    assert log_statuses(device) == []
    assert device.notes.find_by_id(note["id"])["votes"] == 12
    device.close()
    source.close()


def stored_in_log(app: App) -> dict[str, int]:
    """record id -> how many of its operations the log holds."""
    with app.db.lock:
        rows = app.db.conn.execute("SELECT record_id, count(*) FROM _offline_ops GROUP BY record_id")
        return {str(r): int(n) for r, n in rows}


def test_automatic_compaction_drops_superseded_history_and_keeps_a_records_one_operation(
    tmp_path: Path,
) -> None:
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=3)
    busy, once, alone = (source.notes.insert({"body": f"n{i}"})["id"] for i in range(3))
    device.apply(source.operations())
    for _ in range(4):
        source.notes.update(busy, {"votes": op.increment(1)})
    source.notes.update(once, {"body": "edited"})
    device.apply(source.operations())
    # 8 acknowledged operations on 3 records: 5 beyond one each, not yet max(3, 2 x 3).
    assert stored_in_log(device) == {busy: 5, once: 2, alone: 1}
    source.notes.update(busy, {"votes": op.increment(1)})
    device.apply(source.operations(after=device.version_vector))
    # 9: 6 beyond one each: compacted, but the record whose log holds one operation keeps it (nothing of
    # its history is superseded).
    assert stored_in_log(device) == {alone: 1}
    assert device.notes.fetch() == source.notes.fetch()
    # An explicit compaction drops every acknowledged operation.
    assert device.compact() == 1
    assert stored_in_log(device) == {}
    assert device.notes.fetch() == source.notes.fetch()
    device.close()
    source.close()


def test_automatic_compaction_dropping_every_acknowledged_operation_keeps_the_waiting_ones(
    tmp_path: Path,
) -> None:
    # Every record with acknowledged operations holds several: the whole acknowledged log goes at once
    # (one pass over the log), and this device's waiting write stays to be sent.
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=2)
    mine = device.notes.insert({"body": "mine"})["id"]
    ids = [source.notes.insert({"body": f"n{i}"})["id"] for i in range(2)]
    for _ in range(4):
        for record_id in ids:
            source.notes.update(record_id, {"votes": op.increment(1)})
    # 10 acknowledged operations on 2 records (3 with the waiting one's): 7 beyond one each, past max(2, 6).
    device.apply(source.operations())
    assert stored_in_log(device) == {mine: 1}
    assert log_statuses(device) == [PENDING]
    assert [n["votes"] for n in device.notes.fetch() if n["id"] != mine] == [4, 4]
    device.close()
    source.close()


def test_a_compaction_dropping_the_whole_log_clears_it_at_once_and_keeps_recognising_repeats(
    tmp_path: Path,
) -> None:
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    ids = [source.notes.insert({"body": f"n{i}"})["id"] for i in range(3)]
    for record_id in ids:
        source.notes.update(record_id, {"votes": op.increment(1)})
    received = source.operations()
    device.apply(received)
    with traced(device.db.conn) as statements:
        assert device.compact() == 6
    deletes = [s for s in statements if s.startswith("DELETE FROM _offline_ops")]
    # Every operation of the log was acknowledged: the log is cleared, not searched row by row.
    assert deletes == ["DELETE FROM _offline_ops"]
    assert stored_in_log(device) == {}
    expected = device.notes.fetch()
    # What was dropped is still recognised, and the log and numbering go on from there.
    assert device.apply(received) == []
    assert stored_in_log(device) == {}
    mine = device.notes.insert({"body": "mine"})["id"]
    assert [o.sequence_number for o in own_ops(device)] == [1]
    assert [n for n in device.notes.fetch() if n["id"] != mine] == expected
    # With a waiting operation in the log, only the acknowledged ones go.
    source.notes.update(ids[0], {"votes": op.increment(1)})
    device.apply(source.operations(after=device.version_vector))
    with traced(device.db.conn) as statements:
        assert device.compact() == 1
    assert [s for s in statements if s.startswith("DELETE FROM _offline_ops")] != ["DELETE FROM _offline_ops"]
    assert stored_in_log(device) == {mine: 1}
    assert log_statuses(device) == [PENDING]
    device.close()
    source.close()


def test_a_compaction_does_not_write_out_the_pages_it_frees(tmp_path: Path) -> None:
    # Some SQLite builds (Debian's) zero every deleted row by default (secure_delete ON), which writes each page
    # a compaction frees to the write-ahead log and again into the file: a pass cost twice the bytes it
    # dropped. The local database zeroes deleted bytes only in pages it writes anyway (FAST).
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    ids = [source.notes.insert({"body": "x" * 400})["id"] for _ in range(100)]
    for round_ in range(3):
        for record_id in ids:
            source.notes.update(record_id, {"body": f"{round_}" * 400})
    device.apply(source.operations())
    checkpointer = device.db._checkpointer
    assert checkpointer is not None
    checkpointer.close()  # (only this test's own checkpoints: the log's frames are counted below)
    conn = device.db.conn
    with device.db.lock:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        (free_before,) = conn.execute("PRAGMA freelist_count").fetchone()
    assert device.compact() == 400
    with device.db.lock:
        (free_after,) = conn.execute("PRAGMA freelist_count").fetchone()
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    freed = free_after - free_before
    assert freed > 100  # the 400 operations' pages
    assert frames < freed / 2
    device.close()
    source.close()


def test_a_record_whose_log_has_no_merge_state_gets_its_base_folded_from_its_operations(
    tmp_path: Path,
) -> None:
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    kept, lost = (source.notes.insert({"body": f"n{i}"})["id"] for i in range(2))
    for record_id in (kept, lost):
        source.notes.update(record_id, {"votes": op.increment(3)})
    device.apply(source.operations())
    expected = device.notes.fetch()
    with device.db.lock, device.db.transaction():
        device.db.conn.execute("DELETE FROM _offline_state WHERE record_id = ?", (lost,))
    assert device.compact() == 4
    # Its base was made from its operations (not copied from a state it lacks): a rebuild brings it back.
    (versions,) = device.db.conn.execute(
        "SELECT versions FROM _offline_compacted WHERE record_id = ?", (lost,)
    ).fetchone()
    assert json.loads(versions) == {source.node_id: 4}
    device.rebuild()
    assert device.notes.fetch() == expected
    device.close()
    source.close()


def test_a_first_and_a_later_compaction_keep_each_writers_highest_number(tmp_path: Path) -> None:
    # A record written by two nodes, compacted while nothing is compacted yet (a replica's first
    # compaction), then again once one of them wrote more: each time, one number per node, the highest.
    first = create_app(NOTES, path=":memory:", compact_after=None)
    second = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    note = first.notes.insert({"body": "n"})["id"]
    second.apply(first.operations())
    for _ in range(2):
        second.notes.update(note, {"votes": op.increment(1)})
    first.notes.update(note, {"votes": op.increment(1)})
    device.apply(first.operations())
    device.apply(second.operations())

    def versions() -> str:
        (text,) = device.db.conn.execute(
            "SELECT versions FROM _offline_compacted WHERE record_id = ?", (note,)
        ).fetchone()
        return str(text)

    assert device.compact() == 4
    expected = {first.node_id: 2, second.node_id: 2}
    assert versions() == json.dumps(dict(sorted(expected.items())), separators=(",", ":"))
    second.notes.update(note, {"votes": op.increment(1)})
    device.apply(second.operations(after=device.version_vector))
    assert device.compact() == 1
    expected[second.node_id] = 3
    assert versions() == json.dumps(dict(sorted(expected.items())), separators=(",", ":"))
    assert device.notes.find_by_id(note)["votes"] == 4
    device.rebuild()
    assert device.notes.find_by_id(note)["votes"] == 4
    for app in (device, first, second):
        app.close()


def test_a_state_stored_as_its_base_is_written_out_before_compaction_replaces_the_base(
    tmp_path: Path,
) -> None:
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=None)
    note = source.notes.insert({"body": "n"})["id"]
    source.notes.update(note, {"votes": op.increment(2)})
    device.apply(source.operations())
    expected = device.notes.fetch()
    conn = device.db.conn
    # A record whose merge state equals its base, stored as `STATE_BASE`, while its log still holds
    # operations the base has folded already (folding them again changes nothing).
    ((text,),) = conn.execute("SELECT state FROM _offline_state WHERE record_id = ?", (note,)).fetchall()
    with device.db.lock, device.db.transaction():
        conn.execute(
            "INSERT INTO _offline_compacted (collection, record_id, state, versions) VALUES (?, ?, ?, ?)",
            ("notes", note, text, "{}"),
        )
        conn.execute("UPDATE _offline_state SET state = ? WHERE record_id = ?", (STATE_BASE, note))
        device.db.set_meta(compaction.FLAG_KEY, "1")
    device._compacted = True
    assert device.compact() == 2
    # The new base is the state's text, not the marker; the record reads and refolds as before.
    ((base,),) = conn.execute("SELECT state FROM _offline_compacted WHERE record_id = ?", (note,)).fetchall()
    assert base == text
    assert conn.execute("SELECT state FROM _offline_state WHERE record_id = ?", (note,)).fetchone() == (text,)
    device.rebuild()
    assert device.notes.fetch() == expected
    device.close()
    source.close()


def test_new_records_alone_never_set_automatic_compaction_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=2)
    looked: list[App] = []
    real = compaction.due
    monkeypatch.setattr(compaction, "due", lambda app: looked.append(app) or real(app))
    for i in range(50):
        source.notes.insert({"body": f"n{i}"})
    ops = source.operations()
    for start in range(0, len(ops), 5):
        device.apply(ops[start : start + 5])
    assert looked == []  # received first operations of records are not even counted
    assert sum(stored_in_log(device).values()) == 50
    assert device.db.conn.execute("SELECT count(*) FROM _offline_compacted").fetchone() == (0,)
    # Own inserts acknowledged are counted (the store cannot tell them cheaply), looked at, not compacted.
    mine = [device.notes.insert({"body": f"mine {i}"})["id"] for i in range(10)]
    acknowledge_all(device)
    assert looked and sum(stored_in_log(device).values()) == 60
    # Each of them written again and acknowledged: 10 beyond one per record of 60 is not yet max(2, 2 x 60)...
    for record_id in mine:
        device.notes.update(record_id, {"votes": op.increment(1)})
    acknowledge_all(device)
    assert sum(stored_in_log(device).values()) == 70
    # ...but once the log holds twice as many again as it has records, what is superseded goes.
    # (Due at 120 beyond one per record: at most 3 x 60 held, and the 5 of the last acknowledgement.)
    for record_id in [*mine, *(o.record_id for o in ops)]:
        for _ in range(5):
            device.notes.update(record_id, {"votes": op.increment(1)})
        acknowledge_all(device)
        assert sum(stored_in_log(device).values()) < 3 * 60 + 5
    assert device.db.conn.execute("SELECT count(*) FROM _offline_compacted").fetchone() != (0,)
    votes = {r["id"]: r["votes"] for r in device.notes.fetch()}
    assert votes == {**{o.record_id: 5 for o in ops}, **{r: 6 for r in mine}}
    device.close()
    source.close()


def test_a_hot_record_keeps_a_bounded_log_and_stored_state(tmp_path: Path) -> None:
    source = create_app(NOTES, path=":memory:", compact_after=None)
    device = create_app(NOTES, path=str(tmp_path / "d.db"), compact_after=5)
    plain = create_app(NOTES, path=":memory:", compact_after=None)
    note = source.notes.insert({"body": "hot", "tags": ["a"]})
    sizes: list[int] = []
    for n in range(300):
        source.notes.update(note["id"], {"votes": op.increment(1), "body": f"v{n}"})
        batch = source.operations(after=device.version_vector)
        device.apply(batch)
        plain.apply(batch)
        # Due when the acknowledged operations exceed the one record by max(5, 1): at most 6 held.
        assert sum(stored_in_log(device).values()) <= 6
        device.flush()
        ((text,),) = device.db.conn.execute("SELECT state FROM _offline_state").fetchall()
        sizes.append(len(text))
    # The stored state does not grow with the history (a few bytes of longer numbers aside).
    assert sizes[-1] <= sizes[9] + 32
    assert device.notes.fetch() == source.notes.fetch() == plain.notes.fetch()
    assert device.notes.find_by_id(note["id"])["votes"] == 300
    device.close()
    plain.close()
    source.close()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", True])
def test_compact_after_must_be_a_positive_count(bad: Any) -> None:
    with pytest.raises(OfflineError) as caught:
        create_app(NOTES, path=":memory:", compact_after=bad)
    assert caught.value.context["field"] == "compact_after"


# ------------------------------------------------------------------------------- property: every strategy


def in_node_order(ops: list[Operation], rng: random.Random) -> list[Operation]:
    """``ops`` shuffled across nodes, each node's own in its sequence order (how a replica receives them)."""
    shuffled = list(ops)
    rng.shuffle(shuffled)
    by_node: dict[str, list[Operation]] = {}
    for o in shuffled:
        by_node.setdefault(o.node_id, []).append(o)
    for node_ops in by_node.values():
        node_ops.sort(key=lambda o: o.sequence_number)
        node_ops.reverse()
    return [by_node[o.node_id].pop() for o in shuffled]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_compacting_replicas_converge_with_replicas_that_keep_everything(data: st.DataObject) -> None:
    """Random writes (every strategy: lww, counter, max/min, add-wins and append-only arrays, resolver,
    rich text, state machines, deletes) on three replicas exchanging partial, shuffled, duplicated batches;
    one of them compacts now and then (its own operations acknowledged first) and restarts. Once everyone
    has every operation (the compacting one receiving everything again, repeats included), all hold the
    records the engine folds from the whole set, and the compacting one still after a rebuild."""
    clock = FakeClock()
    workdir = tempfile.TemporaryDirectory()
    path = os.path.join(workdir.name, "compacting.db")
    apps = [
        create_app(SCHEMA, path=":memory:", now=clock, compact_after=None),
        create_app(SCHEMA, path=":memory:", now=clock, compact_after=None),
        # (compact_after=2: automatic compactions between the explicit ones too)
        create_app(SCHEMA, path=path, now=clock, compact_after=2),
    ]
    ledger: dict[str, Operation] = {}

    def listen(app: App) -> None:
        app.events.on(
            "operation:created", lambda event: ledger.setdefault(event["operation"].id, event["operation"])
        )

    for app in apps:
        listen(app)
    try:
        for app in apps:
            app.set_authoritative_nodes([apps[0].node_id])
        for _ in range(data.draw(st.integers(6, 40), label="steps")):
            clock.advance(data.draw(st.sampled_from([0, 0, 1, 7])))
            action = data.draw(st.integers(0, 8))
            if action <= 2:
                src, dst = data.draw(st.permutations(apps))[:2]
                held = list(ledger.values()) if src is apps[2] else src.operations()
                if dst is apps[2]:
                    # As a server delivers: each node's operations in its sequence order, with no gap, from
                    # where this replica is (the assumption compaction's repeat check rests on: a server
                    # holds every operation a node sent before one it holds), repeats included.
                    held = list(ledger.values())
                    vector = dst.version_vector
                    cut = data.draw(st.integers(0, 8))
                    picked = [o for o in held if o.sequence_number <= vector.get(o.node_id, 0) + cut]
                    dst.apply(in_node_order(picked, random.Random(len(picked))))
                elif held:
                    picked = data.draw(st.lists(st.sampled_from(held), max_size=len(held) + 3))
                    random.Random(len(picked)).shuffle(picked)
                    dst.apply(picked)
            elif action == 3:
                acknowledge_all(apps[2])
                apps[2].compact()
            elif action == 4 and data.draw(st.booleans()):
                apps[2].close()
                apps[2] = create_app(SCHEMA, path=path, now=clock, compact_after=2)
                listen(apps[2])
            else:
                local_write(data, data.draw(st.sampled_from(apps)))
        everything = list(ledger.values())
        for app in apps:
            ordered = in_node_order(data.draw(st.permutations(everything)), random.Random(1))
            app.apply(ordered)
            app.apply(ordered[: len(ordered) // 2])  # repeats, after the compaction too
        engine = MergeEngine(SCHEMA, authoritative_nodes=[apps[0].node_id])
        by_record: dict[str, list[Operation]] = {}
        for o in everything:
            by_record.setdefault(o.record_id, []).append(o)
        folded = [engine.fold("items", rid, ops)[1] for rid, ops in sorted(by_record.items())]
        expected = canonical([r for r in folded if r is not None])
        for app in apps:
            assert snapshot(app)[1] == expected
        apps[2].rebuild()
        assert snapshot(apps[2])[1] == expected
    finally:
        for app in apps:
            app.close()
        workdir.cleanup()


def test_folding_the_compacted_state_plus_the_rest_equals_folding_the_whole_history(tmp_path: Path) -> None:
    """Same stored records and merge state text for a replica that folded a long history whole and one that
    compacted halfway and folded the rest on its compacted state."""
    writer = create_app(NOTES, path=":memory:", compact_after=None)
    note = writer.notes.insert({"body": "long", "tags": []})
    rng = random.Random(7)
    for n in range(400):
        change: dict[str, Any] = {"votes": op.increment(rng.choice([1, 2, -1]))}
        if n % 3 == 0:
            change["tags"] = op.append(f"t{n % 11}")
        elif n % 7 == 0:
            change["tags"] = op.remove(f"t{(n - 7) % 11}")
        if n % 5 == 0:
            change["body"] = f"body {n}"
        writer.notes.update(note["id"], change)
    history = writer.operations()
    whole = create_app(NOTES, path=str(tmp_path / "whole.db"), compact_after=None)
    whole.apply(history)
    compacted = create_app(NOTES, path=str(tmp_path / "compacted.db"), compact_after=None)
    compacted.apply(history[:200])
    assert compacted.compact() == 200
    compacted.apply(history[150:])
    assert compacted.notes.fetch() == whole.notes.fetch() == writer.notes.fetch()

    def state_text(app: App) -> str:
        return str(app.db.load_state_texts([("notes", note["id"])])[("notes", note["id"])])

    assert state_text(compacted) == state_text(whole)
    for app in (writer, whole, compacted):
        app.close()


def server_states(server: App, held: Mapping[str, Operation]) -> list[tuple[str, str, str, dict[str, int]]]:
    """What a server's state-based catch-up sends for every record ``server`` holds: its state text and each
    node's highest sequence number among the operations folded into it (``held``: those, by id)."""
    versions: dict[str, dict[str, int]] = {}
    for o in held.values():
        record = versions.setdefault(o.record_id, {})
        record[o.node_id] = max(record.get(o.node_id, 0), o.sequence_number)
    keys = [("items", rid) for rid in versions]
    texts = server.db.load_state_texts(keys)
    return [("items", rid, str(texts[("items", rid)]), versions[rid]) for rid in sorted(versions)]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_a_replica_offline_across_a_server_compaction_converges(data: st.DataObject) -> None:
    """A "server" replica relays between an online and an offline replica and compacts; the offline one,
    with writes of its own to the same records (every strategy), catches up from the server's record states
    (`adopt_states`) instead of the compacted operations, sends its writes, and all three end with the
    records the engine folds from the whole set of operations."""
    clock = FakeClock()
    server, online, offline = (
        create_app(SCHEMA, path=":memory:", now=clock, compact_after=None) for _ in "sao"
    )
    ledger: dict[str, Operation] = {}
    held: dict[str, Operation] = {}  # what the server folded
    for app in (online, offline):
        app.events.on("operation:created", lambda e: ledger.setdefault(e["operation"].id, e["operation"]))
    rng = random.Random(data.draw(st.integers(0, 1000)))

    def upload(app: App) -> None:
        ops = [o for o in ledger.values() if o.node_id == app.node_id and o.id not in held]
        server.apply(in_node_order(ops, rng))
        held.update((o.id, o) for o in ops)
        mark_acknowledged(app, [o.sequence_number for o in ops])

    def download(app: App) -> None:
        app.apply(in_node_order(list(held.values()), rng))

    try:
        for app in (server, online, offline):
            app.set_authoritative_nodes([server.node_id])
        for phase in ("together", "apart"):
            for _ in range(data.draw(st.integers(2, 14), label=phase)):
                clock.advance(data.draw(st.sampled_from([0, 1, 5])))
                action = data.draw(st.integers(0, 5))
                writers = (online, offline)
                if action == 0:
                    upload(online)
                    if phase == "together":
                        upload(offline)
                        download(offline)
                    download(online)
                elif action == 1:
                    server.compact()
                else:
                    local_write(data, data.draw(st.sampled_from(writers)))
            if phase == "together":
                upload(online)
                upload(offline)
                download(online)
                download(offline)
        upload(online)
        server.compact()
        # The catch-up, in either order: the offline replica's writes first stored (the states then hold
        # them), or the states first (its writes then fold on top, then go up).
        if data.draw(st.booleans(), label="send first"):
            upload(offline)
            adopt_states(offline, server_states(server, held))
        else:
            adopt_states(offline, server_states(server, held))
            upload(offline)
        download(online)
        download(offline)  # the stream after the horizon: repeats of what the states hold, all of them
        engine = MergeEngine(SCHEMA, authoritative_nodes=[server.node_id])
        by_record: dict[str, list[Operation]] = {}
        for o in ledger.values():
            by_record.setdefault(o.record_id, []).append(o)
        folded = [engine.fold("items", rid, ops)[1] for rid, ops in sorted(by_record.items())]
        expected = canonical([r for r in folded if r is not None])
        for app in (server, online, offline):
            assert snapshot(app)[1] == expected
    finally:
        for app in (server, online, offline):
            app.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_a_fresh_replica_synced_by_states_converges_with_one_synced_by_operations(
    data: st.DataObject,
) -> None:
    """A state-based first sync: a fresh replica takes the server's state of every record (`adopt_states`, in
    messages of any size, perhaps after the server compacted), then the log after them (repeats of what the
    states hold included), while another fresh replica receives every operation. The first may have written
    records of its own before it ever synced, uploaded before or after the states. Both hold the server's
    records, keep no received operation (the first), and after more writes of everyone all converge on what
    the engine folds from the whole set."""
    clock = FakeClock()
    server, writer, by_ops, by_states = (
        create_app(SCHEMA, path=":memory:", now=clock, compact_after=None) for _ in "swob"
    )
    apps = (server, writer, by_ops, by_states)
    ledger: dict[str, Operation] = {}
    held: dict[str, Operation] = {}  # what the server folded
    for app in (writer, by_ops, by_states):
        app.events.on("operation:created", lambda e: ledger.setdefault(e["operation"].id, e["operation"]))
    rng = random.Random(data.draw(st.integers(0, 1000)))

    def upload(app: App) -> None:
        ops = [o for o in ledger.values() if o.node_id == app.node_id and o.id not in held]
        server.apply(in_node_order(ops, rng))
        held.update((o.id, o) for o in ops)
        mark_acknowledged(app, [o.sequence_number for o in ops])

    def download(app: App) -> None:
        app.apply(in_node_order(list(held.values()), rng))

    def expected() -> list[dict[str, Any]]:
        engine = MergeEngine(SCHEMA, authoritative_nodes=[server.node_id])
        by_record: dict[str, list[Operation]] = {}
        for o in held.values():
            by_record.setdefault(o.record_id, []).append(o)
        folded = [engine.fold("items", rid, ops)[1] for rid, ops in sorted(by_record.items())]
        return canonical([r for r in folded if r is not None])

    try:
        for app in apps:
            app.set_authoritative_nodes([server.node_id])
        for _ in range(data.draw(st.integers(1, 25), label="history")):
            clock.advance(data.draw(st.sampled_from([0, 1, 5])))
            action = data.draw(st.integers(0, 6))
            if action == 0:
                upload(writer)
            elif action == 1:
                server.compact()
            else:
                local_write(data, writer)
        upload(writer)
        for _ in range(data.draw(st.integers(0, 4), label="written before the first sync")):
            local_write(data, by_states)
        download(by_ops)
        states = server_states(server, held)
        early = data.draw(st.booleans(), label="own writes stored first")
        if early:
            upload(by_states)
            states = server_states(server, held)
        size = data.draw(st.integers(1, 5), label="states a message")
        for start in range(0, len(states), size):
            adopt_states(by_states, states[start : start + size])
        # A session cut before the final message: the next one is sent (some of) the states again.
        adopt_states(by_states, states[: data.draw(st.integers(0, len(states)), label="sent again")])
        if not early:
            upload(by_states)
        download(by_states)  # the log after the states: all of it repeats what they hold
        with by_states.db.lock:
            received = by_states.db.conn.execute(
                "SELECT count(*) FROM _offline_ops WHERE node_id != ?", (by_states.node_id,)
            ).fetchone()[0]
        assert received == 0  # every received operation is in a state, none in the log
        download(by_ops)
        assert snapshot(by_states)[1] == snapshot(by_ops)[1] == snapshot(server)[1] == expected()
        for _ in range(data.draw(st.integers(0, 10), label="afterwards")):
            clock.advance(data.draw(st.sampled_from([0, 1, 5])))
            local_write(data, data.draw(st.sampled_from([writer, by_ops, by_states])))
        for app in (writer, by_ops, by_states):
            upload(app)
        for app in (writer, by_ops, by_states):
            download(app)
        for app in apps:
            assert snapshot(app)[1] == expected()
    finally:
        for app in apps:
            app.close()


def test_a_schema_migration_after_compaction_keeps_the_compacted_values(tmp_path: Path) -> None:
    """Opening a compacted database with a newer schema rebuilds every record; a compacted record starts
    from its compacted state with its fields renamed as the migration says (and is backfilled as usual)."""
    from tests.store.test_local_migrations import V1, v2

    path = str(tmp_path / "d.db")
    device = create_app(V1, path=path, compact_after=None)
    todo = device.todos.insert({"title": "first"})
    device.todos.update(todo["id"], {"title": "renamed later", "done": True})
    acknowledge_all(device)
    assert device.compact() == 2
    device.close()
    device = create_app(v2(), path=path, compact_after=None)
    record = device.todos.find_by_id(todo["id"])
    assert record is not None
    assert (record["name"], record["done"], record["priority"]) == ("renamed later", True, 5)
    device.close()


def test_states_covering_waiting_operations_move_where_the_waiting_ones_start(tmp_path: Path) -> None:
    """The server's states hold two of this node's three waiting writes (it stored them before the states
    were read): those leave the log, and the search for waiting operations starts at the third."""
    app = create_app(SCHEMA, path=str(tmp_path / "a.db"))
    try:
        ids = [app.items.insert({"title": f"t{i}"})["id"] for i in range(3)]
        app.flush()
        states = [
            (
                "items",
                record_id,
                str(app.db.load_state_texts([("items", record_id)])[("items", record_id)]),
                {},
            )
            for record_id in ids[:2]
        ]
        sequences = {record_id: seq for seq, record_id in enumerate(ids, start=1)}
        adopt_states(app, [(c, r, s, {app.node_id: sequences[r]}) for c, r, s, _ in states])
        with app.db.lock:
            assert app.db.get_meta(PENDING_FROM_KEY) == "3"
        assert [o.record_id for o in pending_operations(app)] == [ids[2]]
    finally:
        app.close()
