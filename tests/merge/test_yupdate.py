"""The canonical encoding of a Yjs update (offline.merge.yupdate): the same bytes for the same content,
however the encoder cut its runs, and nothing of the content lost."""

from __future__ import annotations

import random

import pycrdt
import pytest

from offline.merge import yupdate


def text_of(update: bytes) -> str:
    doc = pycrdt.Doc()
    doc.apply_update(update)
    return str(doc.get("text", type=pycrdt.Text))


def typed(client: int, text: str) -> tuple[pycrdt.Doc, list[bytes]]:
    """``text`` typed one character per update as Yjs client ``client``."""
    doc = pycrdt.Doc(client_id=client)
    body = doc.get("text", type=pycrdt.Text)
    updates = []
    for index, character in enumerate(text):
        before = doc.get_state()
        body.insert(index, character)
        updates.append(doc.get_update(before))
    return doc, updates


def test_a_run_cut_into_keystrokes_encodes_as_the_one_run_a_document_holds() -> None:
    """A merge of one client's keystroke updates keeps one struct per keystroke; the document that typed
    them holds one run: both encode canonically as that one run. Deleted, the run's end is deleted content
    in every document, whichever way it was cut before."""
    alice, keystrokes = typed(5, "hello")
    cut = pycrdt.merge_updates(*reversed(keystrokes))
    assert cut != alice.get_update()
    assert yupdate.canonical(cut) == yupdate.canonical(alice.get_update()) == alice.get_update()

    before = alice.get_state()
    del alice.get("text", type=pycrdt.Text)[3:5]
    deletion = alice.get_update(before)
    fresh = pycrdt.Doc()
    fresh.apply_update(pycrdt.merge_updates(cut, deletion))
    canonical = yupdate.canonical(fresh.get_update())
    assert canonical == yupdate.canonical(alice.get_update())
    assert text_of(canonical) == "hel" and b"lo" not in canonical


def test_random_documents_keep_their_text_and_encode_canonically_once() -> None:
    rng = random.Random(7)
    docs = [pycrdt.Doc(client_id=client) for client in (3, 11, 1 << 48 | 99)]
    for _ in range(400):
        doc = rng.choice(docs)
        body = doc.get("text", type=pycrdt.Text)
        current = str(body)
        if current and rng.random() < 0.3:
            start = rng.randrange(len(current))
            del body[start : min(len(current), start + 3)]
        else:
            body.insert(rng.randint(0, len(current)), rng.choice(["a", "b", "xy"]))  # (yrs counts bytes)
        if rng.random() < 0.2:
            other = rng.choice(docs)
            other.apply_update(doc.get_update(other.get_state()))
    for doc in docs:
        for other in docs:
            doc.apply_update(other.get_update(doc.get_state()))
    encodings = {yupdate.canonical(doc.get_update()) for doc in docs}
    assert len(encodings) == 1
    (canonical,) = encodings
    assert yupdate.canonical(canonical) == canonical
    assert text_of(canonical) == str(docs[0].get("text", type=pycrdt.Text))


def test_updates_a_document_cannot_integrate_yet_are_kept_after_a_gap() -> None:
    """A keystroke whose predecessor is missing stays as update data after a Skip, and completes the text
    once the missing one comes."""
    _, keystrokes = typed(9, "abc")
    pending = yupdate.canonical(keystrokes[0], keystrokes[2])
    assert pending == yupdate.canonical(keystrokes[2], keystrokes[0])
    assert text_of(pending) == "a"
    assert text_of(pycrdt.merge_updates(pending, keystrokes[1])) == "abc"


def test_the_first_update_given_for_a_clock_is_kept() -> None:
    doc, keystrokes = typed(9, "abc")
    body = doc.get("text", type=pycrdt.Text)
    before = doc.get_state()
    del body[0:3]
    deletion = doc.get_update(before)
    deleted_in_a_document = doc.get_update()  # the typing as deleted content
    merged = yupdate.canonical(deleted_in_a_document, pycrdt.merge_updates(*keystrokes, deletion))
    assert merged == yupdate.canonical(deleted_in_a_document)
    assert b"abc" not in merged


@pytest.mark.parametrize("garbage", [b"", b"\x05\xff\xff garbage", b"\x01\x01\x05\x00\x04", b"\x00\x00\x00"])
def test_what_is_not_an_update_is_a_value_error(garbage: bytes) -> None:
    with pytest.raises(ValueError, match="not a Yjs update"):
        yupdate.canonical(garbage)


def test_a_union_says_whether_the_later_updates_added_anything() -> None:
    """`canonical_union(document, pending)` says when the pending part (structs past the document, deletes
    of items it lacks) holds nothing the document does not: then the document is the whole state."""
    doc, keystrokes = typed(9, "abc")
    body = doc.get("text", type=pycrdt.Text)
    before = doc.get_state()
    del body[0:1]
    deletion = doc.get_update(before)
    whole = doc.get_update()
    assert yupdate.canonical_union(whole, pycrdt.get_update(whole, doc.get_state())) == (
        yupdate.canonical(whole),
        True,
    )
    # The last keystroke without the middle one: a struct past the first update's clocks.
    first = pycrdt.merge_updates(keystrokes[0])
    stored, complete = yupdate.canonical_union(first, keystrokes[2])
    assert not complete and stored == yupdate.canonical(first, keystrokes[2])
    # A delete of an item the first update lacks (and of one it has).
    before = doc.get_state()
    del body[1:2]  # the "c"
    stored, complete = yupdate.canonical_union(first, pycrdt.merge_updates(deletion, doc.get_update(before)))
    assert not complete and text_of(stored) == ""
    assert yupdate.canonical_union(first, deletion)[1] is False  # "a" deleted: a range the first lacks
    assert yupdate.canonical_union(first, first) == (yupdate.canonical(first), True)
