"""Version vectors and causal ordering of operations (SPEC 2.8, DESIGN.md sections 2 and 4).

A version vector maps a node id to the highest ``sequence_number`` of that node's operations a replica
holds. A node that is absent means nothing of it has been seen yet, which is different from an entry 0
(sequence numbers may start at 0). Vectors are plain dicts so they serialize as the wire's JSON objects;
every function here returns a new dict and never mutates its arguments.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import TypeAlias

from .errors import INVALID_OPERATION, OfflineError
from .operations import Operation

__all__ = [
    "VersionVector",
    "advance",
    "compute_delta",
    "covers",
    "dominates",
    "merge_vectors",
    "topological_sort",
]

VersionVector: TypeAlias = dict[str, int]


def merge_vectors(a: Mapping[str, int], b: Mapping[str, int]) -> VersionVector:
    """Pointwise maximum: everything seen by either side."""
    merged = dict(a)
    for node, seq in b.items():
        current = merged.get(node)
        if current is None or seq > current:
            merged[node] = seq
    return merged


def dominates(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    """True when ``a`` has seen everything ``b`` has (equal vectors dominate each other)."""
    for node, seq in b.items():
        mine = a.get(node)
        if mine is None or mine < seq:
            return False
    return True


def covers(vector: Mapping[str, int], op: Operation) -> bool:
    """True when ``vector`` already accounts for ``op``."""
    seen = vector.get(op.node_id)
    return seen is not None and seen >= op.sequence_number


def advance(vector: Mapping[str, int], op: Operation) -> VersionVector:
    """A copy of ``vector`` that also accounts for ``op``."""
    advanced = dict(vector)
    seen = advanced.get(op.node_id)
    if seen is None or op.sequence_number > seen:
        advanced[op.node_id] = op.sequence_number
    return advanced


def _sort_key(op: Operation) -> tuple[int, int, str, str]:
    # HLC order first so the result reads naturally; the id makes the key unique, hence the order total.
    ts = op.timestamp
    return (ts.wall_time, ts.logical, ts.node_id, op.id)


def topological_sort(ops: Iterable[Operation]) -> list[Operation]:
    """Order ``ops`` so every operation follows its ``causal_deps`` (those present in ``ops``).

    Ties are broken by HLC order and then id, so the result depends only on the set of operations, not on
    the order they were given in. Duplicates (same id) are kept once. A dependency cycle, which only a
    forged or corrupted operation can create because ids are content hashes, raises INVALID_OPERATION.
    """
    ops = list(ops)
    # The usual case: every dependency held here sorts before its dependent in HLC order (the HLC respects
    # causality), and no id repeats. The heap walk below then yields exactly the sorted order (at each step
    # the smallest remaining operation has all its dependencies out already, so it is the smallest ready
    # one); only when that does not hold is the walk needed.
    ordered = sorted(ops, key=_sort_key)
    position: dict[str, int] = {}
    for index, op in enumerate(ordered):
        if position.setdefault(op.id, index) != index:
            break  # a repeated id
    else:
        get = position.get
        for index, op in enumerate(ordered):
            for dep in op.causal_deps:
                at = get(dep)
                if at is not None and at >= index:
                    break
            else:
                continue
            break
        else:
            return ordered

    by_id: dict[str, Operation] = {}
    for op in ops:
        by_id.setdefault(op.id, op)

    pending: dict[str, int] = {}
    dependents: dict[str, list[str]] = {op_id: [] for op_id in by_id}
    for op_id, op in by_id.items():
        deps = {dep for dep in op.causal_deps if dep in by_id}
        pending[op_id] = len(deps)
        for dep in deps:
            dependents[dep].append(op_id)

    ready = [_sort_key(op) for op_id, op in by_id.items() if pending[op_id] == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        op_id = heapq.heappop(ready)[3]
        ordered.append(by_id[op_id])
        for child in dependents[op_id]:
            pending[child] -= 1
            if pending[child] == 0:
                heapq.heappush(ready, _sort_key(by_id[child]))

    if len(ordered) != len(by_id):
        cycle = _find_cycle({op_id: by_id[op_id] for op_id, count in pending.items() if count > 0})
        raise OfflineError(
            f"causal dependency cycle between operations {', '.join(cycle)}",
            INVALID_OPERATION,
            {"field": "causalDeps", "cycle": cycle},
        )
    return ordered


def _find_cycle(stuck: Mapping[str, Operation]) -> list[str]:
    # Every stuck operation waits on at least one other stuck one, so walking "smallest stuck dependency"
    # links from any start must revisit a node; the revisited stretch is a cycle.
    position: dict[str, int] = {}
    path: list[str] = []
    current = min(stuck)
    while current not in position:
        position[current] = len(path)
        path.append(current)
        current = min(dep for dep in stuck[current].causal_deps if dep in stuck)
    cycle = path[position[current] :]
    # Start from the smallest id so the reported cycle is the same whatever the input order.
    start = cycle.index(min(cycle))
    return cycle[start:] + cycle[:start]


def compute_delta(
    local: Mapping[str, int], remote: Mapping[str, int], log: Iterable[Operation]
) -> list[Operation]:
    """Operations of ``log`` that ``local`` accounts for but ``remote`` does not, in causal order."""
    return topological_sort(op for op in log if covers(local, op) and not covers(remote, op))
