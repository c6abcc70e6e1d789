"""Unit tests of the merge engine's pieces: RecordState, causal graph, op reading, registers, values."""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

import pytest

from offline import define_schema, migrate, t
from offline.core.hlc import HLCTimestamp, HybridLogicalClock
from offline.merge import richtext
from offline.merge.engine import WINDOW_MAX, Conflict, MergeEngine, RecordState
from offline.merge.values import element_key, fits, fraction_to_number, norm_number, normalize, op_key

from ._support import SCHEMA, WINDOWED_SCHEMA, canonical, make_op, make_schema, new_apps

T0 = 1_700_000_000_000


@pytest.fixture
def engine() -> MergeEngine:
    return MergeEngine(SCHEMA)


def insert(**data: Any) -> Any:
    return make_op(node="n1", seq=1, type="insert", data={"title": "base", **data})


# -- RecordState ----------------------------------------------------------------------------------------


def test_record_state_json_round_trip(engine: MergeEngine) -> None:
    first = insert(count=1, tags=["a"], body=richtext.initial_update("hi"), notes="n")
    second = make_op(
        node="n2", seq=1, type="update", data={"count": 4, "tags": ["b"], "notes": "m", "hi": 2.5},
        previous={"count": 1, "tags": ["a"], "notes": "n", "hi": None}, wall=T0 + 1, deps=[first.id],
    )  # fmt: skip
    third = make_op(
        node="n3",
        seq=1,
        type="update",
        data={"title": "x"},
        previous={"title": "base"},
        wall=T0 + 2,
        deps=[first.id],
    )
    state, record = engine.fold("items", "r1", [first, second])
    text = state.to_json()
    restored = RecordState.from_json(text)
    assert restored.to_json() == text
    assert RecordState.from_json(text.encode()).to_json() == text
    assert restored == state
    assert json.loads(text).keys() == {"g", "e", "i", "f"}
    assert engine.materialize("items", "r1", restored) == record
    # Folding on from the restored state is the same as folding on from the original.
    engine.apply(state, third)
    engine.apply(restored, third)
    assert restored.to_json() == state.to_json()
    assert engine.materialize("items", "r1", restored)["title"] == "x"


def test_empty_state_is_not_alive(engine: MergeEngine) -> None:
    state = RecordState()
    assert not state.alive
    assert state.heads() == []
    assert engine.materialize("items", "r1", state) is None
    assert RecordState.from_json(state.to_json()) == state


def test_heads_and_ancestry() -> None:
    a = insert()
    b = make_op(
        node="n1",
        seq=2,
        type="update",
        data={"title": "b"},
        previous={"title": "base"},
        logical=1,
        deps=[a.id],
    )
    c = make_op(
        node="n2",
        seq=1,
        type="update",
        data={"title": "c"},
        previous={"title": "base"},
        logical=1,
        deps=[a.id],
    )
    d = make_op(
        node="n2",
        seq=2,
        type="update",
        data={"title": "d"},
        previous={"title": "c"},
        logical=2,
        deps=[b.id, c.id],
    )
    engine = MergeEngine(SCHEMA)
    state = RecordState()
    for o in (a, b, c):
        engine.apply(state, o)
    assert state.heads() == sorted([b.id, c.id])
    assert state.is_ancestor(a.id, b.id) and state.is_ancestor(a.id, c.id)
    assert not state.is_ancestor(b.id, c.id) and not state.is_ancestor(c.id, b.id)
    assert not state.is_ancestor(b.id, a.id)
    assert not state.is_ancestor(a.id, a.id)
    engine.apply(state, d)
    assert state.heads() == [d.id]
    assert state.ancestors(d.id) == {a.id, b.id, c.id}
    assert state.ancestors(a.id) == set()
    assert state.is_ancestor(a.id, d.id)


def test_heads_skip_missing_dependencies_and_ancestry_completes_later(engine: MergeEngine) -> None:
    a = insert()
    b = make_op(
        node="n1",
        seq=2,
        type="update",
        data={"title": "b"},
        previous={"title": "base"},
        logical=1,
        deps=[a.id],
    )
    c = make_op(
        node="n1", seq=3, type="update", data={"title": "c"}, previous={"title": "b"}, logical=2, deps=[b.id]
    )
    state = RecordState()
    engine.apply(state, c)  # arrives first: its dependency b is not held yet
    engine.apply(state, a)
    assert set(state.heads()) == {a.id, c.id}
    assert not state.is_ancestor(a.id, c.id)
    engine.apply(state, b)
    assert state.heads() == [c.id]
    assert state.is_ancestor(a.id, c.id)


