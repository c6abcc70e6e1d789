"""The local SQLite database: the operation log, merge state, version vector, identity and record tables.

Only the standard `sqlite3` module is used, so the same code runs under Pyodide in a browser.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

from offline.core.errors import STORAGE_ERROR, OfflineError
from offline.core.operations import Operation, operation_from_text, timestamp_text
from offline.core.schema import SchemaDefinition
from offline.merge.engine import RecordState
from offline.merge.values import operation_text
from offline.platform import IS_BROWSER

from .checkpoint import Checkpointer
from .checkpoint import start as start_checkpoints
from .file_lock import FileLock
from .many_rows import write_rows
from .rows import create_table_sql, sync_lookup_indexes

# Status of an operation in the log.
PENDING = 0  # written here, not yet acknowledged by a server
ACKED = 1  # acknowledged (or received from elsewhere)
REJECTED = 2  # refused by the server: kept for the record, excluded from every fold

# Where this node's waiting operations start: every operation of its own numbered below this value is
# acknowledged or refused (a meta key; see `LocalDatabase.advance_pending`). A node's operations are sent
# and acknowledged in sequence order, so the waiting ones are the tail of its part of the log: they are read
# through the log's key from there, and a local write adds nothing but its row. (A partial index of the
# waiting operations did the same job at the price of one more page written to the WAL by every commit:
# a lone insert wrote 5.3 pages instead of 4.2.)
PENDING_FROM_KEY = "pending_from"

# A node's operations waiting for the server, as a FROM ... WHERE fragment for every query reading them
# (a SELECT list before it; more conditions and an ORDER BY may follow): a search of the log's key from
# the lowest number asked for or `PENDING_FROM_KEY`, whichever is higher (read in the statement: the
# committed value, or this transaction's). Two parameters: the node id, the lowest number asked for.
PENDING_OPS = (
    "_offline_ops WHERE node_id = ? AND sequence_number >= max(?, coalesce((SELECT CAST(value AS INTEGER) "
    f"FROM _offline_meta WHERE key = '{PENDING_FROM_KEY}'), 0)) AND status = {PENDING}"
)

# Keyed by (node, sequence number), which a node never reuses: a node's operations are appended in order,
# so a local write adds to the last page of the table. Operation ids are content hashes, spread at random:
# an index on them cost most of the write (a random page per write, hundreds per received batch), so there
# is none. Ids are indexed under their record and node instead, (collection, record id, node, the id's
# first digits: `RECORD_INDEX`): a record's operations are mostly written in order, so that index takes
# appends too. Duplicates are found by
# (node, sequence number), or by the id within its record and node (`held_in_records`: an operation re-sent
# under another sequence number, however old; a record's merge state only recognises a bounded part of its
# history; an id is the hash of content that names the node, so the same id is always the same node's); an
# operation is looked up by its place, or by id within its record, and only a caller that knows neither (a
# refusal from a past session) searches the whole log. The node before the id keeps each record's entries
# in (node, number) order too, which is how compaction reads what it drops (`compaction._fill_dropping`:
# grouped by record and node without a sort).
_OPS_TABLE = """CREATE TABLE IF NOT EXISTS _offline_ops (
        node_id TEXT NOT NULL,
        sequence_number INTEGER NOT NULL,
        id TEXT NOT NULL,
        collection TEXT NOT NULL,
        record_id TEXT NOT NULL,
        hlc TEXT NOT NULL,
        wire TEXT NOT NULL,
        local INTEGER NOT NULL,
        status INTEGER NOT NULL DEFAULT 0,
        delivery INTEGER,
        PRIMARY KEY (node_id, sequence_number)
    ) WITHOUT ROWID"""
_OPS_COLUMNS = "node_id, sequence_number, id, collection, record_id, hlc, wire, local, status, delivery"
# The log's index by record. Of an operation's id it holds the first 16 hex digits (64 bits), not all 64:
# every applied operation writes an entry in its record's place, and the whole id made the entry half as big
# again as all the rest (its pages were a quarter of what a fold wrote). The prefix finds one operation among
# its record's and node's as well; the row's full id is compared too (two ids sharing a prefix are both read).
RECORD_INDEX = "_offline_ops_record_key"
ID_KEY_DIGITS = 16
ID_KEY = f"substr(id, 1, {ID_KEY_DIGITS})"

# A row's text (``wire``) leaves out how every operation this library encodes begins, its id and its node
# (``{"id":"…","nodeId":"…"``), which the row's own columns hold: some 120 of an operation's 440-odd bytes,
# more than the causal context each operation carries since issue 24 added. What is left starts with ",",
# which no JSON text does; a text with its keys in another order (received from a peer whose encoder orders
# them otherwise) is stored whole, as every row written before was. `WIRE` (`wire_sql` for a table alias)
# reads either kind as the whole text, in SQL: every reader gets the text the operation was sent as, byte
# for byte, and an operation is still sent as the text it was received as.


def stored_text(op_id: str, node_id: str, text: str) -> str:
    """``text`` (an operation's wire text) as a log row holds it (see `WIRE`)."""
    head = '{"id":"' + op_id + '","nodeId":"' + node_id + '"'
    if text.startswith(head) and text.startswith(",", len(head)):
        return text[len(head) :]
    return text


def wire_sql(table: str = "") -> str:
    """SQL reading a log row's whole wire text (columns of ``table``, an alias, when given)."""
    t = table + "." if table else ""
    head = '\'{"id":"\' || ' + t + 'id || \'","nodeId":"\' || ' + t + "node_id || '\"'"
    return f"CASE WHEN substr({t}wire, 1, 1) = ',' THEN {head} || {t}wire ELSE {t}wire END"


WIRE = wire_sql()

_INTERNAL = (
    """CREATE TABLE IF NOT EXISTS _offline_meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)""",
    _OPS_TABLE,
    # Records are mostly written in the order they were created (UUID v7 ids): appends again. The id's key
    # last: the lookup of an operation within its record's and node's (`held_in_records`). It replaces the
    # earlier indexes on (collection, record_id), on (collection, record_id, id) and on (collection,
    # record_id, node_id, id).
    f"CREATE INDEX IF NOT EXISTS {RECORD_INDEX} ON _offline_ops (collection, record_id, node_id, {ID_KEY})",
    """DROP INDEX IF EXISTS _offline_ops_record_node""",
    """DROP INDEX IF EXISTS _offline_ops_record_id""",
    """DROP INDEX IF EXISTS _offline_ops_record""",
    """CREATE TABLE IF NOT EXISTS _offline_vv (node_id TEXT PRIMARY KEY NOT NULL, seq INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS _offline_state (
        collection TEXT NOT NULL, record_id TEXT NOT NULL, state TEXT NOT NULL,
        PRIMARY KEY (collection, record_id)
    ) WITHOUT ROWID""",
    # Operations the server refused, kept with its reason and the record as this device had written it, so
    # the user's data stays recoverable after the record shows the server's state (see replication.py).
    """CREATE TABLE IF NOT EXISTS _offline_rejected (
        operation_id TEXT PRIMARY KEY NOT NULL, collection TEXT NOT NULL, record_id TEXT NOT NULL,
        type TEXT NOT NULL, code TEXT NOT NULL, message TEXT NOT NULL, data TEXT, rejected_at INTEGER NOT NULL
    )""",
)


# A record whose merge state is what its one operation makes of an empty state (a record just inserted, the
# usual case) stores a reference to that operation, "@" + its id, instead of the state's text: the log holds
# the operation anyway, and the state is a function of the operations (DESIGN.md section 3), so writing the
# text would only cost its encoding and its bytes. Readers refold the operation; a state text is JSON, so
# never starts with "@".
STATE_REFERENCE = "@"
# A record whose merge state is its compaction base (``_offline_compacted.state``: a server's state taken by
# a state-based catch-up, `compaction.adopt_states`, with nothing folded on it since) stores "=" instead of
# the same text a second time (issue 28: the first sync of a fresh browser wrote every state twice, ~45 % of
# its bytes). Readers read the base; the first write folding anything on the record stores its text.
STATE_BASE = "="


def _upgrade_operation_log(conn: sqlite3.Connection) -> None:
    """Rebuild an operation log written with a unique index on the id (before the layout above), once."""

    def outdated() -> bool:
        # index_list rows: (seq, name, unique, origin, partial); origin "u" is a UNIQUE column constraint.
        return any(row[3] == "u" for row in conn.execute("PRAGMA index_list('_offline_ops')"))

    if not outdated():
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if outdated():  # another process may have done it meanwhile
            conn.execute("ALTER TABLE _offline_ops RENAME TO _offline_ops_before_upgrade")
            conn.execute(_OPS_TABLE)
            conn.execute(
                f"INSERT INTO _offline_ops ({_OPS_COLUMNS}) "
                f"SELECT {_OPS_COLUMNS} FROM _offline_ops_before_upgrade"
            )
            conn.execute("DROP TABLE _offline_ops_before_upgrade")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def storage_error(message: str, exc: BaseException | None = None, **context: Any) -> OfflineError:
    if exc is not None:
        context["cause"] = f"{type(exc).__name__}: {exc}"
    return OfflineError(message, STORAGE_ERROR, context)


def is_damaged(exc: BaseException) -> bool:
    """Whether SQLite refused ``exc``'s file as damaged or as no database at all (not busy, not full)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = getattr(exc, "sqlite_errorname", None)
    if name is not None:
        return str(name).startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))
    return type(exc) is sqlite3.DatabaseError


def damaged_error(path: str, exc: BaseException) -> OfflineError:
    return storage_error(
        f"the local database {path!r} is not a readable SQLite database (damaged, or not a database file); "
        "it was left as it is: restore it from a copy, or move it away to start with an empty one (and "
        "sync again)",
        exc,
        path=path,
        reason="corrupt",
    )


class _Transaction:
    """``LocalDatabase.transaction()``: a plain context manager (a write's hot path enters one per call)."""

    __slots__ = ("db",)

    def __init__(self, db: LocalDatabase) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        db = self.db
        db.lock.acquire()
        try:
            if db._depth:
                db._depth += 1
            else:
                db.conn.execute("BEGIN IMMEDIATE")
                db._depth = 1
        except BaseException:
            db.lock.release()
            raise
        return db.conn

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        db = self.db
        try:
            if db._depth > 1:
                db._depth -= 1  # nested: the outermost transaction commits or rolls back
                return
            db._depth = 0
            if kind is not None:
                db.conn.execute("ROLLBACK")
                return
            try:
                db.conn.execute("COMMIT")
            except sqlite3.Error as error:
                db.conn.execute("ROLLBACK")
                raise storage_error("the local database could not commit a write", error) from error
            if db._checkpointer is not None:
                db._checkpointer.committed(db.conn)
        finally:
            db.lock.release()


def record_chunks(keys: Iterable[tuple[str, str]]) -> Iterator[tuple[str, list[str], str]]:
    """(collection, record ids, their "?,?,..." placeholders) for ``keys`` grouped by collection, each key
    once, at most 500 ids a query (under the 999 bound parameters SQLite builds before 3.32 allow)."""
    by_collection: dict[str, list[str]] = {}
    for collection, record_id in dict.fromkeys(keys):
        by_collection.setdefault(collection, []).append(record_id)
    for collection, ids in by_collection.items():
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            yield collection, chunk, ",".join("?" * len(chunk))


class LocalDatabase:
    """A thin, typed wrapper over one sqlite3 connection. Every public write runs in `transaction()`."""

    def __init__(self, path: str, *, durability: str = "normal") -> None:
        self._file_lock: FileLock | None = None
        self._checkpointer: Checkpointer | None = None  # see the end of __init__
        if path != ":memory:" and not path.startswith("file:"):
            self._file_lock = FileLock(path)
            self._file_lock.acquire()  # before anything is read: another app may be writing
        try:
            self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            self._release_file_lock()
            raise storage_error(f"cannot open the local database {path!r}", exc, path=path) from exc
        self.path = path
        self.lock = threading.RLock()
        self._depth = 0
        # Refolds a record's state from its one operation (the app's merge engine): how stored references
        # (`STATE_REFERENCE`) are read.
        self.refold: Callable[[str, str, Operation], RecordState] | None = None
        try:
            synchronous = self._prepare(durability)
        except BaseException as exc:
            # Nothing is written to a file SQLite cannot read; it stays as it is, and free for another try.
            self.conn.close()
            self._release_file_lock()
            if is_damaged(exc):
                raise damaged_error(path, exc) from exc
            raise
        conn = self.conn
        # Checkpoints run on a thread of their own (see .checkpoint) where there are threads and a file.
        if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            self._checkpointer = start_checkpoints(self, path, synchronous=synchronous)
            if self._checkpointer is not None:
                conn.execute("PRAGMA wal_autocheckpoint=0")

    def _prepare(self, durability: str) -> str:
        """Set the connection up and create the internal tables; returns the synchronous setting."""
        conn = self.conn
        if self.path != ":memory:" and not IS_BROWSER:
            conn.execute("PRAGMA journal_mode=WAL")
        # (In a browser the file lives in the browser's storage, which keeps the database and its rollback
        # journal but not a WAL: a WAL, even for the moment until the worker turns it off, could hold
        # commits that a closed tab loses while the database file already has part of them.)
        # WAL + NORMAL: a committed write survives the process dying at any point; FULL also survives the
        # machine losing power, at the price of an fsync per write.
        synchronous = "FULL" if durability == "full" else "NORMAL"
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA foreign_keys=OFF")
        conn.execute("PRAGMA busy_timeout=5000")
        # Deleted bytes are zeroed where their page is written anyway, never by writing a page only to zero
        # it: builds with secure_delete ON by default (Debian's) wrote every page a compaction frees to the
        # log and again to the file, a pass costing twice what it dropped; builds with it OFF (upstream's,
        # Pyodide's) left deleted rows readable inside live pages. FAST is the same on every build.
        conn.execute("PRAGMA secure_delete=FAST")
        try:
            _upgrade_operation_log(conn)
        except sqlite3.Error as exc:
            if is_damaged(exc):
                raise
            raise storage_error(
                f"cannot upgrade the operation log of {self.path!r}", exc, path=self.path
            ) from exc
        for statement in _INTERNAL:
            conn.execute(statement)
        return synchronous

    # -- transactions -------------------------------------------------------------------------------------

    def transaction(self) -> _Transaction:
        """One SQLite transaction (``BEGIN IMMEDIATE``), under the lock; nested ones join the outermost.

        Usable as ``with db.transaction() as conn:``; an exception rolls everything back and propagates.
        """
        return _Transaction(self)

    @property
    def in_transaction(self) -> bool:
        """True while a `transaction()` is open (a nested one then commits or rolls back with it)."""
        return self._depth > 0

    # -- meta -----------------------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM _offline_meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO _offline_meta (key, value) VALUES (?, ?)", (key, value))

    # -- tables ---------------------------------------------------------------------------------------------

    def create_tables(self, schema: SchemaDefinition) -> None:
        for collection in schema.collections.values():
            for statement in create_table_sql(collection):
                self.conn.execute(statement)
        sync_lookup_indexes(self.conn, schema)

    def table_columns(self, table: str) -> list[str]:
        return [row[1] for row in self.conn.execute(f"PRAGMA table_info({json.dumps(table)})")]

    # -- operation log ----------------------------------------------------------------------------------------

    def held_ids(self, ops: Iterable[Operation]) -> dict[tuple[str, int], str]:
        """The ids of the held operations at the (node, sequence number) of ``ops``: a held id equal to an
        op's id makes it a duplicate; a different one, a forgery (a node never reuses a sequence number)."""
        by_node: dict[str, list[int]] = {}
        for op in ops:
            by_node.setdefault(op.node_id, []).append(op.sequence_number)
        held: dict[tuple[str, int], str] = {}
        for node_id, sequences in by_node.items():
            sequences.sort()
            low, high = sequences[0], sequences[-1]
            if high - low < 2 * len(sequences) + 500:
                # A run of sequence numbers (the usual batch): one range scan, no list of parameters.
                rows = self.conn.execute(
                    "SELECT sequence_number, id FROM _offline_ops WHERE node_id = ? "
                    "AND sequence_number BETWEEN ? AND ?",
                    (node_id, low, high),
                )
                wanted = set(sequences)
                held.update(((node_id, seq), op_id) for seq, op_id in rows if seq in wanted)
                continue
            for start in range(0, len(sequences), 500):
                chunk = sequences[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for seq, op_id in self.conn.execute(
                    "SELECT sequence_number, id FROM _offline_ops WHERE node_id = ? "
                    f"AND sequence_number IN ({marks})",
                    [node_id, *chunk],
                ):
                    held[(node_id, seq)] = op_id
        return held

    def held_in_records(self, ops: Iterable[Operation]) -> set[str]:
        """The ids of ``ops`` the log holds already, at whatever place (found by id within its record and
        node: an id hashes its node's id, so equal ids are the same node's)."""
        keys = [(op.collection, op.record_id, op.node_id, op.id) for op in ops]
        held: set[str] = set()
        for start in range(0, len(keys), 240):
            chunk = keys[start : start + 240]
            values = ",".join("(?, ?, ?, ?)" for _ in chunk)
            held.update(
                row[0]
                for row in self.conn.execute(
                    f"WITH wanted(c, r, n, i) AS (VALUES {values}) SELECT o.id FROM wanted "
                    f"JOIN _offline_ops o INDEXED BY {RECORD_INDEX} ON o.collection = wanted.c "
                    f"AND o.record_id = wanted.r AND o.node_id = wanted.n AND substr(o.id, 1, {ID_KEY_DIGITS}) = "
                    f"substr(wanted.i, 1, {ID_KEY_DIGITS}) AND o.id = wanted.i",
                    [part for key in chunk for part in key],
                )
            )
        return held

    _INSERT_OP_HEAD = (
        "INSERT INTO _offline_ops (id, node_id, sequence_number, collection, record_id, hlc, wire, local, "
        "status, delivery)"
    )
    _INSERT_OP = _INSERT_OP_HEAD + " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

    def insert_operations(self, rows: list[tuple[Any, ...]]) -> None:
        if len(rows) == 1:
            self.conn.execute(self._INSERT_OP, rows[0])
        else:
            write_rows(self.conn, self._INSERT_OP_HEAD, rows)
        if self._depth == 0 and self._checkpointer is not None:  # committed on its own
            self._checkpointer.committed(self.conn)

    @staticmethod
    def op_row(
        op: Operation, *, local: bool, status: int, delivery: int | None = None, text: str | None = None
    ) -> tuple[Any, ...]:
        """The log row of ``op``; ``text``: its wire text when the caller has it (else `operation_text`)."""
        return (
            op.id,
            op.node_id,
            op.sequence_number,
            op.collection,
            op.record_id,
            timestamp_text(op),
            stored_text(op.id, op.node_id, operation_text(op) if text is None else text),
            1 if local else 0,
            status,
            delivery,
        )

    def load_operation(self, op_id: str, record: tuple[str, str] | None = None) -> Operation | None:
        """The operation with ``op_id`` (rejected ones too). Give its ``(collection, record id)`` when known:
        without it, the whole log is searched."""
        if record is not None:
            row = self.conn.execute(
                # (The key's prefix is compared in the index, before a row is read.)
                f"SELECT {WIRE} FROM _offline_ops WHERE collection = ? AND record_id = ? "
                f"AND {ID_KEY} = substr(?, 1, {ID_KEY_DIGITS}) AND id = ?",
                (*record, op_id, op_id),
            ).fetchone()
        else:
            row = self.conn.execute(f"SELECT {WIRE} FROM _offline_ops WHERE id = ?", (op_id,)).fetchone()
        return None if row is None else operation_from_text(row[0])

    def find_operation(self, op_id: str, node_id: str, sequence_number: int) -> Operation | None:
        """The operation with ``op_id`` at (``node_id``, ``sequence_number``), if that is where it is held."""
        row = self.conn.execute(
            f"SELECT {WIRE} FROM _offline_ops WHERE node_id = ? AND sequence_number = ? AND id = ?",
            (node_id, sequence_number, op_id),
        ).fetchone()
        return None if row is None else operation_from_text(row[0])

    def record_operations(self, collection: str, record_id: str) -> list[Operation]:
        """The operations of one record that count (not rejected)."""
        rows = self.conn.execute(
            f"SELECT {WIRE} FROM _offline_ops WHERE collection = ? AND record_id = ? AND status != ?",
            (collection, record_id, REJECTED),
        )
        return [operation_from_text(r[0]) for r in rows]

    def operations_after(self, node_id: str, after: int | None) -> list[Operation]:
        rows = self.conn.execute(
            f"SELECT {WIRE} FROM _offline_ops WHERE node_id = ? AND sequence_number > ? AND status != ? "
            "ORDER BY sequence_number",
            (node_id, -1 if after is None else after, REJECTED),
        )
        return [operation_from_text(r[0]) for r in rows]

    def own_sequence(self, node_id: str) -> int:
        row = self.conn.execute(
            "SELECT max(sequence_number) FROM _offline_ops WHERE node_id = ?", (node_id,)
        ).fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def max_hlc(self) -> str | None:
        """The highest clock in the log, read at open without reading the log: a node's clocks grow with its
        sequence numbers, so the highest is among each node's last operation, and the (node, sequence) key
        reaches those directly (one seek per node, walking the distinct nodes through the key)."""
        row = self.conn.execute(
            """WITH RECURSIVE nodes(node_id) AS (
                SELECT min(node_id) FROM _offline_ops
                UNION ALL
                SELECT (SELECT min(node_id) FROM _offline_ops WHERE node_id > nodes.node_id)
                FROM nodes WHERE nodes.node_id IS NOT NULL
            )
            SELECT max((SELECT hlc FROM _offline_ops o WHERE o.node_id = nodes.node_id
                        ORDER BY o.sequence_number DESC LIMIT 1))
            FROM nodes WHERE node_id IS NOT NULL"""
        ).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def pending_count(self, node_id: str) -> int:
        row = self.conn.execute(f"SELECT count(*) FROM {PENDING_OPS}", (node_id, 0)).fetchone()
        return int(row[0])

    def open_pending(self, node_id: str) -> None:
        """At open (in a transaction): find where ``node_id``'s waiting operations start in a log written
        before `PENDING_FROM_KEY` was kept (once: through the partial index those versions kept, else one
        read of the node's operations), and drop that index."""
        if self.get_meta(PENDING_FROM_KEY) is None:
            row = self.conn.execute(
                "SELECT min(sequence_number) FROM _offline_ops WHERE node_id = ? "
                f"AND status = {PENDING}",  # (a literal: an old partial index's WHERE matches it)
                (node_id,),
            ).fetchone()
            start = row[0] if row[0] is not None else self.own_sequence(node_id) + 1
            self.set_meta(PENDING_FROM_KEY, str(start))
        self.conn.execute("DROP INDEX IF EXISTS _offline_ops_pending")

    def advance_pending(self, node_id: str) -> None:
        """Move `PENDING_FROM_KEY` up to ``node_id``'s first waiting operation, after some of them were
        acknowledged or refused (in the same transaction). Reads from the old start to that operation: the
        ones that stopped waiting, normally. Written only when it moves."""
        value = self.get_meta(PENDING_FROM_KEY)
        start = int(value) if value is not None else 0
        row = self.conn.execute(
            "SELECT sequence_number FROM _offline_ops WHERE node_id = ? AND sequence_number >= ? "
            "AND status = ? ORDER BY sequence_number LIMIT 1",
            (node_id, start, PENDING),
        ).fetchone()
        # None waiting: the next operation the node writes will be the first (numbers only grow).
        first = int(row[0]) if row is not None else max(start, self.own_sequence(node_id) + 1)
        if first != start:
            self.set_meta(PENDING_FROM_KEY, str(first))

    # -- version vector ---------------------------------------------------------------------------------------

    def version_vector(self) -> dict[str, int]:
        return {
            str(node): int(seq) for node, seq in self.conn.execute("SELECT node_id, seq FROM _offline_vv")
        }

    def advance_vector(self, entries: dict[str, int]) -> None:
        self.conn.executemany(
            "INSERT INTO _offline_vv (node_id, seq) VALUES (?, ?) "
            "ON CONFLICT (node_id) DO UPDATE SET seq = max(seq, excluded.seq)",
            list(entries.items()),
        )

    # -- merge state --------------------------------------------------------------------------------------------

    def load_state(self, collection: str, record_id: str) -> RecordState | None:
        row = self.conn.execute(
            "SELECT state FROM _offline_state WHERE collection = ? AND record_id = ?", (collection, record_id)
        ).fetchone()
        if row is None:
            return None
        text = row[0]
        if type(text) is str and text[:1] == STATE_REFERENCE:
            key = (collection, record_id)
            return self._refold_one(collection, record_id, self.referenced_operations({key: text[1:]})[key])
        if text == STATE_BASE:
            text = self.base_texts([(collection, record_id)])[(collection, record_id)]
        return RecordState.from_json(text)

    def load_states(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], RecordState]:
        from_json = RecordState.from_json
        return {key: from_json(text) for key, text in self.load_state_texts(keys).items()}

    def load_state_texts(
        self, keys: list[tuple[str, str]], *, refold: bool = True
    ) -> dict[tuple[str, str], str | bytes]:
        """The merge state text of each of these records that has one. A state stored as a reference is
        refolded, or with ``refold=False`` returned as it is stored (`STATE_REFERENCE` + operation id)."""
        out: dict[tuple[str, str], str | bytes] = {}
        references: dict[tuple[str, str], str] = {}
        bases: list[tuple[str, str]] = []
        for collection, chunk, marks in record_chunks(keys):
            for record_id, state in self.conn.execute(
                f"SELECT record_id, state FROM _offline_state WHERE collection = ? AND record_id IN ({marks})",
                [collection, *chunk],
            ):
                out[(collection, record_id)] = state
                if state == STATE_BASE:
                    bases.append((collection, record_id))
                elif refold and type(state) is str and state[:1] == STATE_REFERENCE:
                    references[(collection, record_id)] = state[1:]
        if bases:
            out.update(self.base_texts(bases))
        if references:
            refold_one = self._refold_one
            for key, op in self.referenced_operations(references).items():
                out[key] = refold_one(*key, op).to_json()
        return out

    def base_texts(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The compaction base text of each of these records, whose state is stored as `STATE_BASE`."""
        out: dict[tuple[str, str], str] = {}
        for collection, chunk, marks in record_chunks(keys):
            for record_id, state in self.conn.execute(
                f"SELECT record_id, state FROM _offline_compacted WHERE collection = ? AND record_id IN ({marks})",
                [collection, *chunk],
            ):
                out[(collection, str(record_id))] = str(state)
        for collection, record_id in keys:
            if (collection, record_id) not in out:
                raise storage_error(
                    "a record's merge state is stored as its compaction base, which is missing (the local "
                    "database is damaged: restore it, or start a fresh one and sync it from the server)",
                    collection=collection,
                    recordId=record_id,
                )
        return out

    def referenced_operations(
        self, references: dict[tuple[str, str], str]
    ) -> dict[tuple[str, str], Operation]:
        """The operation each (collection, record id) -> operation id names (a state stored as a reference)."""
        wires: dict[tuple[str, str], str] = {}
        for collection, chunk, marks in record_chunks(references):
            for record_id, op_id, wire in self.conn.execute(
                f"SELECT record_id, id, {WIRE} FROM _offline_ops WHERE collection = ? AND record_id IN ({marks})",
                [collection, *chunk],
            ):
                if references[(collection, record_id)] == op_id:
                    wires[(collection, record_id)] = wire
        out: dict[tuple[str, str], Operation] = {}
        for key, op_id in references.items():
            wire = wires.get(key)
            if wire is None:
                raise storage_error(
                    "the operation a record's merge state refers to is missing from the operation log (the "
                    "local database is damaged: restore it, or start a fresh one and sync it from the server)",
                    collection=key[0],
                    recordId=key[1],
                    operationId=op_id,
                )
            out[key] = operation_from_text(wire)
        return out

    def _refold_one(self, collection: str, record_id: str, op: Operation) -> RecordState:
        if self.refold is None:
            raise storage_error(
                "a merge state stored as a reference cannot be read here", collection=collection
            )
        return self.refold(collection, record_id, op)

    def save_states(self, rows: list[tuple[str, str, str]]) -> None:
        write_rows(self.conn, "INSERT OR REPLACE INTO _offline_state (collection, record_id, state)", rows)

    def close(self) -> None:
        with self.lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
            self.conn.close()  # the last connection to close checkpoints what is left and removes the log
            self._release_file_lock()

    def _release_file_lock(self) -> None:
        if self._file_lock is not None:
            self._file_lock.release()
            self._file_lock = None
