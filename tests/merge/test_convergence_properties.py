"""Convergence, the product's key claim (DESIGN.md section 3): a record is a function of the set of operations.

Two levels:

* engine level: random histories of several simulated replicas writing one record (realistic
  ``previousData``, ``causal_deps`` and ``causal_context``, plus some forged state-machine writes), then the
  full set of operations is folded in many orders, with duplicates, in chunks with a JSON round trip of the
  state in between, and re-applied: every fold must give the same record and the same stored state text,
  byte for byte. Run per strategy, for all strategies together, on histories several times longer than any
  bound of the state, and with ill-typed values from a hostile peer mixed in; and on histories of
  operations without a causal context (written before it existed), whose records must still agree.
* store level: real ``create_app`` replicas (two in memory, one on an SQLite file that restarts now and
  then) doing random local writes (insert/update/delete, ``op`` helpers, rich text edits) interleaved with
  random partial, shuffled, duplicated exchanges of operations (ops dropped and resent later, as on
  reconnects); after everything reaches everyone, all replicas hold identical records (equal lists and equal
  JSON bytes), identical version vectors, and exactly what the engine folds from the set of operations.

``OFFLINE_MERGE_EXAMPLES=N`` runs N times as many examples.
"""

from __future__ import annotations

import os
import random
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offline import create_app, op
from offline.core.errors import OfflineError
from offline.core.hlc import HybridLogicalClock
from offline.core.operations import Operation, create_operation
from offline.core.schema import SchemaDefinition
from offline.merge import richtext
from offline.merge.engine import WINDOW_MAX, MergeEngine, RecordState
from offline.merge.values import fits, norm_number
from offline.store.app import App

from ._support import (
    PHASE_TRANSITIONS,
    SCHEMA,
    STATUS_TRANSITIONS,
    STRATEGY_FIELDS,
    WINDOWED_SCHEMA,
    FakeClock,
    canonical,
    new_apps,
)

ALL_FIELDS = list(STRATEGY_FIELDS.values())
NODES = ["node-a", "node-b", "node-c"]  # node-a plays the server (authoritative) node
SERVER = NODES[0]

