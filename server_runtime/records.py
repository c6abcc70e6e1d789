"""The server's in-memory view of every record: merge state plus the materialised record.

All writes are serialised (one writer per database, see `SyncService.commit`), so this cache is exact for
the process that holds the write lock; before deciding anything, a writer first catches up on what other
processes committed. Constraint and relation checks read it synchronously through `find_records`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from offline.core.operations import Operation
from offline.core.schema import SchemaDefinition
from offline.merge.engine import RecordState
from offline.merge.values import operation_text

from .stores.base import ONE_OPERATION, RecordRow, state_from_text

Key = tuple[str, str]


def one_operation_state(op: Operation) -> str:
    """The state text standing for what ``op`` makes of a record with no state (``base.ONE_OPERATION``)."""
    return ONE_OPERATION + operation_text(op)


class RecordCache:
    """Every record's merge state, as JSON text, and its materialised value.

    States are kept as text, not `RecordState` objects: a state is a dozen or more containers, and a cache of
    live ones grows by the thousands every second under write load, each of them walked again by every full
    garbage collection (a quarter of a busy server's time). A batch needs its own copy of a state anyway
    (`StagedView.state`), which parsing the text gives.
    """

    def __init__(
        self, schema: SchemaDefinition, refold: Callable[[Operation], RecordState] | None = None
    ) -> None:
        self.schema = schema
        # What one operation makes of an empty state (the merge engine's apply): reads `ONE_OPERATION` texts.
        self.refold = refold
        self.rows: dict[Key, str] = {}
        self.alive: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in schema.collections}

    def put(self, row: RecordRow) -> None:
        self.rows[(row.collection, row.record_id)] = row.state_json()
        bucket = self.alive.setdefault(row.collection, {})
        if row.record is None:
            bucket.pop(row.record_id, None)
        else:
            bucket[row.record_id] = row.record

    def state(self, collection: str, record_id: str) -> RecordState | None:
        """A new copy of the record's committed state (None: the server holds none)."""
        text = self.rows.get((collection, record_id))
        if text is None:
            return None
        return state_from_text(
            text, self.refold, collection, record_id, "the merge engine (RecordCache refold)"
        )

    def record(self, collection: str, record_id: str) -> dict[str, Any] | None:
        return self.alive.get(collection, {}).get(record_id)

    def find_records(self, collection: str, filters: Mapping[str, Any]) -> list[dict[str, Any]]:
        return _find(self.alive.get(collection, {}).values(), filters)

    def count(self, collection: str) -> int:
        return len(self.alive.get(collection, {}))


class StagedView:
    """The cache as one batch sees it: its own uncommitted changes layered over the committed records."""

    def __init__(self, cache: RecordCache) -> None:
        self.cache = cache
        self.schema = cache.schema
        self.rows: dict[Key, RecordRow] = {}

    def state(self, collection: str, record_id: str) -> RecordState:
        key = (collection, record_id)
        if key in self.rows:
            return self.rows[key].state
        # A copy (parsed from the text): a refused or failed batch must leave the committed state untouched.
        return self.cache.state(collection, record_id) or RecordState()

    def record(self, collection: str, record_id: str) -> dict[str, Any] | None:
        key = (collection, record_id)
        if key in self.rows:
            return self.rows[key].record
        return self.cache.record(collection, record_id)

    def put(self, row: RecordRow) -> None:
        self.rows[(row.collection, row.record_id)] = row

    def find_records(self, collection: str, filters: Mapping[str, Any]) -> list[dict[str, Any]]:
        staged = {rid: row.record for (c, rid), row in self.rows.items() if c == collection}
        committed = (r for rid, r in self.cache.alive.get(collection, {}).items() if rid not in staged)
        candidates = [*committed, *(r for r in staged.values() if r is not None)]
        return _find(candidates, filters)


def _find(records: Any, filters: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = filters.items()
    return [r for r in records if all(r.get(k) == v for k, v in items)]
