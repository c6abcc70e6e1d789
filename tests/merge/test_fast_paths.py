"""The fold's fast paths give exactly what the general code gives.

`MergeEngine.apply` and `materialize` inline the common registers (lww, integer counters, an empty add-wins
set), and `apply` holds a state's first operation with a causal context without `_add_dot` and skips
`after_fold` when the fold cannot have left a removal; `topological_sort` returns the HLC order directly
when that order is already causal; the store writes an operation's wire text with `wire_json`. Each is
checked here against the general code it stands for, on the random histories of the convergence tests
(every strategy, ill-typed values, concurrent writes), byte for byte.
"""

from __future__ import annotations

import heapq
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from offline import define_schema, t
from offline.core.hlc import HybridLogicalClock
from offline.core.operations import Operation, create_operation
from offline.core.uuid7 import UUIDv7Generator
from offline.core.version_vector import topological_sort
from offline.merge.engine import (
    REPEATED,
    WINDOW_MAX,
    Conflict,
    MergeEngine,
    RecordState,
    _add_dot,
    trim_window,
)
from offline.merge.values import compact_json, op_key, wire_json

from ._support import FakeClock, sorted_concat
from .test_causal_context import SCHEMA as SETS_SCHEMA
from .test_causal_context import _op
from .test_convergence_properties import ALL_FIELDS, ENGINE_SETTINGS, SCALE, EngineReplica, random_history


def general_apply(engine: MergeEngine, state: RecordState, op: Operation, want: bool) -> list[Conflict]:
    """`MergeEngine.apply` without its inlined registers: every field through `_apply_field`."""
    conflicts = _general_fold(engine, state, op, want)
    engine.after_fold(engine.plan(op.collection), state, op, conflicts)
    return conflicts


def _general_fold(engine: MergeEngine, state: RecordState, op: Operation, want: bool) -> list[Conflict]:
    plan = engine.plan(op.collection)
    context = op.causal_context
    if context is None:
        if op.id in state.graph:
            return []
        if plan.windowed and len(state.graph) >= WINDOW_MAX:
            trim_window(state.graph)
        state.graph[op.id] = list(op.causal_deps)
    else:
        if state.holds(op):
            return []
        _add_dot(state, op.id, op.node_id, context[op.node_id], context)
    data = engine.op_fields(op) if op.type != "delete" else {}
    for name, _, _, policy in engine.transition_problems(op):
        if policy == "reject":
            return []
        data.pop(name, None)
    key = op_key(op)
    if context is not None:
        key.append(context[op.node_id])
    if state.exist is None or key > state.exist[0]:
        state.exist = [key, op.type]
    if op.type == "insert":
        state.has_insert = True
    if op.type == "delete":
        return []
    previous = engine.op_fields(op, "previous") if op.type == "update" else {}
    conflicts = []
    for name, value in data.items():
        register = state.fields.get(name)
        conflict = engine._apply_field(
            plan, state, name, plan.kinds[name], register, op, key, value, previous, want
        )
        if conflict is not None:
            conflicts.append(conflict)
    return conflicts


def general_materialize(engine: MergeEngine, state: RecordState) -> dict[str, Any] | None:
    if not state.alive:
        return None
    plan = engine.plan("items")
    return {"id": "r1", **{n: engine.value_of(plan, n, state.fields.get(n), state) for n in plan.fields}}


def same_fold(engine: MergeEngine, ops: list[Operation], want: bool, reload_every: int) -> None:
    fast, general = RecordState(), RecordState()
    for index, op in enumerate(ops):
        assert engine.apply(fast, op, want_conflicts=want) == general_apply(engine, general, op, want)
        assert fast.to_json() == general.to_json()
        assert compact_json(engine.materialize("items", "r1", fast)) == compact_json(
            general_materialize(engine, general)
        )
        if reload_every and index % reload_every == 0:  # as the store reads it back between batches
            fast = RecordState.from_json(fast.to_json())
            general = RecordState.from_json(general.to_json())