def test_apply_is_idempotent_and_reports_conflicts_once(engine: MergeEngine) -> None:
    a = insert()
    b = make_op(
        node="n1",
        seq=2,
        type="update",
        data={"title": "b"},
        previous={"title": "base"},
        wall=T0 + 1,
        deps=[a.id],
    )
    c = make_op(
        node="n2",
        seq=1,
        type="update",
        data={"title": "c"},
        previous={"title": "base"},
        wall=T0 + 2,
        deps=[a.id],
    )
    state, _ = engine.fold("items", "r1", [a, b])
    conflicts = engine.apply(state, c)
    assert conflicts == [
        Conflict(
            field="title", strategy="lww", tier=1, earlier_op=b.id, later_op=c.id,
            input_a="b", input_b="c", base="base", output="c",
        )
    ]  # fmt: skip
    snapshot = state.to_json()
    assert engine.apply(state, c) == []
    assert engine.apply(state, b) == []
    assert state.to_json() == snapshot
    # want_conflicts=False folds the same way without reporting.
    quiet, _ = engine.fold("items", "r1", [a, b])
    assert engine.apply(quiet, c, want_conflicts=False) == []
    assert engine.materialize("items", "r1", quiet) == engine.materialize("items", "r1", state)


def test_existence_follows_the_latest_insert_update_or_delete(engine: MergeEngine) -> None:
    a = insert()
    delete = make_op(node="n2", seq=1, type="delete", wall=T0 + 2, deps=[a.id])
    older = make_op(
        node="n3",
        seq=1,
        type="update",
        data={"title": "old"},
        previous={"title": "base"},
        wall=T0 + 1,
        deps=[a.id],
    )
    newer = make_op(
        node="n3",
        seq=2,
        type="update",
        data={"title": "new"},
        previous={"title": "old"},
        wall=T0 + 3,
        deps=[older.id],
    )
    assert engine.fold("items", "r1", [a, delete])[1] is None
    assert engine.fold("items", "r1", [older, delete, a])[1] is None
    revived = engine.fold("items", "r1", [newer, delete, older, a])[1]
    assert revived is not None and revived["title"] == "new"
    # Updates without the insert do not make a record.
    assert engine.fold("items", "r1", [older, newer])[1] is None


def test_unknown_fields_are_ignored(engine: MergeEngine) -> None:
    a = make_op(node="n1", seq=1, type="insert", data={"title": "x", "ghost": 1})
    record = engine.fold("items", "r1", [a])[1]
    assert record is not None and "ghost" not in record and record["title"] == "x"


# -- registers ------------------------------------------------------------------------------------------


def test_counter_is_latest_insert_plus_every_delta(engine: MergeEngine) -> None:
    a = insert(count=10)
    inc = make_op(
        node="n2", seq=1, type="update", data={"count": 13}, previous={"count": 10}, wall=T0 + 1, deps=[a.id]
    )
    other_insert = make_op(node="n3", seq=1, type="insert", data={"count": 100}, wall=T0 + 2)
    assert engine.fold("items", "r1", [a, inc])[1]["count"] == 13
    assert engine.fold("items", "r1", [inc, other_insert, a])[1]["count"] == 103


def test_max_and_min_ignore_clearing(engine: MergeEngine) -> None:
    a = insert(hi=5, lo=5)
    clear = make_op(
        node="n2",
        seq=1,
        type="update",
        data={"hi": None, "lo": None},
        previous={"hi": 5, "lo": 5},
        wall=T0 + 1,
        deps=[a.id],
    )
    record = engine.fold("items", "r1", [a, clear])[1]
    assert (record["hi"], record["lo"]) == (5, 5)


