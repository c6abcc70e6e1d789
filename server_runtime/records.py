"""The server's in-memory view of every record: merge state plus the materialised record.

All writes are serialised (one writer per database, see `SyncService.commit`), so this cache is exact for
the process that holds the write lock; before deciding anything, a writer first catches up on what other
processes committed. Constraint and relation checks read it synchronously through `find_records`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from offline.core.operations import Operation
from offline.core.schema import SchemaDefinition
from offline.merge.engine import MergeEngine, RecordState
from offline.merge.values import operation_text
from offline.store.rows import lookup_array_fields, lookup_field_sets

from .stores.base import ONE_OPERATION, RecordRow, state_from_text

Key = tuple[str, str]


def one_operation_state(op: Operation) -> str:
    """The state text standing for what ``op`` makes of a record with no state (``base.ONE_OPERATION``)."""
    return ONE_OPERATION + operation_text(op)


def one_operation_json(engine: MergeEngine, text: str) -> str:
    """The state JSON a ``ONE_OPERATION`` text stands for: ``engine.state_of((op,)).to_json()`` of its
    operation, byte for byte. A state-based catch-up (and a snapshot's build) sends this for every record
    written once, most of a fresh device's first sync: an insert's text is built directly, without building
    and encoding the state, read off the operation's wire form (`MergeEngine.wire_insert_text`) or else
    from the decoded operation (`MergeEngine.insert_fold`, the text the local store already takes as that
    state's). Refolding and encoding was ~60 % of a 20,000-record snapshot's server CPU."""
    wire = json.loads(text[1:])
    built = engine.wire_insert_text(wire)  # (the usual: an insert, read off its wire form)
    if built is not None:
        return built
    op = Operation.from_wire(wire, verify=False)  # (as `operation_from_text` reads it: verified when stored)
    if op.type == "insert":
        made = engine.insert_fold(op, op.record_id, encode=True)
        if made is not None:
            return made.text
    return engine.state_of((op,)).to_json()


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
        # The lookups constraint checks and relation planning make on every write (the same field sets the
        # local store indexes, `rows.lookup_field_sets`): field values -> ids of the alive records holding
        # them, so a check reads the few records concerned instead of the whole collection.
        self.indexes: dict[str, list[_FieldIndex]] = {
            name: [_FieldIndex(fields) for fields in lookup_field_sets(schema, name)]
            for name in schema.collections
        }
        self.elements: dict[str, dict[str, dict[Any, dict[str, None]]]] = {
            name: {field: {} for field in lookup_array_fields(schema, name)} for name in schema.collections
        }

    def put(self, row: RecordRow) -> None:
        self.rows[(row.collection, row.record_id)] = row.state_json()
        collection, record_id = row.collection, row.record_id
        bucket = self.alive.setdefault(collection, {})
        before = bucket.get(record_id)
        if row.record is None:
            bucket.pop(record_id, None)
        else:
            bucket[record_id] = row.record
        if before is None and row.record is None:
            return
        for index in self.indexes.get(collection, ()):
            index.move(record_id, before, row.record)
        for field, holders in self.elements.get(collection, {}).items():
            old = _elements(before, field)
            new = _elements(row.record, field)
            for element in old - new:
                ids = holders.get(element)
                if ids is not None:
                    ids.pop(record_id, None)
                    if not ids:
                        del holders[element]
            for element in new - old:
                holders.setdefault(element, {})[record_id] = None

    def _candidates(self, collection: str, filters: Mapping[str, Any]) -> Any:
        """The alive records that may match ``filters``: an index's bucket when one covers them."""
        alive = self.alive.get(collection, {})
        if "id" in filters:
            found = alive.get(filters["id"]) if _hashable(filters["id"]) else None
            return () if found is None else (found,)
        for index in self.indexes.get(collection, ()):
            ids = index.lookup(filters)
            if ids is not None:
                return [alive[rid] for rid in ids]
        return alive.values()

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
        return _find(self._candidates(collection, filters), filters)

    def find_containing(self, collection: str, field: str, value: Any) -> list[dict[str, Any]]:
        """Alive records whose array ``field`` holds ``value`` (through the element index when kept)."""
        alive = self.alive.get(collection, {})
        holders = self.elements.get(collection, {}).get(field)
        if holders is not None and _hashable(value):
            return [alive[rid] for rid in holders.get(value, ())]
        return [r for r in alive.values() if value in (r.get(field) or ())]

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
        committed = (r for r in self.cache._candidates(collection, filters) if r["id"] not in staged)
        candidates = [*committed, *(r for r in staged.values() if r is not None)]
        return _find(candidates, filters)

    def find_containing(self, collection: str, field: str, value: Any) -> list[dict[str, Any]]:
        staged = {rid: row.record for (c, rid), row in self.rows.items() if c == collection}
        committed = [r for r in self.cache.find_containing(collection, field, value) if r["id"] not in staged]
        mine = [r for r in staged.values() if r is not None and value in (r.get(field) or ())]
        return [*committed, *mine]


def _find(records: Any, filters: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = filters.items()
    return [r for r in records if all(r.get(k) == v for k, v in items)]


class _FieldIndex:
    """Alive records by the values of some fields: values -> ids (insertion-ordered)."""

    __slots__ = ("buckets", "fields")

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = fields
        self.buckets: dict[tuple[Any, ...], dict[str, None]] = {}

    def _key(self, record: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
        if record is None:
            return None
        key = tuple(record.get(f) for f in self.fields)
        return key if _hashable(key) else None

    def move(self, record_id: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> None:
        old, new = self._key(before), self._key(after)
        if old == new and (old is None or record_id in self.buckets.get(old, ())):
            return
        if old is not None:
            ids = self.buckets.get(old)
            if ids is not None:
                ids.pop(record_id, None)
                if not ids:
                    del self.buckets[old]
        if new is not None:
            self.buckets.setdefault(new, {})[record_id] = None

    def lookup(self, filters: Mapping[str, Any]) -> Any:
        """Ids of the records whose fields equal ``filters``' values, or None when this index cannot say
        (a field not filtered on, or an unhashable value: such records are not indexed)."""
        if not all(f in filters for f in self.fields):
            return None
        key = tuple(filters[f] for f in self.fields)
        if not _hashable(key):
            return None
        return self.buckets.get(key, ())


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _elements(record: Mapping[str, Any] | None, field: str) -> set[Any]:
    if record is None:
        return set()
    value = record.get(field)
    if not isinstance(value, list):
        return set()
    return {v for v in value if _hashable(v)}