SCALE = max(1, int(os.environ.get("OFFLINE_MERGE_EXAMPLES", "1")))
ENGINE_SETTINGS = settings(
    max_examples=25 * SCALE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
STORE_SETTINGS = settings(
    max_examples=60 * SCALE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

WORDS = ["apple", "pear", "plum", ""]
NUMBERS = [-5, 0, 1, 2, 3, 7, 1.5, 0.1, 0.2, 0.3, 2.5]
INCREMENTS = [1, 2, 3, -1, 5, 0.1, 0.2, 0.3, 0.5, 2.5]
ELEMENTS = ["w", "x", "y", "z"]
NOTES = ["n1", "n2", "n3|n1", ""]
TEXTS = ["A", "B", "xy", " ", "héllo", "😀"]


# ------------------------------------------------------------------------------------------ value drawing


def draw_change(
    data: st.DataObject, name: str, current: Any, text_state: str | None, client_id: int | None = None
) -> tuple[Any, Any] | None:
    """A realistic (value, previous) change of one field, as a replica seeing ``current`` would write it
    (rich text edits as Yjs client ``client_id``, the writing node's, as the store writes them)."""
    if name == "title":
        return data.draw(st.sampled_from([*WORDS, None])), current
    if name == "count":
        if data.draw(st.booleans()):
            return norm_number((current or 0) + data.draw(st.sampled_from(INCREMENTS))), current
        return data.draw(st.sampled_from(NUMBERS)), current
    if name in ("hi", "lo"):
        return data.draw(st.sampled_from([*NUMBERS, None])), current
    if name in ("tags", "log"):
        items = list(current or [])
        action = data.draw(st.sampled_from(["add", "remove", "replace"]))
        if action == "add":
            element = data.draw(st.sampled_from(ELEMENTS))
            new = items if element in items else [*items, element]
        elif action == "remove" and items:
            element = data.draw(st.sampled_from(items))
            new = [item for item in items if item != element]
        else:
            new = data.draw(st.lists(st.sampled_from(ELEMENTS), unique=True, max_size=4))
        return new, items
    if name == "owner":
        return data.draw(st.sampled_from(["srv", "cli-1", "cli-2", None])), current
    if name in ("status", "phase"):
        transitions = STATUS_TRANSITIONS if name == "status" else PHASE_TRANSITIONS
        if data.draw(st.integers(0, 4)) == 0:
            # A forged write (a buggy or hostile peer): any previous state, any target.
            states = list(transitions)
            return data.draw(st.sampled_from(states)), data.draw(st.sampled_from(states))
        targets = transitions.get(current, [])
        if not targets:
            return None
        return data.draw(st.sampled_from(targets)), current
    if name == "notes":
        return data.draw(st.sampled_from([*NOTES, None])), current
    if name == "body":
        text = richtext.text_of(text_state)
        if text and data.draw(st.booleans()):
            start = data.draw(st.integers(0, len(text) - 1))
            length = data.draw(st.integers(1, len(text) - start))
            update, _ = richtext.edit_update(
                text_state,
                lambda doc, s=start, n=length: doc.__delitem__(slice(s, s + n)),
                client_id=client_id,
            )
        else:
            index = data.draw(st.integers(0, len(text)))
            piece = data.draw(st.sampled_from(TEXTS))
            update, _ = richtext.edit_update(
                text_state, lambda doc, i=index, p=piece: doc.insert(i, p), client_id=client_id
            )
        return update, text
    raise AssertionError(name)


def draw_insert(data: st.DataObject, client_id: int | None = None) -> dict[str, Any]:
    return {
        "title": data.draw(st.sampled_from(WORDS)),
        "count": data.draw(st.sampled_from(NUMBERS)),
        "hi": data.draw(st.sampled_from(NUMBERS)),
        "lo": data.draw(st.sampled_from(NUMBERS)),
        "tags": data.draw(st.lists(st.sampled_from(ELEMENTS), unique=True, max_size=3)),
        "log": data.draw(st.lists(st.sampled_from(ELEMENTS), unique=True, max_size=2)),
        "owner": data.draw(st.sampled_from(["srv", "cli-1"])),
        "status": "todo",
        "phase": "a",
        "notes": data.draw(st.sampled_from(NOTES)),
        "body": richtext.initial_update(data.draw(st.sampled_from(["hello", "hi", ""])), client_id=client_id),
    }


# ------------------------------------------------------------------------------------------ engine level


class EngineReplica:
    """One replica of one record, kept with the engine alone (as the store and the server do)."""

    def __init__(self, engine: MergeEngine, node: str, clock: FakeClock, *, legacy: bool = False) -> None:
        self.engine = engine
        self.legacy = legacy  # writes operations without a causal context (as before it existed)
        self.node = node
        self.hlc = HybridLogicalClock(node, now=clock)
        self.ops: dict[str, Operation] = {}
        self.state = RecordState()
        self.seq = 0
        self.seq_inserts = 0

    def record(self) -> dict[str, Any] | None:
        return self.engine.materialize("items", "r1", self.state)

    def receive(self, ops: list[Operation]) -> None:
        """Fold what is new, as the store does: its log (here ``ops``) recognises repeats; the state only
        within its window (see the engine's "Bounded state"), and folding one there changes nothing."""
        for operation in ops:
            if operation.id not in self.ops:
                self.ops[operation.id] = operation
                self.hlc.receive(operation.timestamp)
                self.engine.apply(self.state, operation)
            elif self.state.holds(operation):
                assert self.engine.apply(self.state, operation) == []

    def write(self, type_: str, data: dict[str, Any] | None, previous: dict[str, Any] | None) -> Operation:
        self.seq += 1
        operation = create_operation(
            {
                "node_id": self.node,
                "type": type_,
                "collection": "items",
                "record_id": "r1",
                "data": data,
                "previous_data": previous,
                "timestamp": self.hlc.now(),
                "sequence_number": self.seq,
                "causal_deps": self.state.heads(),
                "schema_version": 1,
                "causal_context": None if self.legacy else self.state.next_context(self.node),
            }
        )
        self.receive([operation])
        return operation


JUNK = [5, "abc", True, None, [1, None], ["w", 2], {"k": 1}, b"not yjs", "plain text", 1.5, -0.0]


def random_history(
    data: st.DataObject,
    fields: list[str],
    *,
    junk: bool = False,
    steps: tuple[int, int] = (3, 18),
    schema: SchemaDefinition = SCHEMA,
    legacy: bool = False,
) -> tuple[MergeEngine, list[EngineReplica]]:
    engine = MergeEngine(schema, authoritative_nodes=[SERVER])
    clock = FakeClock()
    replicas = [EngineReplica(engine, node, clock, legacy=legacy) for node in NODES]
    steps = data.draw(st.integers(*steps), label="steps")
    for _ in range(steps):
        clock.advance(data.draw(st.sampled_from([0, 0, 1, 5])))
        if data.draw(st.integers(0, 2)) == 0:  # a partial exchange between two replicas
            src, dst = data.draw(st.permutations(replicas))[:2]
            held = list(src.ops.values())
            if held:
                picked = data.draw(st.lists(st.sampled_from(held), max_size=len(held) + 2))
                dst.receive(picked)
            continue
        replica = data.draw(st.sampled_from(replicas))
        current = replica.record()
        if current is None:
            # Each insert of the record as a Yjs client of its own (a random one would make the text of
            # concurrent inserts differ between runs of one example).
            replica.seq_inserts += 1
            client = richtext.client_id_for(f"{replica.node}/insert/{replica.seq_inserts}")
            replica.write("insert", draw_insert(data, client), None)
            continue
        if data.draw(st.integers(0, 7)) == 0:
            replica.write("delete", None, None)
            continue
        if junk and data.draw(st.integers(0, 5)) == 0:
            # A buggy or hostile peer: values of any type, for any field, in data and previousData.
            names = data.draw(st.lists(st.sampled_from(ALL_FIELDS), min_size=1, max_size=4, unique=True))
            replica.write(
                "update",
                {name: data.draw(st.sampled_from(JUNK)) for name in names},
                {name: data.draw(st.sampled_from(JUNK)) for name in names},
            )
            continue
        changes: dict[str, Any] = {}
        previous: dict[str, Any] = {}
        for name in data.draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True)):
            reg = replica.state.fields.get("body") or {}
            change = draw_change(
                data, name, current[name], reg.get("s"), richtext.client_id_for(replica.node)
            )
            if change is None:
                continue
            changes[name], previous[name] = change
        if changes:
            replica.write("update", changes, previous)
    return engine, replicas


