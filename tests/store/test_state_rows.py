"""Rows read off stored state texts by SQLite (`offline.store.state_rows`), as `adopt_states` writes them for
a collection of plain last-writer-wins fields: the same rows as decoding each state and materialising it."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offline import create_app, define_schema, t
from offline.merge.engine import RecordState
from offline.store import state_rows
from offline.store.compaction import adopt_states
from offline.store.database import STATE_BASE
from offline.store.replication import mark_acknowledged, pending_operations, reject_operation

PLAIN = define_schema(
    {
        "version": 1,
        "collections": {
            "tasks": {
                "fields": {
                    "title": t.string(),
                    "note": t.string().default("none"),
                    "done": t.boolean().default(False),
                    "flag": t.boolean().optional(),
                    "size": t.number().default(1),
                    "kind": t.enum(["a", "b"]).default("a"),
                    "at": t.timestamp().optional(),
                }
            },
            "notes": {"fields": {"votes": t.number().merge("counter").default(0)}},
        },
    }
)

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)


def decoded_rows(states: list[tuple[str, str, str, dict[str, int]]]) -> list[dict[str, Any]]:
    """The records a fresh replica holds after adopting ``states`` the way other collections' are: each
    decoded as a `RecordState`, materialised and written as a row."""
    app = create_app(PLAIN, path=":memory:")
    try:
        with mock.patch.object(state_rows, "statements", return_value=None):
            adopt_states(app, states)
        return sorted(app.tasks.fetch(), key=lambda r: r["id"])
    finally:
        app.close()


def written_states(
    writes: list[tuple[int, str, dict[str, Any] | None]],
) -> list[tuple[str, str, str, dict[str, int]]]:
    """States of records written by two replicas that exchange their operations (inserts, updates of any
    field, deletes), as a server would send them."""
    a, b = (create_app(PLAIN, path=":memory:") for _ in "ab")
    ids: list[str] = []
    try:
        for who, verb, data in writes:
            app = (a, b)[who % 2]
            if verb == "insert" or not ids:
                ids.append(app.tasks.insert({"title": "t", **(data or {})})["id"])
                continue
            record_id = ids[who % len(ids)]
            if app.tasks.find_by_id(record_id) is None:
                continue
            if verb == "delete":
                app.tasks.delete(record_id)
            else:
                app.tasks.update(record_id, data or {"title": "u"})
            if who % 3 == 0:  # now and then the replicas exchange what they wrote
                a.apply(b.operations())
                b.apply(a.operations())
        a.apply(b.operations())
        a.flush()
        texts = a.db.load_state_texts([("tasks", r) for r in ids])
        versions: dict[str, dict[str, int]] = {}
        for o in a.operations():
            record = versions.setdefault(o.record_id, {})
            record[o.node_id] = max(record.get(o.node_id, 0), o.sequence_number)
        return [("tasks", r, str(texts[("tasks", r)]), versions[r]) for r in dict.fromkeys(ids)]
    finally:
        a.close()
        b.close()


FIELD_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "title": st.text(max_size=8),
        "note": st.text(max_size=3),
        "done": st.booleans(),
        "flag": st.none() | st.booleans(),
        "size": st.integers(-5, 5) | st.floats(-1e6, 1e6, allow_nan=False),
        "kind": st.sampled_from(["a", "b"]),
        "at": st.none() | st.integers(0, 2**50),
    },
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    writes=st.lists(
        st.tuples(st.integers(0, 20), st.sampled_from(["insert", "update", "delete"]), FIELD_VALUES),
        min_size=1,
        max_size=15,
    )
)
def test_records_adopted_from_states_are_those_the_decoded_states_make(
    writes: list[tuple[int, str, dict[str, Any]]],
) -> None:
    """States of inserted, updated (by two replicas at once) and deleted records: a fresh replica adopting
    them holds exactly the records decoding and materialising each state gives, deleted ones absent."""
    states = written_states(writes)
    app = create_app(PLAIN, path=":memory:")
    try:
        assert state_rows.statements(app.engine, app.codecs["tasks"]) is not None  # (the SQL path is taken)
        adopt_states(app, states)
        assert sorted(app.tasks.fetch(), key=lambda r: r["id"]) == decoded_rows(states)
    finally:
        app.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    done=st.none() | JSON_VALUES,
    title=JSON_VALUES.filter(lambda v: not isinstance(v, (list, dict))),
    missing=st.sets(st.sampled_from(["note", "done", "flag", "size", "kind"])),
    kind=st.sampled_from(["insert", "update", "delete"]),
)
def test_a_state_is_read_as_decoding_it_reads_it_whatever_its_values(
    done: Any, title: Any, missing: set[str], kind: str
) -> None:
    """A boolean register holding any JSON value is stored as Python's truthiness of it, a field without a
    register takes its initial value, a deleted record has no row, as the decoded path does."""
    key = [1_700_000_000_000, 0, "n1", "op1"]
    fields = {
        "title": {"k": key, "lk": key, "v": title},
        "note": {"k": key, "lk": key, "v": "x"},
        "done": {"k": key, "lk": key, "v": done},
        "flag": {"k": key, "lk": key, "v": True},
        "size": {"k": key, "lk": key, "v": 2.5},
        "kind": {"k": key, "lk": key, "v": "b"},
    }
    for name in missing:
        del fields[name]
    text = RecordState(graph={"op1": []}, exist=[key, kind], has_insert=True, fields=fields).to_json()
    states = [("tasks", "r1", text, {"n1": 1})]
    app = create_app(PLAIN, path=":memory:")
    try:
        adopt_states(app, states)
        assert app.tasks.fetch() == decoded_rows(states)
    finally:
        app.close()


@pytest.mark.parametrize("text", ["not json", "{}", "[]", '"text"', '{"i": 1, "e": null, "f": {}}'])
def test_a_text_that_is_not_a_state_refuses_the_message_with_nothing_stored(text: str) -> None:
    """A message holding one text that is not a record state (not JSON, no boolean "i") is refused whole."""
    good = written_states([(0, "insert", {"title": "kept?"})])
    app = create_app(PLAIN, path=":memory:")
    try:
        with pytest.raises(ValueError):
            adopt_states(app, [*good, ("tasks", "bad", text, {"n1": 1})])
        assert app.tasks.count() == 0
        with app.db.lock:
            assert app.db.conn.execute("SELECT count(*) FROM _offline_state").fetchone()[0] == 0
            assert app.db.conn.execute("SELECT count(*) FROM _offline_compacted").fetchone()[0] == 0
    finally:
        app.close()


def test_a_collection_with_other_merge_kinds_is_read_by_decoding_its_states() -> None:
    """A counter field is no register's "v": such a collection takes the decoded path, with the same result."""
    writer = create_app(PLAIN, path=":memory:")
    app = create_app(PLAIN, path=":memory:")
    try:
        record = writer.notes.insert({"votes": 2})
        writer.flush()
        text = writer.db.load_state_texts([("notes", record["id"])])[("notes", record["id"])]
        assert state_rows.statements(app.engine, app.codecs["notes"]) is None
        adopt_states(app, [("notes", record["id"], str(text), {writer.node_id: 1})])
        assert app.notes.fetch() == [{"id": record["id"], "votes": 2}]
    finally:
        writer.close()
        app.close()