@ENGINE_SETTINGS
@given(data=st.data())
def test_apply_and_materialize_equal_the_general_code(data: st.DataObject) -> None:
    engine, replicas = random_history(data, ALL_FIELDS, junk=data.draw(st.booleans()))
    everything = {o.id: o for r in replicas for o in r.ops.values()}
    ops = list(everything.values())
    for want in (False, True):
        same_fold(engine, data.draw(st.permutations(ops)), want, data.draw(st.integers(0, 3)))
        same_fold(engine, topological_sort(ops), want, 1)


@ENGINE_SETTINGS
@given(data=st.data())
def test_lww_and_counter_histories(data: st.DataObject) -> None:
    """The registers the fast paths cover, alone: many concurrent writes and deltas to lww and counters."""
    engine, replicas = random_history(data, ["title", "count", "tags"])
    ops = list({o.id: o for r in replicas for o in r.ops.values()}.values())
    for want in (False, True):
        same_fold(engine, data.draw(st.permutations(ops)), want, data.draw(st.integers(0, 2)))


def test_an_update_folded_first_settles_its_removal() -> None:
    """An update can be the first operation a replica folds (the insert still in transit); the removal it
    carries is settled as `after_fold` settles it: the counts the record's clock covers leave its vector."""
    engine = MergeEngine(SETS_SCHEMA)
    op = _op("A", 1, {"B": 1}, data={"items": []}, previous={"items": ["x"]}, wall=1)
    fast, general = RecordState(), RecordState()
    assert engine.apply(fast, op) == general_apply(engine, general, op, True)
    assert fast.to_json() == general.to_json()
    assert fast.fields["items"]["m"] == {'"x"': {"B": 1}}


def heap_sort(ops: list[Operation]) -> list[Operation]:
    """The Kahn walk `topological_sort` falls back to (smallest HLC key first among the ready ones)."""
    by_id: dict[str, Operation] = {}
    for op in ops:
        by_id.setdefault(op.id, op)
    pending = {}
    dependents: dict[str, list[str]] = {op_id: [] for op_id in by_id}
    for op_id, op in by_id.items():
        deps = {dep for dep in op.causal_deps if dep in by_id}
        pending[op_id] = len(deps)
        for dep in deps:
            dependents[dep].append(op_id)

    def key(op: Operation) -> tuple[int, int, str, str]:
        return (op.timestamp.wall_time, op.timestamp.logical, op.timestamp.node_id, op.id)

    ready = [key(op) for op_id, op in by_id.items() if pending[op_id] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        op_id = heapq.heappop(ready)[3]
        out.append(by_id[op_id])
        for child in dependents[op_id]:
            pending[child] -= 1
            if pending[child] == 0:
                heapq.heappush(ready, key(by_id[child]))
    return out


@ENGINE_SETTINGS
@given(data=st.data())
def test_topological_sort_equals_the_heap_walk(data: st.DataObject) -> None:
    _, replicas = random_history(data, ALL_FIELDS)
    ops = [o for r in replicas for o in r.ops.values()]  # duplicates included
    picked = data.draw(st.lists(st.sampled_from(ops))) if ops else []
    for sample in (ops, data.draw(st.permutations(ops)), picked):
        assert [o.id for o in topological_sort(sample)] == [o.id for o in heap_sort(sample)]


def test_topological_sort_when_a_dependency_is_stamped_later() -> None:
    """A dependency with a later HLC than its dependent (a skewed or forged clock): the walk decides."""

    def make(seq: int, wall: int, deps: list[str]) -> Operation:
        return create_operation(
            {
                "node_id": "n",
                "type": "insert",
                "collection": "items",
                "record_id": f"r{seq}",
                "data": {"title": str(seq)},
                "timestamp": {"wallTime": wall, "logical": 0, "nodeId": "n"},
                "sequence_number": seq,
                "causal_deps": deps,
                "schema_version": 1,
            }
        )

    late = make(1, 50, [])
    early = make(2, 10, [late.id])
    other = make(3, 20, [])
    for ops in ([late, early, other], [other, early, late], [early, late, other, early]):
        assert [o.id for o in topological_sort(ops)] == [o.id for o in heap_sort(ops)]
    assert [o.id for o in topological_sort([late, early, other])] == [other.id, late.id, early.id]


VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
    | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@given(
    data=st.dictionaries(st.text(min_size=1, max_size=4), VALUES, max_size=4),
    previous=st.none() | st.dictionaries(st.text(min_size=1, max_size=4), VALUES, max_size=3),
    deps=st.lists(st.text(min_size=1, max_size=3), max_size=2),
)
def test_wire_json_equals_compact_json_of_to_wire(
    data: dict[str, Any], previous: dict[str, Any] | None, deps: list[str]
) -> None:
    if "__offline_bytes__" in data or (previous and "__offline_bytes__" in previous):
        return
    op = create_operation(
        {
            "node_id": "node-é",
            "type": "update" if previous is not None else "insert",
            "collection": "items",
            "record_id": "r1",
            "data": data,
            "previous_data": previous,
            "timestamp": {"wallTime": 1, "logical": 2, "nodeId": "node-é"},
            "sequence_number": 3,
            "causal_deps": deps,
            "schema_version": 1,
        }
    )
    assert wire_json(op) == compact_json(op.to_wire())


@given(ms=st.integers(0, 2**48 - 1), counter=st.integers(0, 2**73 - 1))
def test_uuid7_text_equals_uuid_str(ms: int, counter: int) -> None:
    generated = UUIDv7Generator(now=lambda: ms, randbits=lambda bits: counter).generate()
    value = (ms << 80) | (0x7 << 76) | ((counter >> 62) << 64) | (0b10 << 62) | (counter & ((1 << 62) - 1))
    assert generated == str(uuid.UUID(int=value))


# ---------------------------------------------------------------------------------- folding on the state text

#: The merge test schema without its state machines (a collection with one never folds on the text).
PLAIN_SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "items": {
                "fields": {
                    "title": t.string().optional(),
                    "count": t.number().merge("counter").default(0),
                    "hi": t.number().merge("max").optional(),
                    "lo": t.number().merge("min").optional(),
                    "tags": t.array(t.string()).default([]),
                    "log": t.array(t.string()).merge("append-only").default([]),
                    "owner": t.string().merge("server-authoritative").optional(),
                    "status": t.enum(["todo", "doing", "done"]).default("todo"),
                    "phase": t.enum(["a", "b", "c"]).default("a"),
                    "notes": t.string().optional(),
                    "body": t.richtext(),
                },
                "resolve": {"notes": sorted_concat},
            }
        },
    }
)


