"""``SQLiteServerStore``: the server's store in one SQLite file, through aiosqlite.

- WAL mode with ``synchronous=FULL``: a committed writer (an acknowledged operation) survives SIGKILL and
  power loss.
- Two connections: the writer's, which holds ``BEGIN IMMEDIATE`` transactions under the in-process write
  lock (and SQLite's own lock keeps writers in other processes out too), and a read-only one for the
  store-level reads, which therefore see committed data only. ``":memory:"`` uses a single connection, and
  its store-level reads wait for the write lock instead.
- Delivery sequences are ``MAX(delivery) + 1`` inside the writer's transaction: gapless and in commit order.
- An optimistic writer (the sync core's) begins its transaction only with its first read or its commit:
  the store remembers the highest delivery, and each node's highest sequence number, it committed last; an
  operation above its node's number is taken for new without a lookup (an honest node never reuses one), so
  a group of new operations goes in one trip to the connection's thread, BEGIN to COMMIT, instead of three.
  That trip checks the highest delivery is still the one remembered, or writes nothing and raises
  `WriteConflict` (another process wrote to the file). An id is not made of the sequence number, though: a
  peer resending a stored operation under a higher one makes the id's unique index refuse the trip, which
  is a `WriteConflict` too, and the next writer looks every id up.
- Ids are unique under their record (the index of collection, record id and id, which is also each record's
  history), not through an index of their own: an id is a hash, so such an index took a random page per
  insert. Operations are looked up under their records (``known_operations``); ``known_ids`` of bare ids
  reads the log. A file written with the older layout is rebuilt once when opened.
- A catch-up of a session that sees part of the log (``operations_in_scope``) reads its collections through
  ``offline_operations_collection`` and its scope values through ``offline_operation_scopes`` (one row per
  operation and scope value, written with the operation; filled once for a log stored before it existed).
- The connections open lazily on first use, so ``create_sqlite_server_store`` needs no running event loop.
- ``listen`` is a no-op: one server process owns a SQLite store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, ClassVar, Final

import aiosqlite

from offline.core.operations import Operation
from offline.store.checkpoint import Checkpointer
from offline.store.checkpoint import start as start_checkpoints
from offline.store.many_rows import row_statements

from . import _codec, compaction
from .base import (
    NotifyCallback,
    RecordKey,
    RecordRow,
    ScopedPage,
    ScopeSelector,
    ServerStore,
    StoredOperation,
    StoreKind,
    StoreWriter,
    WriteConflict,
    merge_selected,
    scope_index_entries,
)
from .base import scoped_statements as base_scoped_statements

__all__ = ["DEFAULT_SQLITE_FILENAME", "SQLiteServerStore", "create_sqlite_server_store"]

log = logging.getLogger("offline.server.store")

DEFAULT_SQLITE_FILENAME: Final = "./offline-server.db"
_BUSY_TIMEOUT_MS: Final = 30_000
# Host parameters per statement (SQLite's limit is at least 999 on every build that matters).
_CHUNK: Final = 500

_OPERATIONS_TABLE: Final = """CREATE TABLE IF NOT EXISTS offline_operations (
        delivery INTEGER PRIMARY KEY,
        id TEXT NOT NULL,
        node_id TEXT NOT NULL,
        sequence_number INTEGER NOT NULL,
        collection TEXT NOT NULL,
        record_id TEXT NOT NULL,
        wire TEXT NOT NULL,
        scope TEXT
    )"""
_OPERATIONS_COLUMNS: Final = "delivery, id, node_id, sequence_number, collection, record_id, wire, scope"

# Where a scoped catch-up finds the operations of one scope value (`base.scope_index_entries`): one row per
# (collection, scope field, value key, delivery), for the values an operation's snapshot holds after it and,
# when it moved its record, before it. Rows of one value sit together in delivery order.
_SCOPES_TABLE: Final = """CREATE TABLE IF NOT EXISTS offline_operation_scopes (
        collection TEXT NOT NULL,
        field TEXT NOT NULL,
        value TEXT NOT NULL,
        delivery INTEGER NOT NULL,
        PRIMARY KEY (collection, field, value, delivery)
    ) WITHOUT ROWID"""
_INSERT_SCOPES: Final = "INSERT INTO offline_operation_scopes (collection, field, value, delivery)"

#: What compaction keeps of deleted operations (see ``server_runtime.stores.compaction``); the same in the
#: PostgreSQL store.
COMPACTION_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS offline_record_versions (
        collection TEXT NOT NULL,
        record_id TEXT NOT NULL,
        versions TEXT NOT NULL,
        PRIMARY KEY (collection, record_id)
    )""",
    """CREATE TABLE IF NOT EXISTS offline_compacted_nodes (
        node_id TEXT PRIMARY KEY,
        sequence_number INTEGER NOT NULL
    )""",
)

