"""Rich text keystrokes on the device (issue 24), at the rich text layer (`offline.merge.richtext`): one
character typed (`edit_update`) and folded into the state (`fold_update`), in CPU milliseconds (median of
``SAMPLE``), with no store around it (the growth suite has the store's share).

- ``typed``: a document typed one character at a time by one node, at 10 and 20,000 characters (one run:
  a few structs); ``last_over_first`` is the ratio of the two.
- ``fragmented``: a document three nodes edited concurrently (``EDITS`` random insertions and deletions,
  each node on its own copy, exchanging their updates every few edits), so it holds thousands of structs;
  ``structs`` says how many its state encodes.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from offline.merge import richtext

SAMPLE = 101
EDITS = 3_000


def _keystrokes(state: str, client_id: int, count: int) -> tuple[str, float]:
    """Type ``count`` characters at the end; the median CPU time of one (edit and fold)."""
    times = []
    for _ in range(count):
        start = time.process_time()
        update, _ = richtext.edit_update(state, lambda t: t.insert(len(t), "x"), client_id=client_id)
        state = richtext.fold_update(state, update)
        times.append(time.process_time() - start)
    return state, statistics.median(times) * 1000


def _typed(size: int) -> float:
    client = richtext.client_id_for("typist")
    state, _ = _keystrokes("", client, size)
    return _keystrokes(state, client, SAMPLE)[1]


def fragmented_state(edits: int = EDITS, seed: int = 24) -> str:
    """A state three nodes made by ``edits`` concurrent random edits (exchanged every few edits)."""
    rng = random.Random(seed)
    nodes = [richtext.client_id_for(f"node {n}") for n in range(3)]
    states = ["" for _ in nodes]
    outbox: list[list[bytes]] = [[] for _ in nodes]
    for step in range(edits):
        n = rng.randrange(len(nodes))

        def edit(t: Any) -> None:
            size = len(t)
            if size > 20 and rng.random() < 0.25:
                start = rng.randrange(size - 3)
                del t[start : start + rng.randint(1, 3)]
            else:
                t.insert(rng.randint(0, size), rng.choice("abcdefgh é"))

        update, _ = richtext.edit_update(states[n], edit, client_id=nodes[n])
        states[n] = richtext.fold_update(states[n], update)
        for other in range(len(nodes)):
            if other != n:
                outbox[other].append(update)
        if step % 7 == 6:  # some node catches up with the others
            m = rng.randrange(len(nodes))
            for pending in outbox[m]:
                states[m] = richtext.fold_update(states[m], pending)
            outbox[m].clear()
    for m in range(len(nodes)):
        for pending in outbox[m]:
            states[m] = richtext.fold_update(states[m], pending)
    assert len(set(states)) == 1, "the nodes did not converge"
    return states[0]


def _structs(state: str) -> int:
    from offline.merge import yupdate

    return yupdate.struct_count(richtext.state_bytes(state))


def run() -> dict[str, Any]:
    small, large = _typed(10), _typed(20_000)
    state = fragmented_state()
    _, fragmented = _keystrokes(state, richtext.client_id_for("node 0"), SAMPLE)
    return {
        "typed": {
            "10": {"keystroke_cpu_ms": round(small, 3)},
            "20000": {"keystroke_cpu_ms": round(large, 3)},
            "last_over_first": round(large / small, 2) if small else None,
        },
        "fragmented": {
            "edits": EDITS,
            "structs": _structs(state),
            "state_bytes": len(richtext.state_bytes(state)),
            "keystroke_cpu_ms": round(fragmented, 3),
        },
    }