def check_text_fold(engine: MergeEngine, text: str | None, op: Operation) -> bool:
    """apply_to_text against decode + apply + materialize + to_json; True when it folded."""
    outcome = engine.apply_to_text(op, text, "r1")
    state = RecordState() if text is None else RecordState.from_json(text)
    if outcome is REPEATED:
        assert state.holds(op)
        return False
    if outcome is None:
        return False
    assert not state.holds(op)
    engine.apply(state, op, want_conflicts=False)
    assert outcome.text == state.to_json()
    assert compact_json(outcome.record) == compact_json(engine.materialize("items", "r1", state))
    return True


def check_insert_fold(engine: MergeEngine, insert: Operation, op: Operation) -> bool:
    """apply_to_insert (a state stored as a reference to its insert) against refolding the insert, then
    apply + materialize + to_json; True when it folded."""
    made = engine.insert_fold(insert, "r1")
    state = RecordState()
    engine.apply(state, insert, want_conflicts=False)
    if made is not None:
        assert made.text == ""
        assert compact_json(made.record) == compact_json(engine.materialize("items", "r1", state))
    outcome = engine.apply_to_insert(op, insert, "r1")
    if outcome is None:
        return False
    assert outcome is not REPEATED
    assert not state.holds(op)
    engine.apply(state, op, want_conflicts=False)
    assert outcome.text == state.to_json()
    assert compact_json(outcome.record) == compact_json(engine.materialize("items", "r1", state))
    return True


SIMPLE_VALUES: dict[str, list[Any]] = {
    "title": ["apple", "pear", "", None, 5],
    "status": ["todo", "doing", "done", "nope"],
    "phase": ["a", "b", "c"],
    "hi": [1, 7, -2, 2.5, None],
    "owner": ["srv", "cli", None],
    "tags": [[], [], ["w"]],
}


