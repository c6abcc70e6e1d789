from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offline.core.errors import INVALID_OPERATION, OfflineError
from offline.core.hlc import HLCTimestamp
from offline.core.operations import Operation, create_operation
from offline.core.version_vector import (
    advance,
    compute_delta,
    covers,
    dominates,
    merge_vectors,
    topological_sort,
)

vectors = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]), st.integers(min_value=0, max_value=5), max_size=4
)


def make_op(
    node: str, seq: int, deps: Sequence[str] = (), *, wall: int = 1000, logical: int = 0, tag: Any = None
) -> Operation:
    return create_operation(
        {
            "node_id": node,
            "type": "insert",
            "collection": "c",
            "record_id": f"{node}-{seq}",
            "data": {"tag": tag},
            "timestamp": HLCTimestamp(wall, logical, node),
            "sequence_number": seq,
            "causal_deps": list(deps),
            "schema_version": 1,
        }
    )


def assert_causal(ordered: list[Operation]) -> None:
    position = {op.id: i for i, op in enumerate(ordered)}
    assert len(position) == len(ordered), "duplicates in result"
    for op in ordered:
        for dep in op.causal_deps:
            if dep in position:
                assert position[dep] < position[op.id]


# --------------------------------------------------------------------------------------------- vectors


@given(vectors, vectors)
def test_merge_is_commutative_and_pointwise_max(a: dict[str, int], b: dict[str, int]) -> None:
    merged = merge_vectors(a, b)
    assert merged == merge_vectors(b, a)
    assert set(merged) == set(a) | set(b)
    for node, seq in merged.items():
        assert seq == max(v for v in (a.get(node), b.get(node)) if v is not None)
    assert dominates(merged, a)
    assert dominates(merged, b)


@given(vectors, vectors, vectors)
def test_merge_is_associative(a: dict[str, int], b: dict[str, int], c: dict[str, int]) -> None:
    assert merge_vectors(merge_vectors(a, b), c) == merge_vectors(a, merge_vectors(b, c))


@given(vectors)
def test_merge_is_idempotent(a: dict[str, int]) -> None:
    assert merge_vectors(a, a) == a
    assert merge_vectors(a, {}) == a


@given(vectors, vectors)
def test_merge_returns_a_new_dict(a: dict[str, int], b: dict[str, int]) -> None:
    a_copy, b_copy = dict(a), dict(b)
    merged = merge_vectors(a, b)
    merged["zzz"] = 1
    assert a == a_copy
    assert b == b_copy


@given(vectors, vectors)
def test_dominates_matches_definition(a: dict[str, int], b: dict[str, int]) -> None:
    expected = all(node in a and a[node] >= seq for node, seq in b.items())
    assert dominates(a, b) == expected
    assert dominates(a, a)
    if dominates(a, b) and dominates(b, a):
        assert a == b
    # a dominates b exactly when merging b into a adds nothing.
    assert dominates(a, b) == (merge_vectors(a, b) == a)


def test_dominates_examples() -> None:
    assert dominates({"a": 3, "b": 1}, {"a": 2})
    assert not dominates({"a": 2}, {"a": 3})
    assert not dominates({"a": 2}, {"a": 1, "b": 0})  # b's op 0 is unseen by the left side
    assert dominates({}, {})
    assert dominates({"a": 0}, {})
    assert not dominates({}, {"a": 0})


def test_covers_and_advance() -> None:
    op = make_op("a", 3)
    assert not covers({}, op)
    assert not covers({"a": 2}, op)
    assert covers({"a": 3}, op)
    assert covers({"a": 9}, op)
    original = {"a": 1, "b": 4}
    advanced = advance(original, op)
    assert advanced == {"a": 3, "b": 4}
    assert original == {"a": 1, "b": 4}
    assert covers(advanced, op)
    assert advance({"a": 7}, op) == {"a": 7}
    assert advance({}, make_op("z", 0)) == {"z": 0}


# ---------------------------------------------------------------------------------------- delta / sort


def build_log() -> list[Operation]:
    a0 = make_op("a", 0, wall=1000)
    a1 = make_op("a", 1, [a0.id], wall=1001)
    b0 = make_op("b", 0, [a0.id], wall=1002)
    b1 = make_op("b", 1, [b0.id, a1.id], wall=1003)
    c0 = make_op("c", 0, [b1.id], wall=1004)
    return [a0, a1, b0, b1, c0]


def test_compute_delta_returns_exactly_the_missing_ops_in_causal_order() -> None:
    a0, a1, b0, b1, c0 = build_log()
    log = [c0, b1, a1, b0, a0, b1]  # shuffled, with a duplicate
    local = {"a": 1, "b": 1, "c": 0}
    remote = {"a": 0}
    delta = compute_delta(local, remote, log)
    assert delta == [a1, b0, b1, c0]
    assert_causal(delta)
    assert compute_delta(local, local, log) == []
    assert compute_delta(local, {}, log) == [a0, a1, b0, b1, c0]


def test_compute_delta_skips_ops_local_does_not_cover() -> None:
    a0, a1, b0, b1, c0 = build_log()
    # The log holds c0, but the local vector does not account for it (e.g. not committed yet).
    assert compute_delta({"a": 1, "b": 1}, {"a": 1}, [a0, a1, b0, b1, c0]) == [b0, b1]