_DDL: Final = (
    _OPERATIONS_TABLE,
    """CREATE INDEX IF NOT EXISTS offline_operations_node_sequence
        ON offline_operations (node_id, sequence_number)""",
    # An operation's id is unique under its record: the id hashes the collection and the record id, so this
    # is as unique as the id alone, and it is also the record's history (sent to a client when the record
    # moves into its scope). An index on the id alone, a hash, put every insert on a random page of an
    # ever larger index: most of each commit's writes (~13 us an operation at 60,000 stored, and growing),
    # where this one is appended to like the records' (UUID v7 ids, mostly written in creation order).
    """CREATE UNIQUE INDEX IF NOT EXISTS offline_operations_record
        ON offline_operations (collection, record_id, id)""",
    # A catch-up that sees whole collections reads each one's operations in delivery order (the rowid, which
    # every index ends with), not the whole log.
    """CREATE INDEX IF NOT EXISTS offline_operations_collection ON offline_operations (collection)""",
    _SCOPES_TABLE,
    """CREATE TABLE IF NOT EXISTS offline_records (
        collection TEXT NOT NULL,
        record_id TEXT NOT NULL,
        state TEXT NOT NULL,
        record TEXT,
        PRIMARY KEY (collection, record_id)
    )""",
    """CREATE TABLE IF NOT EXISTS offline_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    # Which principal first used each node id (see SyncService.bind_node).
    """CREATE TABLE IF NOT EXISTS offline_nodes (
        node_id TEXT PRIMARY KEY,
        principal TEXT NOT NULL
    )""",
    *COMPACTION_DDL,
    "CREATE INDEX IF NOT EXISTS offline_nodes_principal ON offline_nodes (principal)",
)

_STATS_SQL: Final = """
    SELECT NULL, COUNT(*), COALESCE(MAX(delivery), 0) FROM offline_operations
    UNION ALL
    SELECT collection, COUNT(record), COUNT(*) - COUNT(record) FROM offline_records GROUP BY collection
"""


async def _exec(conn: aiosqlite.Connection, sql: str, params: Iterable[Any] = ()) -> None:
    cursor = await conn.execute(sql, tuple(params))
    await cursor.close()


# One statement of a batch run by `_run_steps`: ("execute" | "fetch", sql, parameters), or
# ("expect", sql, value): the query's one value must be ``value``, else `_Moved` is raised (nothing after it
# runs), or ("rows", sql, [(sql, parameters), ...]): statements of several rows each (see `_rows_step`).
_Step = tuple[str, str, Any]


def _rows_step(head: str, rows: Sequence[tuple[Any, ...]], tail: str = "") -> _Step:
    """``head`` (``INSERT INTO table (columns)``) ``VALUES`` each of ``rows``, then ``tail`` (an upsert clause),
    in statements of several rows (`offline.store.many_rows`: ``executemany`` let go of the GIL and took it
    back for every row, and each take-back waited for the busy event loop)."""
    return ("rows", head, row_statements(head, rows, tail))


class _Moved(Exception):
    """An "expect" step found another value: the database changed since what the writer knew."""


def _expect(found: Any, expected: Any) -> None:
    if found != expected:
        raise _Moved(f"expected {expected!r}, found {found!r}")


def _thread_runner(
    conn: aiosqlite.Connection,
) -> tuple[Callable[[Callable[[], Any]], Awaitable[Any]], sqlite3.Connection] | None:
    """aiosqlite's own "run this on the connection's thread" (one queue round trip for many statements)
    and the sqlite3 connection, or None when this aiosqlite version does not have them under these names."""
    run = getattr(conn, "_execute", None)
    raw = getattr(conn, "_connection", None)
    if run is None or not isinstance(raw, sqlite3.Connection):
        return None
    return run, raw


def _steps_on(raw: sqlite3.Connection, steps: Sequence[_Step]) -> list[list[Any] | None]:
    out: list[list[Any] | None] = []
    for kind, sql, params in steps:
        if kind == "fetch":
            out.append(raw.execute(sql, params).fetchall())
            continue
        if kind == "expect":
            _expect(raw.execute(sql).fetchone()[0], params)
            out.append(None)
            continue
        if kind == "rows":
            for statement, values in params:
                raw.execute(statement, values)
        else:
            raw.execute(sql, params)
        out.append(None)
    return out


async def _run_steps(conn: aiosqlite.Connection, steps: Sequence[_Step]) -> list[list[Any] | None]:
    """Run ``steps`` in order on ``conn``; the rows of each "fetch" step (None for the others).

    Every aiosqlite call is a round trip to the connection's thread and back to the event loop; a write
    transaction made of one call per statement spent most of its time in those trips. This runs them all
    in one trip. Without the private runner (another aiosqlite version) it falls back to one call each.
    """
    runner = _thread_runner(conn)
    if runner is not None:
        run, raw = runner
        # The sqlite3 connection is only touched on its own thread, inside _steps_on.
        return await run(partial(_steps_on, raw, steps))  # type: ignore[no-any-return]
    out: list[list[Any] | None] = []
    for kind, sql, params in steps:
        if kind == "fetch":
            out.append(list(await conn.execute_fetchall(sql, params)))
            continue
        if kind == "expect":
            _expect(next(iter(await conn.execute_fetchall(sql)))[0], params)
        elif kind == "rows":
            for statement, values in params:
                await _exec(conn, statement, values)
        else:
            await _exec(conn, sql, params)
        out.append(None)
    return out


def _known_ids_steps(ids: Sequence[str]) -> list[_Step]:
    """Lookups of bare ids: no index leads to them (see ``offline_operations_record``), so each reads the
    log; the sync core asks ``known_operations``, which looks operations up under their records."""
    return [
        ("fetch", f"SELECT id FROM offline_operations WHERE id IN ({','.join('?' * len(part))})", tuple(part))
        for part in _codec.chunks(ids, _CHUNK)
    ]


def _known_keys_steps(keys: Sequence[tuple[str, str, str]]) -> list[_Step]:
    """Lookups of (collection, record id, id): one search of the ``offline_operations_record`` index each, the
    keys given as rows of a VALUES list in statements of the sizes `offline.store.many_rows` prepares once."""
    statements = row_statements(
        "WITH wanted (c, r, i) AS (",
        keys,
        ") SELECT o.id FROM wanted JOIN offline_operations AS o"
        " ON o.collection = wanted.c AND o.record_id = wanted.r AND o.id = wanted.i",
    )
    return [("fetch", sql, values) for sql, values in statements]


async def _upgrade_operations(conn: aiosqlite.Connection) -> None:
    """Rebuild an operation log written with a unique index on the id alone (before the layout above), once,
    inside the caller's transaction."""
    # index_list rows: (seq, name, unique, origin, partial); origin "u" is a UNIQUE column constraint.
    indexes = await conn.execute_fetchall("PRAGMA index_list('offline_operations')")
    if not any(row[3] == "u" for row in indexes):
        return
    # Once per file, and as long as copying the log takes: say so, a large store's first start is slower.
    log.warning(
        "SQLite store: rebuilding the operation log's indexes (once; ids indexed under their records)"
    )
    await _exec(conn, "ALTER TABLE offline_operations RENAME TO offline_operations_before_upgrade")
    # The renamed table keeps its indexes, under the names the new ones take.
    await _exec(conn, "DROP INDEX IF EXISTS offline_operations_node_sequence")
    await _exec(conn, "DROP INDEX IF EXISTS offline_operations_record")
    await _exec(conn, _OPERATIONS_TABLE)
    await _exec(
        conn,
        f"INSERT INTO offline_operations ({_OPERATIONS_COLUMNS})"
        f" SELECT {_OPERATIONS_COLUMNS} FROM offline_operations_before_upgrade ORDER BY delivery",
    )
    await _exec(conn, "DROP TABLE offline_operations_before_upgrade")


async def _has_table(conn: aiosqlite.Connection, name: str) -> bool:
    rows = await conn.execute_fetchall(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    )
    return bool(list(rows))


async def _index_scopes(conn: aiosqlite.Connection) -> None:
    """Fill ``offline_operation_scopes`` from a log stored before it existed, once, inside the caller's
    transaction (page by page: the log may be large)."""
    after = 0
    while True:
        rows = list(
            await conn.execute_fetchall(
                "SELECT delivery, collection, scope FROM offline_operations"
                " WHERE delivery > ? AND scope IS NOT NULL ORDER BY delivery LIMIT ?",
                (after, _codec.PAGE_SIZE),
            )
        )
        if not rows:
            return
        if after == 0:
            log.warning("SQLite store: indexing the operation log's scopes (once)")
        entries = [
            (collection, field, key, delivery)
            for delivery, collection, scope in rows
            for field, key in sorted(scope_index_entries(_codec.decode_optional(scope)))
        ]
        for statement, values in row_statements(_INSERT_SCOPES, entries):
            await _exec(conn, statement, values)
        after = int(rows[-1][0])


def _scope_entries(
    values: Sequence[tuple[Any, ...]], scopes: Sequence[Mapping[str, Any] | None]
) -> list[tuple[Any, ...]]:
    """``offline_operation_scopes`` rows of appended operations (``values`` rows of ``_INSERT_OPERATIONS``)."""
    return [
        (value[4], field, key, value[0])
        for value, scope in zip(values, scopes, strict=True)
        if scope
        for field, key in sorted(scope_index_entries(scope))
    ]


#: Catch-up pages (``operations_in_scope``): one collection's operations, or one scope value's, in delivery
#: order from the start of the page, each a search of an index (tests check the plans).
SCOPED_COLLECTION_SQL: Final = (
    "SELECT delivery, node_id, collection, record_id, scope, wire FROM offline_operations"
    " WHERE collection = ? AND delivery > ? ORDER BY delivery LIMIT ?"
)
SCOPED_VALUE_SQL: Final = (
    "SELECT o.delivery, o.node_id, o.collection, o.record_id, o.scope, o.wire"
    " FROM offline_operation_scopes AS s CROSS JOIN offline_operations AS o ON o.delivery = s.delivery"
    " WHERE s.collection = ? AND s.field = ? AND s.value = ? AND s.delivery > ? ORDER BY s.delivery LIMIT ?"
)


#: A record's history (sent to a session the record moves into). Named index: without statistics SQLite
#: took the collection's index for it, and read every operation of the collection.
RECORD_HISTORY_SQL: Final = (
    "SELECT delivery, wire, scope FROM offline_operations INDEXED BY offline_operations_record"
    " WHERE collection = ? AND record_id = ? AND delivery < ? ORDER BY delivery"
)


def scoped_statements(
    after: int, limit: int, selectors: Sequence[ScopeSelector]
) -> list[tuple[str, tuple[Any, ...]]]:
    """The query of each selector in a catch-up page (see `SQLiteServerStore.operations_in_scope`)."""
    return base_scoped_statements(
        after, limit, selectors, collection_sql=SCOPED_COLLECTION_SQL, value_sql=SCOPED_VALUE_SQL
    )


_OPERATIONS_SINCE: Final = (
    "SELECT delivery, wire, scope FROM offline_operations WHERE delivery > ? ORDER BY delivery LIMIT ?"
)
_MAX_DELIVERY: Final = "SELECT COALESCE(MAX(delivery), 0) FROM offline_operations"
_NODE_TAILS: Final = "SELECT node_id, MAX(sequence_number) FROM offline_operations GROUP BY node_id"
_BEGIN: Final[_Step] = ("execute", "BEGIN IMMEDIATE", ())
_INSERT_OPERATIONS: Final = f"INSERT INTO offline_operations ({_OPERATIONS_COLUMNS})"
_INSERT_RECORDS: Final = "INSERT INTO offline_records (collection, record_id, state, record)"
_ON_RECORD_CONFLICT: Final = (
    " ON CONFLICT (collection, record_id) DO UPDATE SET state = excluded.state, record = excluded.record"
)


async def _operations_since(
    conn: aiosqlite.Connection, after: int, limit: int | None
) -> list[StoredOperation]:
    rows = await conn.execute_fetchall(
        _OPERATIONS_SINCE, (int(after), -1 if limit is None else max(int(limit), 0))
    )
    return [_codec.stored_operation(d, w, s) for d, w, s in rows]


async def _load_rows(
    conn: aiosqlite.Connection, keys: Iterable[RecordKey], refold: Callable[[Operation], Any]
) -> dict[RecordKey, RecordRow]:
    by_collection: dict[str, list[str]] = {}
    for collection, record_id in dict.fromkeys(keys):
        by_collection.setdefault(collection, []).append(record_id)
    out: dict[RecordKey, RecordRow] = {}
    for collection, record_ids in by_collection.items():
        for part in _codec.chunks(record_ids, _CHUNK):
            rows = await conn.execute_fetchall(
                "SELECT record_id, state, record FROM offline_records"
                f" WHERE collection = ? AND record_id IN ({','.join('?' * len(part))})",
                (collection, *part),
            )
            for record_id, state, record in rows:
                out[(collection, record_id)] = _codec.record_row(collection, record_id, state, record, refold)
    return out


class SQLiteServerStore(ServerStore):
    """The server store in a SQLite file (see the module docstring). Build with ``create_sqlite_server_store``."""

    kind: ClassVar[StoreKind] = "sqlite"

    def __init__(self, filename: str | os.PathLike[str] = DEFAULT_SQLITE_FILENAME) -> None:
        super().__init__()
        self.filename = os.fspath(filename)
        self._shared = self.filename == ":memory:" or self.filename.startswith("file::memory:")
        self._writer_conn: aiosqlite.Connection | None = None
        self._reader_conn: aiosqlite.Connection | None = None
        self._open_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        # As of this store's last commit: the highest delivery, and (once an optimistic writer asked) each
        # node's highest sequence number. None when not known (before the first writer, after a failed one).
        self._top: int | None = None
        self._tails: dict[str, int] | None = None
        self._look_up_next = False  # the next writer looks up every id (an id taken for new was stored)
        # The compaction horizon, once read (None: not read, or a compaction or restore failed). One process
        # owns the file, as for ``_top``: its own compactions and restores raise it, before they delete
        # anything (a relay asks after every catch-up page it reads, and a page read meanwhile is dropped).
        self._horizon: int | None = None
        self._checkpointer: Checkpointer | None = None
        self._wal = False  # the writer's connection is in WAL mode

    def __repr__(self) -> str:
        return f"SQLiteServerStore({self.filename!r})"

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError, ValueError) as exc:
            # aiosqlite raises ValueError for a connection that was closed underneath it.
            raise _codec.storage_error(self.kind, action, exc) from exc

    # ------------------------------------------------------------------------------------------ lifecycle

    async def _prepare(self) -> None:
        self._check_open()
        if self._writer_conn is not None:
            return
        async with self._open_lock:
            self._check_open()
            if self._writer_conn is not None:
                return
            opened: list[aiosqlite.Connection] = []
            try:
                with self._errors(f"opening {self.filename}"):
                    directory = os.path.dirname(self.filename)
                    if directory and not self._shared and not self.filename.startswith("file:"):
                        os.makedirs(directory, exist_ok=True)
                    uri = self.filename.startswith("file:")
                    writer = await aiosqlite.connect(self.filename, isolation_level=None, uri=uri)
                    opened.append(writer)
                    await self._configure(writer, write=True)
                    await _exec(writer, "BEGIN IMMEDIATE")
                    await _upgrade_operations(writer)
                    indexed = await _has_table(writer, "offline_operation_scopes")
                    for statement in _DDL:
                        await _exec(writer, statement)
                    if not indexed:
                        await _index_scopes(writer)
                    await _exec(writer, "COMMIT")
                    if self._shared:
                        reader = writer
                    else:
                        reader = await aiosqlite.connect(self.filename, isolation_level=None, uri=uri)
                        opened.append(reader)
                        await self._configure(reader, write=False)
                    if self._wal and not self._shared:
                        # Checkpoints on a thread of their own (offline.store.checkpoint): the commits of
                        # the write pipeline only append to the log.
                        self._checkpointer = start_checkpoints(self, self.filename, synchronous="FULL")
                        if self._checkpointer is not None:
                            await _exec(writer, "PRAGMA wal_autocheckpoint = 0")
            except BaseException:
                if self._checkpointer is not None:
                    self._checkpointer.close()
                    self._checkpointer = None
                for conn in opened:
                    with contextlib.suppress(Exception):
                        await conn.close()
                raise
            self._reader_conn = reader
            self._writer_conn = writer

    async def _configure(self, conn: aiosqlite.Connection, *, write: bool) -> None:
        await _exec(conn, f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        if write:
            rows = list(await conn.execute_fetchall("PRAGMA journal_mode = WAL"))
            mode = str(rows[0][0]).lower() if rows else "?"
            self._wal = mode == "wal"
            if mode != "wal" and not self._shared:
                log.warning("SQLite store %s: journal_mode is %s, not WAL", self.filename, mode)
            # FULL: in WAL mode every commit is fsynced, so an acknowledged operation survives power loss.
            await _exec(conn, "PRAGMA synchronous = FULL")
        else:
            await _exec(conn, "PRAGMA synchronous = FULL")
            await _exec(conn, "PRAGMA query_only = ON")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Let a writer in progress finish (commit or roll back) before its connection goes away.
        async with self._write_lock, self._open_lock:
            connections = {id(c): c for c in (self._reader_conn, self._writer_conn) if c is not None}
            self._reader_conn = self._writer_conn = None
            if self._checkpointer is not None:
                checkpointer, self._checkpointer = self._checkpointer, None
                await asyncio.to_thread(checkpointer.close)  # waits for a checkpoint in progress
            for conn in connections.values():
                try:
                    await conn.close()
                except Exception:  # pragma: no cover - closing is best effort
                    log.exception("closing SQLite store %s", self.filename)

    # -------------------------------------------------------------------------------------------- writing

    def writer(self, *, optimistic: bool = False) -> AbstractAsyncContextManager[StoreWriter]:
        return self._writer(optimistic)

    @asynccontextmanager
    async def _writer(self, optimistic: bool) -> AsyncIterator[StoreWriter]:
        await self._prepare()
        async with self._write_lock:
            self._check_open()
            conn = self._writer_conn
            assert conn is not None
            top, tails = self._top, self._tails
            # Known again only once this writer has committed.
            self._top = self._tails = None
            with self._errors("beginning a write transaction"):
                if conn.in_transaction:  # left open by a writer cancelled mid-rollback
                    await _exec(conn, "ROLLBACK")
                exact, self._look_up_next = self._look_up_next, False
                if optimistic and top is not None and tails is not None and not exact:
                    writer = _SQLiteWriter(self, conn, top, tails, begun=False)
                else:
                    # The highest delivery comes with BEGIN: nobody else can write until this writer ends.
                    steps: list[_Step] = [_BEGIN, ("fetch", _MAX_DELIVERY, ())]
                    if optimistic:
                        steps.append(("fetch", _NODE_TAILS, ()))
                    results = await _run_steps(conn, steps)
                    assert results[1] is not None
                    found = int(results[1][0][0])
                    if optimistic:
                        assert results[2] is not None
                        tails = {str(node): int(seq) for node, seq in results[2]}
                    elif found != top:
                        tails = None  # another process wrote: what it stored is not counted in them
                    writer = _SQLiteWriter(self, conn, found, tails, begun=True)
                writer.skip_lookups = optimistic and not exact
            try:
                yield writer
                writer.active = False
                steps = writer.take_queued()
                if steps or writer.begun:
                    with self._errors("committing"):
                        # The writes the writer queued and COMMIT (BEGIN first, if nothing did it yet): one
                        # trip to the connection's thread.
                        try:
                            await _run_steps(conn, [*writer.opening(), *steps, ("execute", "COMMIT", ())])
                            if self._checkpointer is not None:
                                self._checkpointer.committed()
                        except sqlite3.IntegrityError as error:
                            # The unique index of (collection, record_id, id), i.e. the id.
                            if writer.skipped and "offline_operations.id" in str(error):
                                self._look_up_next = True
                                raise _Moved("an operation taken for new is stored already") from error
                            raise
            except BaseException as exc:
                writer.active = False
                if conn.in_transaction:
                    try:
                        await _exec(conn, "ROLLBACK")
                    except Exception:
                        log.exception("rolling back a write transaction of SQLite store %s", self.filename)
                if isinstance(exc, _Moved):
                    raise WriteConflict(
                        f"another process wrote to the SQLite store {self.filename} meanwhile; nothing was written"
                    ) from exc
                raise
            if not writer.raw_used:  # statements of the caller's own may have stored operations
                self._top = writer.max_delivery
                self._tails = writer.tails

    # -------------------------------------------------------------------------------------------- reading

    @asynccontextmanager
    async def _reading(self, action: str) -> AsyncIterator[aiosqlite.Connection]:
        await self._prepare()
        conn = self._reader_conn
        assert conn is not None
        with self._errors(action):
            if self._shared:
                # One connection: wait until no writer's uncommitted data is visible on it.
                async with self._write_lock:
                    self._check_open()
                    yield conn
            else:
                yield conn

    async def get_meta(self, key: str) -> str | None:
        _codec.check_meta(key)
        async with self._reading("reading meta") as conn:
            rows = list(await conn.execute_fetchall("SELECT value FROM offline_meta WHERE key = ?", (key,)))
        return str(rows[0][0]) if rows else None

    async def operations_since(self, after: int, limit: int | None = None) -> list[StoredOperation]:
        async with self._reading("reading operations") as conn:
            return await _operations_since(conn, after, limit)

    async def operation_texts_since(
        self, after: int, limit: int | None = None
    ) -> list[tuple[int, str, str, str, str | None, str]]:
        """``operations_since`` as stored, undecoded: ``(delivery, node id, collection, record id, scope JSON
        or None, wire JSON)``. The relay sends the wire text as it is."""
        async with self._reading("reading operations") as conn:
            rows = await conn.execute_fetchall(
                "SELECT delivery, node_id, collection, record_id, scope, wire FROM offline_operations"
                " WHERE delivery > ? ORDER BY delivery LIMIT ?",
                (int(after), -1 if limit is None else max(int(limit), 0)),
            )
        return [(int(d), str(n), str(c), str(r), s, str(w)) for d, n, c, r, s, w in rows]

    async def operations_in_scope(
        self, after: int, limit: int, selectors: Sequence[ScopeSelector]
    ) -> ScopedPage:
        limit = max(int(limit), 1)
        # One read transaction (one snapshot of the log) in one trip to the connection's thread.
        steps: list[_Step] = [("execute", "BEGIN", ()), ("fetch", _MAX_DELIVERY, ())]
        steps += [("fetch", sql, params) for sql, params in scoped_statements(after, limit, selectors)]
        steps.append(("execute", "COMMIT", ()))
        async with self._reading("reading a catch-up page") as conn:
            try:
                results = await _run_steps(conn, steps)
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(Exception):
                        await _exec(conn, "ROLLBACK")
                raise
        top_rows = results[1]
        assert top_rows is not None
        pages = [
            [(int(d), str(n), str(c), str(r), sc, str(w)) for d, n, c, r, sc, w in rows or ()]
            for rows in results[2:-1]
        ]
        return merge_selected(pages, limit, int(top_rows[0][0]))

    async def record_operations(self, collection: str, record_id: str, before: int) -> list[StoredOperation]:
        async with self._reading("reading a record's operations") as conn:
            rows = await conn.execute_fetchall(
                RECORD_HISTORY_SQL,
                (collection, record_id, int(before)),
            )
        return [_codec.stored_operation(d, w, s) for d, w, s in rows]

    async def max_delivery(self) -> int:
        async with self._reading("reading the max delivery") as conn:
            rows = list(
                await conn.execute_fetchall("SELECT COALESCE(MAX(delivery), 0) FROM offline_operations")
            )
        return int(rows[0][0])

    async def load_all_rows(self) -> AsyncIterator[RecordRow]:
        last: RecordKey | None = None
        while True:
            async with self._reading("reading records") as conn:
                if last is None:
                    rows = list(
                        await conn.execute_fetchall(
                            "SELECT collection, record_id, state, record FROM offline_records"
                            " ORDER BY collection, record_id LIMIT ?",
                            (_codec.PAGE_SIZE,),
                        )
                    )
                else:
                    rows = list(
                        await conn.execute_fetchall(
                            "SELECT collection, record_id, state, record FROM offline_records"
                            " WHERE (collection, record_id) > (?, ?) ORDER BY collection, record_id LIMIT ?",
                            (*last, _codec.PAGE_SIZE),
                        )
                    )
            for collection, record_id, state, record in rows:
                yield _codec.record_row(collection, record_id, state, record, self._refold_state)
            if len(rows) < _codec.PAGE_SIZE:
                return
            last = (rows[-1][0], rows[-1][1])

    async def load_rows(self, keys: Iterable[RecordKey]) -> dict[RecordKey, RecordRow]:
        async with self._reading("reading records") as conn:
            return await _load_rows(conn, keys, self._refold_state)

    async def version_vector(self) -> dict[str, int]:
        async with self._reading("reading the version vector") as conn:
            rows = await conn.execute_fetchall(
                "SELECT node_id, MAX(sequence_number) FROM offline_operations GROUP BY node_id"
            )
        return {str(node): int(seq) for node, seq in rows}

    async def stats(self) -> dict[str, Any]:
        async with self._reading("reading statistics") as conn:
            rows = list(await conn.execute_fetchall(_STATS_SQL))
        return _codec.stats_from_rows(self.kind, rows)

    async def export_operations(self) -> AsyncIterator[StoredOperation]:
        after = 0
        while True:
            async with self._reading("reading operations") as conn:
                page = await _operations_since(conn, after, _codec.PAGE_SIZE)
            for op in page:
                yield op
            if len(page) < _codec.PAGE_SIZE:
                return
            after = page[-1].delivery

    async def claim_node(self, node_id: str, principal: str, *, replacing: str | None = None) -> str:
        _codec.check_node_claim(node_id, principal)
        async with self.writer() as writer:
            assert isinstance(writer, _SQLiteWriter)
            with self._errors("registering a node"):
                _, rows = await writer._read(
                    [
                        (
                            "execute",
                            "INSERT INTO offline_nodes (node_id, principal) VALUES (?, ?) ON CONFLICT (node_id)"
                            " DO UPDATE SET principal = excluded.principal WHERE offline_nodes.principal IS ?",
                            (node_id, principal, replacing),
                        ),
                        ("fetch", "SELECT principal FROM offline_nodes WHERE node_id = ?", (node_id,)),
                    ]
                )
        assert rows
        return str(rows[0][0])

    async def node_principals(self, node_ids: Iterable[str]) -> dict[str, str]:
        wanted = list(dict.fromkeys(node_ids))
        out: dict[str, str] = {}
        async with self._reading("reading node registrations") as conn:
            for part in _codec.chunks(wanted, _CHUNK):
                rows = await conn.execute_fetchall(
                    f"SELECT node_id, principal FROM offline_nodes WHERE node_id IN ({','.join('?' * len(part))})",
                    tuple(part),
                )
                out.update((str(n), str(p)) for n, p in rows)
        return out

    async def node_scopes(self, node_id: str) -> list[tuple[str, dict[str, Any] | None]]:
        async with self._reading("reading a node's operations") as conn:
            rows = await conn.execute_fetchall(
                "SELECT DISTINCT collection, scope FROM offline_operations WHERE node_id = ?", (node_id,)
            )
        return [(str(collection), _codec.decode_optional(scope)) for collection, scope in rows]

    async def node_registrations(self) -> dict[str, str]:
        async with self._reading("reading node registrations") as conn:
            rows = await conn.execute_fetchall(
                "SELECT node_id, principal FROM offline_nodes ORDER BY node_id"
            )
        return {str(n): str(p) for n, p in rows}

    async def principal_nodes(self, principal: str) -> list[str]:
        async with self._reading("reading node registrations") as conn:
            rows = await conn.execute_fetchall(
                "SELECT node_id FROM offline_nodes WHERE principal = ? ORDER BY node_id", (principal,)
            )
        return [str(row[0]) for row in rows]

    async def listen(self, callback: NotifyCallback) -> None:
        self._check_open()

    async def compaction_horizon(self) -> int:
        if self._horizon is None:
            # (A compaction may have announced a higher one meanwhile, before its commit.)
            self._announce_horizon(await super().compaction_horizon())
        assert self._horizon is not None
        return self._horizon

    def _announce_horizon(self, horizon: int) -> None:
        self._horizon = max(self._horizon or 0, horizon)

    @contextlib.contextmanager
    def _changing_horizon(self) -> Iterator[None]:
        """Around a compaction or a restore: after one that failed, the horizon is read again, as committed."""
        try:
            yield
        except BaseException:
            self._horizon = None
            raise

    async def compact(self, horizon: int | None = None) -> dict[str, Any]:
        with self._changing_horizon():
            async with self.writer() as writer:
                assert isinstance(writer, _SQLiteWriter)
                horizon = compaction.bounded(horizon, writer.max_delivery)
                self._announce_horizon(horizon)
                with self._errors("compacting the operation log"):
                    (rows,) = await writer._read(
                        [
                            (
                                "fetch",
                                "SELECT delivery, node_id, sequence_number, collection, record_id, scope"
                                " FROM offline_operations WHERE delivery <= ? ORDER BY delivery",
                                (horizon,),
                            )
                        ]
                    )
                    done = compaction.plan(
                        ((int(d), str(n), int(q), str(c), str(r), sc) for d, n, q, c, r, sc in rows or ()),
                        horizon,
                    )
                    stored = await _stored_versions(writer._read, done.record_versions)
                    steps: list[_Step] = [
                        (
                            "execute",
                            f"DELETE FROM offline_operations WHERE delivery IN ({','.join('?' * len(part))})",
                            tuple(part),
                        )
                        for part in _codec.chunks(done.deliveries, _CHUNK)
                    ]
                    steps += [
                        (
                            "execute",
                            "DELETE FROM offline_operation_scopes WHERE collection = ? AND field = ? AND value = ?"
                            " AND delivery = ?",
                            row,
                        )
                        for row in done.scope_rows
                    ]
                    steps += _compaction_marks(stored, done.record_versions, done.node_marks)
                    await writer._read(steps)
                await writer.set_meta(compaction.HORIZON_KEY, str(horizon))
            return done.result()

    async def compacted_history(self) -> tuple[dict[RecordKey, dict[str, int]], dict[str, int]]:
        async with self._reading("reading what compaction recorded") as conn:
            versions = await conn.execute_fetchall(
                "SELECT collection, record_id, versions FROM offline_record_versions"
            )
            marks = await conn.execute_fetchall(
                "SELECT node_id, sequence_number FROM offline_compacted_nodes"
            )
        return (
            {(str(c), str(r)): compaction.parse_versions(v) for c, r, v in versions},
            {str(n): int(q) for n, q in marks},
        )

    async def restore_compaction(
        self,
        rows: Iterable[RecordRow],
        record_versions: Mapping[RecordKey, Mapping[str, int]],
        node_marks: Mapping[str, int],
        horizon: int,
    ) -> None:
        with self._changing_horizon():
            async with self.writer() as writer:
                assert isinstance(writer, _SQLiteWriter)
                self._announce_horizon(int(horizon))
                await writer.save_rows(rows)
                with self._errors("restoring what compaction recorded"):
                    stored = await _stored_versions(writer._read, record_versions)
                    steps = _compaction_marks(stored, record_versions, node_marks)
                    if steps:
                        await writer._read(steps)
                await writer.set_meta(compaction.HORIZON_KEY, str(int(horizon)))

    async def record_versions(self, keys: Iterable[RecordKey]) -> dict[RecordKey, dict[str, int]]:
        wanted = list(dict.fromkeys(keys))
        out: dict[RecordKey, dict[str, int]] = {}
        async with self._reading("reading record versions") as conn:

            async def read(steps: list[_Step]) -> list[list[Any] | None]:
                return await _run_steps(conn, steps)

            stored = await _stored_versions(read, wanted)
            # A statement per chunk of records, all in one trip to the connection's thread (a state-based
            # first sync asks for every record of the log: one round trip per record was most of its cost).
            by_collection: dict[str, list[str]] = {}
            for collection, record_id in wanted:
                by_collection.setdefault(collection, []).append(record_id)
            steps: list[_Step] = [
                (
                    "fetch",
                    "SELECT record_id, node_id, MAX(sequence_number) FROM offline_operations INDEXED BY"
                    f" offline_operations_record WHERE collection = ? AND record_id IN ({','.join('?' * len(part))})"
                    " GROUP BY record_id, node_id",
                    (collection, *part),
                )
                for collection, record_ids in by_collection.items()
                for part in _codec.chunks(record_ids, _CHUNK)
            ]
            kept: dict[RecordKey, dict[str, int]] = {}
            answers = await read(steps) if steps else []
            for (_, _, params), rows in zip(steps, answers, strict=True):
                for record_id, node, seq in rows or ():
                    kept.setdefault((params[0], str(record_id)), {})[str(node)] = int(seq)
            for key in wanted:
                versions = compaction.merge_versions(stored.get(key), kept.get(key))
                if versions:
                    out[key] = versions
        return out


def _compaction_marks(
    stored: Mapping[RecordKey, Mapping[str, int]],
    record_versions: Mapping[RecordKey, Mapping[str, int]],
    node_marks: Mapping[str, int],
) -> list[_Step]:
    """The upserts merging ``record_versions`` (over ``stored``, what the table holds of them) and
    ``node_marks`` into what compaction recorded."""
    steps: list[_Step] = []
    versions = [
        (c, r, compaction.versions_text(compaction.merge_versions(stored.get((c, r)), v)))
        for (c, r), v in record_versions.items()
    ]
    if versions:
        steps.append(
            _rows_step(
                "INSERT INTO offline_record_versions (collection, record_id, versions)",
                versions,
                " ON CONFLICT (collection, record_id) DO UPDATE SET versions = excluded.versions",
            )
        )
    if node_marks:
        steps.append(
            _rows_step(
                "INSERT INTO offline_compacted_nodes (node_id, sequence_number)",
                list(node_marks.items()),
                " ON CONFLICT (node_id) DO UPDATE SET sequence_number"
                " = max(sequence_number, excluded.sequence_number)",
            )
        )
    return steps


async def _stored_versions(
    read: Callable[[list[_Step]], Awaitable[list[list[Any] | None]]], keys: Iterable[RecordKey]
) -> dict[RecordKey, dict[str, int]]:
    """``offline_record_versions`` of these records (those that have a row)."""
    by_collection: dict[str, list[str]] = {}
    for collection, record_id in keys:
        by_collection.setdefault(collection, []).append(record_id)
    steps: list[_Step] = [
        (
            "fetch",
            "SELECT collection, record_id, versions FROM offline_record_versions"
            f" WHERE collection = ? AND record_id IN ({','.join('?' * len(part))})",
            (collection, *part),
        )
        for collection, ids in by_collection.items()
        for part in _codec.chunks(ids, _CHUNK)
    ]
    if not steps:
        return {}
    return {
        (str(c), str(r)): compaction.parse_versions(v) for rows in await read(steps) for c, r, v in rows or ()
    }


class _SQLiteWriter(StoreWriter):
    """Writes are queued and run with COMMIT, in one trip to the connection's thread; a read first runs
    what is queued (in the same trip), so reads see this writer's own writes."""

    def __init__(
        self,
        store: SQLiteServerStore,
        conn: aiosqlite.Connection,
        max_delivery: int,
        tails: dict[str, int] | None,
        *,
        begun: bool,
    ) -> None:
        self.store = store
        self._conn = conn
        self.active = True
        self._queued: list[_Step] = []
        self._max_delivery = max_delivery  # the highest delivery, this writer's appends included
        self._top = max_delivery  # as the writer began: what an optimistic BEGIN checks
        # Each node's highest stored sequence number (None: not known), this writer's appends included.
        self.tails = tails
        self.begun = begun  # False: an optimistic writer whose BEGIN goes with its first trip
        self.raw_used = False
        # Take operations above their node's highest stored sequence number for new (optimistic writers);
        # ``skipped``: some were.
        self.skip_lookups = False
        self.skipped = False
        # Ids this transaction found not stored (known_ids), found stored, or stored itself (append): append
        # needs no query for them.
        self._absent: set[str] = set()
        self._present: set[str] = set()
        self._appended: set[str] = set()

    @property
    def max_delivery(self) -> int:
        return self._max_delivery

    @property
    def conn(self) -> aiosqlite.Connection:
        """The raw connection, inside this writer's transaction (for statements of one's own)."""
        if self._queued:
            # Its statements would run before the queued ones: out of order.
            raise RuntimeError("the writer has queued writes; use its methods, not its raw connection")
        if not self.begun:
            raise RuntimeError("an optimistic writer has no transaction yet; use its methods")
        self.raw_used = True
        return self._conn

    def opening(self) -> list[_Step]:
        """BEGIN and its check, for the trip that opens an optimistic writer's transaction (else nothing)."""
        if self.begun:
            return []
        self.begun = True
        return [_BEGIN, ("expect", _MAX_DELIVERY, self._top)]

    def take_queued(self) -> list[_Step]:
        queued, self._queued = self._queued, []
        return queued

    def _check(self) -> None:
        self.store._check_open()
        if not self.active:
            raise RuntimeError("a store writer is only valid inside its 'async with' block")

    async def _read(self, steps: list[_Step]) -> list[list[Any] | None]:
        """Run the queued writes, then ``steps``; the results of ``steps``."""
        before = [*self.opening(), *self.take_queued()]
        results = await _run_steps(self._conn, [*before, *steps])
        return results[len(before) :]

    async def operations_since(self, after: int, limit: int | None = None) -> list[StoredOperation]:
        self._check()
        if after >= self._max_delivery:
            return []  # nothing was stored after that, by anyone: this writer holds the lock since BEGIN
        limit_value = -1 if limit is None else max(int(limit), 0)
        with self.store._errors("reading operations"):
            (rows,) = await self._read([("fetch", _OPERATIONS_SINCE, (int(after), limit_value))])
        assert rows is not None
        return [_codec.stored_operation(d, w, s) for d, w, s in rows]

    async def compaction_horizon(self) -> int | None:
        # In this writer's transaction: a shared connection (":memory:") is read only under the write lock.
        self._check()
        with self.store._errors("reading the compaction horizon"):
            (rows,) = await self._read(
                [("fetch", "SELECT value FROM offline_meta WHERE key = ?", (compaction.HORIZON_KEY,))]
            )
        return int(rows[0][0]) if rows else 0

    async def _known(self, wanted: list[str], steps: list[_Step]) -> set[str]:
        """Which of ``wanted`` the lookups ``steps`` found stored (remembered either way)."""
        results = await self._read(steps)
        found = {row[0] for rows in results if rows for row in rows}
        self._absent.update(i for i in wanted if i not in found and i not in self._appended)
        self._present.update(found)
        return found

    async def _known_operations(self, ops: list[Operation]) -> set[str]:
        keys = {op.id: (op.collection, op.record_id, op.id) for op in ops}
        if not keys:
            return set()
        return await self._known(list(keys), _known_keys_steps(list(keys.values())))

    async def known_ids(self, ids: Iterable[str]) -> set[str]:
        self._check()
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return set()
        with self.store._errors("reading operation ids"):
            return await self._known(wanted, _known_ids_steps(wanted))

    async def known_operations(self, ops: Iterable[Operation]) -> set[str]:
        self._check()
        ops = list(ops)
        unsure = self._unsure(ops)
        found = {op.id for op in ops if op.id in self._present or op.id in self._appended}
        if unsure:
            with self.store._errors("reading operation ids"):
                found |= await self._known_operations(unsure)
        return found

    def _unsure(self, ops: Iterable[Operation]) -> list[Operation]:
        """The operations of ``ops`` this writer cannot tell stored or not without a query."""
        tails = self.tails
        out: list[Operation] = []
        for op in ops:
            op_id = op.id
            if op_id in self._absent or op_id in self._present or op_id in self._appended:
                continue
            if self.skip_lookups and tails is not None and op.sequence_number > tails.get(op.node_id, 0):
                self._absent.add(op_id)  # beyond what the store holds of its node: new
                self.skipped = True
                continue
            out.append(op)
        return out

    async def load_rows(self, keys: Iterable[RecordKey]) -> dict[RecordKey, RecordRow]:
        self._check()
        by_collection: dict[str, list[str]] = {}
        for collection, record_id in dict.fromkeys(keys):
            by_collection.setdefault(collection, []).append(record_id)
        steps: list[_Step] = []
        for collection, record_ids in by_collection.items():
            for part in _codec.chunks(record_ids, _CHUNK):
                steps.append(
                    (
                        "fetch",
                        "SELECT collection, record_id, state, record FROM offline_records"
                        f" WHERE collection = ? AND record_id IN ({','.join('?' * len(part))})",
                        (collection, *part),
                    )
                )
        out: dict[RecordKey, RecordRow] = {}
        if not steps:
            return out
        with self.store._errors("reading records"):
            results = await self._read(steps)
        for rows in results:
            for collection, record_id, state, record in rows or ():
                out[(collection, record_id)] = _codec.record_row(
                    collection, record_id, state, record, self.store._refold_state
                )
        return out

    async def held_places(self, places: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str]:
        self._check()
        wanted = list(dict.fromkeys(places))
        if not wanted:
            return {}
        # One search of the (node_id, sequence_number) index each, the places as rows of a VALUES list.
        statements = row_statements(
            "WITH wanted (n, s) AS (",
            wanted,
            ") SELECT o.node_id, o.sequence_number, o.id FROM wanted JOIN offline_operations AS o"
            " ON o.node_id = wanted.n AND o.sequence_number = wanted.s",
        )
        nodes = list(dict.fromkeys(n for n, _ in wanted))
        marks_sql = (
            "SELECT node_id, sequence_number FROM offline_compacted_nodes"
            f" WHERE node_id IN ({','.join('?' * len(nodes))})"
        )
        with self.store._errors("reading sequence numbers"):
            *results, marks = await self._read(
                [*(("fetch", sql, values) for sql, values in statements), ("fetch", marks_sql, tuple(nodes))]
            )
        held = {(str(n), int(s)): str(i) for rows in results for n, s, i in rows or ()}
        return compaction.with_compacted(held, wanted, {str(n): int(q) for n, q in marks or ()})

    async def append(self, ops: Sequence[tuple[Operation, Mapping[str, Any] | None]]) -> list[int | None]:
        self._check()
        _codec.check_appends(ops)
        if not ops:
            return []
        with self.store._errors("appending operations"):
            unchecked = self._unsure(op for op, _ in ops)
            seen = await self._known_operations(unchecked) if unchecked else set()
            seen |= self._appended | self._present
            delivery = self._max_delivery
            result: list[int | None] = []
            values: list[tuple[Any, ...]] = []
            scopes: list[Mapping[str, Any] | None] = []
            for op, scope in ops:
                if op.id in seen:
                    result.append(None)
                    continue
                scopes.append(scope)
                seen.add(op.id)
                delivery += 1
                result.append(delivery)
                values.append(
                    (
                        delivery,
                        op.id,
                        op.node_id,
                        op.sequence_number,
                        op.collection,
                        op.record_id,
                        _codec.encode_operation(op),
                        _codec.encode_optional(scope),
                    )
                )
            if values:
                self._queued.append(_rows_step(_INSERT_OPERATIONS, values))
                entries = _scope_entries(values, scopes)
                if entries:
                    self._queued.append(_rows_step(_INSERT_SCOPES, entries))
                self._max_delivery = delivery
                tails = self.tails
                if tails is not None:
                    for value in values:
                        node, seq = value[2], value[3]
                        if seq > tails.get(node, 0):
                            tails[node] = seq
                self._appended.update(v[1] for v in values)
                self._absent.difference_update(self._appended)
        return result

    async def save_rows(self, rows: Iterable[RecordRow]) -> None:
        self._check()
        values = [
            (row.collection, row.record_id, row.state_json(), _codec.encode_optional(row.record))
            for row in _codec.check_rows(rows)
        ]
        if values:
            self._queued.append(_rows_step(_INSERT_RECORDS, values, _ON_RECORD_CONFLICT))

    async def set_meta(self, key: str, value: str) -> None:
        self._check()
        _codec.check_meta(key, value)
        self._queued.append(
            (
                "execute",
                "INSERT INTO offline_meta (key, value) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )
        )


def create_sqlite_server_store(
    filename: str | os.PathLike[str] = DEFAULT_SQLITE_FILENAME,
) -> SQLiteServerStore:
    """A server store in the SQLite file ``filename`` (created with its directory if missing).

    Synchronous: the file is opened on first use (normally ``await store.set_schema(schema)``).
    """
    return SQLiteServerStore(filename)
