"""`create_app`: the local-first application object (DESIGN.md section 2).

Every local write is one SQLite transaction that appends an operation to the log, folds it into the
record's merge state and rewrites the record's row; it is durable when the call returns. Remote operations
go through `apply()`, which folds them with the same engine. Subscriptions and events run after the commit,
before the call returns.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from offline.core.errors import (
    CLOCK_DRIFT,
    INVALID_OPERATION,
    OfflineError,
)
from offline.core.frozen import FrozenDict, adopt
from offline.core.hlc import HLCTimestamp, HybridLogicalClock, parse_timestamp, serialize_timestamp
from offline.core.operations import (
    Operation,
    _check_record,
    _check_str,
    _content_id,
    _new_operation,
    create_operation,
    operation_from_text,
    verify_operation,
)
from offline.core.schema import SchemaDefinition
from offline.core.server_nodes import is_server_node_id
from offline.core.uuid7 import generate_uuid_v7
from offline.core.version_vector import topological_sort
from offline.merge.constraints import Violation
from offline.merge.engine import REPEATED, Conflict, MergeEngine, RecordState, TextFold
from offline.merge.trace import MergeTrace
from offline.merge.values import compact_json, floatless_json, is_floatless

from . import breaches, compaction, replication
from .collection import Collection
from .database import (
    ACKED,
    PENDING,
    REJECTED,
    STATE_REFERENCE,
    WIRE,
    LocalDatabase,
    damaged_error,
    is_damaged,
    storage_error,
    stored_text,
)
from .events import EventBus
from .local_migrations import migrate_database
from .many_rows import write_rows
from .rows import RowCodec
from .subscriptions import SubscriptionRegistry, records_of, records_of_keys

log = logging.getLogger("offline.store")

# create_app(durability=...): "normal" survives a process crash, "full" also an OS crash or a power cut
# (SQLite's synchronous=NORMAL / FULL under WAL; see the README).
DURABILITY = ("normal", "full")

# Bound on records awaiting materialisation, so memory stays small during long write bursts.
_MAX_DIRTY = 2000


@dataclass(slots=True)
class Write:
    """One local write planned inside a transaction."""

    collection: str
    record_id: str
    type: str
    data: dict[str, Any] | None
    previous_data: dict[str, Any] | None = None


#: A record's merge state waiting for its flush: the state, or the insert that made the record when that is
#: all the record holds. Such a state is what the insert makes of nothing, and its stored form is a reference
#: to the insert anyway (`STATE_REFERENCE`), while the insert itself is held until the commit announces it:
#: keeping it instead of the decoded state leaves no merge state alive per inserted record. (A batch of
#: 10,000 inserts kept ~10 containers each, which every full garbage collection walked again: a third of the
#: batch's time at 30,000.)
Unflushed = RecordState | Operation


@dataclass(slots=True)
class _Batch:
    staged: dict[tuple[str, str], Unflushed] = field(default_factory=dict)
    results: list[tuple[Operation, dict[str, Any] | None]] = field(default_factory=list)
    traces: list[tuple[Operation, Conflict]] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    # Staged records changed since the batch's last flush: a read inside the batch writes only those rows.
    unflushed: set[tuple[str, str]] = field(default_factory=set)
    # Remote operations applied inside the batch, with their traces and start time: announced at commit.
    applied: list[tuple[list[Operation], list[tuple[Operation, Conflict]], float]] = field(
        default_factory=list
    )


class Ready:
    """`app.ready`: awaitable, and already done for the local store (writes work at once)."""

    def __init__(self, app: App) -> None:
        self._app = app

    def __await__(self) -> Generator[Any, None, App]:
        return self._result()

    def _result(self) -> Generator[Any, None, App]:
        if False:  # pragma: no cover - makes this a generator without suspending
            yield None
        return self._app

    @property
    def done(self) -> bool:
        return True


class LocalOnlySync:
    """`app.sync` of an app created without a sync configuration (refusals kept by an earlier session that
    had one stay listed and recoverable)."""

    status = "disabled"

    def __init__(self, app: App) -> None:
        self._app = app

    @property
    def clock_offset_ms(self) -> int:
        return self._app.clock_offset_ms

    def rejected(self) -> list[dict[str, Any]]:
        return replication.rejected(self._app)

    def retry(self, operation_id: str) -> dict[str, Any] | None:
        return replication.retry(self._app, operation_id)

    def discard(self, operation_id: str) -> bool:
        return replication.discard(self._app, operation_id)

    async def connect(self) -> None:
        raise OfflineError(
            "this app was created without sync; pass sync={'url': 'ws://host:3001/offline-sync'} to create_app",
            "SYNC_ERROR",
            {"field": "sync"},
        )

    async def disconnect(self) -> None:
        return None


class App:
    def __init__(
        self,
        schema: SchemaDefinition,
        *,
        path: str = "app.db",
        sync: Mapping[str, Any] | None = None,
        durability: str = "normal",
        now: Callable[[], int] | None = None,
        compact_after: int | None = compaction.DEFAULT_COMPACT_AFTER,
    ) -> None:
        if not isinstance(schema, SchemaDefinition):
            raise OfflineError(
                "create_app needs the result of define_schema(...)", "INVALID_SCHEMA", {"field": "schema"}
            )
        if durability not in DURABILITY:
            raise OfflineError(
                f"durability must be one of {', '.join(map(repr, DURABILITY))}, got {durability!r}",
                INVALID_OPERATION,
                {"field": "durability", "expected": list(DURABILITY), "received": repr(durability)},
            )
        if compact_after is not None and (
            isinstance(compact_after, bool) or not isinstance(compact_after, int) or compact_after < 1
        ):
            raise OfflineError(
                f"compact_after must be a positive number of operations or None, got {compact_after!r}",
                INVALID_OPERATION,
                {"field": "compact_after", "received": repr(compact_after)},
            )
        self.schema = schema
        self.path = path
        # Automatic compaction (`compact`): once this many operations were stored since the app opened or
        # last compacted; None: only when `compact()` is called.
        self.compact_after = compact_after
        self._log_growth = 0
        # `_grew` looks at the log once `_log_growth` reaches this (then again after what `compaction.due` says).
        self._compact_check = compact_after or 0
        self._compacting = False
        self.events = EventBus()
        self.db = LocalDatabase(path, durability=durability)
        try:
            self._open(schema, sync, now)
        except BaseException as exc:
            self.db.close()  # the file (and its lock) is free for the next attempt; the error says what to fix
            if is_damaged(exc):
                raise damaged_error(path, exc) from exc
            raise

    def _open(
        self,
        schema: SchemaDefinition,
        sync: Mapping[str, Any] | None,
        now: Callable[[], int] | None,
    ) -> None:
        self._authoritative: set[str] = set()
        self.engine = MergeEngine(schema, authoritative_nodes=lambda: self._authoritative)
        self.db.refold = self._refold_one
        self.codecs = {name: RowCodec(coll) for name, coll in schema.collections.items()}
        self.subscriptions = SubscriptionRegistry(self)
        self._wall = now or (lambda: time.time_ns() // 1_000_000)
        self._closed = False

        with self.db.transaction():
            self.db.conn.execute(compaction.TABLE)
            self._compacted = self.db.get_meta(compaction.FLAG_KEY) == "1"
            node_id = self.db.get_meta("node_id")
            if node_id is None:
                node_id = generate_uuid_v7()
                self.db.set_meta("node_id", node_id)
            self.node_id: str = node_id
            self._authoritative = set(json.loads(self.db.get_meta("authoritative_nodes") or "[]"))
            # Compaction may have dropped a node's last operations: the highest of those is kept apart.
            last = max(self.db.max_hlc() or "", self.db.get_meta(compaction.CLOCK_KEY) or "") or None
            # Server time minus this device's time, learnt at the last handshake: new operations are
            # stamped by the server's clock, so a device whose clock is wrong is neither refused nor
            # ordered minutes away from everyone else.
            self._clock_offset = int(self.db.get_meta("clock_offset_ms") or 0)
            self.clock = HybridLogicalClock(
                node_id, now=self._physical, last=parse_timestamp(last) if last else None
            )
            # (The version vector keeps this node's number when compaction dropped its last operations.)
            self._seq = max(self.db.own_sequence(node_id), self.db.version_vector().get(node_id, 0))
            self.db.open_pending(node_id)
        # Records whose latest local operations are committed but not yet written to their row (see flush()).
        self._dirty: dict[tuple[str, str], Unflushed] = {}
        # The row (None: no record) each local write materialised, with the state object (or insert) it came
        # from: flush() and reads of unflushed records reuse it while that same object is still the state.
        self._rows: dict[tuple[str, str], tuple[Unflushed, list[Any] | None]] = {}
        self._batch: _Batch | None = None
        # Called with the operations of every committed local write (the sync engine streams them).
        self.commit_listeners: list[Callable[[list[Operation]], None]] = []
        self._collections = {name: Collection(self, name) for name in schema.collections}
        migrate_database(self)
        self._recover()
        self.ready = Ready(self)
        self.sync: Any = LocalOnlySync(self)
        if sync:
            self.sync = self._make_sync(sync)

    def _physical(self) -> int:
        return self._wall() + self._clock_offset

    @property
    def clock_offset_ms(self) -> int:
        """Server time minus this device's time (0 until a server has said), applied to new timestamps."""
        return self._clock_offset

    def set_clock_offset(self, offset_ms: int) -> None:
        """Adopt a new offset (kept across restarts, so writes made offline later are stamped right too)."""
        offset_ms = int(offset_ms)
        if offset_ms == self._clock_offset:
            return
        with self.db.lock, self.db.transaction():
            self.db.set_meta("clock_offset_ms", str(offset_ms))
            self._clock_offset = offset_ms

    def reseed_clock(self, ceiling: int) -> None:
        """Seed the clock again from the operation set, ignoring timestamps past ``ceiling`` (a wall time).

        The clock never goes back behind what it issued; but what a fast clock issued before the server's
        time was known is refused by the server and written again (`replication.restamp`): those stamps
        must not drag the new ones along into the future, or the server would refuse them as well.
        """
        # Refused stamps within the ceiling count too: a write made again in the same millisecond as the
        # refused one would otherwise get its timestamp, and so its content-addressed id.
        with self.db.lock:
            row = self.db.conn.execute(
                "SELECT max(hlc) FROM _offline_ops WHERE hlc <= ?",
                ("%015d:99999:\U0010ffff" % ceiling,),  # noqa: UP031
            ).fetchone()
            found = row[0] if row and row[0] else ""
            dropped = self.db.get_meta(compaction.CLOCK_KEY) or ""
            if dropped and int(dropped.split(":", 1)[0]) <= ceiling:
                found = max(found, dropped)
            last = parse_timestamp(found) if found else None
            self.clock = HybridLogicalClock(self.node_id, now=self._physical, last=last)

    def _receive(self, remote: HLCTimestamp) -> None:
        """Move the clock past a received timestamp, however far ahead of this device's clock it is.

        The drift limit protects a server from a client's runaway clock; what a replica receives was
        accepted by its server already, and refusing it here would only lose it (the receive rule moves
        the local clock forward instead).
        """
        try:
            self.clock.receive(remote)
        except OfflineError as exc:
            if exc.code != CLOCK_DRIFT:
                raise
            ahead = HLCTimestamp(remote.wall_time, remote.logical, self.node_id)
            last = self.clock.last
            self.clock = HybridLogicalClock(
                self.node_id, now=self._physical, last=ahead if last is None or last < ahead else last
            )
            self.clock.now()  # after the remote one, as receive() leaves it

    def _make_sync(self, config: Mapping[str, Any]) -> Any:
        from offline.sync import create_sync_engine  # the sync layer is optional for local-only apps

        return create_sync_engine(self, config)

    # -- collections ----------------------------------------------------------------------------------------

    def collection(self, name: str) -> Collection:
        try:
            return self._collections[name]
        except KeyError:
            raise OfflineError(
                f"unknown collection {name!r}; the schema has {', '.join(self._collections)}",
                INVALID_OPERATION,
                {"collection": name},
            ) from None

    def __getattr__(self, name: str) -> Collection:
        collections = self.__dict__.get("_collections")
        if collections is not None and name in collections:
            return collections[name]  # type: ignore[no-any-return]
        raise AttributeError(name)

    # -- identity and replication -----------------------------------------------------------------------------

    @property
    def version_vector(self) -> dict[str, int]:
        with self.db.lock:
            return self._vector()

    def _vector(self) -> dict[str, int]:
        vector = self.db.version_vector()
        if self._seq:
            vector[self.node_id] = max(vector.get(self.node_id, 0), self._seq)
        return vector

    def operations(self, after: Mapping[str, int] | None = None) -> list[Operation]:
        """Operations held here and not covered by ``after``, in causal order (rejected ones excluded)."""
        after = after or {}
        with self.db.lock:
            ops: list[Operation] = []
            for node, seq in self._vector().items():
                since = after.get(node)
                if since is not None and since >= seq:
                    continue
                ops.extend(self.db.operations_after(node, since))
        return topological_sort(ops)

    def set_authoritative_nodes(self, nodes: Iterable[str]) -> None:
        """Declare the server node(s) whose writes win for 'server-authoritative' fields; refolds if changed."""
        # Marked server ids are authoritative everywhere already (offline.core.server_nodes): nothing to refold.
        new = {n for n in nodes if not is_server_node_id(n)} | self._authoritative
        if new == self._authoritative:
            return
        added = new - self._authoritative
        with self.db.transaction():
            self._authoritative = new
            self.db.set_meta("authoritative_nodes", json.dumps(sorted(new)))
            refolded = self._refold_written_by(added)
        # Those records' rows changed with no operation saying so: live queries hear of them here.
        changed = records_of_keys(refolded)
        if changed:
            self.subscriptions.notify(changed, None, record_ids=changed)

    def _refold_written_by(self, nodes: set[str]) -> list[tuple[str, str]]:
        """Refold the records whose value a change of the authoritative nodes may change: those holding a
        write of one of ``nodes`` in a collection with a 'server-authoritative' field (no other register
        reads which nodes are authoritative)."""
        collections = [
            name
            for name, collection in self.schema.collections.items()
            if name in self.codecs
            and any(d.effective_merge_strategy == "server-authoritative" for d in collection.fields.values())
        ]
        if not collections or not nodes:
            return []
        marks = ",".join("?" * len(collections))
        keys: set[tuple[str, str]] = set()
        for node_id in sorted(nodes):
            keys.update(
                self.db.conn.execute(
                    f"SELECT DISTINCT collection, record_id FROM _offline_ops WHERE node_id = ? "
                    f"AND collection IN ({marks}) AND status != ?",
                    (node_id, *collections, REJECTED),
                )
            )
        self.flush()
        for collection, record_id in sorted(keys):
            compaction.refold_and_persist(self, collection, record_id)
        return sorted(keys)

    def compact(self) -> int:
        """Drop from the local log the operations the server has acknowledged (or sent), keeping what
        merging and recognising repeats need (see `offline.store.compaction`); returns how many were
        dropped. This node's unacknowledged and refused operations always stay."""
        return compaction.compact(self)

    def _grew(self, droppable: int) -> None:
        """``droppable`` more operations may have become droppable (acknowledged, or received onto a record
        that had a state): compact automatically once that is due (`compaction.due`; not inside a
        transaction or a batch: then at the next chance)."""
        self._log_growth += droppable
        if (
            self.compact_after is None
            or self._log_growth < self._compact_check
            or self._compacting
            or self._batch is not None
            or self.db.in_transaction
            or self._closed
        ):
            return
        self._compacting = True
        try:
            wanted = compaction.due(self)
            if wanted:
                # Not yet: nothing can be due before this many more (checked against the log then).
                self._log_growth, self._compact_check = 0, wanted
                return
            dropped = compaction.compact(self, superseded_only=True)
            self._compact_check = self.compact_after
            log.info("compacted the local operation log: %d operations dropped", dropped)
        finally:
            self._compacting = False

    def rebuild(self) -> None:
        """Refold every record from the operation log (after a schema migration or a new server node)."""
        conn = self.db.conn
        with self.db.transaction():
            self._dirty.clear()
            self._rows.clear()
            conn.execute("DELETE FROM _offline_state")
            for codec in self.codecs.values():
                conn.execute(f"DELETE FROM {codec.table}")
            grouped: dict[tuple[str, str], list[Operation]] = {}
            for (wire,) in conn.execute(f"SELECT {WIRE} FROM _offline_ops WHERE status != ?", (REJECTED,)):
                op = operation_from_text(wire)
                if op.collection in self.codecs:
                    grouped.setdefault((op.collection, op.record_id), []).append(op)
            # A compacted record starts from its base (what its dropped operations made of it).
            bases = compaction.bases(self)
            for key in bases:
                grouped.setdefault(key, [])
            for (collection, record_id), ops in grouped.items():
                if collection not in self.codecs:
                    continue
                base = bases.get((collection, record_id))
                if base is None:
                    state, record = self.engine.fold(collection, record_id, ops)
                else:
                    state = base
                    for op in ops:
                        self.engine.apply(state, op, want_conflicts=False)
                    record = self.engine.materialize(collection, record_id, state)
                self._persist(collection, record_id, state, record, reference=base is None)
            self.db.set_meta("materialized_sequence", str(self._seq))

    def _recover(self) -> None:
        """Materialise local operations committed after the last flush (the process stopped before it)."""
        done = int(self.db.get_meta("materialized_sequence") or 0)
        if done >= self._seq:
            return
        with self.db.lock, self.db.transaction():
            ops = [op for op in self.db.operations_after(self.node_id, done) if op.collection in self.codecs]
            keys = list(dict.fromkeys((op.collection, op.record_id) for op in ops))
            states = self.db.load_states(keys)
            for op in ops:
                self.engine.apply(states.setdefault((op.collection, op.record_id), RecordState()), op)
            for key in keys:
                state = states[key]
                self._persist(*key, state, self.engine.materialize(*key, state))
            self.db.set_meta("materialized_sequence", str(self._seq))

    def flush(self) -> None:
        """Write the rows of records changed by local writes since the last flush (one transaction).

        Local writes commit only their operation; the operation log is the durable truth and rows are its
        materialisation. Every read path calls this first, so callers always see their own writes.
        """
        if not self._dirty and self._batch is None:
            return
        with self.db.lock:
            # Inside app.batch(), the batch's own writes are materialised too (read-your-writes, and
            # materialized_sequence must not claim operations whose rows were not written).
            batch = self._batch
            staged = {key: batch.staged[key] for key in batch.unflushed} if batch is not None else {}
            if not self._dirty and not staged:
                return
            # Nested in an outer transaction (a batch), these rows roll back with it: keep the dirty set.
            nested = self.db.in_transaction
            with self.db.transaction():
                self._persist_many({**self._dirty, **staged})
                self.db.set_meta("materialized_sequence", str(self._seq))
            if batch is not None:
                batch.unflushed.clear()
            if not nested:
                self._dirty.clear()
                self._rows.clear()

    def unflushed(self, collection: str, record_id: str) -> Unflushed | None:
        """The state of a record written since the last flush (or in the open batch), else None: as it is
        kept, for `row_of`."""
        key = (collection, record_id)
        if self._batch is not None and key in self._batch.staged:
            return self._batch.staged[key]
        return self._dirty.get(key)

    def unflushed_state(self, collection: str, record_id: str) -> RecordState | None:
        """The state of a record written since the last flush (or in the open batch), else None."""
        state = self.unflushed(collection, record_id)
        return None if state is None else self._decoded(collection, record_id, state)

    def _decoded(self, collection: str, record_id: str, state: Unflushed) -> RecordState:
        """``state`` as a `RecordState`: an insert kept for its flush refolded (a new object each time)."""
        if isinstance(state, Operation):
            return self._refold_one(collection, record_id, state)
        return state

    def _refold_one(self, collection: str, record_id: str, op: Operation) -> RecordState:
        """The state one operation makes of a record (how a state stored as a reference is read)."""
        return self.engine.state_of((op,))

    def cached_state(self, collection: str, record_id: str) -> RecordState | None:
        state = self.unflushed_state(collection, record_id)
        return state if state is not None else self.db.load_state(collection, record_id)

    def row_of(self, collection: str, record_id: str, state: Unflushed) -> list[Any] | None:
        """The table row of a record in ``state`` (None when it does not exist), as flush() writes it.

        Reuses the row the last local write computed from this very state object. Callers must not modify it.
        """
        cached = self._rows.get((collection, record_id))
        if cached is not None and cached[0] is state:
            return cached[1]
        decoded = self._decoded(collection, record_id, state)
        return self._row(collection, decoded, self.engine.materialize(collection, record_id, decoded))

    def _row(self, collection: str, state: RecordState, record: dict[str, Any] | None) -> list[Any] | None:
        if record is None:
            return None
        codec = self.codecs[collection]
        rich = (
            {name: (state.fields.get(name) or {}).get("s") for name in codec.names}
            if codec.has_richtext
            else None
        )
        return codec.row(record, rich)

    def _text_row(self, collection: str, done: TextFold) -> list[Any] | None:
        """`_row` of a record folded by `MergeEngine.apply_to_text`."""
        if done.record is None:
            return None
        codec = self.codecs[collection]
        rich = (
            {name: (done.fields.get(name) or {}).get("s") for name in codec.names}
            if codec.has_richtext
            else None
        )
        return codec.row(done.record, rich)

    # -- writes ---------------------------------------------------------------------------------------------

    def _persist(
        self,
        collection: str,
        record_id: str,
        state: RecordState,
        record: dict[str, Any] | None,
        *,
        reference: bool = True,
    ) -> None:
        """Write a record's state and row. ``reference=False``: never as a reference to its one operation
        (a compacted record's operation may be gone from the log)."""
        codec = self.codecs[collection]
        conn = self.db.conn
        self.db.save_states([(collection, record_id, _stored_state(state) if reference else state.to_json())])
        if record is None:
            conn.execute(codec.delete_sql, (record_id,))
        else:
            rich = (
                {name: (state.fields.get(name) or {}).get("s") for name in codec.names}
                if codec.has_richtext
                else None
            )
            conn.execute(codec.upsert_sql, codec.row(record, rich))

    def find_records(self, collection: str, filters: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Alive records of ``collection`` equal to ``filters`` (the lookup constraints and relations use)."""
        return self.collection(collection).where(filters).fetch()

    def find_containing(self, collection: str, field: str, value: Any) -> list[dict[str, Any]]:
        """Alive records of ``collection`` whose array ``field`` holds ``value`` (through the element index
        the store keeps for arrays of ids, see `rows.lookup_array_fields`)."""
        return self.collection(collection).containing(field, value)

    @contextmanager
    def batch(self) -> Iterator[App]:
        """Group many writes into one transaction: all are committed (durably) together, or none.

        Each write is still its own operation; events and subscriptions fire once the batch commits.
        """
        self._check_open()
        with self.db.lock:
            if self._batch is not None:
                yield self  # nested: the outer batch commits
                return
            batch = _Batch()
            seq_before = self._seq
            self._batch = batch
            try:
                with self.db.transaction():
                    yield self
            except BaseException:
                self._seq = seq_before
                raise
            finally:
                self._batch = None
            self._dirty.update(batch.staged)
            if len(self._dirty) >= _MAX_DIRTY:
                self.flush()
        self._after_commit([op for op, _ in batch.results], batch.traces, started=None)
        if batch.violations:
            self._emit_violations(batch.violations, [op for op, _ in batch.results])
        for ordered, traces, started in batch.applied:
            self._after_commit(ordered, traces, started=started)

    def _persist_many(self, states: Mapping[tuple[str, str], Unflushed]) -> None:
        row_of = self.row_of
        self._write_records([(c, r, state, row_of(c, r, state)) for (c, r), state in states.items()])

    def _write_records(self, items: Sequence[tuple[str, str, Unflushed | str, list[Any] | None]]) -> None:
        """Store the merge state (or its text) and the row (None: delete it) of each record, a statement per
        table."""
        conn = self.db.conn
        self.db.save_states(
            [(c, r, state if isinstance(state, str) else _stored_state(state)) for c, r, state, _ in items]
        )
        upserts: dict[str, list[list[Any]]] = {}
        deletes: dict[str, list[tuple[str]]] = {}
        for collection, record_id, _, row in items:
            if row is None:
                deletes.setdefault(collection, []).append((record_id,))
            else:
                upserts.setdefault(collection, []).append(row)
        for collection, rows in upserts.items():
            write_rows(conn, self.codecs[collection].upsert_head, rows)
        for collection, ids in deletes.items():
            conn.executemany(self.codecs[collection].delete_sql, ids)

    def commit_local(
        self,
        writes: list[Write],
        violations: list[Violation] | None = None,
        *,
        fresh: bool = False,
        loaded: dict[tuple[str, str], RecordState] | None = None,
    ) -> list[tuple[Operation, dict[str, Any] | None]]:
        """Turn planned writes into operations and store them in one transaction.

        ``loaded``: states of written records the caller just read from the database (`Database.load_state`,
        under the lock it still holds, unchanged since): the writes fold into them instead of reading them
        again (a rich text state is the size of its document)."""
        self._check_open()
        results: list[tuple[Operation, dict[str, Any] | None]] = []
        traces: list[tuple[Operation, Conflict]] = []
        with self.db.lock:
            seq_before = self._seq
            batch = self._batch
            staged: dict[tuple[str, str], Unflushed] = batch.staged if batch is not None else {}
            # A single write that reads nothing from the database (a just-generated record, or one whose
            # state is in memory) is one INSERT: SQLite commits it as its own transaction, as durably.
            direct = (
                len(writes) == 1
                and not self.db.in_transaction
                and (fresh or (writes[0].collection, writes[0].record_id) in self._dirty)
            )
            try:
                if direct:
                    self.db.insert_operations(
                        self._plan_writes(writes, staged, fresh, results, traces, loaded)
                    )
                else:
                    with self.db.transaction():
                        rows = self._plan_writes(writes, staged, fresh, results, traces, loaded)
                        self.db.insert_operations(rows)
            except OfflineError:
                self._seq = seq_before
                raise
            except Exception as exc:
                self._seq = seq_before
                raise storage_error("a local write failed and was rolled back", exc) from exc
            except BaseException:
                # KeyboardInterrupt, or a panic from a native extension: the transaction rolled back, so
                # its sequence numbers must be reused or the log would have a gap.
                self._seq = seq_before
                raise
            if batch is not None:
                # Inside app.batch(): nothing is visible or announced until the batch commits.
                batch.results.extend(results)
                batch.unflushed.update((w.collection, w.record_id) for w in writes)
                batch.traces.extend(traces)
                batch.violations.extend(violations or ())
                return results
            self._dirty.update(staged)
            if len(self._dirty) >= _MAX_DIRTY:
                self.flush()
        self._after_commit([op for op, _ in results], traces, started=None)
        if violations:
            self._emit_violations(violations, [op for op, _ in results])
        return results

    def _plan_writes(
        self,
        writes: list[Write],
        staged: dict[tuple[str, str], Unflushed],
        fresh: bool,
        results: list[tuple[Operation, dict[str, Any] | None]],
        traces: list[tuple[Operation, Conflict]],
        loaded: dict[tuple[str, str], RecordState] | None = None,
    ) -> list[tuple[Any, ...]]:
        """Create the operations of ``writes``, fold them into their (staged) states; return their log rows."""
        rows = []
        engine = self.engine
        cached_rows = self._rows
        for write in writes:
            key = (write.collection, write.record_id)
            staged_state = staged.get(key)
            new = False  # a state holding nothing yet
            if staged_state is not None:
                state = staged[key] = self._decoded(*key, staged_state)
            else:
                # ``fresh``: the first write creates a record under a just-generated id.
                if fresh and write is writes[0]:
                    state, new = RecordState(), True
                else:
                    dirty = self._dirty.get(key)
                    # Work on a copy of a cached state (if the transaction fails, the cache must not hold its
                    # effects); one read from the database, or a refold, is a private copy already.
                    if isinstance(dirty, RecordState):
                        state = dirty.copy()
                    elif dirty is not None:
                        state = self._decoded(*key, dirty)
                    elif loaded is not None and key in loaded:
                        state = loaded.pop(key)  # read by the caller: a private copy already
                    else:
                        loaded_state = self.db.load_state(*key)
                        state, new = (RecordState(), True) if loaded_state is None else (loaded_state, False)
                staged[key] = state
            self._seq += 1
            op, wire = _local_operation(
                self.node_id,
                write.type,
                write.collection,
                write.record_id,
                write.data,
                write.previous_data,
                self.clock.now(),
                self._seq,
                [] if new else state.heads(),
                self.schema.version,
                {self.node_id: 1} if new else state.next_context(self.node_id),
            )
            cached_rows.pop(key, None)
            for conflict in engine.apply(state, op):
                traces.append((op, conflict))
            record = engine.materialize(write.collection, write.record_id, state)
            row = self._row(write.collection, state, record)
            if new and op.type == "insert":
                staged[key] = op  # the state it makes of nothing (`Unflushed`)
                cached_rows[key] = (op, row)
            else:
                cached_rows[key] = (state, row)
            results.append((op, record))
            rows.append(
                (
                    op.id,
                    op.node_id,
                    op.sequence_number,
                    op.collection,
                    op.record_id,
                    serialize_timestamp(op.timestamp),
                    stored_text(op.id, op.node_id, wire),
                    1,
                    PENDING,
                    None,
                )
            )
        return rows

    def _emit_violations(self, violations: list[Violation], ops: list[Operation]) -> None:
        """Tier 2 traces: the winning write (B) against the latest operation of each losing record (A)."""
        if not (
            self.events.has_listeners("constraint:violated") or self.events.has_listeners("merge:conflict")
        ):
            return
        committed = {op.id for op in ops}
        for violation in violations:
            # B: the write that won, i.e. this commit's operation on the record that was judged.
            winner = next(
                (
                    o
                    for o in ops
                    if o.collection == violation.collection and o.record_id == violation.record_id
                ),
                ops[0],
            )
            for loser_id in violation.losers or [violation.record_id]:
                self.flush()
                state = self.db.load_state(violation.collection, loser_id)
                # A: the loser's own latest write of the constrained fields, from before this commit (the
                # eviction written now is the resolution, not an input).
                earlier = [
                    o
                    for o in (self.db.record_operations(violation.collection, loser_id) if state else ())
                    if o.id not in committed and any(f in (o.data or {}) for f in violation.fields)
                ]
                latest = max(
                    earlier,
                    key=lambda o: (o.timestamp.wall_time, o.timestamp.logical, o.timestamp.node_id, o.id),
                    default=None,
                )
                other = latest if latest is not None else winner
                strategy = (
                    "unique-constraint" if violation.type == "unique" else f"{violation.type}-constraint"
                )
                trace = MergeTrace(
                    operation_a=other,
                    operation_b=winner,
                    field=",".join(violation.fields),
                    strategy=strategy,
                    input_a={f: (dict(other.data or {})).get(f) for f in violation.fields},
                    input_b={f: (dict(winner.data or {})).get(f) for f in violation.fields},
                    base=None,
                    output=violation.output,
                    tier=2,
                    constraint_violated=violation.constraint,
                )
                self.events.emit("constraint:violated", constraint=violation.constraint, trace=trace)
                self.events.emit("merge:conflict", trace=trace)

    # -- remote operations ------------------------------------------------------------------------------------

    def apply(
        self,
        operations: Iterable[Operation | Mapping[str, Any]],
        *,
        delivery: int | None = None,
        watermark: int | None = None,
        verified: bool = False,
    ) -> breaches.Applied:
        """Merge remote operations (Operation objects or wire dicts). Idempotent; returns those newly applied,
        a list whose ``violations`` name the cross-record rules the records they touched now break (nothing
        resolves those without a server; see `offline.store.breaches`), each also a ``constraint:violated``
        event.

        Operations whose id does not match their content or for an unknown collection are refused with
        OfflineError and nothing of the batch is stored. One stamped ahead of this device's clock moves the
        clock forward (the drift limit is the server's).
        ``verified=True`` skips recomputing the ids: the caller vouches that it checked every one of them
        (``protocol.decode_operation`` does).
        """
        self._check_open()
        started = time.perf_counter()
        incoming: list[Operation] = []
        for item in operations:
            if isinstance(item, Operation):
                op = item
                checked = verified or verify_operation(op)
            else:
                op = Operation.from_wire(dict(item), verify=not verified)
                checked = True
            if not checked:
                raise OfflineError(
                    f"operation {op.id} does not match its content hash",
                    INVALID_OPERATION,
                    {"field": "id", "reason": "HASH_MISMATCH", "operationId": op.id},
                )
            incoming.append(op)
        applied = self.apply_verified(incoming, None, delivery=delivery, watermark=watermark, started=started)
        return breaches.report(self, applied)

    def apply_verified(
        self,
        incoming: list[Operation],
        wires: list[str] | None,
        *,
        delivery: int | None = None,
        watermark: int | None = None,
        started: float | None = None,
    ) -> list[Operation]:
        """`apply()` of operations whose ids were verified; ``wires`` (parallel, optional) are their compact
        wire JSON texts, stored as they are instead of encoding each operation again (the sync engine has
        them from decoding). The whole batch is one transaction: each record is loaded, folded and written
        once, however many of the operations it receives."""
        self._check_open()
        if started is None:
            started = time.perf_counter()
        for op in incoming:
            if op.collection not in self.codecs:
                raise OfflineError(
                    f"operation {op.id} is for unknown collection {op.collection!r}",
                    INVALID_OPERATION,
                    {"field": "collection", "collection": op.collection, "operationId": op.id},
                )
        if not incoming:
            if watermark is not None:
                with self.db.lock, self.db.transaction():
                    if watermark > int(self.db.get_meta("delivery_watermark") or 0):
                        self.db.set_meta("delivery_watermark", str(watermark))
            return []
        events = self.events
        # Conflicts only become traces for these listeners; without them the fold skips detecting them.
        want_traces = (
            events.has_listeners("merge:conflict")
            or events.has_listeners("merge:completed")
            or events.has_listeners("merge:started")
        )
        traces: list[tuple[Operation, Conflict]] = []
        self.flush()
        with self.db.lock, self.db.transaction():
            # Duplicates: the same id at the same (node, sequence number); the same place held by another
            # id, or taken twice in this batch, is a forgery and refuses the whole batch.
            held = self.db.held_ids(incoming)
            # A compacted record's repeats are no longer in the log: its per-node numbers tell them.
            dropped = compaction.repeats(
                self, [op for op in incoming if (op.node_id, op.sequence_number) not in held]
            )
            fresh: dict[str, Operation] = {}
            taken: dict[tuple[str, int], str] = {}
            wire_of: dict[str, str] = {}
            forged: Operation | None = None
            for index, op in enumerate(incoming):
                place = (op.node_id, op.sequence_number)
                have = held.get(place) or taken.get(place)
                if have is not None:
                    if have != op.id and forged is None:
                        forged = op
                    continue
                if op.id in fresh or op.id in dropped:
                    continue  # the same operation again, under another place (a misbehaving peer)
                taken[place] = op.id
                fresh[op.id] = op
                if wires is not None:
                    wire_of[op.id] = wires[index]
            if forged is not None:
                raise OfflineError(
                    f"operation {forged.id} reuses sequence number {forged.sequence_number} of node "
                    f"{forged.node_id} with different content",
                    INVALID_OPERATION,
                    {"field": "sequenceNumber", "operationId": forged.id},
                )
            if watermark is not None:
                # The server's delivery sequence of this batch, committed with its operations, so a restart
                # resumes exactly after what was applied.
                current = int(self.db.get_meta("delivery_watermark") or 0)
                if watermark > current:
                    self.db.set_meta("delivery_watermark", str(watermark))
            # Held under another place (a peer re-sending an operation with a new sequence number). One with
            # a causal context is recognised by its number in its record's state, whatever its place
            # (`RecordState.holds`; a compacted record's base keeps the clock), so the log is searched by id
            # only for operations without one (a state recognises a bounded window of those) and for this
            # node's own: a refused operation is in the log and out of its record's state, and only this
            # node's are refused here (the server refuses what this replica sent).
            node_id = self.node_id
            unplaced = [op for op in fresh.values() if op.causal_context is None or op.node_id == node_id]
            if unplaced:
                for op_id in self.db.held_in_records(unplaced):
                    del fresh[op_id]
            if not fresh:
                return []
            ordered = topological_sort(fresh.values())
            # Receiving the latest timestamp of the batch leaves the clock after every one of them, as
            # receiving each in turn would.
            self._receive(max(ordered, key=_timestamp_key).timestamp)
            keys = list(dict.fromkeys((op.collection, op.record_id) for op in ordered))
            staged = self._batch.staged if self._batch is not None else {}
            texts = self.db.load_state_texts(keys, refold=False)
            # States stored as a reference to their insert: the update that usually follows folds on it.
            references = {
                key: text[1:]
                for key, text in texts.items()
                if type(text) is str and text[:1] == STATE_REFERENCE
            }
            inserts = self.db.referenced_operations(references) if references else {}
            # A record receiving a single operation (the usual case: a new record's insert, or an update) is
            # folded on its stored state text when the engine covers it (apply_to_text, the same result);
            # every other record decodes its state.
            single: dict[tuple[str, str], Operation | None] = {}
            for op in ordered:
                key = (op.collection, op.record_id)
                single[key] = op if key not in single else None
            # (state text, row) of the records folded on their text: kept small, nothing of the parsed state
            # outlives its fold (a batch's worth of live containers would otherwise reach the oldest
            # garbage collector generation and make it walk every object of the process).
            folded: dict[tuple[str, str], tuple[str, list[Any] | None]] = {}
            states: dict[tuple[str, str], RecordState] = {}
            # An id its record's state already holds is a duplicate held under another sequence number
            # (only a misbehaving peer resends an operation so): keep one copy.
            repeated: set[str] = set()
            apply_to_text = self.engine.apply_to_text
            insert_fold = self.engine.insert_fold
            apply_to_insert = self.engine.apply_to_insert
            from_json = RecordState.from_json
            for key in keys:
                text = texts.get(key)
                single_op = single[key]
                if single_op is not None and not want_traces and key not in staged:
                    if text is None:
                        # A new record's insert: its state is stored as a reference to the operation
                        # (automatic compaction leaves a record's one operation in the log).
                        outcome = insert_fold(single_op, key[1], encode=False)
                        if outcome is not None:
                            folded[key] = (STATE_REFERENCE + single_op.id, self._text_row(key[0], outcome))
                            continue
                    else:
                        insert = inserts.get(key)
                        outcome = (
                            apply_to_text(single_op, text, key[1])
                            if insert is None
                            else apply_to_insert(single_op, insert, key[1])
                        )
                        if outcome is REPEATED:
                            repeated.add(single_op.id)
                            continue
                        if outcome is not None:
                            folded[key] = (outcome.text, self._text_row(key[0], outcome))
                            continue
                if key in inserts:
                    states[key] = self._refold_one(*key, inserts[key])
                elif text is not None:
                    states[key] = from_json(text)
            repeated.update(
                op.id
                for op in ordered
                if (state := states.get((op.collection, op.record_id))) is not None and state.holds(op)
            )
            if repeated:
                ordered = [op for op in ordered if op.id not in repeated]
                if not ordered:
                    return []
                keys = list(dict.fromkeys((op.collection, op.record_id) for op in ordered))
            engine_apply = self.engine.apply
            for op in ordered:
                key = (op.collection, op.record_id)
                if key in folded:
                    continue
                state = states.get(key)
                if state is None:
                    state = states[key] = RecordState()
                for conflict in engine_apply(state, op, want_conflicts=want_traces):
                    traces.append((op, conflict))
            materialize = self.engine.materialize
            items: list[tuple[str, str, RecordState | str, list[Any] | None]] = []
            for collection, record_id in keys:
                done = folded.get((collection, record_id))
                if done is not None:
                    items.append((collection, record_id, *done))
                    continue
                state = states[(collection, record_id)]
                row = self._row(collection, state, materialize(collection, record_id, state))
                items.append((collection, record_id, state, row))
                if (collection, record_id) in staged:
                    # Inside app.batch(): the batch's copy is written again at commit; keep it current.
                    staged[(collection, record_id)] = state
            self._write_records(items)
            op_row = self.db.op_row
            rows = [
                op_row(
                    op,
                    local=op.node_id == node_id,
                    status=ACKED,
                    delivery=delivery,
                    text=None if wires is None else wire_of[op.id],
                )
                for op in ordered
            ]
            self.db.insert_operations(rows)
            vector: dict[str, int] = {}
            for op in ordered:
                vector[op.node_id] = max(vector.get(op.node_id, -1), op.sequence_number)
            self.db.advance_vector(vector)
            self._seq = max(self._seq, vector.get(self.node_id, self._seq))
            if self._batch is not None:
                # Inside app.batch(): announced when the batch commits (it may still roll back).
                self._batch.applied.append((ordered, traces, started))
                return ordered
        self._after_commit(ordered, traces, started=started)
        # A new record's first operation supersedes nothing (automatic compaction keeps it): not counted.
        self._grew(len(ordered) - sum(1 for key in keys if texts.get(key) is None))
        return ordered

    # -- after a commit -------------------------------------------------------------------------------------------

    def _trace(self, op: Operation, conflict: Conflict) -> MergeTrace | None:
        other_id = conflict.earlier_op if conflict.later_op == op.id else conflict.later_op
        other = self.db.load_operation(other_id, (op.collection, op.record_id))
        if other is None:
            return None
        a, b = (other, op) if conflict.earlier_op == other_id else (op, other)
        return MergeTrace(
            operation_a=a,
            operation_b=b,
            field=conflict.field,
            strategy=conflict.strategy,
            input_a=conflict.input_a,
            input_b=conflict.input_b,
            base=conflict.base,
            output=conflict.output,
            tier=conflict.tier,  # type: ignore[arg-type]
            duration=conflict.duration,
            fallback=conflict.fallback,
        )

    def _after_commit(
        self, ops: list[Operation], conflicts: list[tuple[Operation, Conflict]], *, started: float | None
    ) -> None:
        events = self.events
        remote = started is not None
        if not remote and ops:
            for listener in list(self.commit_listeners):
                listener(ops)
        for op in ops:
            if not remote and events.has_listeners("operation:created"):
                events.emit("operation:created", operation=op)
        if conflicts and (
            events.has_listeners("merge:conflict")
            or events.has_listeners("merge:completed")
            or events.has_listeners("merge:started")
        ):
            for op, conflict in conflicts:
                trace = self._trace(op, conflict)
                if trace is None:
                    continue
                events.emit("merge:started", operationA=trace.operation_a, operationB=trace.operation_b)
                events.emit("merge:conflict", trace=trace)
                events.emit("merge:completed", trace=trace)
        if events.has_listeners("operation:applied"):
            duration = (time.perf_counter() - started) * 1000 if started is not None else 0.0
            for op in ops:
                events.emit("operation:applied", operation=op, duration=duration)
        touched = {op.collection for op in ops}
        if self.subscriptions.watching(touched):
            self.flush()
            self.subscriptions.notify(touched, ops[-1] if ops else None, record_ids=records_of(ops))

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise OfflineError("this app is closed", "STORAGE_ERROR", {"path": self.path})

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        self.subscriptions.clear()
        self.db.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _timestamp_key(op: Operation) -> tuple[int, int, str]:
    ts = op.timestamp
    return (ts.wall_time, ts.logical, ts.node_id)


def _stored_state(state: Unflushed) -> str:
    """What `_offline_state` holds for ``state``: a reference to its operation when it has only one (see
    `STATE_REFERENCE`; an insert kept for its flush, `Unflushed`, is that one), else its text."""
    if isinstance(state, Operation):
        return STATE_REFERENCE + state.id
    single = state.single_operation()
    if single is not None:
        return STATE_REFERENCE + single
    return state.to_json()


def _local_operation(
    node_id: str,
    type_: str,
    collection: str,
    record_id: str,
    data: Mapping[str, Any] | None,
    previous: Mapping[str, Any] | None,
    timestamp: HLCTimestamp,
    sequence_number: int,
    causal_deps: list[str],
    schema_version: int,
    causal_context: Mapping[str, int] | None = None,
) -> tuple[Operation, str]:
    """``create_operation`` of a local write, and the operation's wire text (``compact_json(op.to_wire())``).

    The store supplies the node, collection, clock reading, sequence number, causal deps and schema version
    itself, so only what comes from the caller is validated (the record id, ``data`` and ``previousData``),
    with the same checks, in the same order and with the same errors as ``create_operation``.
    """
    well_formed = (
        (type_ == "insert" and data is not None)
        or (type_ == "update" and data is not None and previous is not None)
        or (type_ == "delete" and data is None)
    )
    if not well_formed:  # create_operation reports the problem
        op = create_operation(
            {
                "node_id": node_id,
                "type": type_,
                "collection": collection,
                "record_id": record_id,
                "data": data,
                "previous_data": previous,
                "timestamp": timestamp,
                "sequence_number": sequence_number,
                "causal_deps": causal_deps,
                "schema_version": schema_version,
                "causal_context": causal_context,
            }
        )
        return op, compact_json(op.to_wire())
    _check_str("collection", collection)
    _check_str("recordId", record_id)
    frozen, hashed = (None, None) if data is None else _check_record("data", data)
    frozen_previous, hashed_previous = (
        (None, None) if previous is None else _check_record("previousData", previous)
    )
    # One plain copy of the context (the caller's may change later): hashed, frozen and written from it.
    plain_context = None if causal_context is None else dict(causal_context)
    # The operation adopts it: the id and the wire text below only read it, and nothing else holds it.
    context: FrozenDict[str, int] | None = None if plain_context is None else adopt(plain_context)
    op_id = _content_id(type_, collection, record_id, hashed, timestamp, node_id, plain_context)
    deps = tuple(causal_deps)
    # Every field is checked and frozen already: what the dataclass __init__ and __post_init__ would store.
    op = _new_operation(Operation)
    op.__dict__.update(
        id=op_id,
        node_id=node_id,
        type=type_,
        collection=collection,
        record_id=record_id,
        data=frozen,
        previous_data=frozen_previous,
        timestamp=timestamp,
        sequence_number=sequence_number,
        causal_deps=deps,
        schema_version=schema_version,
        causal_context=context,
    )
    # The same dict, in the same key order, as op.to_wire() (the hashed forms are encode_value's output).
    wire = {
        "id": op_id,
        "nodeId": node_id,
        "type": type_,
        "collection": collection,
        "recordId": record_id,
        "data": hashed,
        "previousData": hashed_previous,
        "timestamp": {
            "wallTime": timestamp.wall_time,
            "logical": timestamp.logical,
            "nodeId": timestamp.node_id,
        },
        "sequenceNumber": sequence_number,
        "causalDeps": list(deps),
        "schemaVersion": schema_version,
    }
    if plain_context is not None:
        wire["causalContext"] = plain_context
    # The rest of the wire is str, int and lists and dicts of them: only the data can hold a float.
    if is_floatless(hashed) and is_floatless(hashed_previous):
        return op, floatless_json(wire)
    return op, compact_json(wire)


def create_app(
    schema: SchemaDefinition,
    sync: Mapping[str, Any] | None = None,
    path: str = "app.db",
    *,
    durability: str = "normal",
    now: Callable[[], int] | None = None,
    compact_after: int | None = compaction.DEFAULT_COMPACT_AFTER,
) -> App:
    """Open (or create) the local database at ``path`` for ``schema``; needs no running event loop.

    ``compact_after``: compact the local log (`App.compact`) once that many operations became droppable
    (acknowledged by the server, or received) since the app opened or last compacted; None: only when
    ``app.compact()`` is called.
    """
    return App(schema, path=path, sync=sync, durability=durability, now=now, compact_after=compact_after)


__all__ = ["ACKED", "PENDING", "REJECTED", "App", "Write", "create_app"]
