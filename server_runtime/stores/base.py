"""The server store interface: the persistence behind the server's sync core (DESIGN.md sections 1, 4).

The sync core keeps records in memory and serialises every write; a store makes them durable. All writes go
through ``store.writer()``, which holds the store's exclusive write lock for its whole duration (across
processes, for PostgreSQL) and commits everything it did atomically at exit, or nothing if the block raises.
Because writers are serialised, the delivery sequences stamped on operations increase in commit order: a
reader that has seen delivery N never later finds a newly committed operation below N, so clients can resume
from the highest delivery sequence they applied.

A writer asked for with ``optimistic=True`` may take the lock only when it first reads or commits (the SQLite
store, owned by one process, then stores a group of new operations in one trip to its database thread). Should
another process have written meanwhile, nothing is written and ``WriteConflict`` is raised: the caller, which
made its decisions on what it knew before, decides again with a new writer.

Store-level reads (``operations_since``, ``load_rows``, ...) take no lock and see only committed data.
Inside a writer, use the writer's own methods: they also see what the writer has done so far. Taking a
second writer (or calling ``store.set_meta``) while holding one deadlocks; the write lock is not reentrant.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

from offline.core.errors import STORAGE_ERROR, OfflineError
from offline.core.operations import Operation, operation_from_text
from offline.core.schema import SchemaDefinition
from offline.merge.engine import MergeEngine, RecordState

if TYPE_CHECKING:
    from ..auth.storage import AuthStore

__all__ = [
    "MOVED_FROM",
    "NotifyCallback",
    "OperationText",
    "RecordKey",
    "RecordRow",
    "ScopeSelector",
    "ScopedPage",
    "ServerStore",
    "StoreKind",
    "StoreWriter",
    "StoredOperation",
    "WriteConflict",
]

StoreKind = Literal["memory", "sqlite", "postgresql"]
#: (collection, record id)
RecordKey = tuple[str, str]
#: Called with the highest delivery sequence another process committed; may be a coroutine function.
NotifyCallback = Callable[[int], Awaitable[None] | None]

#: Key of a scope snapshot holding the record's scope values before the operation that moved it (no field name
#: starts with ``$``).
MOVED_FROM: Final = "$from"

#: Meta key under which ``set_schema`` records the schema version it was last given.
SCHEMA_VERSION_KEY = "schema_version"

#: Meta key of the highest delivery compaction deleted up to (see ``server_runtime.stores.compaction``).
COMPACTION_HORIZON_KEY: Final = "compaction_horizon"


@dataclass(frozen=True)
class StoredOperation:
    """An operation as stored: its delivery sequence (commit order) and its scope snapshot.

    ``scope`` holds the record's scope-relevant field values when the operation was stored (JSON), used to
    decide which clients may receive it; None when the operation is visible to everyone. An operation that
    moved the record from one scope to another also holds the values before it under ``"$from"`` (no field
    name starts with ``$``), so the relay can tell both sides (see ``SyncService.relay``).
    """

    delivery: int
    operation: Operation
    scope: dict[str, Any] | None


#: An operation as stored, undecoded: ``(delivery, node id, collection, record id, scope JSON or None, wire
#: JSON)``. The relay sends the wire text as it is.
OperationText = tuple[int, str, str, str, str | None, str]


@dataclass(frozen=True, slots=True)
class ScopeSelector:
    """Operations of one collection a session may be shown: all of them (``field`` None), or those whose scope
    snapshot holds ``value`` under ``field``, after the operation or (``MOVED_FROM``) before it.

    A session's record filter ``{field: value, ...}`` sees a subset of what one of its fields selects, so a
    catch-up reads the operations of that one field's value through the stores' scope index, and the relay
    judges each of those few exactly as before (``Session.matches``). Values compare as Python compares them
    (``1 == 1.0 == True``); ``value`` None selects nothing more narrowly than the whole collection.
    """

    collection: str
    field: str | None = None
    value: Any = None


@dataclass(frozen=True, slots=True)
class ScopedPage:
    """One page of a scoped catch-up (``ServerStore.operations_in_scope``).

    ``operations``: every operation after the page's start, up to and including delivery ``through``, that
    a selector selects, ascending, each once (a superset of what the session is shown, never less).
    ``complete``: ``through`` was the highest committed delivery when the page was read.
    """

    operations: list[OperationText]
    through: int
    complete: bool


def scope_index_entries(scope: Mapping[str, Any] | None) -> set[tuple[str, str]]:
    """``(field, value key)`` pairs under which an operation with this scope snapshot is found by a
    `ScopeSelector` with a value: its values after it and, when it moved its record, before it."""
    if not scope:
        return set()
    out = {(f, key) for f, v in scope.items() if f != MOVED_FROM and (key := scope_value_key(v)) is not None}
    moved = scope.get(MOVED_FROM)
    if isinstance(moved, Mapping):
        out.update((f, key) for f, v in moved.items() if (key := scope_value_key(v)) is not None)
    return out


def scope_value_key(value: Any) -> str | None:
    """The text a scope value is indexed under: values Python finds equal share a key (``1``, ``1.0`` and
    ``True``), different strings and numbers do not. None is not indexed (a selector of None reads the whole
    collection); other values (lists, objects, bytes) share one key, and the relay's exact check sorts them.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return "s:" + value
    if isinstance(value, bool | int):
        return f"n:{int(value)}"
    if isinstance(value, float):
        if value.is_integer():
            return f"n:{int(value)}"
        return f"n:{value!r}"
    return "*"


