"""The server's record cache: states kept as text, each batch working on its own copy."""

from __future__ import annotations

from typing import Any

import pytest

from offline.core.errors import OfflineError
from offline.core.fields import t
from offline.core.hlc import HLCTimestamp
from offline.core.operations import Operation, create_operation
from offline.core.schema import define_schema
from offline.merge.engine import MergeEngine, RecordState
from server_runtime.records import RecordCache, StagedView
from server_runtime.stores.base import RecordRow

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {"todos": {"fields": {"title": t.string(), "votes": t.number().merge("counter")}}},
    }
)
ENGINE = MergeEngine(SCHEMA)


def _op(
    kind: str, data: dict[str, object], wall: int, previous: dict[str, object] | None = None
) -> Operation:
    return create_operation(
        {
            "node_id": "node-a",
            "type": kind,
            "collection": "todos",
            "record_id": "r1",
            "data": data,
            "previous_data": previous,
            "timestamp": HLCTimestamp(wall, 0, "node-a"),
            "sequence_number": wall,
            "schema_version": 1,
        }
    )


def _row(state: RecordState, text: str | None = None) -> RecordRow:
    return RecordRow("todos", "r1", state, ENGINE.materialize("todos", "r1", state), text)


def test_the_cache_hands_out_copies_of_the_committed_state() -> None:
    state = RecordState()
    ENGINE.apply(state, _op("insert", {"title": "a", "votes": 1}, 1))
    cache = RecordCache(SCHEMA)
    cache.put(_row(state))

    first = cache.state("todos", "r1")
    assert first is not None and first.to_json() == state.to_json()
    ENGINE.apply(first, _op("update", {"votes": 5}, 2, {"votes": 1}))  # a batch that is later refused
    again = cache.state("todos", "r1")
    assert again is not None and again.to_json() == state.to_json()  # the committed state is untouched
    assert cache.record("todos", "r1") == {"id": "r1", "title": "a", "votes": 1}
    assert cache.state("todos", "missing") is None


def test_a_staged_view_layers_its_own_states_over_the_cache() -> None:
    state = RecordState()
    ENGINE.apply(state, _op("insert", {"title": "a", "votes": 1}, 1))
    cache = RecordCache(SCHEMA)
    cache.put(_row(state))
    view = StagedView(cache)

    staged = view.state("todos", "r1")
    ENGINE.apply(staged, _op("update", {"title": "b"}, 2, {"title": "a"}))
    view.put(_row(staged))
    assert view.state("todos", "r1") is staged  # later operations of the batch build on it
    assert view.record("todos", "r1") == {"id": "r1", "title": "b", "votes": 1}
    assert cache.record("todos", "r1") == {"id": "r1", "title": "a", "votes": 1}
    assert view.state("todos", "r2").to_json() == RecordState().to_json()


def test_a_row_encodes_its_state_only_when_its_text_is_unknown() -> None:
    state = RecordState()
    ENGINE.apply(state, _op("insert", {"title": "a", "votes": 1}, 1))
    assert _row(state).state_json() == state.to_json()
    assert _row(state, "given text").state_json() == "given text"  # as stored: not encoded again
    assert _row(state, "given text") == _row(state)  # the text is a cache, not part of the row's value
    cache = RecordCache(SCHEMA)
    cache.put(_row(state, state.to_json()))
    cached = cache.state("todos", "r1")
    assert cached is not None and cached.to_json() == state.to_json()


LOOKUPS = define_schema(
    {
        "version": 1,
        "collections": {
            "tags": {"fields": {"label": t.string()}},
            "users": {
                "fields": {
                    "email": t.string().optional(),
                    "team": t.string().optional(),
                    "tagIds": t.array(t.string()).optional(),
                },
                "constraints": {
                    "uniqueEmail": {"type": "unique", "fields": ["email"], "onConflict": "first-write-wins"}
                },
            },
        },
        "relations": {
            "userTags": {"from": "users", "to": "tags", "type": "many-to-many", "field": "tagIds"},
        },
    }
)


def _plain_find(records: list[dict[str, object]], filters: dict[str, object]) -> list[str]:
    return sorted(str(r["id"]) for r in records if all(r.get(k) == v for k, v in filters.items()))


def test_lookups_through_the_cache_indexes_find_what_a_scan_finds() -> None:
    """Random puts, changes and deletes: every indexed lookup (by email, by an element of tagIds), on the
    cache and on a staged view over it, finds exactly the records a scan of the alive records finds."""
    import random

    rng = random.Random(7)
    cache = RecordCache(LOOKUPS)
    assert cache.indexes["users"] and cache.elements["users"] == {"tagIds": {}}
    emails, tags = ["a", "b", "c", None], ["t1", "t2", "t3"]
    view = StagedView(cache)  # takes the last 100 steps, over the cache the first 300 made
    for step in range(400):
        record_id = f"u{rng.randrange(30)}"
        record = (
            None
            if rng.random() < 0.2
            else {
                "id": record_id,
                "email": rng.choice(emails),
                "team": rng.choice(["x", "y"]),
                "tagIds": rng.sample(tags, rng.randrange(3)),
            }
        )
        target: RecordCache | StagedView = cache if step < 300 else view
        target.put(RecordRow("users", record_id, RecordState(), record, "{}"))
        alive = list(cache.alive["users"].values())
        if step >= 300:
            staged = {rid: row.record for (_, rid), row in view.rows.items()}
            alive = [r for r in alive if r["id"] not in staged] + [
                r for r in staged.values() if r is not None
            ]
        for email in emails:
            assert sorted(r["id"] for r in target.find_records("users", {"email": email})) == _plain_find(
                alive, {"email": email}
            )
            both = {"email": email, "team": "x"}
            assert sorted(r["id"] for r in target.find_records("users", both)) == _plain_find(alive, both)
        for tag in tags:
            found = sorted(r["id"] for r in target.find_containing("users", "tagIds", tag))
            assert found == sorted(str(r["id"]) for r in alive if tag in (r.get("tagIds") or ()))


def test_a_unique_constrained_insert_into_100_000_records_reads_an_index_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server judges constraints against its record cache (every server store, SQLite and PostgreSQL
    alike, loads its records into one and runs no SQL per check): at 100,000 records, the unique check of an
    insert reads the index bucket of the new value, not the collection."""
    from offline.merge import constraints
    from server_runtime import records

    cache = RecordCache(LOOKUPS)
    for i in range(100_000):
        record_id = f"u{i:06d}"
        cache.put(
            RecordRow("users", record_id, RecordState(), {"id": record_id, "email": f"u{i}@x.io"}, "{}")
        )
    read: list[int] = []
    find = records._find

    def counting(candidates: Any, filters: Any) -> list[dict[str, Any]]:
        candidates = list(candidates)
        read.append(len(candidates))
        return find(candidates, filters)

    monkeypatch.setattr(records, "_find", counting)
    view = StagedView(cache)
    fresh = constraints.check_write(view, "users", {"id": "new", "email": "new@x.io"}, None)
    assert fresh.violations == []
    with pytest.raises(OfflineError, match="uniqueEmail"):  # first-write-wins: the later insert is refused
        constraints.check_write(view, "users", {"id": "dup", "email": "u99999@x.io"}, None)
    assert read and max(read) <= 1
