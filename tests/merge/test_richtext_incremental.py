"""Folding a rich text update from a kept decoded model (`yupdate.Incremental`, taken by
`richtext.fold_update` when the state is known complete) gives the bytes the general fold gives: the
canonical encoding of a fresh document made from the state and the update."""

from __future__ import annotations

import random
from typing import Any

import pytest

from offline.merge import richtext, yupdate


def general_fold(state: bytes, update: bytes) -> bytes:
    """The general path alone (a fresh document, canonicalised, pending kept)."""
    backend = richtext._yjs()
    merged = backend.merge_updates(state, update) if state else update
    doc = backend.new_doc()
    doc.apply_update(merged)
    pending = backend.diff_update(merged, doc.get_state())
    return yupdate.canonical_union(doc.get_update(), pending)[0]


def random_edit(rng: random.Random) -> Any:
    def edit(t: Any) -> None:
        size = len(t)
        roll = rng.random()
        if size and roll < 0.3:
            start = rng.randrange(size)
            del t[start : min(size, start + rng.randint(1, 4))]
        else:
            t.insert(rng.randint(0, size), rng.choice(["a", "bc", "é", "😀", "xyz", "\n"]))

    return edit


@pytest.mark.parametrize("seed", range(12))
def test_the_incremental_fold_writes_the_bytes_the_general_fold_writes(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [richtext.client_id_for(f"n{seed}-{n}") for n in range(3)]
    states = ["" for _ in nodes]
    inbox: list[list[bytes]] = [[] for _ in nodes]
    for _ in range(150):
        n = rng.randrange(len(nodes))
        if inbox[n] and rng.random() < 0.4:
            # Deliver what the others wrote so far, oldest first (in causal order: an update arriving
            # before one it depends on is pending, which the general path alone folds).
            for _ in range(rng.randint(1, len(inbox[n]))):
                update = inbox[n].pop(0)
                before = richtext.state_bytes(states[n])
                states[n] = richtext.fold_update(states[n], update)
                assert richtext.state_bytes(states[n]) == general_fold(before, update)
            continue
        before = richtext.state_bytes(states[n])
        update, _ = richtext.edit_update(states[n], random_edit(rng), client_id=nodes[n])
        if not update or update == b"\x00\x00":
            continue
        states[n] = richtext.fold_update(states[n], update)
        assert richtext.state_bytes(states[n]) == general_fold(before, update)
        # The document the edit left (kept as the new state's) reads as a fresh one.
        assert (
            richtext.text_of(states[n]) == richtext._DOCUMENTS.fresh(richtext.state_bytes(states[n])).text()
        )
        for other in range(len(nodes)):
            if other != n:
                inbox[other].append(update)
    for n in range(len(nodes)):
        for update in inbox[n]:
            states[n] = richtext.fold_update(states[n], update)
    assert len(set(states)) == 1


def test_a_model_folds_a_typed_run_and_a_delete_as_a_document_would() -> None:
    client = richtext.client_id_for("typist")
    state = ""
    for character in "hello world":
        update, _ = richtext.edit_update(state, lambda t, c=character: t.insert(len(t), c), client_id=client)
        state = richtext.fold_update(state, update)
    raw = richtext.state_bytes(state)
    model = yupdate.Incremental(raw)
    assert model.encode() == raw
    update, _ = richtext.edit_update(state, lambda t: t.__delitem__(slice(2, 7)), client_id=client)
    assert model.fold(update) == general_fold(raw, update)


def test_an_update_the_model_cannot_integrate_is_left_to_the_general_path() -> None:
    client = richtext.client_id_for("typist")
    state = richtext.fold_update("", richtext.initial_update("abc", client_id=client))
    raw = richtext.state_bytes(state)
    later, _ = richtext.edit_update(state, lambda t: t.insert(3, "d"), client_id=client)
    after = richtext.fold_update(state, later)
    latest, _ = richtext.edit_update(after, lambda t: t.insert(4, "e"), client_id=client)
    model = yupdate.Incremental(raw)
    assert model.fold(latest) is None  # after a gap: pending in a document
    assert model.encode() == raw  # unchanged
    assert model.fold(b"not an update") is None