def scoped_statements(
    after: int, limit: int, selectors: Sequence[ScopeSelector], *, collection_sql: str, value_sql: str
) -> list[tuple[str, tuple[Any, ...]]]:
    """The query of each selector in a catch-up page, in a store's own SQL: ``collection_sql`` takes
    (collection, after, limit) for a collection seen whole, ``value_sql`` (collection, field, value key,
    after, limit) for one scope value."""
    out: list[tuple[str, tuple[Any, ...]]] = []
    for selector in selectors:
        key = None if selector.field is None else scope_value_key(selector.value)
        if key is None:
            out.append((collection_sql, (selector.collection, int(after), limit)))
        else:
            out.append((value_sql, (selector.collection, selector.field, key, int(after), limit)))
    return out


def merge_selected(pages: Sequence[Sequence[OperationText]], limit: int, top: int) -> ScopedPage:
    """One `ScopedPage` from the pages of each selector (each ascending, at most ``limit`` long, read with
    deliveries up to ``top``, the highest committed one when reading began).

    A selector whose page is full may have more after its last delivery: the merged page goes only that far.
    """
    through = top
    for page in pages:
        if limit > 0 and len(page) >= limit:
            through = min(through, page[-1][0])
    seen: dict[int, OperationText] = {}
    for page in pages:
        for row in page:
            if row[0] <= through:
                seen.setdefault(row[0], row)
    return ScopedPage([seen[d] for d in sorted(seen)], through, through >= top)


# A state text that is this prefix and an operation's wire JSON: the state that operation makes of a record
# with none (a record just inserted, the usual case), a function of the operation alone (DESIGN.md section
# 3). The sync core writes it for a record's first operation: the operation's text is at hand, where
# encoding the state was a sizeable part of storing an insert. A state's JSON text never starts with it.
ONE_OPERATION: Final = "@"


def state_from_text(
    text: str,
    refold: Callable[[Operation], RecordState] | None,
    collection: str,
    record_id: str,
    missing: str,
) -> RecordState:
    """The state a stored state text stands for: its JSON, or (`ONE_OPERATION`) what ``refold`` makes of its
    operation; without ``refold``, such a text is a STORAGE_ERROR saying what is ``missing``."""
    if text[:1] != ONE_OPERATION:
        return RecordState.from_json(text)
    if refold is None:
        raise OfflineError(
            f"a record state stored as its one operation needs {missing} to be read",
            STORAGE_ERROR,
            {"collection": collection, "recordId": record_id},
        )
    return refold(operation_from_text(text[1:]))


@dataclass(frozen=True)
class RecordRow:
    """One record's merge state and materialised value (``record`` None: deleted / not alive)."""

    collection: str
    record_id: str
    state: RecordState
    record: dict[str, Any] | None
    # ``state``'s JSON text when it is already known (as stored, or encoded once for both the store and the
    # server's cache); None: encode ``state``. Whoever sets it must not change ``state`` afterwards.
    state_text: str | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> RecordKey:
        return (self.collection, self.record_id)

    def state_json(self) -> str:
        """``state`` as JSON text (`RecordState.to_json`), encoded only when not already known."""
        text = self.state_text
        return self.state.to_json() if text is None else text