def test_server_authoritative_uses_the_declared_nodes() -> None:
    a = make_op(node="server", seq=1, type="insert", data={"owner": "srv"})
    b = make_op(
        node="client",
        seq=1,
        type="update",
        data={"owner": "cli"},
        previous={"owner": "srv"},
        wall=T0 + 5,
        deps=[a.id],
    )
    assert MergeEngine(SCHEMA).fold("items", "r1", [a, b])[1]["owner"] == "cli"
    assert (
        MergeEngine(SCHEMA, authoritative_nodes=["server"]).fold("items", "r1", [b, a])[1]["owner"] == "srv"
    )
    nodes: set[str] = set()
    dynamic = MergeEngine(SCHEMA, authoritative_nodes=lambda: nodes)
    assert dynamic.authoritative_nodes() == frozenset()
    nodes.add("server")
    assert dynamic.authoritative_nodes() == frozenset({"server"})


def test_raising_resolver_falls_back_to_the_later_value(caplog: pytest.LogCaptureFixture) -> None:
    def broken(a: Any, b: Any, base: Any) -> Any:
        raise RuntimeError("boom")

    engine = MergeEngine(make_schema(resolver=broken))
    a = insert(notes="base")
    b = make_op(
        node="n2",
        seq=1,
        type="update",
        data={"notes": "b"},
        previous={"notes": "base"},
        wall=T0 + 1,
        deps=[a.id],
    )
    c = make_op(
        node="n3",
        seq=1,
        type="update",
        data={"notes": "c"},
        previous={"notes": "base"},
        wall=T0 + 2,
        deps=[a.id],
    )
    with caplog.at_level(logging.WARNING, logger="offline.merge"):
        assert engine.fold("items", "r1", [c, a, b])[1]["notes"] == "c"
    assert "resolver for items.notes: raised RuntimeError: boom" in caplog.text


def test_transition_problem_reports_forged_edges(engine: MergeEngine) -> None:
    valid = make_op(node="n2", seq=1, type="update", data={"status": "doing"}, previous={"status": "todo"})
    forged = make_op(node="n2", seq=2, type="update", data={"status": "done"}, previous={"status": "todo"})
    sneaky = make_op(node="n2", seq=3, type="update", data={"phase": "c"}, previous={"phase": "a"})
    assert engine.transition_problem(valid) is None
    assert engine.transition_problem(forged) == ("status", "todo", ["doing"], "reject")
    assert engine.transition_problem(sneaky) == ("phase", "a", ["b"], "last-valid-state")
    assert engine.transition_problem(insert(status="done")) is None  # inserts start anywhere


def test_a_reject_machine_decides_even_when_a_last_valid_state_machine_also_objects() -> None:
    schema = define_schema(
        {
            "version": 1,
            "collections": {
                "items": {
                    "fields": {
                        # The last-valid-state machine's field comes first, so it is checked first.
                        "phase": t.enum(["a", "b", "c"]).default("a"),
                        "status": t.enum(["todo", "doing", "done"])
                        .transitions({"todo": ["doing"], "doing": ["done"], "done": []})
                        .default("todo"),
                        "title": t.string().optional(),
                    },
                    "stateMachine": {
                        "field": "phase",
                        "transitions": {"a": ["b"], "b": ["c"], "c": []},
                        "onInvalidTransition": "last-valid-state",
                    },
                }
            },
        }
    )
    engine = MergeEngine(schema)
    assert list(engine.plan("items").state_machines) == ["phase", "status"]
    a = make_op(node="n1", seq=1, type="insert", data={"title": "base"})
    both = make_op(
        node="n2", seq=1, type="update", data={"phase": "c", "status": "done", "title": "t"},
        previous={"phase": "a", "status": "todo", "title": "base"}, wall=T0 + 1, deps=[a.id],
    )  # fmt: skip
    assert engine.transition_problem(both) == ("status", "todo", ["doing"], "reject")
    assert engine.transition_problems(both) == [
        ("status", "todo", ["doing"], "reject"),
        ("phase", "a", ["b"], "last-valid-state"),
    ]
    # The local store refuses this write (InvalidTransitionError), so the merge drops all of it.
    assert engine.fold("items", "r1", [a, both])[1] == {
        "id": "r1",
        "phase": "a",
        "status": "todo",
        "title": "base",
    }
    # Only the last-valid-state machine objects: that field keeps its value, the rest applies.
    partial = make_op(
        node="n2", seq=2, type="update", data={"phase": "c", "status": "doing", "title": "t"},
        previous={"phase": "a", "status": "todo", "title": "base"}, wall=T0 + 2, deps=[a.id],
    )  # fmt: skip
    assert engine.transition_problems(partial) == [("phase", "a", ["b"], "last-valid-state")]
    assert engine.fold("items", "r1", [partial, a])[1] == {
        "id": "r1",
        "phase": "a",
        "status": "doing",
        "title": "t",
    }