def test_adopting_a_state_again_replaces_the_row_and_a_deleted_one_removes_it() -> None:
    """A record's state sent again (a later one, or its delete) replaces what the first gave."""
    writer = create_app(PLAIN, path=":memory:")
    app = create_app(PLAIN, path=":memory:")
    try:
        record_id = writer.tasks.insert({"title": "one"})["id"]

        def state() -> tuple[str, str, str, dict[str, int]]:
            writer.flush()
            text = writer.db.load_state_texts([("tasks", record_id)])[("tasks", record_id)]
            seq = max(o.sequence_number for o in writer.operations())
            return ("tasks", record_id, str(text), {writer.node_id: seq})

        adopt_states(app, [state()])
        writer.tasks.update(record_id, {"title": "two", "done": True})
        adopt_states(app, [state()])
        assert [(r["title"], r["done"]) for r in app.tasks.fetch()] == [("two", True)]
        writer.tasks.delete(record_id)
        adopt_states(app, [state()])
        assert app.tasks.fetch() == []
        assert (
            json.loads(app.db.load_state_texts([("tasks", record_id)])[("tasks", record_id)])["e"][1]
            == "delete"
        )
    finally:
        writer.close()
        app.close()


@pytest.mark.parametrize(
    "record_id", ["café", "emoji 😀 id", "tab\tand\nnewline", 'quote " and \\', "nul\x00id"]
)
def test_records_whose_ids_are_not_plain_ascii_get_their_rows(record_id: str) -> None:
    """The batch's ids reach SQLite as JSON: ids with characters outside ASCII, escapes or a NUL (which
    SQLite's JSON functions would cut) still find their states and get their rows."""
    key = [1_700_000_000_000, 0, "n1", "op1"]
    fields = {"title": {"k": key, "lk": key, "v": "t"}}
    text = RecordState(graph={"op1": []}, exist=[key, "insert"], has_insert=True, fields=fields).to_json()
    app = create_app(PLAIN, path=":memory:")
    try:
        adopt_states(app, [("tasks", record_id, text, {"n1": 1}), ("tasks", "plain", text, {"n1": 1})])
        assert sorted(r["id"] for r in app.tasks.fetch()) == sorted([record_id, "plain"])
    finally:
        app.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    writes=st.lists(
        st.tuples(st.integers(0, 20), st.sampled_from(["insert", "update", "delete"]), FIELD_VALUES),
        min_size=1,
        max_size=10,
    ),
    after=st.lists(
        st.tuples(
            st.sampled_from(["write", "refuse", "acknowledge", "compact", "rebuild"]), st.integers(0, 20)
        ),
        max_size=8,
    ),
)
def test_a_state_stored_as_its_base_reads_and_refolds_as_its_text(
    writes: list[tuple[int, str, dict[str, Any]]], after: list[tuple[str, int]]
) -> None:
    """Adopted states are stored once, as the records' compaction bases, their merge states referring to
    them (`STATE_BASE`). Writes folded on them, a refusal refolding from the base, a compaction and a rebuild
    then leave the same records as on a replica that stored each state's text (the decoded path)."""
    states = written_states(writes)
    by_base, by_text = (create_app(PLAIN, path=":memory:") for _ in "bt")
    try:
        adopt_states(by_base, states)
        with mock.patch.object(state_rows, "statements", return_value=None):
            adopt_states(by_text, states)
        stored = dict(by_base.db.conn.execute("SELECT record_id, state FROM _offline_state").fetchall())
        # (A text with a \\u escape is decoded instead, and stored as text: see `_adopt_plain`.)
        plain = {r for _, r, text, _ in states if "\\u" not in text}
        assert stored and {r for r, s in stored.items() if s == STATE_BASE} == plain & set(stored)
        ids = sorted(stored)
        keys = [("tasks", r) for r in ids]
        assert by_base.db.load_state_texts(keys) == by_text.db.load_state_texts(keys)
        for verb, index in after:
            record_id = ids[index % len(ids)]
            for app in (by_base, by_text):
                if verb == "write" and app.tasks.find_by_id(record_id) is not None:
                    app.tasks.update(record_id, {"title": f"w{index}"})
                elif verb in ("refuse", "acknowledge"):
                    waiting = pending_operations(app)
                    if waiting and verb == "refuse":
                        reject_operation(app, waiting[-1].id, "FORBIDDEN", "no")
                    elif waiting:
                        mark_acknowledged(app, [o.sequence_number for o in waiting])
                elif verb == "compact":
                    app.compact()
                elif verb == "rebuild":
                    app.rebuild()
                app.flush()
            assert sorted(by_base.tasks.fetch(), key=lambda r: r["id"]) == sorted(
                by_text.tasks.fetch(), key=lambda r: r["id"]
            )
    finally:
        by_base.close()
        by_text.close()