class StoredRecordRow(RecordRow):
    """A `RecordRow` read back from a store: its state is parsed from the stored text only when first used,
    and so is its record when it was made by `unread`.

    The server's cache keeps states as text (`RecordCache`), so loading every record at startup, or the rows
    of a catch-up, never needs the parsed state, which was most of the time a restart took. A state-based
    catch-up of a session seeing the whole log (a snapshot's build) reads neither: only the state texts.
    """

    @classmethod
    def unread(
        cls,
        collection: str,
        record_id: str,
        state_text: str,
        record_text: str | None,
        read_record: Callable[[str | None], dict[str, Any] | None],
        refold: Callable[[Operation], RecordState] | None = None,
    ) -> StoredRecordRow:
        """A row whose record is ``read_record(record_text)``, called when the record is first used."""
        row = cls.__new__(cls)
        setattr_ = object.__setattr__  # frozen
        setattr_(row, "collection", collection)
        setattr_(row, "record_id", record_id)
        setattr_(row, "state_text", state_text)
        setattr_(row, "_refold", refold)
        setattr_(row, "_unread_record", (record_text, read_record))
        return row

    def __init__(
        self,
        collection: str,
        record_id: str,
        state_text: str,
        record: dict[str, Any] | None,
        refold: Callable[[Operation], RecordState] | None = None,
    ) -> None:
        setattr_ = object.__setattr__  # frozen
        setattr_(self, "collection", collection)
        setattr_(self, "record_id", record_id)
        setattr_(self, "record", record)
        setattr_(self, "state_text", state_text)
        setattr_(self, "_refold", refold)  # reads a `ONE_OPERATION` text

    def __eq__(self, other: object) -> bool:
        # As a RecordRow compares (the same fields), with either class on either side.
        if not isinstance(other, RecordRow):
            return NotImplemented
        return (self.collection, self.record_id, self.state, self.record) == (
            other.collection,
            other.record_id,
            other.state,
            other.record,
        )

    __hash__ = None  # type: ignore[assignment]  # as RecordRow's: a state is not hashable

    def __getattr__(self, name: str) -> Any:
        # Reached only while the instance has no such attribute: "state" before its first use, "record"
        # before the first use of one made by `unread`.
        if name == "record" and "_unread_record" in self.__dict__:
            text, read = self.__dict__["_unread_record"]
            record = read(text)
            object.__setattr__(self, "record", record)
            del self.__dict__["_unread_record"]
            return record
        if name != "state":
            raise AttributeError(name)
        text = self.state_text
        assert text is not None  # set by __init__
        state = state_from_text(
            text, self.__dict__["_refold"], self.collection, self.record_id, "the schema (set_schema)"
        )
        object.__setattr__(self, "state", state)
        return state


class WriteConflict(Exception):
    """An optimistic writer found that another process wrote to the store since what it knew: nothing of
    it was written. Decide again with a new writer (which reads what the other process wrote)."""