# -- reading operations: schema upgrades and ill-typed values ----------------------------------------------


def _renamed_schema() -> Any:
    return define_schema(
        {
            "version": 3,
            "collections": {
                "items": {
                    "fields": {
                        "label": t.string().optional(),
                        "count": t.number().merge("counter").default(0),
                    }
                }
            },
            "migrations": {
                2: migrate().rename_field("items", "title", "name").remove_field("items", "legacy").build(),
                3: migrate().rename_field("items", "name", "label").build(),
            },
        }
    )


def test_op_fields_reads_old_operations_with_todays_names() -> None:
    engine = MergeEngine(_renamed_schema())
    v1 = make_op(
        node="n1", seq=1, type="insert", data={"title": "old", "legacy": 1, "count": 2}, schema_version=1
    )
    v2 = make_op(
        node="n1",
        seq=2,
        type="update",
        data={"name": "mid"},
        previous={"name": "old"},
        schema_version=2,
        wall=T0 + 1,
        deps=[v1.id],
    )
    v3 = make_op(
        node="n1",
        seq=3,
        type="update",
        data={"label": "new", "title": "stale"},
        previous={"label": "mid"},
        schema_version=3,
        wall=T0 + 2,
        deps=[v2.id],
    )
    assert engine.op_fields(v1) == {"label": "old", "count": 2}
    assert engine.op_fields(v2) == {"label": "mid"}
    assert engine.op_fields(v2, "previous") == {"label": "old"}
    assert engine.op_fields(v3) == {"label": "new"}  # 'title' means nothing at version 3
    assert engine.fold("items", "r1", [v3, v1, v2])[1] == {"id": "r1", "label": "new", "count": 2}
    assert engine.fold("items", "r1", [v1])[1] == {"id": "r1", "label": "old", "count": 2}


def test_app_on_a_newer_schema_applies_operations_of_an_older_peer() -> None:
    old_schema = define_schema(
        {
            "version": 1,
            "collections": {
                "items": {
                    "fields": {
                        "title": t.string().optional(),
                        "legacy": t.number().optional(),
                        "count": t.number().merge("counter").default(0),
                    }
                }
            },
        }
    )
    (old,) = new_apps(1, old_schema)
    (new,) = new_apps(1, _renamed_schema())
    old.items.insert({"id": "r1", "title": "hello", "legacy": 7, "count": 1})
    new.apply(old.operations())
    assert new.items.find_by_id("r1") == {"id": "r1", "label": "hello", "count": 1}
    new.items.update("r1", {"label": "edited", "count": 5})
    old.items.update("r1", {"count": 3})
    new.apply(old.operations())
    assert new.items.find_by_id("r1") == {"id": "r1", "label": "edited", "count": 7}


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("count", "abc"),
        ("count", True),
        ("title", 5),
        ("hi", "x"),
        ("lo", [1]),
        ("tags", "xyz"),
        ("tags", [1, 2]),
        ("tags", ["ok", None]),
        ("log", {"k": "v"}),
        ("status", "bogus"),
        ("phase", 3),
        ("owner", False),
        ("notes", ["n"]),
        ("body", 5),
        ("body", b"\x01\x02garbage"),
        ("status", None),  # required: cannot be cleared
        ("count", None),
    ],
)
def test_ill_typed_remote_values_are_ignored(engine: MergeEngine, field: str, bad: Any) -> None:
    a = insert(
        count=1,
        tags=["t"],
        log=["l"],
        hi=1,
        lo=1,
        owner="o",
        notes="n",
        body=richtext.initial_update("hello"),
    )
    good = engine.fold("items", "r1", [a])[1]
    forged = make_op(
        node="rogue",
        seq=1,
        type="update",
        data={field: bad},
        previous={field: good[field]},
        wall=T0 + 1,
        deps=[a.id],
    )
    if not isinstance(bad, bytes):  # bytes are rich text's type; undecodable ones are dropped by the fold
        assert engine.op_fields(forged) == {}
    for order in ([a, forged], [forged, a]):
        assert engine.fold("items", "r1", order)[1] == good


