"""The server's record cache: states kept as text, each batch working on its own copy."""

from __future__ import annotations

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