def test_sort_orders_deps_first_even_against_hlc_order() -> None:
    late_parent = make_op("a", 0, wall=5000)
    early_child = make_op("b", 0, [late_parent.id], wall=1000)
    independent = make_op("c", 0, wall=3000)
    assert topological_sort([early_child, independent, late_parent]) == [
        independent,
        late_parent,
        early_child,
    ]


def test_sort_ties_broken_by_hlc_then_id() -> None:
    x = make_op("n", 0, wall=1, logical=0, tag=1)
    y = make_op("n", 1, wall=1, logical=0, tag=2)  # same timestamp as x: id decides
    z = make_op("m", 2, wall=1, logical=1)
    first, second = sorted([x, y], key=lambda op: op.id)
    assert topological_sort([z, y, x]) == [first, second, z]


def test_deps_outside_the_set_are_ignored_and_duplicates_dropped() -> None:
    _a0, a1, *_ = build_log()
    ghost = make_op("g", 0, ["f" * 64, "not-an-id"], wall=2000)
    assert topological_sort([a1, ghost, a1]) == [a1, ghost]
    assert topological_sort([]) == []


def test_cycle_is_rejected() -> None:
    # Ids do not cover causalDeps, so a forged pair can point at each other.
    p = make_op("a", 0, tag="p")
    q = make_op("b", 0, tag="q")
    p_forged = make_op("a", 0, [q.id], tag="p")
    q_forged = make_op("b", 0, [p.id], tag="q")
    assert (p_forged.id, q_forged.id) == (p.id, q.id)
    free = make_op("c", 0)
    for order in ([p_forged, q_forged, free], [free, q_forged, p_forged]):
        with pytest.raises(OfflineError) as info:
            topological_sort(order)
        assert info.value.code == INVALID_OPERATION
        assert info.value.context is not None
        assert info.value.context["field"] == "causalDeps"
        assert info.value.context["cycle"] == sorted([p.id, q.id])


def test_self_dependency_is_a_cycle() -> None:
    op = make_op("a", 0)
    looped = make_op("a", 0, [op.id])
    child = make_op("b", 0, [op.id])
    with pytest.raises(OfflineError) as info:
        topological_sort([child, looped])
    assert info.value.context is not None
    assert info.value.context["cycle"] == [op.id]


def test_longer_cycle_reported_in_dependency_order() -> None:
    base = [make_op("n", i, tag=i) for i in range(3)]
    ids = [op.id for op in base]
    # 0 -> 1 -> 2 -> 0 ("->" meaning "depends on").
    forged = [make_op("n", i, [ids[(i + 1) % 3]], tag=i) for i in range(3)]
    with pytest.raises(OfflineError) as info:
        topological_sort(forged)
    assert info.value.context is not None
    cycle = info.value.context["cycle"]
    assert sorted(cycle) == sorted(ids)
    assert cycle[0] == min(ids)
    for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True):
        assert ids.index(b) == (ids.index(a) + 1) % 3


@st.composite
def dag_logs(draw: st.DrawFn) -> list[Operation]:
    """Random causal histories: per-node sequence numbers, deps on earlier ops, arbitrary timestamps."""
    ops: list[Operation] = []
    next_seq = {"a": 0, "b": 0, "c": 0}
    for i in range(draw(st.integers(min_value=0, max_value=14))):
        node = draw(st.sampled_from(sorted(next_seq)))
        deps: list[str] = []
        if ops:
            deps = [ops[j].id for j in draw(st.sets(st.integers(0, len(ops) - 1), max_size=3))]
        ops.append(
            make_op(
                node,
                next_seq[node],
                deps,
                wall=draw(st.integers(min_value=0, max_value=3)),
                logical=draw(st.integers(min_value=0, max_value=1)),
                tag=i,
            )
        )
        next_seq[node] += 1
    return ops


@settings(max_examples=120, deadline=None)
@given(dag_logs(), st.randoms(use_true_random=False))
def test_topological_sort_is_deterministic_and_causal(log: list[Operation], rnd: random.Random) -> None:
    reference = topological_sort(log)
    assert_causal(reference)
    assert {op.id for op in reference} == {op.id for op in log}
    for _ in range(3):
        shuffled = list(log) + rnd.sample(log, k=min(2, len(log)))
        rnd.shuffle(shuffled)
        assert topological_sort(shuffled) == reference


@settings(max_examples=120, deadline=None)
@given(dag_logs(), st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(min_value=-1, max_value=6)))
def test_compute_delta_property(log: list[Operation], remote_raw: dict[str, int]) -> None:
    remote = {node: seq for node, seq in remote_raw.items() if seq >= 0}
    local: dict[str, int] = {}
    for op in log:
        local = advance(local, op)
    delta = compute_delta(local, remote, reversed(log))
    expected = {op.id for op in log if op.sequence_number > remote.get(op.node_id, -1)}
    assert {op.id for op in delta} == expected
    assert len(delta) == len(expected)
    assert_causal(delta)
    # Applying the delta brings the remote up to the local vector.
    caught_up = dict(remote)
    for op in delta:
        caught_up = advance(caught_up, op)
    assert dominates(caught_up, local)