class StoreWriter(abc.ABC):
    """The handle ``ServerStore.writer()`` yields; valid only inside its ``async with`` block.

    Its reads see the committed data plus everything this writer did so far.
    """

    @abc.abstractmethod
    async def operations_since(self, after: int, limit: int | None = None) -> list[StoredOperation]:
        """Operations with delivery > ``after``, ascending, at most ``limit`` of them."""

    @abc.abstractmethod
    async def known_ids(self, ids: Iterable[str]) -> set[str]:
        """The subset of ``ids`` that are stored operation ids."""

    async def known_operations(self, ops: Iterable[Operation]) -> set[str]:
        """``known_ids`` of these operations' ids. A store may answer some without a lookup (the SQLite
        store's optimistic writer takes an operation above its node's highest stored sequence number for new,
        and has its commit refused by the id's unique index if a peer resent a stored one under it)."""
        return await self.known_ids(op.id for op in ops)

    @abc.abstractmethod
    async def load_rows(self, keys: Iterable[RecordKey]) -> dict[RecordKey, RecordRow]:
        """The stored rows of ``keys`` (keys without a row are absent from the result)."""

    @abc.abstractmethod
    async def held_places(self, places: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """The ids of the stored operations at these (node id, sequence number) places (free ones absent).
        A node never numbers two operations alike: clients refuse a batch that does."""

    @abc.abstractmethod
    async def append(self, ops: Sequence[tuple[Operation, Mapping[str, Any] | None]]) -> list[int | None]:
        """Store ``(operation, scope)`` pairs in order, stamping each new one with the next delivery sequence.

        Returns a list parallel to ``ops``: the delivery sequence of each newly stored operation, None for
        one whose id was already stored (or appeared earlier in ``ops``); skipped ones get no sequence.
        """

    @abc.abstractmethod
    async def save_rows(self, rows: Iterable[RecordRow]) -> None:
        """Insert or replace rows (a later row with the same key wins)."""

    async def compaction_horizon(self) -> int | None:
        """The compaction horizon as this writer's reads see it, or None when the store's own read
        (``ServerStore.compaction_horizon``, on another connection) is as good: the store has no second
        connection to wait for while this writer holds one (PostgreSQL's pool, a shared SQLite connection)."""
        return None

    @abc.abstractmethod
    async def set_meta(self, key: str, value: str) -> None:
        """Set a meta value in this transaction."""


class ServerStore(abc.ABC):
    """Persistence of the server's operations, record states and meta values. See the module docstring."""

    kind: ClassVar[StoreKind]

    def __init__(self) -> None:
        self._closed = False
        self._schema: SchemaDefinition | None = None
        self._engine: MergeEngine | None = None  # `_refold_state`'s, for ``_schema``

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def schema(self) -> SchemaDefinition | None:
        """The schema last given to ``set_schema`` (None before)."""
        return self._schema

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise OfflineError(
                f"the {self.kind} server store is closed", STORAGE_ERROR, {"store": self.kind, "closed": True}
            )

    async def set_schema(self, schema: SchemaDefinition) -> None:
        """Create the tables if needed (idempotent), remember ``schema`` and record its version in meta.

        May be called again later, e.g. with a newer schema version. The tables do not depend on the schema:
        operations, record states and records are stored as JSON.
        """
        self._check_open()
        await self._prepare()
        self._schema = schema
        self._engine = None  # built again for this schema when first needed
        async with self.writer() as writer:
            await writer.set_meta(SCHEMA_VERSION_KEY, str(schema.version))

    def _refold_state(self, op: Operation) -> RecordState:
        """What ``op`` makes of a record with no state: how rows read back a `ONE_OPERATION` state text."""
        engine = self._engine
        if engine is None:
            if self._schema is None:
                raise OfflineError(
                    f"the {self.kind} server store has no schema yet (set_schema)", STORAGE_ERROR, {}
                )
            # No authoritative nodes: the sync core stores this form only for clients' operations, on
            # which its engine (whose own node is authoritative) folds the same.
            engine = self._engine = MergeEngine(self._schema)
        return engine.state_of((op,))

    @abc.abstractmethod
    async def _prepare(self) -> None:
        """Connect (if lazy) and create the tables if they do not exist."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections; idempotent. Every later call raises OfflineError STORAGE_ERROR."""

    # -------------------------------------------------------------------------------------------- writing

    @abc.abstractmethod
    def writer(self, *, optimistic: bool = False) -> AbstractAsyncContextManager[StoreWriter]:
        """``async with store.writer() as w:`` holds the exclusive write lock and commits atomically at exit.

        An exception inside the block rolls everything back and propagates. ``optimistic``: see the module
        docstring (a store may ignore it; the writer may then raise `WriteConflict`).
        """

    async def set_meta(self, key: str, value: str) -> None:
        """Set one meta value (takes the write lock: inside a writer use ``writer.set_meta``)."""
        async with self.writer() as writer:
            await writer.set_meta(key, value)

    def auth_store(self) -> AuthStore:
        """Users, sessions and refresh tokens kept beside this store's data, on its connections (tables
        ``offline_auth_*``, created on first use). One object per store; see ``server_runtime.auth.storage``."""
        cached: AuthStore | None = getattr(self, "_auth_store", None)
        if cached is None:
            from ..auth.storage import auth_store_for

            cached = auth_store_for(self)
            self._auth_store = cached
        return cached

    # -------------------------------------------------------------------------------------------- reading

    @abc.abstractmethod
    async def get_meta(self, key: str) -> str | None:
        """A committed meta value, None when unset."""

    @abc.abstractmethod
    async def operations_since(self, after: int, limit: int | None = None) -> list[StoredOperation]:
        """Committed operations with delivery > ``after``, ascending, at most ``limit`` of them."""

    @abc.abstractmethod
    async def record_operations(self, collection: str, record_id: str, before: int) -> list[StoredOperation]:
        """Every committed operation of one record with delivery < ``before``, ascending: what a client
        needs to build the record when it moves into that client's scope."""

    @abc.abstractmethod
    async def operations_in_scope(
        self, after: int, limit: int, selectors: Sequence[ScopeSelector]
    ) -> ScopedPage:
        """The next page of a catch-up that sees only what ``selectors`` select: operations with delivery >
        ``after``, read through indexes of collections and scope values (at most ``limit`` per selector), so
        its cost follows what the selectors select, not the length of the log. See `ScopedPage`."""

    @abc.abstractmethod
    async def max_delivery(self) -> int:
        """The highest committed delivery sequence, 0 when there is no operation."""

    @abc.abstractmethod
    def load_all_rows(self) -> AsyncIterator[RecordRow]:
        """Every committed row (to warm the server's cache at start), read page by page."""

    @abc.abstractmethod
    async def load_rows(self, keys: Iterable[RecordKey]) -> dict[RecordKey, RecordRow]:
        """The committed rows of ``keys`` (keys without a row are absent from the result)."""

    @abc.abstractmethod
    async def version_vector(self) -> dict[str, int]:
        """The highest stored ``sequence_number`` per node id."""

    @abc.abstractmethod
    async def stats(self) -> dict[str, Any]:
        """``{"kind", "operations", "max_delivery", "records": {collection: alive rows},
        "deleted": {collection: rows whose record is None}}``."""

    @abc.abstractmethod
    def export_operations(self) -> AsyncIterator[StoredOperation]:
        """Every committed operation in delivery order, read page by page (for backups)."""

    # ------------------------------------------------------------------------------------- node registry

    @abc.abstractmethod
    async def claim_node(self, node_id: str, principal: str, *, replacing: str | None = None) -> str:
        """Register ``node_id`` to ``principal`` unless it is registered already (to a principal other than
        ``replacing``, which it is taken from); the principal it is registered to afterwards. Atomic across
        processes sharing the store (insert-if-absent, then read): two claiming at once get the same answer."""

    @abc.abstractmethod
    async def node_principals(self, node_ids: Iterable[str]) -> dict[str, str]:
        """The registered principal of each of ``node_ids`` that is registered (the others are absent)."""

    @abc.abstractmethod
    async def node_scopes(self, node_id: str) -> list[tuple[str, dict[str, Any] | None]]:
        """The distinct (collection, scope snapshot) of the stored operations of ``node_id``: where a node
        that no principal registered yet (a database from before the registry) has written."""

    @abc.abstractmethod
    async def node_registrations(self) -> dict[str, str]:
        """Every registered node id and its principal (for backups)."""

    async def principal_nodes(self, principal: str) -> list[str]:
        """The node ids registered to ``principal``, sorted (a user's devices, for the administrator). The SQL
        stores read them through an index; this default filters every registration."""
        return sorted(node for node, owner in (await self.node_registrations()).items() if owner == principal)

    # ---------------------------------------------------------------------------------------- compaction

    @abc.abstractmethod
    async def compact(self, horizon: int | None = None) -> dict[str, Any]:
        """Delete superseded history: the operations up to delivery ``horizon`` (None: the highest now; kept
        in meta ``compaction_horizon``), all folded into the stored rows already, except each record's latest
        and each node's highest, with their scope index rows; keep each node's and each record's highest
        deleted sequence numbers. Returns ``{"horizon", "dropped", "kept"}``. See
        ``server_runtime.stores.compaction`` for what each kept part serves."""

    @abc.abstractmethod
    async def record_versions(self, keys: Iterable[RecordKey]) -> dict[RecordKey, dict[str, int]]:
        """Per record of ``keys`` that has operations (deleted or kept), each node's highest sequence number
        folded into its row: what a state-based catch-up sends with the state."""

    @abc.abstractmethod
    async def compacted_history(self) -> tuple[dict[RecordKey, dict[str, int]], dict[str, int]]:
        """What compaction recorded of the operations it deleted: per record, each node's highest deleted
        sequence number (``offline_record_versions``), and each node's (``offline_compacted_nodes``). A
        backup carries them with the compacted records' states (``server_runtime.backup``)."""

    @abc.abstractmethod
    async def restore_compaction(
        self,
        rows: Iterable[RecordRow],
        record_versions: Mapping[RecordKey, Mapping[str, int]],
        node_marks: Mapping[str, int],
        horizon: int,
    ) -> None:
        """In one transaction: store ``rows`` (replacing those of their keys), merge ``record_versions`` and
        ``node_marks`` into what compaction recorded, and set the horizon (restoring a backup of a compacted
        store: the rows hold what the deleted operations made)."""

    async def compaction_horizon(self) -> int:
        """The delivery the last compaction deleted up to (0: never compacted)."""
        return int(await self.get_meta(COMPACTION_HORIZON_KEY) or 0)

    # -------------------------------------------------------------------------------------- notifications

    async def other_servers(self) -> int:
        """How many other server processes are using this store now (each one's LISTEN connection counts).

        Only PostgreSQL is shared between processes; the memory and SQLite stores have one owner: 0.
        """
        return 0

    @abc.abstractmethod
    async def listen(self, callback: NotifyCallback) -> None:
        """Call ``callback(max_delivery)`` whenever another process commits operations to this store.

        Only PostgreSQL relays between processes (LISTEN/NOTIFY). For the memory and SQLite stores this
        registers nothing and never calls back: a single server process owns those stores, and it already
        knows about its own writes.
        """