def test_ill_typed_previous_values_do_not_break_the_fold(engine: MergeEngine) -> None:
    a = insert(count=1, tags=["t"])
    forged = make_op(
        node="rogue",
        seq=1,
        type="update",
        data={"count": 4, "tags": ["t", "u"]},
        previous={"count": "x", "tags": 7},
        wall=T0 + 1,
        deps=[a.id],
    )
    assert engine.op_fields(forged, "previous") == {}
    record = engine.fold("items", "r1", [forged, a])[1]
    assert record["count"] == 5  # previous unknown: the whole value is the delta
    assert record["tags"] == ["t", "u"]


def test_valid_values_survive_reading(engine: MergeEngine) -> None:
    forged = make_op(
        node="n",
        seq=1,
        type="update",
        data={"count": 2.0, "title": None, "tags": ["a"], "body": "plain"},
        previous={},
    )
    assert engine.op_fields(forged) == {"count": 2, "title": None, "tags": ["a"], "body": "plain"}
    assert type(engine.op_fields(forged)["count"]) is int


# -- rich text ------------------------------------------------------------------------------------------


def test_plain_text_initial_updates_are_the_same_on_every_replica() -> None:
    assert richtext.merge_update(None, "hello") == richtext.merge_update(None, "hello")
    left = richtext.merge_update(richtext.merge_update(None, "left"), "right")
    right = richtext.merge_update(richtext.merge_update(None, "right"), "left")
    assert richtext.text_of(left) == richtext.text_of(right)
    assert sorted(richtext.text_of(left)) == sorted("leftright")


def test_out_of_order_rich_text_updates_converge() -> None:
    base = richtext.initial_update("hello")
    state = richtext.merge_update(None, base)
    first, _ = richtext.edit_update(state, lambda text: text.insert(5, " world"))
    after_first = richtext.merge_update(state, first)
    second, _ = richtext.edit_update(after_first, lambda text: text.insert(11, "!"))
    in_order = richtext.merge_update(richtext.merge_update(richtext.merge_update(None, base), first), second)
    # 'second' arrives before the update it builds on: it waits inside the state instead of being lost.
    shuffled = richtext.merge_update(richtext.merge_update(richtext.merge_update(None, second), base), first)
    assert richtext.text_of(in_order) == richtext.text_of(shuffled) == "hello world!"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda text: text.insert(1, "Z"), "😀Zhéllo"),
        (lambda text: text.insert(-1, "Z"), "😀héllZo"),
        (lambda text: text.insert(6, "!"), "😀héllo!"),
        (lambda text: text.__delitem__(slice(2, 3)), "😀hllo"),
        (lambda text: text.__delitem__(0), "héllo"),
        (lambda text: text.__delitem__(-1), "😀héll"),
        (lambda text: text.__delitem__(slice(None)), ""),
        (lambda text: text.__iadd__(" ça"), "😀héllo ça"),
    ],
)
def test_edits_address_characters_not_utf8_bytes(edit: Any, expected: str) -> None:
    state = richtext.merge_update(None, richtext.initial_update("😀héllo"))
    update, text = richtext.edit_update(state, edit)
    assert text == expected
    assert richtext.text_of(richtext.merge_update(state, update)) == expected


def test_edit_text_wrapper_reports_length_in_characters() -> None:
    state = richtext.merge_update(None, richtext.initial_update("😀é"))
    seen: list[int] = []
    richtext.edit_update(state, lambda text: seen.append(len(text)))
    assert seen == [2]
    with pytest.raises(IndexError):
        richtext.edit_update(state, lambda text: text.__delitem__(2))
    with pytest.raises(ValueError):
        richtext.edit_update(state, lambda text: text.__delitem__(slice(0, 2, 2)))


def test_garbage_rich_text_update_is_ignored() -> None:
    state = richtext.merge_update(None, richtext.initial_update("keep"))
    assert richtext.merge_update(state, b"\x07garbage") == state
    assert richtext.merge_update(None, b"\x07garbage") == ""
    assert richtext.text_of(state) == "keep"


# -- values ---------------------------------------------------------------------------------------------


