"""Causal contexts (`Operation.causal_context`): the merge decides causal order without the record's graph.

An operation numbers itself among its node's writes to the record and carries the record's version vector
its writer held; the add-wins set and Tier 3 resolvers read "had this write seen that one" from it, so a
record's state is bounded by its content and writers (offline/merge/engine.py, "Bounded state").
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from offline import create_app, define_schema, t
from offline.core.errors import OfflineError
from offline.core.operations import Operation, compute_operation_id, create_operation
from offline.merge.engine import MergeEngine, RecordState, numbers_listed

from ._support import FakeClock, canonical, exchange_all, make_op

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "sets": {"fields": {"items": t.array(t.string()).default([])}},
            "notes": {
                "fields": {"text": t.string().optional()},
                "resolve": {
                    "text": lambda a, b, base: "|".join(sorted({*(a or "").split("|"), *b.split("|")}))
                },
            },
        },
    }
)


def _op(node: str, number: int, context: dict[str, int], **fields: Any) -> Operation:
    kind = fields.pop("type", "update")
    return create_operation(
        {
            "node_id": node,
            "type": kind,
            "collection": fields.pop("collection", "sets"),
            "record_id": "r1",
            "data": fields.pop("data"),
            "previous_data": fields.pop("previous", None) if kind == "update" else None,
            "timestamp": {"wallTime": 1_700_000_000_000 + fields.pop("wall"), "logical": 0, "nodeId": node},
            "sequence_number": number,
            "causal_deps": [],
            "schema_version": 1,
            "causal_context": {**context, node: number},
        }
    )


def test_the_context_is_hashed_and_an_operation_without_one_keeps_its_id() -> None:
    with_context = _op("n1", 1, {}, type="insert", data={"items": ["a"]}, wall=0)
    plain = dataclasses.replace(with_context, causal_context=None)
    assert compute_operation_id(with_context) == with_context.id
    assert compute_operation_id(plain) != with_context.id  # the context is part of the content
    legacy = make_op(node="n1", seq=1, type="insert", data={"items": ["a"]}, collection="sets")
    assert legacy.causal_context is None and "causalContext" not in legacy.to_wire()
    assert Operation.from_wire(with_context.to_wire()) == with_context
    tampered = {**with_context.to_wire(), "causalContext": {"n1": 1, "n2": 5}}
    with pytest.raises(OfflineError) as refused:
        Operation.from_wire(tampered)
    assert refused.value.context["reason"] == "HASH_MISMATCH"
    with pytest.raises(OfflineError) as missing:
        Operation.from_wire({**with_context.to_wire(), "causalContext": {"n2": 1}}, verify=False)
    assert missing.value.context["field"] == "causalContext"


def test_design_example_removals_honoured_concurrent_additions_kept() -> None:
    """DESIGN.md section 3: base [a,b,c,d]; one device writes [a,c,e], another [a,b,f]: [a,e,f]."""
    engine = MergeEngine(SCHEMA)
    base = _op("n0", 1, {}, type="insert", data={"items": ["a", "b", "c", "d"]}, wall=0)
    one = _op("n1", 1, {"n0": 1}, data={"items": ["a", "c", "e"]}, previous={"items": list("abcd")}, wall=1)
    two = _op("n2", 1, {"n0": 1}, data={"items": ["a", "b", "f"]}, previous={"items": list("abcd")}, wall=2)
    texts = set()
    for order in ([base, one, two], [two, one, base], [one, base, two]):
        state, record = engine.fold("sets", "r1", order)
        assert record is not None and record["items"] == ["a", "e", "f"]
        assert not state.graph
        texts.add(state.to_json())
    assert len(texts) == 1  # the same bytes whatever the order


def test_a_removal_arriving_before_the_addition_it_saw_still_removes_it() -> None:
    engine = MergeEngine(SCHEMA)
    base = _op("n0", 1, {}, type="insert", data={"items": []}, wall=0)
    add = _op("n1", 1, {"n0": 1}, data={"items": ["x"]}, previous={"items": []}, wall=1)
    remove = _op("n2", 1, {"n0": 1, "n1": 1}, data={"items": []}, previous={"items": ["x"]}, wall=2)
    concurrent = _op("n3", 1, {"n0": 1}, data={"items": ["x"]}, previous={"items": []}, wall=3)
    _, record = engine.fold("sets", "r1", [remove, base, add])
    assert record is not None and record["items"] == []
    _, record = engine.fold("sets", "r1", [remove, concurrent, base, add])
    assert record is not None and record["items"] == ["x"]  # add wins over a removal that had not seen it


def test_a_set_written_many_times_keeps_a_bounded_state(tmp_path: Any) -> None:
    with create_app(SCHEMA, path=str(tmp_path / "a.db")) as app:
        record = app.sets.insert({"items": []})
        sizes = []
        for i in range(600):
            items = list(app.sets.find_by_id(record["id"])["items"])  # type: ignore[index]
            items = [*items, f"e{i}"] if i % 2 == 0 else [x for x in items if x != f"e{i - 1}"]
            app.sets.update(record["id"], {"items": [*items, "keep"] if i == 599 else items})
            if i in (100, 599):
                app.flush()
                (text,) = app.db.conn.execute("SELECT state FROM _offline_state").fetchone()
                sizes.append(len(text))
        assert app.sets.find_by_id(record["id"])["items"] == ["keep"]  # type: ignore[index]
        state = RecordState.from_json(text)
        assert not state.graph and state.clock == {app.node_id: 601}
        assert "m" not in state.fields["items"]  # every removal vector settled
        assert sizes[1] <= sizes[0] + 64


def test_a_number_the_server_refused_leaves_the_state_bounded() -> None:
    """The server refused one of a node's writes to a record (a field it would not take): its number never
    reaches another replica, and every later write of that node is beyond the held prefix. Those are kept as
    runs of numbers, so the state stays the size of one write's, not of that node's history on the record
    (each write added 45 bytes, so one refusal let a writer grow a shared record's state without bound);
    and the refused number, were it to arrive after all, still counts: every order converges."""
    engine = MergeEngine(SCHEMA)
    ops = [_op("n1", 1, {}, type="insert", data={"items": []}, wall=0)]
    for number in range(2, 1202):
        previous, items = (["x"], []) if number % 2 else ([], ["x"])
        context = {"n2": 1} if number > 600 else {}
        ops.append(
            _op("n1", number, context, data={"items": items}, previous={"items": previous}, wall=number)
        )
    ops.insert(600, _op("n2", 1, {"n1": 599}, data={"items": ["y"]}, previous={"items": ["x"]}, wall=600))
    refused = {3, 700}  # n1's third write and its 700th: they reach no other replica
    kept = [o for o in ops if not (o.node_id == "n1" and o.sequence_number in refused)]
    state, _ = engine.fold("sets", "r1", kept)
    whole, _ = engine.fold("sets", "r1", ops)  # nothing refused: the same content, no holes
    assert not whole.extra and state.extra == [["n1", 4, 699], ["n1", 701, 1201]]
    assert len(state.to_json()) <= len(whole.to_json()) + 64, (len(whole.to_json()), len(state.to_json()))
    assert state.holds_dot("n1", 1201) and state.holds_dot("n1", 4) and not state.holds_dot("n1", 700)
    assert state.next_context("n1")["n1"] == 1202
    # A text written before runs lists each number alone: read as the runs.
    listed = json.loads(state.to_json())
    listed["x"] = [["n1", n] for n in (*range(4, 700), *range(701, 1202))]
    assert RecordState.from_json(json.dumps(listed)).to_json() == state.to_json()
    listed["x"] = [["n1", 3], *listed["x"]]  # and a number next to the prefix joins it
    assert RecordState.from_json(json.dumps(listed)).clock["n1"] == 699
    texts = set()
    for order in (kept, kept[::-1], kept[1::2] + kept[::2]):
        texts.add(engine.fold("sets", "r1", order)[0].to_json())
    assert len(texts) == 1
    # What a server sends (`numbers_listed`): each number alone, as clients from before runs read "x"; a
    # client with runs reads it as the same state.
    sent = numbers_listed(state.to_json())
    assert all(len(dot) == 2 for dot in json.loads(sent)["x"]) and len(json.loads(sent)["x"]) == 1197
    assert RecordState.from_json(sent).to_json() == state.to_json()
    assert numbers_listed(whole.to_json()) == whole.to_json()
    # The refused numbers arriving late after all (a replica that did get them): the same as in order.
    late = kept + [o for o in ops if o.sequence_number in refused and o.node_id == "n1"]
    assert engine.fold("sets", "r1", late)[0].to_json() == engine.fold("sets", "r1", ops)[0].to_json()


def test_folding_a_history_in_any_order_keeps_few_numbers_beyond_the_prefix(monkeypatch: Any) -> None:
    """`fold` takes a record's operations in any order (the log reads them in its index's order, by id) and
    folds them in their clock's order, in which each node's numbers come up one by one: what it holds beyond
    the prefix stays a run per hole. Folded as read, a history in id order kept thousands of runs, and each
    number looked through them all (a refold of a long history took minutes)."""
    import random

    from offline.merge import engine as engine_module

    ops = [_op("n1", 1, {}, type="insert", data={"items": []}, wall=0)]
    for number in range(2, 3000):
        previous, items = (["x"], []) if number % 2 else ([], ["x"])
        ops.append(_op("n1", number, {}, data={"items": items}, previous={"items": previous}, wall=number))
    held = [o for o in ops if o.sequence_number != 3]
    random.Random(7).shuffle(held)
    widest = 0
    whole_runs = engine_module._whole_runs

    def watched(clock: dict[str, int], extra: list[list[Any]]) -> list[list[Any]]:
        nonlocal widest
        runs = whole_runs(clock, extra)
        widest = max(widest, len(runs))
        return runs

    monkeypatch.setattr(engine_module, "_whole_runs", watched)
    state, _ = MergeEngine(SCHEMA).fold("sets", "r1", held)
    assert state.extra == [["n1", 4, 2999]]
    assert widest <= 2, widest


def test_resolver_keeps_only_its_heads() -> None:
    clock = FakeClock()
    apps = [create_app(SCHEMA, path=":memory:", now=clock) for _ in range(2)]
    try:
        a, b = apps
        a.notes.insert({"id": "r1", "text": "base"})
        exchange_all(apps)
        for i in range(30):
            clock.advance()
            a.notes.update("r1", {"text": f"a{i}"})
        clock.advance()
        b.notes.update("r1", {"text": "b"})  # concurrent with all of a's updates
        exchange_all(apps)
        for app in apps:
            assert app.notes.find_by_id("r1")["text"] == "a29|b"  # type: ignore[index]
        texts = set()
        for app in apps:
            app.flush()
            (text,) = app.db.conn.execute("SELECT state FROM _offline_state").fetchone()
            texts.add(text)
            heads = RecordState.from_json(text).fields["text"]["h"]
            assert [h[1] for h in heads] == ["a29", "b"]
        assert len(texts) == 1
        clock.advance()
        a.notes.update("r1", {"text": "merged"})  # had seen both heads: replaces them
        exchange_all(apps)
        assert {canonical(app.notes.find_by_id("r1")) for app in apps} == {
            canonical({"id": "r1", "text": "merged"})
        }
    finally:
        for app in apps:
            app.close()
