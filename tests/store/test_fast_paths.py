"""The store's fast paths give the same results as the general ones: the compact merge-state text, the
operations a local write builds, `apply(verified=True)`, batched forgery checks and cached rows."""

from __future__ import annotations

import dataclasses
import gc
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from offline import OfflineError, create_app, define_schema, op, t
from offline.core.operations import Operation, create_operation
from offline.merge.engine import RecordState
from offline.store import App, compaction
from offline.store.database import WIRE

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "title": t.string(),
                    "done": t.boolean().default(False),
                    "votes": t.number().merge("counter").default(0),
                    "tags": t.array(t.string()).default([]),
                    "owner": t.string().optional(),
                }
            }
        },
    }
)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    with create_app(SCHEMA, path=str(tmp_path / "app.db")) as app:
        yield app


def _plain(state: RecordState) -> str:
    plain: dict[str, object] = {"g": state.graph, "e": state.exist, "i": state.has_insert, "f": state.fields}
    if state.clock or state.extra:  # a state of operations with a causal context
        plain.update(c=state.clock, x=state.extra, p=state.past, h=state.tips)
    return json.dumps(plain, separators=(",", ":"), ensure_ascii=False)


def _without_contexts(ops: list[Operation]) -> list[Operation]:
    """The operations as a client from before causal contexts wrote them (new ids; deps follow)."""
    renamed: dict[str, str] = {}
    out = []
    for o in ops:
        wire = o.to_wire()
        del wire["causalContext"], wire["id"]
        wire["causalDeps"] = [renamed.get(dep, dep) for dep in wire["causalDeps"]]
        legacy = create_operation(wire)
        renamed[o.id] = legacy.id
        out.append(legacy)
    return out


def _state(app: App, record_id: str) -> RecordState:
    app.flush()
    state = app.db.load_state("todos", record_id)
    assert state is not None
    return state


def test_state_text_is_compact_and_reads_back_equal(app: App) -> None:
    record = app.todos.insert({"title": "a", "tags": ["x"]})
    for i in range(3):
        app.todos.update(record["id"], {"votes": op.increment(2), "title": f"t{i}", "tags": ["y"]})
    state = _state(app, record["id"])
    text = state.to_json()
    # Local writes carry causal contexts: no causal graph, a canonical text (sorted keys).
    assert json.loads(text)["g"] == {} and list(json.loads(text)) == sorted(json.loads(text))
    assert len(text) < 1_000
    assert RecordState.from_json(text) == state
    assert RecordState.from_json(text).to_json() == text


def test_plain_state_text_is_still_read(app: App) -> None:
    record = app.todos.insert({"title": "a"})
    app.todos.update(record["id"], {"title": "b"})
    state = _state(app, record["id"])
    assert RecordState.from_json(_plain(state)) == state
    assert RecordState.from_json(_plain(state).encode()) == state


def test_state_with_dependencies_outside_its_graph_round_trips() -> None:
    key = [1, 0, "n1", "b" * 64]
    state = RecordState(
        graph={"b" * 64: ["a" * 64], "c" * 64: ["b" * 64, "z" * 64]},
        exist=[[2, 0, "n2", "c" * 64], "update"],
        has_insert=True,
        fields={"title": {"k": key, "v": "x", "lk": [5, 1, "n3", "q" * 64]}},
    )
    assert RecordState.from_json(state.to_json()) == state


def test_irregular_state_falls_back_to_the_plain_text() -> None:
    state = RecordState(graph={"a": [1]}, exist=None, has_insert=False, fields={"x": {"k": 3}})  # type: ignore[list-item]
    text = state.to_json()
    assert text == _plain(state)
    assert RecordState.from_json(text) == state


def test_local_operations_equal_create_operation(app: App) -> None:
    record = app.todos.insert({"title": "héllo", "tags": ["a", "b"]})
    app.todos.update(record["id"], {"votes": op.increment(1), "owner": "me"})
    app.todos.delete(record["id"])
    ops = app.operations()
    assert [o.type for o in ops] == ["insert", "update", "delete"]
    for stored in ops:
        fields = {f.name: getattr(stored, f.name) for f in dataclasses.fields(Operation) if f.name != "id"}
        assert create_operation(fields) == stored
    rows = app.db.conn.execute(f"SELECT {WIRE} FROM _offline_ops ORDER BY sequence_number").fetchall()
    for stored, (wire,) in zip(ops, rows, strict=True):
        assert wire == json.dumps(stored.to_wire(), separators=(",", ":"), ensure_ascii=False)