def simple_history(data: st.DataObject) -> list[Operation]:
    """Replicas writing one record with the writes apply_to_text covers (lww fields, whole-number counter
    deltas), mixed with what it leaves to the general code (float deltas, sets, ill-typed values, deletes),
    concurrently and with partial exchanges."""
    engine = MergeEngine(PLAIN_SCHEMA, authoritative_nodes=["node-a"])
    clock = FakeClock()
    replicas = [EngineReplica(engine, node, clock) for node in ("node-a", "node-b", "node-c")]
    replicas[0].write("insert", {"title": "a", "count": 1, "tags": [], "log": []}, None)
    for _ in range(data.draw(st.integers(3, 16), label="steps")):
        clock.advance(data.draw(st.sampled_from([0, 0, 1, 5])))
        if data.draw(st.integers(0, 2)) == 0:
            src, dst = data.draw(st.permutations(replicas))[:2]
            held = list(src.ops.values())
            if held:
                dst.receive(data.draw(st.lists(st.sampled_from(held), max_size=len(held) + 1)))
            continue
        replica = data.draw(st.sampled_from(replicas))
        current = replica.record()
        if current is None:
            if replica.state.has_insert or data.draw(st.booleans()):
                replica.write("insert", {"title": "again", "count": 0}, None)
            continue
        if data.draw(st.integers(0, 9)) == 0:
            replica.write("delete", None, None)
            continue
        changes: dict[str, Any] = {}
        previous: dict[str, Any] = {}
        names = ["count", "count", "title", "title", "status", "phase", *SIMPLE_VALUES]
        for name in data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)):
            if name == "count":
                step = data.draw(st.sampled_from([1, 2, -3, 1, 0.5]))
                changes[name], previous[name] = (current[name] or 0) + step, current[name]
            else:
                changes[name], previous[name] = data.draw(st.sampled_from(SIMPLE_VALUES[name])), current[name]
        replica.write("update", changes, previous)
    return list({o.id: o for r in replicas for o in r.ops.values()}.values())


@settings(ENGINE_SETTINGS, max_examples=80 * SCALE)
@given(data=st.data())
def test_apply_to_text_equals_the_general_fold(data: st.DataObject) -> None:
    engine = MergeEngine(PLAIN_SCHEMA, authoritative_nodes=["node-a"])
    if data.draw(st.integers(0, 3)) == 0:  # every strategy, ill-typed values: mostly the general path
        _, replicas = random_history(data, ALL_FIELDS, junk=True)
        ops = list({o.id: o for r in replicas for o in r.ops.values()}.values())
    else:
        ops = simple_history(data)
    for op in ops:  # onto a record with no state yet (inserts are covered)
        check_text_fold(engine, None, op)
    for insert in ops:  # onto a record stored as a reference to its insert
        if insert.type == "insert":
            for op in ops:
                check_insert_fold(engine, insert, op)
    for ordered in (topological_sort(ops), data.draw(st.permutations(ops))):
        state = RecordState()
        for op in ordered:
            text = state.to_json()
            for other in data.draw(st.lists(st.sampled_from(ops), max_size=2)):  # held or not, any type
                check_text_fold(engine, text, other)
            check_text_fold(engine, text, op)
            engine.apply(state, op, want_conflicts=False)