def fold_canonical(engine: MergeEngine, ops: list[Operation]) -> str:
    """The record and the stored state text ``ops`` fold to."""
    state, record = engine.fold("items", "r1", ops)
    return canonical(record) + "\n" + state.to_json()


def outcome(engine: MergeEngine, state: RecordState, legacy: bool) -> str:
    """What must be equal between folds of one operation set: the record, and the stored state text too
    unless the operations carry no causal context (their states keep a part of the causal graph that
    follows arrival order; see the engine's "Bounded state"). The rich text register is compared byte for
    byte too: its Yjs encoding is canonical, whatever order the updates were merged in."""
    record = canonical(engine.materialize("items", "r1", state))
    if legacy:
        return record
    return record + "\n" + state.to_json()


def check_fold_laws(
    data: st.DataObject, engine: MergeEngine, replicas: list[EngineReplica], *, legacy: bool = False
) -> None:
    everything = {o.id: o for r in replicas for o in r.ops.values()}
    ops = [everything[k] for k in sorted(everything)]
    state, _ = engine.fold("items", "r1", ops)
    reference = outcome(engine, state, legacy)

    def folded(some: list[Operation]) -> str:
        return outcome(engine, engine.fold("items", "r1", some)[0], legacy)

    # Commutativity: any delivery order gives the same record (and state text).
    for _ in range(3):
        assert folded(data.draw(st.permutations(ops))) == reference

    # Idempotence: duplicates change nothing, and re-applying everything is a no-op.
    duplicated = [*ops, *data.draw(st.lists(st.sampled_from(ops), max_size=len(ops)))] if ops else []
    assert folded(data.draw(st.permutations(duplicated))) == reference
    before = state.to_json()
    for operation in ops:
        if state.holds(operation):  # a repeat the state recognises itself (beyond: the log's)
            assert engine.apply(state, operation) == []
    assert state.to_json() == before
    assert outcome(engine, state, legacy) == reference

    # Associativity: folding in chunks, the state stored as JSON between chunks (as the store does).
    shuffled = data.draw(st.permutations(ops))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(shuffled)), max_size=4)))
    chunked = RecordState()
    start = 0
    for cut in [*cuts, len(shuffled)]:
        for operation in shuffled[start:cut]:
            engine.apply(chunked, operation)
        chunked = RecordState.from_json(chunked.to_json())
        start = max(start, cut)
    assert outcome(engine, chunked, legacy) == reference

    # fold(A) then B == fold(B) then A == fold(A + B), for overlapping A and B.
    a = data.draw(st.lists(st.sampled_from(ops), unique_by=lambda o: o.id)) if ops else []
    a_ids = {o.id for o in a}
    b = [o for o in ops if o.id not in a_ids or data.draw(st.booleans())]
    for first, second in ((a, b), (b, a)):
        grouped, _ = engine.fold("items", "r1", first)
        held = {o.id for o in first}  # the log of the replica that folded ``first``
        for operation in second:
            if operation.id not in held:
                engine.apply(grouped, operation)
        assert outcome(engine, grouped, legacy) == reference

    # Every replica's incrementally built state converges once it holds everything.
    for replica in replicas:
        replica.receive(data.draw(st.permutations(ops)))
        assert outcome(engine, replica.state, legacy) == reference