def test_number_normalisation() -> None:
    assert norm_number(2.0) == 2 and type(norm_number(2.0)) is int
    assert norm_number(-0.0) == 0 and type(norm_number(-0.0)) is int
    assert norm_number(0.5) == 0.5
    assert norm_number(1e300) == 1e300 and type(norm_number(1e300)) is float  # beyond 2**53 stays a float
    assert element_key(1.0) == element_key(1)
    assert element_key({"b": 1, "a": 2}) == element_key({"a": 2, "b": 1})
    assert fraction_to_number(6, 3 * 2) == 1 and fraction_to_number(4, 1) == 4
    assert fraction_to_number(1, 3) == 1 / 3
    assert normalize(t.array(t.number()), (1.0, 2.5)) == [1, 2.5]


def test_fits() -> None:
    assert fits(t.timestamp(), 1_700_000_000_000.0)
    assert not fits(t.timestamp(), 1.5)
    assert fits(t.number(), 3) and not fits(t.number(), "3") and not fits(t.number(), True)
    assert fits(t.enum(["a"]), "a") and not fits(t.enum(["a"]), "b")
    assert fits(t.richtext(), b"\x00") and fits(t.richtext(), "x") and not fits(t.richtext(), 1)


def test_op_key_orders_like_the_hlc() -> None:
    # Node ids of different lengths: the key must sort exactly like HybridLogicalClock.compare.
    stamps = [
        HLCTimestamp(T0, 0, "b"),
        HLCTimestamp(T0, 0, "ab"),
        HLCTimestamp(T0, 0, "a"),
        HLCTimestamp(T0, 1, "a"),
        HLCTimestamp(T0 - 1, 9, "z"),
    ]
    ops = [
        make_op(node=s.node_id, seq=1, type="insert", data={}, wall=s.wall_time, logical=s.logical)
        for s in stamps
    ]
    by_key = [o.timestamp for o in sorted(ops, key=op_key)]
    by_hlc = sorted(stamps, key=functools.cmp_to_key(HybridLogicalClock.compare))
    assert by_key == by_hlc


def test_materialized_defaults(engine: MergeEngine) -> None:
    record = engine.fold("items", "r1", [make_op(node="n", seq=1, type="insert", data={})])[1]
    assert canonical(record) == canonical(
        {"id": "r1", "title": None, "count": 0, "hi": None, "lo": None, "tags": [], "log": [], "owner": None,
         "status": "todo", "phase": "a", "notes": None, "body": ""}
    )  # fmt: skip


# -- bounded state ---------------------------------------------------------------------------------------


def _counter_history(engine: MergeEngine, writes: int) -> tuple[RecordState, list[Any]]:
    """A record of the windowed schema (no add-wins set, no resolver) and ``writes`` sequential updates of
    its counter by two alternating nodes, each write having seen the one before."""
    state = RecordState()
    ops = [make_op(node="n1", seq=1, type="insert", data={"title": "t", "count": 0})]
    engine.apply(state, ops[0])
    for i in range(writes):
        node = ("n1", "n2")[i % 2]
        op = make_op(
            node=node,
            seq=i + 2,
            type="update",
            data={"count": i + 1},
            previous={"count": i},
            wall=T0 + i + 1,
            deps=state.heads(),
        )
        ops.append(op)
        engine.apply(state, op)
    return state, ops


def test_a_windowed_state_stays_small_whatever_the_history() -> None:
    engine = MergeEngine(WINDOWED_SCHEMA)
    short, _ = _counter_history(engine, 20)
    long, ops = _counter_history(engine, 600)

    assert len(long.to_json()) <= len(short.to_json()) + 100  # bounded: the keys' digits grow, not the graph
    assert len(long.to_json()) <= 2048
    assert len(long.graph) <= WINDOW_MAX
    assert long.heads() == [ops[-1].id]  # heads stay exact
    assert engine.materialize("items", "r1", long)["count"] == 600  # type: ignore[index]
    # The whole set folded at once (duplicates included) gives the same record.
    assert engine.fold("items", "r1", [*reversed(ops), *ops[:50]])[1] == engine.materialize(
        "items", "r1", long
    )


