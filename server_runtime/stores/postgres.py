"""``PostgresServerStore``: the server's store in PostgreSQL, through an asyncpg pool.

Several server processes may share one database (DESIGN.md section 4):

- A writer holds the in-process write lock, then a transaction on a pooled connection that starts with
  ``pg_advisory_xact_lock(key)``, so writers in every process are serialised. The lock is released only after
  the commit is visible, so delivery sequences (taken from the ``delivery`` BIGSERIAL's sequence while the
  lock is held) increase in commit order and a reader never finds a new operation below one it has seen.
  A rolled-back writer may leave a gap in the numbers; gaps are harmless (clients resume "after N").
- A writer that stored operations runs ``pg_notify(channel, '<max delivery>')`` inside its transaction, so the
  notification fires at commit. ``listen`` keeps a dedicated connection LISTENing on the channel and calls
  back with that number whenever *another* store object (another process) committed; the store's own commits
  are recognised by their delivery number and skipped. If that connection drops it is re-established, and the
  callbacks are then called with the current max delivery so nothing committed meanwhile is missed.
- Lock key and channel are derived from the store's schema (``current_schema()``): ``offline_operations``
  and a constant key for ``public``, so deployments in other schemas of one database stay independent.

Columns ``wire``, ``state`` and ``record`` are TEXT (byte-exact JSON); ``scope`` is JSONB. Catch-ups of
sessions that see part of the log read indexes of collections and scope values, as the SQLite store's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, ClassVar, Final

import asyncpg  # type: ignore[import-untyped, unused-ignore]

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
)
from .base import scoped_statements as base_scoped_statements

__all__ = [
    "DEFAULT_CHANNEL",
    "DEFAULT_LOCK_KEY",
    "PostgresServerStore",
    "create_relational_server_store",
    "normalize_postgres_url",
]

log = logging.getLogger("offline.server.store")

#: NOTIFY channel of the stores in schema ``public``.
DEFAULT_CHANNEL: Final = "offline_operations"
#: ``pg_advisory_xact_lock`` key of the stores in schema ``public`` (b"offline\0" as a big-endian int64).
DEFAULT_LOCK_KEY: Final = 0x6F66666C696E6500
_CLOSE_TIMEOUT: Final = 10.0
_RECONNECT_MAX_DELAY: Final = 5.0
_OWN_NOTIFICATIONS_MAX: Final = 10_000

_DDL: Final = """
CREATE TABLE IF NOT EXISTS offline_operations (
    delivery BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    node_id TEXT NOT NULL,
    sequence_number BIGINT NOT NULL,
    collection TEXT NOT NULL,
    record_id TEXT NOT NULL,
    wire TEXT NOT NULL,
    scope JSONB
);
CREATE INDEX IF NOT EXISTS offline_operations_node_sequence ON offline_operations (node_id, sequence_number);
CREATE INDEX IF NOT EXISTS offline_operations_record ON offline_operations (collection, record_id, delivery);
CREATE INDEX IF NOT EXISTS offline_operations_collection ON offline_operations (collection, delivery);
CREATE TABLE IF NOT EXISTS offline_operation_scopes (
    collection TEXT NOT NULL,
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    delivery BIGINT NOT NULL,
    PRIMARY KEY (collection, field, value, delivery)
);
CREATE TABLE IF NOT EXISTS offline_records (
    collection TEXT NOT NULL,
    record_id TEXT NOT NULL,
    state TEXT NOT NULL,
    record TEXT,
    PRIMARY KEY (collection, record_id)
);
CREATE TABLE IF NOT EXISTS offline_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS offline_nodes (
    node_id TEXT PRIMARY KEY,
    principal TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS offline_record_versions (
    collection TEXT NOT NULL,
    record_id TEXT NOT NULL,
    versions TEXT NOT NULL,
    PRIMARY KEY (collection, record_id)
);
CREATE TABLE IF NOT EXISTS offline_compacted_nodes (
    node_id TEXT PRIMARY KEY,
    sequence_number BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS offline_nodes_principal ON offline_nodes (principal);
"""

_STATS_SQL: Final = """
    SELECT NULL::text, COUNT(*), COALESCE(MAX(delivery), 0) FROM offline_operations
    UNION ALL
    SELECT collection, COUNT(record), COUNT(*) - COUNT(record) FROM offline_records GROUP BY collection
"""
_SINCE_SQL: Final = "SELECT delivery, wire, scope::text FROM offline_operations WHERE delivery > $1 ORDER BY delivery LIMIT $2"
_LOAD_ROWS_SQL: Final = """
    SELECT r.collection, r.record_id, r.state, r.record
    FROM offline_records r JOIN unnest($1::text[], $2::text[]) AS k(collection, record_id)
        USING (collection, record_id)
"""
_INSERT_SCOPES_SQL: Final = """
    INSERT INTO offline_operation_scopes (collection, field, value, delivery)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
"""
#: Catch-up pages (``operations_in_scope``): one collection's operations, or one scope value's
#: (``offline_operation_scopes``, see the SQLite store), in delivery order from the start of the page, each a
#: search of an index (tests check the plans).
SCOPED_COLLECTION_SQL: Final = (
    "SELECT delivery, node_id, collection, record_id, scope::text, wire FROM offline_operations"
    " WHERE collection = $1 AND delivery > $2 ORDER BY delivery LIMIT $3"
)
SCOPED_VALUE_SQL: Final = (
    "SELECT o.delivery, o.node_id, o.collection, o.record_id, o.scope::text, o.wire"
    " FROM offline_operation_scopes AS s JOIN offline_operations AS o ON o.delivery = s.delivery"
    " WHERE s.collection = $1 AND s.field = $2 AND s.value = $3 AND s.delivery > $4"
    " ORDER BY s.delivery LIMIT $5"
)
_DB_ERRORS: Final = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, asyncio.TimeoutError)


def normalize_postgres_url(url: str) -> str:
    """Accept ``postgres://``, ``postgresql://`` and SQLAlchemy-style ``postgresql+driver://`` URLs."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("a PostgreSQL connection string is required")
    url = url.strip()
    match = re.match(r"^(postgres(?:ql)?)(\+[A-Za-z0-9_]+)?://", url)
    if not match:
        raise ValueError("a PostgreSQL connection string starts with postgres:// or postgresql://")
    return "postgresql://" + url[match.end() :]


def redact_url(url: str) -> str:
    """``url`` without its password (for messages and logs)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _names_for_schema(schema: str) -> tuple[str, int]:
    """(NOTIFY channel, advisory lock key) of a store whose tables live in ``schema``."""
    if schema == "public":
        return DEFAULT_CHANNEL, DEFAULT_LOCK_KEY
    digest = hashlib.sha256(f"offline:{schema}".encode()).digest()
    key = int.from_bytes(digest[:8], "big", signed=True)
    channel = f"{DEFAULT_CHANNEL}.{schema}"
    if len(channel.encode()) > 63:  # identifiers are cut at NAMEDATALEN - 1 bytes
        channel = f"{DEFAULT_CHANNEL}.{digest.hex()[:32]}"
    return channel, key


def _listener_name(channel: str) -> str:
    """The ``application_name`` of a LISTEN connection on ``channel``: how `other_servers` finds the other
    processes of this database+schema in ``pg_stat_activity`` (a name must be ASCII, at most 63 bytes)."""
    name = f"offline-listen:{channel}"
    if not name.isascii() or len(name) > 63:
        name = "offline-listen:" + hashlib.sha256(channel.encode()).hexdigest()[:40]
    return name


def _quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def scoped_statements(
    after: int, limit: int, selectors: Sequence[ScopeSelector]
) -> list[tuple[str, tuple[Any, ...]]]:
    """The query of each selector in a catch-up page (see `PostgresServerStore.operations_in_scope`)."""
    return base_scoped_statements(
        after, limit, selectors, collection_sql=SCOPED_COLLECTION_SQL, value_sql=SCOPED_VALUE_SQL
    )


def _scope_columns(
    entries: Iterable[tuple[int, str, Mapping[str, Any] | None]],
) -> tuple[list[str], list[str], list[str], list[int]]:
    """``offline_operation_scopes`` rows, as columns, of ``(delivery, collection, scope snapshot)``."""
    columns: tuple[list[str], list[str], list[str], list[int]] = ([], [], [], [])
    for delivery, collection, scope in entries:
        if not scope:
            continue
        for field, key in sorted(scope_index_entries(scope)):
            columns[0].append(collection)
            columns[1].append(field)
            columns[2].append(key)
            columns[3].append(delivery)
    return columns


async def _index_scopes(conn: Any) -> None:
    """Fill ``offline_operation_scopes`` from a log stored before it existed, once, inside the caller's
    transaction (page by page: the log may be large)."""
    after = 0
    while True:
        rows = await conn.fetch(
            "SELECT delivery, collection, scope::text FROM offline_operations"
            " WHERE delivery > $1 AND scope IS NOT NULL ORDER BY delivery LIMIT $2",
            after,
            _codec.PAGE_SIZE,
        )
        if not rows:
            return
        if after == 0:
            log.warning("PostgreSQL store: indexing the operation log's scopes (once)")
        columns = _scope_columns((int(r[0]), str(r[1]), _codec.decode_optional(r[2])) for r in rows)
        if columns[0]:
            await conn.execute(_INSERT_SCOPES_SQL, *columns)
        after = int(rows[-1][0])


async def _operations_since(conn: Any, after: int, limit: int | None) -> list[StoredOperation]:
    rows = await conn.fetch(_SINCE_SQL, int(after), None if limit is None else max(int(limit), 0))
    return [_codec.stored_operation(r[0], r[1], r[2]) for r in rows]


async def _load_rows(
    conn: Any, keys: Iterable[RecordKey], refold: Callable[[Operation], Any]
) -> dict[RecordKey, RecordRow]:
    unique = list(dict.fromkeys(keys))
    if not unique:
        return {}
    rows = await conn.fetch(_LOAD_ROWS_SQL, [k[0] for k in unique], [k[1] for k in unique])
    return {(r[0], r[1]): _codec.record_row(r[0], r[1], r[2], r[3], refold) for r in rows}


class PostgresServerStore(ServerStore):
    """The server store in PostgreSQL (see the module docstring). Build with ``create_relational_server_store``."""

    kind: ClassVar[StoreKind] = "postgresql"

    def __init__(self, pool: Any, url: str, schema_name: str) -> None:
        super().__init__()
        self._pool = pool
        self._url = url
        self.schema_name = schema_name
        self.channel, self.lock_key = _names_for_schema(schema_name)
        self._sequence = ""  # the delivery column's sequence, found by _prepare
        self._write_lock = asyncio.Lock()
        self._prepare_lock = asyncio.Lock()
        self._callbacks: list[NotifyCallback] = []
        self._listen_conn: Any = None
        self._listen_lock = asyncio.Lock()
        self._reconnect_task: asyncio.Task[None] | None = None
        self._callback_tasks: set[asyncio.Future[Any]] = set()
        # Max deliveries this object notified and has not yet seen come back on its own LISTEN connection.
        self._own_notifications: set[int] = set()

    def __repr__(self) -> str:
        return f"PostgresServerStore({redact_url(self._url)!r}, schema={self.schema_name!r})"

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except _DB_ERRORS as exc:
            raise _codec.storage_error(self.kind, action, exc) from exc

    # ------------------------------------------------------------------------------------------ lifecycle

    async def _prepare(self) -> None:
        self._check_open()
        if self._sequence:
            return
        async with self._prepare_lock:
            if self._sequence:
                return
            with self._errors("creating tables"):
                async with self._pool.acquire() as conn, conn.transaction():
                    # Two processes starting at once must not race on CREATE TABLE IF NOT EXISTS.
                    await conn.execute("SELECT pg_advisory_xact_lock($1)", self.lock_key)
                    indexed = await conn.fetchval(
                        "SELECT to_regclass(format('%I.%I', $1::text, 'offline_operation_scopes')) IS NOT NULL",
                        self.schema_name,
                    )
                    await conn.execute(_DDL)
                    if not indexed:
                        await _index_scopes(conn)
                    sequence = await conn.fetchval(
                        "SELECT pg_get_serial_sequence(format('%I.%I', $1::text, 'offline_operations'), 'delivery')",
                        self.schema_name,
                    )
            if not sequence:
                raise _codec.storage_error(
                    self.kind, "creating tables", RuntimeError("offline_operations.delivery has no sequence")
                )
            self._sequence = str(sequence)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reconnect_task
        async with self._listen_lock:
            conn, self._listen_conn = self._listen_conn, None
            if conn is not None:
                await _close_connection(conn)
        for task in list(self._callback_tasks):
            task.cancel()
        # Let a writer in progress finish before the pool goes away.
        async with self._write_lock:
            try:
                await asyncio.wait_for(self._pool.close(), _CLOSE_TIMEOUT)
            except Exception:
                log.warning("PostgreSQL store: the pool did not close in time; terminating it")
                self._pool.terminate()

    # -------------------------------------------------------------------------------------------- writing

    def writer(self, *, optimistic: bool = False) -> AbstractAsyncContextManager[StoreWriter]:
        return self._writer()  # always holds the lock from the start (a WriteConflict cannot happen)

    @asynccontextmanager
    async def _writer(self) -> AsyncIterator[StoreWriter]:
        await self._prepare()
        async with self._write_lock:
            self._check_open()
            async with contextlib.AsyncExitStack() as stack:
                with self._errors("beginning a write transaction"):
                    conn = await stack.enter_async_context(self._pool.acquire())
                    transaction = conn.transaction()
                    await transaction.start()
                writer = _PostgresWriter(self, conn)
                notified: int | None = None
                try:
                    with self._errors("taking the write lock"):
                        await conn.execute("SELECT pg_advisory_xact_lock($1)", self.lock_key)
                    yield writer
                    writer.active = False
                    with self._errors("committing"):
                        if writer.max_appended is not None:
                            notified = writer.max_appended
                            if self._callbacks:
                                self._remember_own(notified)
                            await conn.execute("SELECT pg_notify($1, $2)", self.channel, str(notified))
                        await transaction.commit()
                except BaseException:
                    writer.active = False
                    if notified is not None:
                        self._own_notifications.discard(notified)
                    try:
                        await transaction.rollback()
                    except Exception:
                        log.debug("rollback of a failed PostgreSQL write transaction failed", exc_info=True)
                    raise

    def _remember_own(self, delivery: int) -> None:
        own = self._own_notifications
        own.add(delivery)
        if len(own) > _OWN_NOTIFICATIONS_MAX:  # notifications lost with a dropped LISTEN connection
            for stale in sorted(own)[: len(own) - _OWN_NOTIFICATIONS_MAX // 2]:
                own.discard(stale)

    # -------------------------------------------------------------------------------------------- reading

    @asynccontextmanager
    async def _reading(self, action: str) -> AsyncIterator[Any]:
        await self._prepare()
        with self._errors(action):
            async with self._pool.acquire() as conn:
                yield conn

    async def get_meta(self, key: str) -> str | None:
        _codec.check_meta(key)
        async with self._reading("reading meta") as conn:
            value = await conn.fetchval("SELECT value FROM offline_meta WHERE key = $1", key)
        return None if value is None else str(value)

    async def operations_since(self, after: int, limit: int | None = None) -> list[StoredOperation]:
        async with self._reading("reading operations") as conn:
            return await _operations_since(conn, after, limit)

    async def operation_texts_since(self, after: int, limit: int | None = None) -> list[OperationText]:
        """``operations_since`` as stored, undecoded (`OperationText`): the relay sends the wire text as it
        is, instead of decoding every operation of a catch-up and encoding it again."""
        async with self._reading("reading operations") as conn:
            rows = await conn.fetch(
                "SELECT delivery, node_id, collection, record_id, scope::text, wire FROM offline_operations"
                " WHERE delivery > $1 ORDER BY delivery LIMIT $2",
                int(after),
                None if limit is None else max(int(limit), 0),
            )
        return [(int(r[0]), str(r[1]), str(r[2]), str(r[3]), r[4], str(r[5])) for r in rows]

    async def operations_in_scope(
        self, after: int, limit: int, selectors: Sequence[ScopeSelector]
    ) -> ScopedPage:
        limit = max(int(limit), 1)
        statements = scoped_statements(after, limit, selectors)
        # One snapshot of the log for the highest delivery and every selector's page.
        async with (
            self._reading("reading a catch-up page") as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            top = int(await conn.fetchval("SELECT COALESCE(MAX(delivery), 0) FROM offline_operations"))
            pages = [
                [
                    (int(r[0]), str(r[1]), str(r[2]), str(r[3]), r[4], str(r[5]))
                    for r in await conn.fetch(sql, *params)
                ]
                for sql, params in statements
            ]
        return merge_selected(pages, limit, top)

    async def record_operations(self, collection: str, record_id: str, before: int) -> list[StoredOperation]:
        async with self._reading("reading a record's operations") as conn:
            rows = await conn.fetch(
                "SELECT delivery, wire, scope FROM offline_operations"
                " WHERE collection = $1 AND record_id = $2 AND delivery < $3 ORDER BY delivery",
                collection,
                record_id,
                int(before),
            )
        return [_codec.stored_operation(r["delivery"], r["wire"], r["scope"]) for r in rows]

    async def max_delivery(self) -> int:
        async with self._reading("reading the max delivery") as conn:
            return int(await conn.fetchval("SELECT COALESCE(MAX(delivery), 0) FROM offline_operations"))

    async def load_all_rows(self) -> AsyncIterator[RecordRow]:
        last: RecordKey | None = None
        while True:
            async with self._reading("reading records") as conn:
                if last is None:
                    rows = await conn.fetch(
                        "SELECT collection, record_id, state, record FROM offline_records"
                        " ORDER BY collection, record_id LIMIT $1",
                        _codec.PAGE_SIZE,
                    )
                else:
                    rows = await conn.fetch(
                        "SELECT collection, record_id, state, record FROM offline_records"
                        " WHERE (collection, record_id) > ($1, $2) ORDER BY collection, record_id LIMIT $3",
                        *last,
                        _codec.PAGE_SIZE,
                    )
            for r in rows:
                yield _codec.record_row(r[0], r[1], r[2], r[3], self._refold_state)
            if len(rows) < _codec.PAGE_SIZE:
                return
            last = (rows[-1][0], rows[-1][1])

    async def load_rows(self, keys: Iterable[RecordKey]) -> dict[RecordKey, RecordRow]:
        async with self._reading("reading records") as conn:
            return await _load_rows(conn, keys, self._refold_state)

    async def version_vector(self) -> dict[str, int]:
        async with self._reading("reading the version vector") as conn:
            rows = await conn.fetch(
                "SELECT node_id, MAX(sequence_number) FROM offline_operations GROUP BY node_id"
            )
        return {str(r[0]): int(r[1]) for r in rows}

    async def stats(self) -> dict[str, Any]:
        async with self._reading("reading statistics") as conn:
            rows = await conn.fetch(_STATS_SQL)
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

    # ------------------------------------------------------------------------------------- node registry

    async def claim_node(self, node_id: str, principal: str, *, replacing: str | None = None) -> str:
        _codec.check_node_claim(node_id, principal)
        # Not under the write lock: the primary key decides between processes claiming at once (the loser's
        # insert waits for the winner's commit, then does nothing), and a handshake need not queue behind
        # the write pipeline.
        async with self._reading("registering a node") as conn:
            await conn.execute(
                "INSERT INTO offline_nodes (node_id, principal) VALUES ($1, $2) ON CONFLICT (node_id)"
                " DO UPDATE SET principal = excluded.principal WHERE offline_nodes.principal = $3",
                node_id,
                principal,
                replacing,
            )
            owner = await conn.fetchval("SELECT principal FROM offline_nodes WHERE node_id = $1", node_id)
        return str(owner)

    async def node_principals(self, node_ids: Iterable[str]) -> dict[str, str]:
        wanted = list(dict.fromkeys(node_ids))
        if not wanted:
            return {}
        async with self._reading("reading node registrations") as conn:
            rows = await conn.fetch(
                "SELECT node_id, principal FROM offline_nodes WHERE node_id = ANY($1::text[])", wanted
            )
        return {str(r["node_id"]): str(r["principal"]) for r in rows}

    async def node_scopes(self, node_id: str) -> list[tuple[str, dict[str, Any] | None]]:
        async with self._reading("reading a node's operations") as conn:
            rows = await conn.fetch(
                "SELECT DISTINCT collection, scope::text FROM offline_operations WHERE node_id = $1", node_id
            )
        return [(str(r[0]), _codec.decode_optional(r[1])) for r in rows]

    async def node_registrations(self) -> dict[str, str]:
        async with self._reading("reading node registrations") as conn:
            rows = await conn.fetch("SELECT node_id, principal FROM offline_nodes ORDER BY node_id")
        return {str(r["node_id"]): str(r["principal"]) for r in rows}

    async def principal_nodes(self, principal: str) -> list[str]:
        async with self._reading("reading node registrations") as conn:
            rows = await conn.fetch(
                "SELECT node_id FROM offline_nodes WHERE principal = $1 ORDER BY node_id", principal
            )
        return [str(r["node_id"]) for r in rows]

    # -------------------------------------------------------------------------------------- notifications

    async def listen(self, callback: NotifyCallback) -> None:
        """Call ``callback(max_delivery)`` after every commit of another store object on this database+schema.

        The callback may be a plain function or a coroutine function (run as a task); its exceptions are
        logged. Notifications of commits made while the LISTEN connection was down are replaced by one call
        with the then current max delivery after it is re-established.
        """
        self._check_open()
        if not callable(callback):
            raise TypeError("listen() takes a callable")
        await self._prepare()
        self._callbacks.append(callback)
        try:
            await self._ensure_listener()
        except BaseException:
            self._callbacks.remove(callback)
            raise

    async def other_servers(self) -> int:
        own = self._listen_conn
        own_pid = own.get_server_pid() if own is not None else 0
        async with self._reading("counting the server processes sharing this database") as conn:
            count = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = $1 AND pid <> $2",
                _listener_name(self.channel),
                own_pid,
            )
        return int(count)

    async def compact(self, horizon: int | None = None) -> dict[str, Any]:
        async with self.writer() as writer:
            assert isinstance(writer, _PostgresWriter)
            conn = writer.conn
            with self._errors("compacting the operation log"):
                top = int(await conn.fetchval("SELECT COALESCE(MAX(delivery), 0) FROM offline_operations"))
                horizon = compaction.bounded(horizon, top)
                rows = await conn.fetch(
                    "SELECT delivery, node_id, sequence_number, collection, record_id, scope::text"
                    " FROM offline_operations WHERE delivery <= $1 ORDER BY delivery",
                    horizon,
                )
                done = compaction.plan(
                    ((int(d), str(n), int(q), str(c), str(r), sc) for d, n, q, c, r, sc in rows), horizon
                )
                stored = await _stored_versions(conn, done.record_versions)
                await conn.execute(
                    "DELETE FROM offline_operations WHERE delivery = ANY($1::bigint[])", done.deliveries
                )
                if done.scope_rows:
                    await conn.execute(
                        "DELETE FROM offline_operation_scopes s USING unnest($1::text[], $2::text[], $3::text[],"
                        " $4::bigint[]) AS d(c, f, v, n) WHERE s.collection = d.c AND s.field = d.f"
                        " AND s.value = d.v AND s.delivery = d.n",
                        *(list(column) for column in zip(*done.scope_rows, strict=True)),
                    )
                await _record_compaction(conn, stored, done.record_versions, done.node_marks)
            await writer.set_meta(compaction.HORIZON_KEY, str(horizon))
        return done.result()

    async def compacted_history(self) -> tuple[dict[RecordKey, dict[str, int]], dict[str, int]]:
        async with self._reading("reading what compaction recorded") as conn:
            versions = await conn.fetch("SELECT collection, record_id, versions FROM offline_record_versions")
            marks = await conn.fetch("SELECT node_id, sequence_number FROM offline_compacted_nodes")
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
        async with self.writer() as writer:
            assert isinstance(writer, _PostgresWriter)
            await writer.save_rows(rows)
            with self._errors("restoring what compaction recorded"):
                stored = await _stored_versions(writer.conn, record_versions)
                await _record_compaction(writer.conn, stored, record_versions, node_marks)
            await writer.set_meta(compaction.HORIZON_KEY, str(int(horizon)))

    async def record_versions(self, keys: Iterable[RecordKey]) -> dict[RecordKey, dict[str, int]]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        async with self._reading("reading record versions") as conn:
            stored = await _stored_versions(conn, wanted)
            rows = await conn.fetch(
                "SELECT o.collection, o.record_id, o.node_id, MAX(o.sequence_number) FROM offline_operations o"
                " JOIN unnest($1::text[], $2::text[]) AS k(collection, record_id) USING (collection, record_id)"
                " GROUP BY o.collection, o.record_id, o.node_id",
                [c for c, _ in wanted],
                [r for _, r in wanted],
            )
        kept: dict[RecordKey, dict[str, int]] = {}
        for c, r, n, q in rows:
            kept.setdefault((str(c), str(r)), {})[str(n)] = int(q)
        out: dict[RecordKey, dict[str, int]] = {}
        for key in wanted:
            versions = compaction.merge_versions(stored.get(key), kept.get(key))
            if versions:
                out[key] = versions
        return out

    async def _ensure_listener(self) -> None:
        async with self._listen_lock:
            if self._listen_conn is not None or self._closed:
                return
            with self._errors("starting to LISTEN"):
                conn = await asyncpg.connect(
                    self._url, server_settings={"application_name": _listener_name(self.channel)}
                )
                try:
                    await conn.add_listener(self.channel, self._on_notification)
                except BaseException:
                    await _close_connection(conn)
                    raise
            conn.add_termination_listener(self._on_listener_lost)
            self._listen_conn = conn

    def _on_notification(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        try:
            delivery = int(payload)
        except ValueError:
            log.warning("PostgreSQL store: ignoring a notification on %s with payload %r", channel, payload)
            return
        if delivery in self._own_notifications:
            self._own_notifications.discard(delivery)
            return
        self._dispatch(delivery)

    def _dispatch(self, delivery: int) -> None:
        if self._closed:
            return
        for callback in list(self._callbacks):
            try:
                result = callback(delivery)
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._callback_tasks.add(task)
                    task.add_done_callback(self._callback_done)
            except Exception:
                log.exception("PostgreSQL store: a listen callback raised")

    def _callback_done(self, task: asyncio.Future[Any]) -> None:
        self._callback_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("PostgreSQL store: a listen callback raised", exc_info=task.exception())

    def _on_listener_lost(self, conn: Any) -> None:
        if self._closed or conn is not self._listen_conn:
            return
        self._listen_conn = None
        log.warning("PostgreSQL store: the LISTEN connection was lost; reconnecting")
        if self._reconnect_task is None or self._reconnect_task.done():
            self._reconnect_task = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        delay = 0.1
        while not self._closed:
            try:
                await self._ensure_listener()
                latest = await self.max_delivery()
            except Exception as exc:
                log.warning("PostgreSQL store: LISTEN reconnect failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RECONNECT_MAX_DELAY)
                continue
            self._dispatch(latest)  # catch up on whatever was committed while the connection was down
            return


async def _record_compaction(
    conn: Any,
    stored: Mapping[RecordKey, Mapping[str, int]],
    record_versions: Mapping[RecordKey, Mapping[str, int]],
    node_marks: Mapping[str, int],
) -> None:
    """Merge ``record_versions`` (over ``stored``, what the table holds of them) and ``node_marks`` into
    what compaction recorded."""
    versions = [
        (c, r, compaction.versions_text(compaction.merge_versions(stored.get((c, r)), v)))
        for (c, r), v in record_versions.items()
    ]
    if versions:
        await conn.execute(
            "INSERT INTO offline_record_versions (collection, record_id, versions)"
            " SELECT * FROM unnest($1::text[], $2::text[], $3::text[])"
            " ON CONFLICT (collection, record_id) DO UPDATE SET versions = EXCLUDED.versions",
            *(list(column) for column in zip(*versions, strict=True)),
        )
    if node_marks:
        await conn.execute(
            "INSERT INTO offline_compacted_nodes (node_id, sequence_number)"
            " SELECT * FROM unnest($1::text[], $2::bigint[])"
            " ON CONFLICT (node_id) DO UPDATE SET sequence_number"
            " = GREATEST(offline_compacted_nodes.sequence_number, EXCLUDED.sequence_number)",
            list(node_marks),
            [int(q) for q in node_marks.values()],
        )


async def _stored_versions(conn: Any, keys: Iterable[RecordKey]) -> dict[RecordKey, dict[str, int]]:
    """``offline_record_versions`` of these records (those that have a row)."""
    keys = list(keys)
    if not keys:
        return {}
    rows = await conn.fetch(
        "SELECT v.collection, v.record_id, v.versions FROM offline_record_versions v"
        " JOIN unnest($1::text[], $2::text[]) AS k(collection, record_id) USING (collection, record_id)",
        [c for c, _ in keys],
        [r for _, r in keys],
    )
    return {(str(c), str(r)): compaction.parse_versions(v) for c, r, v in rows}


async def _close_connection(conn: Any) -> None:
    try:
        await asyncio.wait_for(conn.close(), _CLOSE_TIMEOUT)
    except Exception:
        conn.terminate()


class _PostgresWriter(StoreWriter):
    def __init__(self, store: PostgresServerStore, conn: Any) -> None:
        self.store = store
        self.conn = conn
        self.active = True
        self.max_appended: int | None = None

    def _check(self) -> None:
        self.store._check_open()
        if not self.active:
            raise RuntimeError("a store writer is only valid inside its 'async with' block")

    async def operations_since(self, after: int, limit: int | None = None) -> list[StoredOperation]:
        self._check()
        with self.store._errors("reading operations"):
            return await _operations_since(self.conn, after, limit)

    async def compaction_horizon(self) -> int | None:
        # On this writer's connection: the pool may have no other one free while it is held.
        self._check()
        with self.store._errors("reading the compaction horizon"):
            value = await self.conn.fetchval(
                "SELECT value FROM offline_meta WHERE key = $1", compaction.HORIZON_KEY
            )
        return int(value or 0)

    async def known_ids(self, ids: Iterable[str]) -> set[str]:
        self._check()
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return set()
        with self.store._errors("reading operation ids"):
            rows = await self.conn.fetch(
                "SELECT id FROM offline_operations WHERE id = ANY($1::text[])", wanted
            )
        return {str(r[0]) for r in rows}

    async def load_rows(self, keys: Iterable[RecordKey]) -> dict[RecordKey, RecordRow]:
        self._check()
        with self.store._errors("reading records"):
            return await _load_rows(self.conn, keys, self.store._refold_state)

    async def held_places(self, places: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str]:
        self._check()
        wanted = list(dict.fromkeys(places))
        if not wanted:
            return {}
        with self.store._errors("reading sequence numbers"):
            rows = await self.conn.fetch(
                "SELECT o.node_id, o.sequence_number, o.id FROM offline_operations o"
                " JOIN unnest($1::text[], $2::bigint[]) AS w(node_id, sequence_number)"
                " USING (node_id, sequence_number)",
                [n for n, _ in wanted],
                [s for _, s in wanted],
            )
            marks = await self.conn.fetch(
                "SELECT node_id, sequence_number FROM offline_compacted_nodes WHERE node_id = ANY($1::text[])",
                list(dict.fromkeys(n for n, _ in wanted)),
            )
        held = {(str(r[0]), int(r[1])): str(r[2]) for r in rows}
        return compaction.with_compacted(held, wanted, {str(n): int(q) for n, q in marks})

    async def append(self, ops: Sequence[tuple[Operation, Mapping[str, Any] | None]]) -> list[int | None]:
        self._check()
        _codec.check_appends(ops)
        if not ops:
            return []
        seen = await self.known_ids(op.id for op, _ in ops)
        fresh: list[tuple[int, Operation, Mapping[str, Any] | None]] = []
        for index, (op, scope) in enumerate(ops):
            if op.id not in seen:
                seen.add(op.id)
                fresh.append((index, op, scope))
        result: list[int | None] = [None] * len(ops)
        if not fresh:
            return result
        columns: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [])
        with self.store._errors("appending operations"):
            numbers = await self.conn.fetch(
                f"SELECT nextval({_quote_literal(self.store._sequence)}) FROM generate_series(1, $1)",
                len(fresh),
            )
            # Sorted, so deliveries follow the list order whatever order the rows came back in.
            deliveries = sorted(int(r[0]) for r in numbers)
            for delivery, (index, op, scope) in zip(deliveries, fresh, strict=True):
                result[index] = delivery
                for column, value in zip(
                    columns,
                    (
                        delivery,
                        op.id,
                        op.node_id,
                        op.sequence_number,
                        op.collection,
                        op.record_id,
                        _codec.encode_operation(op),
                        _codec.encode_optional(scope),
                    ),
                    strict=True,
                ):
                    column.append(value)
            await self.conn.execute(
                """
                INSERT INTO offline_operations
                    (delivery, id, node_id, sequence_number, collection, record_id, wire, scope)
                SELECT d, i, n, s, c, r, w, sc::jsonb
                FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[],
                            $7::text[], $8::text[]) AS t(d, i, n, s, c, r, w, sc)
                """,
                *columns,
            )
            scopes = _scope_columns(
                (delivery, op.collection, scope)
                for delivery, (_, op, scope) in zip(deliveries, fresh, strict=True)
            )
            if scopes[0]:
                await self.conn.execute(_INSERT_SCOPES_SQL, *scopes)
        self.max_appended = max(self.max_appended or 0, deliveries[-1])
        return result

    async def save_rows(self, rows: Iterable[RecordRow]) -> None:
        self._check()
        latest = {row.key: row for row in _codec.check_rows(rows)}  # one statement may not hit a row twice
        if not latest:
            return
        values = [
            (row.collection, row.record_id, row.state_json(), _codec.encode_optional(row.record))
            for row in latest.values()
        ]
        with self.store._errors("saving records"):
            await self.conn.execute(
                """
                INSERT INTO offline_records (collection, record_id, state, record)
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
                ON CONFLICT (collection, record_id) DO UPDATE SET state = EXCLUDED.state, record = EXCLUDED.record
                """,
                *(list(column) for column in zip(*values, strict=True)),
            )

    async def set_meta(self, key: str, value: str) -> None:
        self._check()
        _codec.check_meta(key, value)
        with self.store._errors("writing meta"):
            await self.conn.execute(
                "INSERT INTO offline_meta (key, value) VALUES ($1, $2)"
                " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                key,
                value,
            )


async def create_relational_server_store(
    connection_string: str, *, min_size: int = 1, max_size: int = 10
) -> PostgresServerStore:
    """Connect a pool to PostgreSQL (``postgres://`` or ``postgresql://`` URL) and create the tables.

    The tables live in the connection's ``current_schema()`` (set ``search_path``, e.g. with
    ``?options=-c%20search_path%3Dmyschema``, to use another schema than ``public``).
    """
    url = normalize_postgres_url(connection_string)
    try:
        pool = await asyncpg.create_pool(url, min_size=min_size, max_size=max_size)
    except _DB_ERRORS as exc:
        raise _codec.storage_error("postgresql", f"connecting to {redact_url(url)}", exc) from exc
    try:
        async with pool.acquire() as conn:
            schema = await conn.fetchval("SELECT current_schema()")
        if not schema:
            raise _codec.storage_error(
                "postgresql",
                f"connecting to {redact_url(url)}",
                RuntimeError("no schema of the search_path exists (current_schema() is NULL)"),
            )
        store = PostgresServerStore(pool, url, str(schema))
        await store._prepare()
    except BaseException as exc:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pool.close(), _CLOSE_TIMEOUT)
        if isinstance(exc, _DB_ERRORS):
            raise _codec.storage_error("postgresql", f"preparing {redact_url(url)}", exc) from exc
        raise
    return store