@pytest.mark.parametrize("strategy", list(STRATEGY_FIELDS))
@ENGINE_SETTINGS
@given(data=st.data())
def test_engine_fold_laws_per_strategy(strategy: str, data: st.DataObject) -> None:
    engine, replicas = random_history(data, [STRATEGY_FIELDS[strategy]])
    check_fold_laws(data, engine, replicas)


@pytest.mark.parametrize("strategy", list(STRATEGY_FIELDS))
@settings(ENGINE_SETTINGS, max_examples=5 * SCALE)
@given(data=st.data())
def test_engine_fold_laws_on_long_histories(strategy: str, data: st.DataObject) -> None:
    """Histories several times longer than the window of the causal graph a state of operations without a
    causal context keeps: with contexts the state keeps no graph at all, and its text is still a function of
    the operation set."""
    field = STRATEGY_FIELDS[strategy]
    engine, replicas = random_history(data, [field], steps=(50, 70))
    check_fold_laws(data, engine, replicas)
    assert all(not r.state.graph and len(r.state.tips) <= len(NODES) for r in replicas)


@pytest.mark.parametrize("strategy", list(STRATEGY_FIELDS))
@settings(ENGINE_SETTINGS, max_examples=5 * SCALE)
@given(data=st.data())
def test_engine_fold_laws_on_long_histories_without_causal_contexts(
    strategy: str, data: st.DataObject
) -> None:
    """Operations written before causal contexts existed merge as they did: records agree whatever the order
    (the state keeps their causal graph, trimmed to a window when no register reads it)."""
    field = STRATEGY_FIELDS[strategy]
    schema = SCHEMA if field in ("tags", "notes") else WINDOWED_SCHEMA
    engine, replicas = random_history(data, [field], steps=(50, 70), schema=schema, legacy=True)
    check_fold_laws(data, engine, replicas, legacy=True)
    if schema is WINDOWED_SCHEMA:
        # Trimmed: what is left is the window, and the heads (never dropped) beyond it.
        assert all(len(r.state.graph) <= WINDOW_MAX + len(r.state.heads()) for r in replicas)


