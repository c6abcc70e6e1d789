"""``MemoryServerStore``: keeps everything in this process (development and tests; lost on restart).

It stores the same JSON text forms as the persistent stores, so a caller that mutates a ``RecordState`` or a
record after saving it does not change what is stored, and a value that could not be persisted elsewhere
fails here too.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from offline.core.operations import Operation

from . import _codec, compaction
from .base import (
    NotifyCallback,
    OperationText,
    RecordKey,
    RecordRow,
    ScopedPage,
    ScopeSelector,
    ServerStore,
    StoredOperation,
    StoreKind,
    StoreWriter,
    merge_selected,
    scope_index_entries,
    scope_value_key,
)

__all__ = ["MemoryServerStore"]


@dataclass(frozen=True, slots=True)
class _Op:
    delivery: int
    operation: Operation
    scope: str | None  # JSON text
    scope_keys: frozenset[tuple[str, str]]  # `scope_index_entries` of the scope

    def stored(self) -> StoredOperation:
        return StoredOperation(self.delivery, self.operation, _codec.decode_optional(self.scope))

    def text(self) -> OperationText:
        op = self.operation
        return (
            self.delivery,
            op.node_id,
            op.collection,
            op.record_id,
            self.scope,
            _codec.encode_operation(op),
        )


# (state JSON, record JSON or None)
_Row = tuple[str, str | None]


def _row(key: RecordKey, value: _Row, refold: Callable[[Operation], Any]) -> RecordRow:
    return _codec.record_row(key[0], key[1], value[0], value[1], refold)


def _since(ops: list[_Op | None], after: int, limit: int | None) -> list[_Op]:
    # Deliveries are 1..n without gaps (a rolled-back writer consumes none), so position = delivery - 1;
    # compaction leaves None where it deleted.
    start = max(after, 0)
    wanted = len(ops) if limit is None else max(limit, 0)
    out: list[_Op] = []
    for op in itertools.islice(ops, start, None):
        if len(out) >= wanted:
            break
        if op is not None:
            out.append(op)
    return out


class MemoryServerStore(ServerStore):
    """A server store in this process's memory. ``listen`` is a no-op (there is no other process)."""

    kind: ClassVar[StoreKind] = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._ops: list[_Op | None] = []  # at delivery - 1; None: deleted by compaction
        self._deleted = 0
        # Compaction: per record and per node, the highest deleted sequence numbers.
        self._record_versions: dict[RecordKey, dict[str, int]] = {}
        self._compacted_nodes: dict[str, int] = {}
        self._ids: set[str] = set()
        self._rows: dict[RecordKey, _Row] = {}
        self._meta: dict[str, str] = {}
        self._vector: dict[str, int] = {}
        self._places: dict[tuple[str, int], str] = {}  # (node id, sequence number) -> operation id
        self._nodes: dict[str, str] = {}  # node id -> principal
        self._lock = asyncio.Lock()
        # The deliveries (ascending) of each collection, of each record, and of each (collection, scope field,
        # value key) an operation's scope snapshot holds (`scope_index_entries`): what the SQL stores' indexes
        # give catch-ups and moved records' histories.
        self._by_collection: dict[str, list[int]] = {}
        self._by_record: dict[RecordKey, list[int]] = {}
        self._by_scope: dict[tuple[str, str, str], list[int]] = {}

    async def _prepare(self) -> None:
        self._check_open()

    async def close(self) -> None:
        self._closed = True

    @asynccontextmanager
    async def _writer(self) -> AsyncIterator[StoreWriter]:
        self._check_open()
        async with self._lock:
            self._check_open()
            writer = _MemoryWriter(self)
            try:
                yield writer
            finally:
                writer.active = False
            # Reached only when the block did not raise: apply everything at once (nothing can fail here).
            self._commit(writer)

    def writer(self, *, optimistic: bool = False) -> AbstractAsyncContextManager[StoreWriter]:
        return self._writer()  # always holds the lock from the start (a WriteConflict cannot happen)

    def _commit(self, writer: _MemoryWriter) -> None:
        for op in writer.ops:
            self._ops.append(op)
            self._ids.add(op.operation.id)
            self._index(op)
            self._places.setdefault((op.operation.node_id, op.operation.sequence_number), op.operation.id)
            node = op.operation.node_id
            if op.operation.sequence_number > self._vector.get(node, -1):
                self._vector[node] = op.operation.sequence_number
        self._rows.update(writer.rows)
        self._meta.update(writer.meta)

    def _index(self, op: _Op) -> None:
        collection = op.operation.collection
        self._by_collection.setdefault(collection, []).append(op.delivery)
        self._by_record.setdefault((collection, op.operation.record_id), []).append(op.delivery)
        for field, key in op.scope_keys:
            self._by_scope.setdefault((collection, field, key), []).append(op.delivery)

    async def get_meta(self, key: str) -> str | None:
        self._check_open()
        _codec.check_meta(key)
        return self._meta.get(key)

    async def operations_since(self, after: int, limit: int | None = None) -> list[StoredOperation]:
        self._check_open()
        return [op.stored() for op in _since(self._ops, after, limit)]

    async def record_operations(self, collection: str, record_id: str, before: int) -> list[StoredOperation]:
        self._check_open()
        deliveries = self._by_record.get((collection, record_id), [])
        end = bisect.bisect_left(deliveries, before)
        return [self._at(d).stored() for d in deliveries[:end]]

    def _at(self, delivery: int) -> _Op:
        op = self._ops[delivery - 1]
        assert op is not None  # the indexes list only what is kept
        return op

    async def operations_in_scope(
        self, after: int, limit: int, selectors: Sequence[ScopeSelector]
    ) -> ScopedPage:
        self._check_open()
        top = len(self._ops)
        limit = max(int(limit), 1)
        pages: list[list[OperationText]] = []
        for selector in selectors:
            if selector.field is None:
                deliveries = self._by_collection.get(selector.collection, [])
            else:
                key = scope_value_key(selector.value)
                if key is None:
                    deliveries = self._by_collection.get(selector.collection, [])
                else:
                    deliveries = self._by_scope.get((selector.collection, selector.field, key), [])
            start = bisect.bisect_right(deliveries, after)
            pages.append([self._at(d).text() for d in deliveries[start : start + limit] if d <= top])
        return merge_selected(pages, limit, top)

    async def max_delivery(self) -> int:
        self._check_open()
        return len(self._ops)

    async def load_all_rows(self) -> AsyncIterator[RecordRow]:
        self._check_open()
        for key, value in list(self._rows.items()):
            yield _row(key, value, self._refold_state)

    async def load_rows(self, keys: Iterable[RecordKey]) -> dict[RecordKey, RecordRow]:
        self._check_open()
        return {key: _row(key, self._rows[key], self._refold_state) for key in keys if key in self._rows}

    async def version_vector(self) -> dict[str, int]:
        self._check_open()
        return dict(self._vector)

    async def stats(self) -> dict[str, Any]:
        self._check_open()
        records: dict[str, int] = {}
        deleted: dict[str, int] = {}
        for (collection, _), (_, record) in self._rows.items():
            target = records if record is not None else deleted
            target[collection] = target.get(collection, 0) + 1
        return {
            "kind": self.kind,
            "operations": len(self._ops) - self._deleted,
            "max_delivery": len(self._ops),
            "records": records,
            "deleted": deleted,
        }

    async def export_operations(self) -> AsyncIterator[StoredOperation]:
        self._check_open()
        for op in list(self._ops):
            if op is not None:
                yield op.stored()

    async def claim_node(self, node_id: str, principal: str, *, replacing: str | None = None) -> str:
        self._check_open()
        _codec.check_node_claim(node_id, principal)
        if replacing is not None and self._nodes.get(node_id) == replacing:
            self._nodes[node_id] = principal
        return self._nodes.setdefault(node_id, principal)

    async def node_principals(self, node_ids: Iterable[str]) -> dict[str, str]:
        self._check_open()
        return {n: self._nodes[n] for n in node_ids if n in self._nodes}

    async def node_scopes(self, node_id: str) -> list[tuple[str, dict[str, Any] | None]]:
        self._check_open()
        seen = dict.fromkeys(
            (o.operation.collection, o.scope)
            for o in self._ops
            if o is not None and o.operation.node_id == node_id
        )
        return [(collection, _codec.decode_optional(scope)) for collection, scope in seen]

    async def node_registrations(self) -> dict[str, str]:
        self._check_open()
        return dict(self._nodes)

    async def listen(self, callback: NotifyCallback) -> None:
        self._check_open()

    async def compact(self, horizon: int | None = None) -> dict[str, Any]:
        async with self._lock:
            self._check_open()
            horizon = compaction.bounded(horizon, len(self._ops))
            rows = [
                (
                    o.delivery,
                    o.operation.node_id,
                    o.operation.sequence_number,
                    o.operation.collection,
                    o.operation.record_id,
                    o.scope,
                )
                for o in self._ops[:horizon]
                if o is not None
            ]
            done = compaction.plan(rows, horizon)
            gone = set(done.deliveries)
            for delivery in done.deliveries:
                op = self._at(delivery).operation
                self._ids.discard(op.id)
                self._places.pop((op.node_id, op.sequence_number), None)
                self._ops[delivery - 1] = None
            self._deleted += len(gone)
            for index in (self._by_collection, self._by_record, self._by_scope):
                for key, deliveries in index.items():  # type: ignore[attr-defined]
                    index[key] = [d for d in deliveries if d not in gone]  # type: ignore[index]
            for key, versions in done.record_versions.items():
                self._record_versions[key] = compaction.merge_versions(
                    self._record_versions.get(key), versions
                )
            self._compacted_nodes = compaction.merge_versions(self._compacted_nodes, done.node_marks)
            self._meta[compaction.HORIZON_KEY] = str(horizon)
            return done.result()

    async def compacted_history(self) -> tuple[dict[RecordKey, dict[str, int]], dict[str, int]]:
        self._check_open()
        return {k: dict(v) for k, v in self._record_versions.items()}, dict(self._compacted_nodes)

    async def restore_compaction(
        self,
        rows: Iterable[RecordRow],
        record_versions: Mapping[RecordKey, Mapping[str, int]],
        node_marks: Mapping[str, int],
        horizon: int,
    ) -> None:
        async with self._writer() as writer:
            await writer.save_rows(rows)
            await writer.set_meta(compaction.HORIZON_KEY, str(int(horizon)))
            # Applied only once the block cannot fail any more (as the writer's own changes are).
            for key, versions in record_versions.items():
                self._record_versions[key] = compaction.merge_versions(
                    self._record_versions.get(key), versions
                )
            self._compacted_nodes = compaction.merge_versions(self._compacted_nodes, node_marks)

    async def record_versions(self, keys: Iterable[RecordKey]) -> dict[RecordKey, dict[str, int]]:
        self._check_open()
        out: dict[RecordKey, dict[str, int]] = {}
        for key in dict.fromkeys(keys):
            stored: dict[str, int] = {}
            for delivery in self._by_record.get(key, []):
                op = self._at(delivery).operation
                stored[op.node_id] = max(stored.get(op.node_id, -1), op.sequence_number)
            versions = compaction.merge_versions(self._record_versions.get(key), stored)
            if versions:
                out[key] = versions
        return out