def test_local_wire_text_is_json_dumps_with_floats_and_odd_strings(tmp_path: Path) -> None:
    """A local write's wire text is orjson's when its data holds no float (`floatless_json`): the same bytes
    as json.dumps, as is the text of a write holding floats (which json writes: "1e-07", "1e+16")."""
    schema = define_schema(
        {
            "version": 1,
            "collections": {
                "notes": {
                    "fields": {
                        "text": t.string(),
                        "n": t.number().optional(),
                        "ns": t.array(t.number()).default([]),
                        "words": t.array(t.string()).default([]),
                    }
                }
            },
        }
    )
    odd = 'q"\\ \n\t\x01\x1f\x7f \u2028 é 日本 \U0001f600'
    with create_app(schema, path=str(tmp_path / "wire.db")) as app:
        first = app.notes.insert({"text": odd, "n": 2**53 - 1, "words": [odd, ""]})
        app.notes.insert({"id": f"id {odd}", "text": "x", "n": -(2**53 - 1), "ns": [0, -1]})
        for number in (0.1, 1e-7, 1e16, 2.5, 1e21, -3.25):
            app.notes.insert({"text": "f", "n": number, "ns": [1, number]})
        app.notes.insert({"text": "in the array only", "ns": [1, 1e-7]})
        app.notes.update(first["id"], {"n": 0.5, "text": odd + odd})
        app.notes.update(first["id"], {"n": 7})
        app.notes.delete(first["id"])
        ops = app.operations()
        rows = app.db.conn.execute(f"SELECT {WIRE} FROM _offline_ops ORDER BY sequence_number").fetchall()
    assert len(rows) == 12
    texts = [wire for (wire,) in rows]
    assert any("1e-07" in text for text in texts) and any("1e+16" in text for text in texts)
    for stored, text in zip(ops, texts, strict=True):
        assert text == json.dumps(stored.to_wire(), separators=(",", ":"), ensure_ascii=False)
        assert Operation.from_wire(json.loads(text)) == stored


def test_local_write_with_invalid_text_is_refused_and_leaves_no_gap(app: App) -> None:
    with pytest.raises(OfflineError):
        app.todos.insert({"title": "bad\ud800"})
    app.todos.insert({"title": "ok"})
    assert app.version_vector == {app.node_id: 1}


def test_apply_verified_skips_only_the_hash_check(tmp_path: Path, app: App) -> None:
    with create_app(SCHEMA, path=str(tmp_path / "other.db")) as other:
        other.todos.insert({"title": "remote"})
        (remote,) = other.operations()
    forged = dataclasses.replace(remote, id="f" * 64)
    with pytest.raises(OfflineError) as refused:
        app.apply([forged])
    assert refused.value.context["reason"] == "HASH_MISMATCH"
    with pytest.raises(OfflineError):
        app.apply([forged.to_wire()])
    assert app.apply([remote], verified=True) == [remote]
    assert app.todos.count() == 1


def test_reused_sequence_numbers_are_found_in_a_batch(tmp_path: Path, app: App) -> None:
    with create_app(SCHEMA, path=str(tmp_path / "other.db")) as other:
        for i in range(3):
            other.todos.insert({"title": f"r{i}"})
        ops = other.operations()
    app.apply(ops[:2])
    rewritten = create_operation(
        {
            **{f.name: getattr(ops[1], f.name) for f in dataclasses.fields(Operation) if f.name != "id"},
            "data": {"title": "other"},
        }
    )
    with pytest.raises(OfflineError) as refused:
        app.apply([ops[2], rewritten])
    assert refused.value.context == {"field": "sequenceNumber", "operationId": rewritten.id}
    assert app.todos.count() == 2


def test_unflushed_reads_use_the_rows_of_the_last_write(app: App) -> None:
    record = app.todos.insert({"title": "a", "tags": ["x"]})
    record["tags"].append("changed by the caller")
    record["title"] = "changed by the caller"
    assert app.todos.find_by_id(record["id"]) == {
        "id": record["id"],
        "title": "a",
        "done": False,
        "votes": 0,
        "tags": ["x"],
        "owner": None,
    }
    updated = app.todos.update(record["id"], {"done": True})
    assert app.todos.find_by_id(record["id"]) == updated
    app.flush()
    assert app.todos.find_by_id(record["id"]) == updated


def _live_states() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is RecordState)