@settings(ENGINE_SETTINGS, max_examples=20 * SCALE)
@given(data=st.data())
def test_engine_fold_laws_without_causal_contexts_all_strategies(data: st.DataObject) -> None:
    engine, replicas = random_history(data, ALL_FIELDS, legacy=True)
    check_fold_laws(data, engine, replicas, legacy=True)


@settings(ENGINE_SETTINGS, max_examples=60 * SCALE)
@given(data=st.data())
def test_engine_fold_laws_all_strategies_together(data: st.DataObject) -> None:
    engine, replicas = random_history(data, ALL_FIELDS)
    check_fold_laws(data, engine, replicas)


def typing_history(data: st.DataObject, nodes: int) -> tuple[MergeEngine, list[EngineReplica]]:
    """``nodes`` replicas of one record typing into its rich text field concurrently: bursts of characters
    typed one operation each (runs of one Yjs client, as a person types), deletions of spans (of anyone's
    typing), and partial, duplicated exchanges between them."""
    engine = MergeEngine(SCHEMA, authoritative_nodes=[SERVER])
    clock = FakeClock()
    replicas = [EngineReplica(engine, node, clock) for node in NODES[:nodes]]
    first = replicas[0]
    first.write(
        "insert", {"body": richtext.initial_update("hello", client_id=richtext.client_id_for("x"))}, None
    )
    for _ in range(data.draw(st.integers(4, 16), label="steps")):
        clock.advance(data.draw(st.sampled_from([0, 1])))
        if data.draw(st.integers(0, 2)) == 0:
            src, dst = data.draw(st.permutations(replicas))[:2]
            held = list(src.ops.values())
            if held:
                dst.receive(data.draw(st.lists(st.sampled_from(held), max_size=len(held) + 2)))
            continue
        replica = data.draw(st.sampled_from(replicas))
        if replica.record() is None:
            continue  # has not seen the insert yet
        client = richtext.client_id_for(replica.node)
        text = richtext.text_of((replica.state.fields.get("body") or {}).get("s"))
        if text and data.draw(st.integers(0, 2)) == 0:
            start = data.draw(st.integers(0, len(text) - 1))
            stop = data.draw(st.integers(start + 1, min(len(text), start + 4)))
            edits: list[Any] = [lambda doc, a=start, b=stop: doc.__delitem__(slice(a, b))]
        else:
            at = data.draw(st.integers(0, len(text)))
            typed = data.draw(st.text(alphabet="abé😀 ", min_size=1, max_size=5))
            edits = [lambda doc, i=at + k, c=c: doc.insert(i, c) for k, c in enumerate(typed)]
        for edit in edits:
            body = (replica.state.fields.get("body") or {}).get("s")
            update, before = richtext.edit_update(body, edit, client_id=client)
            replica.write("update", {"body": update}, {"body": before})
    return engine, replicas


@settings(ENGINE_SETTINGS, max_examples=40 * SCALE)
@given(data=st.data())
def test_rich_text_state_bytes_are_a_function_of_the_operation_set(data: st.DataObject) -> None:
    """Two or three nodes typing into one rich text field at once: whatever order (with duplicates, in chunks
    stored between) a replica folds their operations in, it stores the same Yjs bytes, not only the same
    text: the state the store persists (and its row's BLOB) and the state text the server keeps."""
    engine, replicas = typing_history(data, data.draw(st.integers(2, 3)))
    check_fold_laws(data, engine, replicas)
    everything = {o.id: o for r in replicas for o in r.ops.values()}
    state, _ = engine.fold("items", "r1", list(everything.values()))
    expected = richtext.state_bytes(state.fields["body"]["s"])
    for replica in replicas:
        held = replica.state.fields["body"]["s"]
        assert richtext.state_bytes(held) == expected
        assert richtext.text_of(held) == richtext.text_of(expected)