def test_apply_to_text_takes_the_common_updates() -> None:
    """lww and whole-number counter updates on a compact state: folded on the text, as the general code."""
    engine = MergeEngine(PLAIN_SCHEMA)
    clock = HybridLogicalClock("node-b", now=lambda: 1000)
    state = RecordState()
    ops = []
    insert = create_operation(
        {
            "node_id": "node-b",
            "type": "insert",
            "collection": "items",
            "record_id": "r1",
            "data": {"title": "a", "count": 1, "tags": []},
            "timestamp": clock.now(),
            "sequence_number": 1,
            "schema_version": 1,
        }
    )
    assert check_text_fold(engine, None, insert)
    engine.apply(state, insert)
    assert engine.apply_to_insert(insert, insert, "r1") is None  # a repeat: the general path finds it
    for seq in range(2, 9):
        changes = {"title": f"t{seq}", "count": seq} if seq % 3 else {"count": seq, "status": "doing"}
        ops.append(
            create_operation(
                {
                    "node_id": "node-b",
                    "type": "update",
                    "collection": "items",
                    "record_id": "r1",
                    "data": changes,
                    "previous_data": {"count": seq - 1, "title": "x"},
                    "timestamp": clock.now(),
                    "sequence_number": seq,
                    "causal_deps": state.heads() if seq % 2 else [],
                    "schema_version": 1,
                }
            )
        )
        assert check_text_fold(engine, state.to_json(), ops[-1])
        assert check_insert_fold(engine, insert, ops[-1])  # each as the first update after the insert
        engine.apply(state, ops[-1])
    # Delivered out of order: older writes lose to the newer ones already folded (on the text while the
    # state holds no dependency it lacks the operation of; the general path after that, the same result).
    state = RecordState()
    engine.apply(state, insert)
    folded = []
    for op in reversed(ops):
        folded.append(check_text_fold(engine, state.to_json(), op))
        engine.apply(state, op)
    assert folded[:2] == [True, True]
    assert engine.apply_to_text(ops[0], state.to_json(), "r1") is REPEATED
    for data in ({"title": "b", "count": 1.5}, {"count": True, "tags": []}, {"hi": 3}, {"tags": ["w"]}, {}):
        other = create_operation(
            {
                "node_id": "node-c",
                "type": "insert",
                "collection": "items",
                "record_id": "r1",
                "data": data,
                "timestamp": clock.now(),
                "sequence_number": 1,
                "causal_deps": ["not-held"],
                "schema_version": 1,
            }
        )
        check_text_fold(engine, None, other)
    assert check_text_fold(engine, None, other)  # the last one: nothing written, folded on the text


def test_apply_to_text_takes_updates_with_a_causal_context() -> None:
    """The updates of today's writers carry a causal context: a node's next lww and whole-number counter
    update on a state of such operations (and on a record kept as a reference to its insert) is folded on
    the text too, byte for byte as the general code; one whose number is held is a repeat."""
    engine = MergeEngine(PLAIN_SCHEMA)
    clock = FakeClock()
    writers = [EngineReplica(engine, node, clock) for node in ("node-a", "node-b")]
    a, b = writers
    insert = a.write("insert", {"title": "a", "count": 1, "tags": []}, None)
    assert insert.causal_context == {"node-a": 1}
    assert check_text_fold(engine, None, insert)
    b.receive([insert])
    state = RecordState()
    engine.apply(state, insert)
    taken = []
    for step in range(2, 12):
        clock.advance(1)
        writer = writers[step % 2]
        current = writer.record()
        assert current is not None
        changes = {"title": f"t{step}", "count": current["count"] + step}
        if step % 3 == 0:
            changes = {"count": current["count"] - 1}
        op = writer.write("update", changes, {k: current[k] for k in changes})
        writers[(step + 1) % 2].receive([op])
        assert op.causal_context is not None
        taken.append(check_text_fold(engine, state.to_json(), op))
        if step < 4:
            assert check_insert_fold(engine, insert, op)  # each node's next write onto the insert alone
        engine.apply(state, op)
        assert engine.apply_to_text(op, state.to_json(), "r1") is REPEATED
    assert all(taken)
    assert a.state.to_json() == b.state.to_json() == state.to_json()


def test_apply_to_text_with_a_causal_context_writes_floats_and_odd_strings_as_to_json() -> None:
    """The fold of a node's next update writes the state text byte for byte as `to_json`, whatever the state
    holds: floats in exponent form (which other encoders spell differently), strings with control,
    separator and supplementary characters."""
    engine = MergeEngine(PLAIN_SCHEMA)
    clock = FakeClock()
    for hi in (None, 1e-07, 2.5, 1e16):
        a = EngineReplica(engine, "node-a", clock)
        state = RecordState()
        insert = a.write("insert", {"title": "a", "count": 1, "tags": [], "hi": hi}, None)
        engine.apply(state, insert)
        for title in ("\u2028\x01\x7f\u00e9", '\U0001f600 "q" \\', "plain"):
            clock.advance(1)
            current = a.record()
            assert current is not None
            op = a.write("update", {"title": title, "count": current["count"] + 1}, dict(current))
            assert check_text_fold(engine, state.to_json(), op)
            engine.apply(state, op)
        if hi is not None:
            assert repr(hi) in state.to_json()
