"""Rich text converges when updates arrive out of order and nodes edit while holding some they cannot
integrate yet (pending: they came before updates they depend on).

Three nodes edit one document (`richtext.edit_update` as their own Yjs client, then `fold_update`, as the
store does) and receive the others' updates in any order, some twice. Every edit's text is the text its fold
stores, and at the end every replica stores the same bytes: those of folding every update in the order
they were made. (Yjs applying one update sends integrable structs to pending with the one that truly waits,
following the order it visited them in: an edit made on a state holding pending structs lost its insert in
the fold, a node wrote a clock of its own twice, and replicas ended with different texts.)
"""

from __future__ import annotations

import os
import random
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from offline.merge import richtext, yupdate

SCALE = max(1, int(os.environ.get("OFFLINE_MERGE_EXAMPLES", "1")))
NODES = 3
PIECES = ["a", "bc", "é", "😀", "xyz", "\n"]


def _edit(rng: random.Random) -> tuple[Any, Any]:
    """A random edit (insert a piece, or delete up to 4 characters), and the same on a plain string."""
    roll, where, piece, length = rng.random(), rng.random(), rng.choice(PIECES), rng.randint(1, 4)

    def edit(t: Any) -> None:
        size = len(t)
        if size and roll < 0.3:
            start = min(size - 1, int(where * size))
            del t[start : min(size, start + length)]
        else:
            t.insert(min(size, int(where * (size + 1))), piece)

    def on_text(text: str) -> str:
        box = _ListText(text)
        edit(box)
        return box.text

    return edit, on_text


@settings(max_examples=25 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32))
@example(2)  # (seeds whose histories diverged before)
@example(11)
@example(57)
def test_replicas_editing_while_holding_pending_updates_converge(seed: int) -> None:
    """150 steps: a node edits, or receives some of the updates waiting for it, picked in any order (not
    the oldest first), keeping some to receive again; at the end each receives the rest, shuffled."""
    rng = random.Random(seed)
    clients = [richtext.client_id_for(f"p{seed}-{n}") for n in range(NODES)]
    states = ["" for _ in range(NODES)]
    inbox: list[list[bytes]] = [[] for _ in range(NODES)]
    made: list[bytes] = []
    for _ in range(150):
        n = rng.randrange(NODES)
        if inbox[n] and rng.random() < 0.4:
            for _ in range(rng.randint(1, len(inbox[n]))):
                update = inbox[n].pop(rng.randrange(len(inbox[n])))
                states[n] = richtext.fold_update(states[n], update)
                if rng.random() < 0.1:
                    inbox[n].append(update)  # a duplicate, received again later
            continue
        edit, on_text = _edit(rng)
        before = richtext.text_of(states[n])
        update, text = richtext.edit_update(states[n], edit, client_id=clients[n])
        if not update or update == b"\x00\x00":
            continue
        # The edit is made on the text the node reads, and its fold stores the text the edit gave.
        assert text == on_text(before)
        states[n] = richtext.fold_update(states[n], update)
        assert richtext.text_of(states[n]) == text
        made.append(update)
        for other in range(NODES):
            if other != n:
                inbox[other].append(update)
    for n in range(NODES):
        rng.shuffle(inbox[n])
        for update in inbox[n]:
            states[n] = richtext.fold_update(states[n], update)
    reference = ""
    for update in made:  # in the order they were made: causal order, nothing pending
        reference = richtext.fold_update(reference, update)
    assert {richtext.state_bytes(state) for state in states} == {richtext.state_bytes(reference)}
    assert {richtext.text_of(state) for state in states} == {richtext.text_of(reference)}


class _ListText:
    """A plain string under the `CharText` calls `_edit` makes (what the edit should do to the text)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __len__(self) -> int:
        return len(self.text)

    def insert(self, index: int, value: str) -> None:
        self.text = self.text[:index] + value + self.text[index:]

    def __delitem__(self, key: slice) -> None:
        self.text = self.text[: key.start] + self.text[key.stop :]


def test_a_state_holding_waiting_structs_splits_into_what_a_document_integrates_and_the_rest() -> None:
    first = richtext.client_id_for("split-first")
    second = richtext.client_id_for("split-second")
    a, _ = richtext.edit_update("", lambda t: t.insert(0, "ab"), client_id=first)
    state = richtext.fold_update("", a)
    b, _ = richtext.edit_update(state, lambda t: t.insert(1, "X"), client_id=first)
    state = richtext.fold_update(state, b)
    c, _ = richtext.edit_update(state, lambda t: t.insert(3, "Y"), client_id=second)
    # ``c`` (after "b") arrives alone at an empty replica: it waits; then the rest arrives and it integrates.
    assert yupdate.split_ready(c) is not None
    waiting = richtext.fold_update("", c)
    assert richtext.text_of(waiting) == ""
    both = richtext.fold_update(waiting, b)
    assert richtext.text_of(both) == ""
    assert richtext.text_of(richtext.fold_update(both, a)) == "aXbY"
    assert yupdate.split_ready(richtext.state_bytes(richtext.fold_update(both, a))) is None