@ENGINE_SETTINGS
@given(data=st.data())
def test_engine_ignores_ill_typed_remote_values_the_same_way_everywhere(data: st.DataObject) -> None:
    engine, replicas = random_history(data, ALL_FIELDS, junk=True)
    check_fold_laws(data, engine, replicas)
    # Whatever was sent, every field of the record still has a value of its declared type.
    record = replicas[0].record()
    if record is not None:
        for name, descriptor in SCHEMA.collections["items"].fields.items():
            value = record[name]
            if descriptor.type == "richtext":
                assert isinstance(value, str)
            elif value is not None:
                assert fits(descriptor, value), (name, value)


# ------------------------------------------------------------------------------------------ store level

RECORD_IDS = ["r1", "r2"]


def local_write(data: st.DataObject, app: App) -> None:
    """One random local write through the public collection API; refused writes are skipped."""
    items = app.collection("items")
    record_id = data.draw(st.sampled_from(RECORD_IDS))
    current = items.find_by_id(record_id)
    try:
        if current is None:
            items.insert(
                {
                    "id": record_id,
                    "title": data.draw(st.sampled_from(WORDS)),
                    "count": data.draw(st.sampled_from(NUMBERS)),
                    "tags": data.draw(st.lists(st.sampled_from(ELEMENTS), unique=True, max_size=2)),
                    "body": data.draw(st.sampled_from(["hello", ""])),
                }
            )
            return
        kind = data.draw(
            st.sampled_from(
                ["delete", "set", "set", "increment", "max", "min", "append", "remove", "text", "text"]
            )
        )
        if kind == "delete":
            items.delete(record_id)
        elif kind == "increment":
            items.update(record_id, {"count": op.increment(data.draw(st.sampled_from(INCREMENTS)))})
        elif kind == "max":
            items.update(record_id, {"hi": op.max(data.draw(st.sampled_from(NUMBERS)))})
        elif kind == "min":
            items.update(record_id, {"lo": op.min(data.draw(st.sampled_from(NUMBERS)))})
        elif kind in ("append", "remove"):
            name = data.draw(st.sampled_from(["tags", "log"]))
            helper = op.append if kind == "append" else op.remove
            items.update(record_id, {name: helper(data.draw(st.sampled_from(ELEMENTS)))})
        elif kind == "text":
            handle = items.richtext(record_id, "body")
            size = len(handle)
            if size and data.draw(st.booleans()):
                start = data.draw(st.integers(0, size - 1))
                handle.delete(start, data.draw(st.integers(1, size - start)))
            else:
                handle.insert(data.draw(st.integers(0, size)), data.draw(st.sampled_from(TEXTS)))
        else:
            changes: dict[str, Any] = {}
            for name in data.draw(st.lists(st.sampled_from(ALL_FIELDS), min_size=1, max_size=3, unique=True)):
                if name == "body":
                    changes[name] = data.draw(st.sampled_from(["new text", "", "hello world"]))
                elif name in ("status", "phase"):
                    # Any target: invalid ones raise ('reject') or are silently kept ('last-valid-state').
                    changes[name] = data.draw(
                        st.sampled_from(["todo", "doing", "done"] if name == "status" else ["a", "b", "c"])
                    )
                else:
                    change = draw_change(data, name, current[name], None)
                    if change is not None:
                        changes[name] = change[0]
            items.update(record_id, changes)
    except OfflineError as exc:
        # Refused locally: an invalid transition under 'reject', or an insert reusing the id of a record this
        # replica has history for (ids are not reused). Nothing else may fail here.
        refused = exc.code == "INVALID_TRANSITION" or (exc.context or {}).get("reason") == "DUPLICATE_ID"
        assert refused, exc