class _MemoryWriter(StoreWriter):
    def __init__(self, store: MemoryServerStore) -> None:
        self.store = store
        self.active = True
        self.ops: list[_Op] = []
        self.ids: set[str] = set()
        self.rows: dict[RecordKey, _Row] = {}
        self.meta: dict[str, str] = {}

    def _check(self) -> None:
        self.store._check_open()
        if not self.active:
            raise RuntimeError("a store writer is only valid inside its 'async with' block")

    async def operations_since(self, after: int, limit: int | None = None) -> list[StoredOperation]:
        self._check()
        return [op.stored() for op in _since([*self.store._ops, *self.ops], after, limit)]

    async def compaction_horizon(self) -> int | None:
        self._check()
        return int(self.meta.get(compaction.HORIZON_KEY) or self.store._meta.get(compaction.HORIZON_KEY) or 0)

    async def known_ids(self, ids: Iterable[str]) -> set[str]:
        self._check()
        return {i for i in ids if i in self.store._ids or i in self.ids}

    async def load_rows(self, keys: Iterable[RecordKey]) -> dict[RecordKey, RecordRow]:
        self._check()
        out: dict[RecordKey, RecordRow] = {}
        for key in keys:
            value = self.rows.get(key) or self.store._rows.get(key)
            if value is not None:
                out[key] = _row(key, value, self.store._refold_state)
        return out

    async def held_places(self, places: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str]:
        self._check()
        own = {(o.operation.node_id, o.operation.sequence_number): o.operation.id for o in reversed(self.ops)}
        out: dict[tuple[str, int], str] = {}
        places = list(places)
        for place in places:
            found = self.store._places.get(place) or own.get(place)
            if found is not None:
                out[place] = found
        return compaction.with_compacted(out, places, self.store._compacted_nodes)

    async def append(self, ops: Sequence[tuple[Operation, Mapping[str, Any] | None]]) -> list[int | None]:
        self._check()
        _codec.check_appends(ops)
        result: list[int | None] = []
        for op, scope in ops:
            if op.id in self.store._ids or op.id in self.ids:
                result.append(None)
                continue
            delivery = len(self.store._ops) + len(self.ops) + 1
            self.ops.append(
                _Op(delivery, op, _codec.encode_optional(scope), frozenset(scope_index_entries(scope)))
            )
            self.ids.add(op.id)
            result.append(delivery)
        return result

    async def save_rows(self, rows: Iterable[RecordRow]) -> None:
        self._check()
        for row in _codec.check_rows(rows):
            self.rows[row.key] = (row.state_json(), _codec.encode_optional(row.record))

    async def set_meta(self, key: str, value: str) -> None:
        self._check()
        _codec.check_meta(key, value)
        self.meta[key] = value