def test_inserted_records_wait_for_their_flush_as_their_insert(app: App) -> None:
    """A record just inserted has the state its insert makes of nothing, which its stored state refers to
    anyway ("@" + the insert's id): until the flush, the store keeps the insert (held for the batch's
    announcement already), not a decoded state. 10,000 batched inserts kept ~10 containers each alive
    otherwise, and the garbage collector walked them all again at every full collection."""
    states_before = _live_states()
    with app.batch():
        ids = [app.todos.insert({"title": f"t{i}", "tags": ["x"]})["id"] for i in range(300)]
        assert _live_states() == states_before
        # Later writes and reads inside the batch see them.
        assert app.todos.find_by_id(ids[1]) == {
            "id": ids[1],
            "title": "t1",
            "done": False,
            "votes": 0,
            "tags": ["x"],
            "owner": None,
        }
        updated = app.todos.update(ids[0], {"votes": op.increment(2), "tags": ["x", "y"]})
        assert updated["votes"] == 2 and updated["tags"] == ["x", "y"]
        assert app.todos.find_by_id(ids[0]) == updated
        assert app.todos.where({"title": "t2"}).fetch()[0]["id"] == ids[2]  # flushed inside the batch
        app.todos.update(ids[2], {"done": True})
    for record_id in (ids[3], ids[299]):
        (insert,) = app.db.record_operations("todos", record_id)
        assert _stored_state(app, record_id) == "@" + insert.id
    for record_id in (ids[0], ids[2]):
        assert RecordState.from_json(_stored_state(app, record_id)) == _fold(app, record_id)
    assert app.todos.find_by_id(ids[2])["done"] is True
    app.todos.insert({"title": "one by one"})  # outside a batch, kept until the flush the same way
    assert _live_states() == states_before
    assert app.todos.count() == 301


def _stored_state(app: App, record_id: str) -> str:
    app.flush()
    (text,) = app.db.conn.execute(
        "SELECT state FROM _offline_state WHERE collection = 'todos' AND record_id = ?", (record_id,)
    ).fetchone()
    return str(text)


def _fold(app: App, record_id: str) -> RecordState:
    state = RecordState()
    for stored in app.db.record_operations("todos", record_id):
        app.engine.apply(state, stored, want_conflicts=False)
    return state


def test_a_record_made_by_one_insert_stores_a_reference_to_it(tmp_path: Path) -> None:
    path = str(tmp_path / "app.db")
    with create_app(SCHEMA, path=path) as app:
        record = app.todos.insert({"title": "a", "tags": ["x"]})
        (insert,) = app.operations()
        assert _stored_state(app, record["id"]) == "@" + insert.id
        assert app.db.load_state("todos", record["id"]) == _fold(app, record["id"])
        assert app.db.load_state_texts([("todos", record["id"])]) == {
            ("todos", record["id"]): _fold(app, record["id"]).to_json()
        }
    with create_app(SCHEMA, path=path) as app:  # read back after a restart, then written as a text
        app.todos.update(record["id"], {"votes": op.increment(2)})
        assert app.todos.find_by_id(record["id"])["votes"] == 2
        text = _stored_state(app, record["id"])
        assert not text.startswith("@")
        assert RecordState.from_json(text) == _fold(app, record["id"])


def test_remote_inserts_and_their_updates_fold_on_the_reference_as_the_general_path(tmp_path: Path) -> None:
    with create_app(SCHEMA, path=str(tmp_path / "writer.db")) as writer:
        ids = [writer.todos.insert({"title": f"t{i}", "tags": []})["id"] for i in range(4)]
        inserts = writer.operations()
        writer.todos.update(ids[0], {"title": "renamed", "votes": op.increment(3)})
        writer.todos.update(ids[1], {"done": True})
        writer.todos.update(ids[2], {"tags": ["set"]})  # an add-wins set write: the general path
        writer.todos.delete(ids[3])
        later = writer.operations()[len(inserts) :]
    # The fold on the reference covers operations without a causal context (states keeping a graph).
    legacy = _without_contexts([*inserts, *later])
    inserts, later = legacy[: len(inserts)], legacy[len(inserts) :]
    # The fast path, and the general one (a merge:conflict listener makes every record decode its state).
    # Without automatic compaction: with it, a received insert's state is stored as text (next test).
    fast = create_app(SCHEMA, path=str(tmp_path / "fast.db"), compact_after=None)
    general = create_app(SCHEMA, path=str(tmp_path / "general.db"), compact_after=None)
    general.events.on("merge:conflict", lambda event: None)
    folded: list[object] = []
    on_reference = fast.engine.apply_to_insert

    def counted(*args: object) -> object:
        outcome = on_reference(*args)  # type: ignore[arg-type]
        folded.append(outcome)
        return outcome

    fast.engine.apply_to_insert = counted  # type: ignore[method-assign]
    with fast, general:
        for replica in (fast, general):
            replica.apply(inserts)
            replica.apply(later)
        # The two updates of lww fields and a counter folded on the reference; the set write and the delete
        # took the general path.
        assert [outcome is not None for outcome in folded] == [True, True, False, False]
        assert [_stored_state(fast, i)[:1] for i in ids] == ["{", "{", "{", "{"]
        for record_id in ids:
            assert _stored_state(fast, record_id) == _stored_state(general, record_id)
            assert fast.db.load_state("todos", record_id) == _fold(fast, record_id)
        assert fast.todos.all().fetch() == general.todos.all().fetch()
        assert fast.todos.find_by_id(ids[0])["title"] == "renamed"