def test_a_state_stored_with_its_whole_graph_loads_and_is_trimmed_by_its_next_write() -> None:
    """States written before the window held every operation of the record; they still load, and the
    next write leaves a window."""
    engine = MergeEngine(WINDOWED_SCHEMA)
    _, ops = _counter_history(engine, 60)
    full = RecordState()
    for op in ops:  # every id kept, as the engine did before windows
        full.graph[op.id] = list(op.causal_deps)
    full_engine_state = RecordState.from_json(engine.fold("items", "r1", ops)[0].to_json())
    old = RecordState(
        graph=full.graph, exist=full_engine_state.exist, has_insert=True, fields=full_engine_state.fields
    )
    loaded = RecordState.from_json(old.to_json())
    assert len(loaded.graph) == len(ops)
    assert engine.materialize("items", "r1", loaded)["count"] == 60  # type: ignore[index]

    nxt = make_op(
        node="n3",
        seq=1,
        type="update",
        data={"count": 61},
        previous={"count": 60},
        wall=T0 + 999,
        deps=loaded.heads(),
    )
    engine.apply(loaded, nxt)
    assert len(loaded.graph) <= WINDOW_MAX
    assert loaded.heads() == [nxt.id]
    assert engine.materialize("items", "r1", loaded)["count"] == 61  # type: ignore[index]


def test_collections_with_causal_registers_keep_the_whole_graph() -> None:
    """An add-wins set or a resolver reads the causal graph for its value: their records keep all of it."""
    engine = MergeEngine(SCHEMA)
    state, ops = _counter_history(engine, 40)
    assert len(state.graph) == len(ops)


def test_a_state_copy_is_independent_and_encodes_like_a_decoded_one() -> None:
    engine = MergeEngine(SCHEMA)
    state, _ = _counter_history(engine, 30)
    tagged = make_op(
        node="n3", seq=1, type="update", data={"tags": ["x"], "notes": "n"}, previous={"tags": []}, wall=T0 + 99,
        deps=state.heads(),
    )  # fmt: skip
    engine.apply(state, tagged)
    copied = state.copy()
    assert copied == RecordState.from_json(state.to_json())
    assert copied.to_json() == state.to_json()
    later = make_op(
        node="n3", seq=2, type="update", data={"tags": [], "count": 99}, previous={"tags": ["x"], "count": 30},
        wall=T0 + 100, deps=copied.heads(),
    )  # fmt: skip
    before = state.to_json()
    engine.apply(copied, later)
    assert state.to_json() == before  # the original did not change
    assert engine.materialize("items", "r1", copied)["tags"] == []  # type: ignore[index]


def test_a_state_copy_shares_the_rich_text_document_and_stays_independent() -> None:
    """A local write starts from a copy of the cached state: the rich text document's encoding (an
    immutable string, tens of KB for a long text) is shared, not re-encoded, so a keystroke does not cost
    the document's size; registers are still the copy's own."""
    engine = MergeEngine(SCHEMA)
    first = make_op(node="n1", seq=1, type="insert", data={"title": "t", "body": "hello"}, wall=T0)
    state = RecordState()
    engine.apply(state, first)
    edit, _ = richtext.edit_update(state.fields["body"]["s"], lambda text: text.insert(5, " world"))
    second = make_op(
        node="n1", seq=2, type="update", data={"body": edit, "tags": ["x"]}, previous={"body": "hello"},
        wall=T0 + 1, deps=state.heads(),
    )  # fmt: skip
    engine.apply(state, second)
    copied = state.copy()
    assert copied.fields["body"]["s"] is state.fields["body"]["s"]
    assert copied == RecordState.from_json(state.to_json())
    assert copied.to_json() == state.to_json()
    assert copied.fields["body"] is not state.fields["body"]
    before = state.to_json()
    more, _ = richtext.edit_update(copied.fields["body"]["s"], lambda text: text.insert(0, ">"))
    third = make_op(
        node="n1", seq=3, type="update", data={"body": more, "tags": []}, previous={"body": "hello world"},
        wall=T0 + 2, deps=copied.heads(),
    )  # fmt: skip
    engine.apply(copied, third)
    assert state.to_json() == before  # the original did not change
    assert engine.materialize("items", "r1", copied)["body"] == ">hello world"  # type: ignore[index]
    assert engine.materialize("items", "r1", state)["body"] == "hello world"  # type: ignore[index]