def partial_exchange(data: st.DataObject, src: App, dst: App) -> None:
    """dst receives a random subset of src's operations: shuffled, duplicated, in several batches."""
    held = src.operations()
    if not held:
        return
    picked = data.draw(st.lists(st.sampled_from(held), max_size=len(held) + 3))
    batches = data.draw(st.integers(1, 3))
    for index in range(batches):
        batch = picked[index::batches]
        random.Random(index).shuffle(batch)
        dst.apply(batch)


def snapshot(app: App) -> tuple[list[dict[str, Any]], str]:
    records = app.collection("items").fetch()
    return records, canonical(records)


def stored_bytes(app: App) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What the store persists of the records: their merge states and their rows (a rich text field's row
    column holds its Yjs state as a BLOB). A state of one operation may be stored as a reference to it (a
    local insert) or as its text (a received one, under automatic compaction): compared as the text."""
    app.flush()
    conn = app.db.conn
    keys = [(str(c), str(r)) for c, r in conn.execute("SELECT collection, record_id FROM _offline_state")]
    texts = app.db.load_state_texts(keys)
    states = [(c, r, texts[(c, r)]) for c, r in sorted(keys)]
    codec = app.codecs["items"]
    rows = conn.execute(f"SELECT {codec.select_columns} FROM {codec.table} ORDER BY 1").fetchall()
    return [tuple(r) for r in states], [tuple(r) for r in rows]


@STORE_SETTINGS
@given(data=st.data())
def test_store_replicas_converge(data: st.DataObject) -> None:
    clock = FakeClock()
    workdir = tempfile.TemporaryDirectory()
    # Two in-memory replicas and one on an SQLite file, which sometimes restarts (close, reopen).
    path = os.path.join(workdir.name, "replica.db")
    apps = [*new_apps(2, clock=clock), create_app(SCHEMA, path=path, now=clock)]
    try:
        for app in apps:
            app.set_authoritative_nodes([apps[0].node_id])
        steps = data.draw(st.integers(4, 24), label="steps")
        for _ in range(steps):
            clock.advance(data.draw(st.sampled_from([0, 0, 1, 7])))
            action = data.draw(st.integers(0, 6))
            if action <= 1:
                src, dst = data.draw(st.permutations(apps))[:2]
                partial_exchange(data, src, dst)
            elif action == 2 and data.draw(st.booleans()):
                before = snapshot(apps[2])
                apps[2].close()
                apps[2] = create_app(SCHEMA, path=path, now=clock)
                assert snapshot(apps[2]) == before  # every write was durable
            else:
                local_write(data, data.draw(st.sampled_from(apps)))

        # Reconnect everyone: each replica gets every operation, in a random order of batches.
        everything = [o for app in apps for o in app.operations()]
        for app in data.draw(st.permutations(apps)):
            batches = data.draw(st.integers(1, 3))
            ordered = data.draw(st.permutations(everything))
            for index in range(batches):
                app.apply(ordered[index::batches])

        records, text = snapshot(apps[0])
        stored = stored_bytes(apps[0])
        for app in apps[1:]:
            other_records, other_text = snapshot(app)
            assert other_records == records
            assert other_text == text
            assert stored_bytes(app) == stored  # merge states and rows, rich text BLOBs included
            assert app.version_vector == apps[0].version_vector
            for record in other_records:
                assert app.collection("items").find_by_id(record["id"]) == record

        # The rows are what the engine computes from the set of operations alone.
        engine = MergeEngine(SCHEMA, authoritative_nodes=[apps[0].node_id])
        by_record: dict[str, list[Operation]] = {}
        for o in {o.id: o for o in everything}.values():
            by_record.setdefault(o.record_id, []).append(o)
        folded = [engine.fold("items", rid, ops)[1] for rid, ops in sorted(by_record.items())]
        assert canonical([r for r in folded if r is not None]) == text

        # A full refold from the log (what a schema migration does) gives the same rows again.
        apps[1].rebuild()
        assert snapshot(apps[1])[1] == text
    finally:
        for app in apps:
            app.close()
        workdir.cleanup()