def test_with_automatic_compaction_a_received_insert_keeps_its_reference_and_its_operation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Automatic compaction drops superseded history only: a record's one operation stays in the log, so a
    # received insert's state is stored as a reference to it, with or without compaction, and the
    # compaction that comes has no reference to write out (no operation is parsed).
    with create_app(SCHEMA, path=str(tmp_path / "writer.db")) as writer:
        ids = [writer.todos.insert({"title": f"t{i}", "tags": []})["id"] for i in range(3)]
        inserts = writer.operations()
        # (6 beyond one operation per record: automatic compaction is due at max(2, 2 x 3 records).)
        for n in range(6):
            writer.todos.update(ids[0], {"title": f"renamed {n}", "votes": op.increment(1)})
        later = writer.operations()[len(inserts) :]
    with (
        create_app(SCHEMA, path=str(tmp_path / "compacting.db"), compact_after=2) as compacting,
        create_app(SCHEMA, path=str(tmp_path / "plain.db"), compact_after=None) as plain,
    ):
        for replica in (compacting, plain):
            replica.apply(inserts)
        for record_id in ids:
            for replica in (compacting, plain):
                assert _stored_state(replica, record_id)[:1] == "@"
        parsed: list[str] = []
        real = compaction.operation_from_text
        monkeypatch.setattr(compaction, "operation_from_text", lambda text: parsed.append(text) or real(text))
        for replica in (compacting, plain):
            replica.apply(later)
        kept = {str(r) for (r,) in compacting.db.conn.execute("SELECT record_id FROM _offline_ops")}
        assert kept == {ids[1], ids[2]}  # ids[0]'s seven operations went
        assert parsed == []
        for record_id in ids[1:]:
            assert _stored_state(compacting, record_id)[:1] == "@"
        assert compacting.todos.all().fetch() == plain.todos.all().fetch()
        assert compacting.todos.find_by_id(ids[0])["votes"] == 6


def test_a_reference_to_a_missing_operation_is_a_storage_error(app: App) -> None:
    record = app.todos.insert({"title": "a"})
    app.flush()
    app.db.conn.execute("DELETE FROM _offline_ops")  # a damaged log
    with pytest.raises(OfflineError) as failed:
        app.db.load_state("todos", record["id"])
    assert failed.value.code == "STORAGE_ERROR"
    assert failed.value.context["recordId"] == record["id"]
    assert app.todos.find_by_id(record["id"])["title"] == "a"  # the row is still read


def stored_wires(app: App) -> dict[str, str]:
    return dict(app.db.conn.execute(f"SELECT id, {WIRE} FROM _offline_ops").fetchall())


def test_operations_read_from_the_log_carry_their_stored_text_to_another_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``app.operations()`` hands out operations with the text the log holds, and ``apply`` on another
    replica stores that text as it is: nothing is encoded again, even a text in another key order."""
    from offline.core.operations import received_text
    from offline.merge import values

    with create_app(SCHEMA, path=str(tmp_path / "a.db")) as a:
        first = a.todos.insert({"title": "milk", "tags": ["x"]})
        a.todos.update(first["id"], {"votes": op.increment(2), "title": "oat milk"})
        # A text the way another writer's encoder may order the operation's own keys (its data keeps the
        # writer's order): it reads back as the same operation.
        other = create_operation(
            {
                "node_id": "peer",
                "type": "insert",
                "collection": "todos",
                "record_id": "r2",
                "data": {"title": "bread"},
                "timestamp": a.clock.now(),
                "sequence_number": 1,
                "schema_version": 1,
            }
        )
        shuffled = json.dumps(dict(reversed(list(other.to_wire().items()))), separators=(",", ":"))
        a.apply([json.loads(shuffled)])
        a.db.conn.execute("UPDATE _offline_ops SET wire = ? WHERE id = ?", (shuffled, other.id))
        ops = a.operations()
        held = stored_wires(a)
    assert [received_text(o) for o in ops] == [held[o.id] for o in ops]

    def no_encoding(op: Operation) -> str:
        raise AssertionError(f"operation {op.id} was encoded again")

    monkeypatch.setattr(values, "wire_json", no_encoding)
    with create_app(SCHEMA, path=str(tmp_path / "b.db")) as b:
        b.apply(ops)
        assert stored_wires(b) == held
        assert b.todos.find_by_id(first["id"])["title"] == "oat milk"
        assert b.todos.find_by_id("r2")["title"] == "bread"
        # A copy made with dataclasses.replace carries no text: it is encoded as usual.
        assert received_text(dataclasses.replace(ops[0])) is None
