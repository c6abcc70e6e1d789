"""Compaction of the local operation log: `app.compact()` drops what merging never reads again.

Every operation in the log is folded into its record's merge state when it is stored, and the merge engine
folds further operations on that state alone (DESIGN.md section 3: a record's state is a function of the set
of operations held). An operation the server has acknowledged (or that came from the server) is therefore
read again only by four things, and compaction keeps what each needs:

- Recognising it when it arrives again (a batch resent after a lost acknowledgement, a resync from delivery
  0, a peer's overlapping export). The log found repeats by (node, sequence number). For each compacted
  record, ``_offline_compacted.versions`` keeps every node's highest sequence number among its dropped
  operations; an operation of that record at or below its node's number is a repeat. This relies on one
  node's operations *on one record* reaching a device in that node's sequence order, which holds on every
  path that delivers them: a node writes a record with its previous write to it in its causal deps (the
  record's heads), sends its operations in sequence order over one ordered connection, the server stores
  them in that order and relays a record's operations in delivery order (a record entering a scope gets
  its earlier history, or its state, before the operation that moved it), and `App.operations` exports in
  causal order. It does *not* hold per node across records (a record entering a device's scope brings a
  node's older operations after newer ones on other records), which is why the numbers are per record.
- Refolding a record (a refusal taking a pending operation out, a new authoritative server node, a
  schema rebuild): ``_offline_compacted.state`` keeps the *base*, the state the dropped operations make of
  the record, and a refold starts from it instead of from nothing (`refold`).
- The clock and the sequence numbering at open: this node's highest sequence number goes into the
  version vector (``_offline_vv``), the highest dropped clock into meta ``compacted_clock``.
- A merge state stored as a reference to its one operation (``STATE_REFERENCE``): written out as text
  before that operation goes.

Never dropped: this node's operations the server has not acknowledged (they are still to be sent, and a
refusal takes them out again) and refused ones (kept so they are never resent; the rejected list refers
to them). Conflict traces (`MergeTrace`) of later merges cannot name a dropped operation (none is emitted
for it), and `App.operations` exports only what is kept: a peer behind the compaction catches up through a
server (which sends record states, see `adopt_states`).

The same table holds what a server's state-based catch-up gave (`adopt_states`): the server's state of a
record as base and its per-node numbers, so the operations the server streams after it are recognised. The
record's merge state is then that same text: it is stored once, as the base, the merge state holding
`STATE_BASE` (read through the base) until something is folded on it, which stores its own text (a
compaction about to change the base writes such a state out first, as it does a `STATE_REFERENCE`).

Automatic compaction (issue 24: "automatically past a size") drops *superseded* history only, and runs when
the log has grown by twice as much again as it holds records:

- What goes: the acknowledged operations of records whose log holds at least two of them. A record whose
  log holds one (a record received or written once, the usual case for most records of a replica) keeps
  it: that operation is the record's whole history, nothing superseded; dropping it would trade its row for
  a base copy of the record's state as large as the state itself, and its state could no longer be stored
  as a reference to it (`STATE_REFERENCE`), so every new record would cost the encoding of its state. The
  log then holds at most one acknowledged operation per record between compactions plus what came since.
- When (`due`): once the acknowledged operations of the log exceed the records it holds operations of by
  ``max(compact_after, twice those records)``. A compaction's work is a pass over the log's acknowledged
  operations and a base write per record compacted; it runs only when it drops at least as many
  operations as that excess (each record compacted holds two or more, each record left holds one), so its
  cost per dropped operation stays bounded however large the replica, and the log stays within about three
  times its records plus ``compact_after`` (a hot record: ``compact_after`` operations), not its history.
  Why twice, not once: each pass writes a base per record it compacts and pays its fixed costs (the
  fill, the statements, the commit of every page it dirtied) once however many operations it drops, so
  fewer, larger passes drop the same history for less. Measured (callgrind, issue 24, when the rule was
  chosen) on a fold shaped like the bench's, 2,000 records x (1 insert + 4 updates) in batches of 1,000
  with ``compact_after`` 2,000: at once the records, two passes dropped 8,000 operations; at twice, one
  pass dropped 6,000: 413k -> 387k instructions per applied operation (the same fold without compaction:
  353k). Passes have become cheaper since (that fold: 358k with compaction, 341k without). The price: the
  log's bound grows from about two operations per record to about three.
  Counted in memory (`App._grew`), checked against the log (two index scans) only when the count could
  have reached the excess.

`app.compact()` called by the application drops every acknowledged operation (what the tests of this module
and ``offline compact`` expect); the correctness argument above holds for both, an operation kept being
recognised as a repeat by the log as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from offline.core.operations import Operation, operation_from_text
from offline.merge.engine import RecordState

from . import state_rows
from .database import (
    ACKED,
    RECORD_INDEX,
    REJECTED,
    STATE_BASE,
    STATE_REFERENCE,
    WIRE,
    record_chunks,
    storage_error,
    wire_sql,
)
from .many_rows import write_rows

if TYPE_CHECKING:
    from .app import App

#: create_app(compact_after=...) default: the log is compacted automatically once its acknowledged
#: operations exceed the records they belong to by this many (or by those records' number when larger; see
#: the module docstring). Large enough that a compaction is rare work.
DEFAULT_COMPACT_AFTER = 10_000

TABLE = """CREATE TABLE IF NOT EXISTS _offline_compacted (
        collection TEXT NOT NULL,
        record_id TEXT NOT NULL,
        state TEXT NOT NULL,
        versions TEXT NOT NULL,
        PRIMARY KEY (collection, record_id)
    ) WITHOUT ROWID"""

#: Meta keys: the highest clock among dropped operations, and "1" once anything was compacted (the write
#: path looks repeats up in ``_offline_compacted`` only then).
CLOCK_KEY = "compacted_clock"
FLAG_KEY = "compacted"
#: Meta key: this node's highest sequence number among its own operations that left the log (JSON
#: ``{"node", "sequence"}``), acknowledged by a server and so never sent again (see `dropped_own`).
OWN_KEY = "compacted_own"


def compact(app: App, *, superseded_only: bool = False) -> int:
    """Drop the acknowledged operations of the log (see the module docstring); returns how many.
    ``superseded_only`` (automatic compaction): only those of records whose log holds two or more of them.

    The cost is kept to SQLite's own work per record the dropped operations touch (issue 24: automatic
    compaction runs every `compact_after` operations, so a fold of many operations pays for it many times):
    what the dropped operations leave (each record's per-node highest number and highest clock) is aggregated
    into a temporary table, and every record whose operations all go takes its current state as its base and
    its merged numbers (old and new, as JSON) in one statement, no row passing through Python. Only the few
    records that keep operations (this node's pending ones), have no state, or hold their state as a
    reference to an operation about to go are handled one by one.
    """
    app._check_open()
    app.flush()
    db = app.db
    engine = app.engine
    with db.lock, db.transaction():
        conn = db.conn
        conn.execute(_DROPPING_TABLE)
        conn.execute("DELETE FROM temp._offline_dropping")
        _fill_dropping(conn, app.node_id)
        # Whether some acknowledged operations stay (automatic compaction: a record's one operation).
        keeping = False
        if superseded_only:
            # A record's one acknowledged operation stays (its whole history: nothing superseded).
            keeping = (
                conn.execute(
                    "DELETE FROM temp._offline_dropping WHERE (collection, record_id) IN (SELECT collection, "
                    "record_id FROM temp._offline_dropping GROUP BY collection, record_id HAVING sum(n) < 2)"
                ).rowcount
                > 0
            )
        (count,) = conn.execute("SELECT coalesce(sum(n), 0) FROM temp._offline_dropping").fetchone()
        if not count:
            conn.execute("DELETE FROM temp._offline_dropping")
            app._log_growth = 0
            return 0
        clock = db.get_meta(CLOCK_KEY) or ""
        # A node's clocks grow with its sequence numbers (as `LocalDatabase.max_hlc` reads them): the highest
        # dropped clock is that of one node's highest dropped operation, read through the log's key.
        newest, own = conn.execute(
            "SELECT max(o.hlc), max(CASE WHEN d.node_id = ? THEN d.seq END) FROM (SELECT node_id, "
            "max(seq) AS seq FROM temp._offline_dropping GROUP BY node_id) d "
            "JOIN _offline_ops o ON o.node_id = d.node_id AND o.sequence_number = d.seq",
            (app.node_id,),
        ).fetchone()
        if newest is not None and str(newest) > clock:
            clock = str(newest)
        own = int(own or 0)
        # A state stored as a reference to its operation is written out (that operation is about to go), and
        # one stored as its base (`STATE_BASE`, whose base is about to change): both found by one read of
        # the records' states.
        based, stateless = _write_out_dropping_references(app)
        if based:
            conn.executemany(
                "UPDATE _offline_state SET state = (SELECT c.state FROM _offline_compacted c "
                "WHERE c.collection = _offline_state.collection AND c.record_id = _offline_state.record_id) "
                "WHERE collection = ? AND record_id = ? AND state = ?",
                [(*key, STATE_BASE) for key in based],
            )
        # Records that keep operations (pending ones), or have no merge state (found by the read above):
        # their base is folded here. (Only this node's operations wait: its part of the log's key, not the
        # whole log, is read.)
        conn.execute(
            "UPDATE temp._offline_dropping SET special = 1 WHERE (collection, record_id) IN "
            "(SELECT collection, record_id FROM _offline_ops WHERE node_id = ? AND status NOT IN (?, ?))",
            (app.node_id, ACKED, REJECTED),
        )
        if stateless:
            conn.executemany(
                "UPDATE temp._offline_dropping SET special = 1 WHERE collection = ? AND record_id = ?",
                stateless,
            )
        special: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for collection, record_id, node_id, seq in conn.execute(
            "SELECT collection, record_id, node_id, seq FROM temp._offline_dropping WHERE special = 1"
        ):
            special.setdefault((str(collection), str(record_id)), []).append((str(node_id), int(seq)))
        # Records whose every operation goes: their base is their current state, copied by SQLite, their
        # numbers the highest of the old ones and the dropped ones per node (json_group_object writes the
        # compact sorted form `_versions_text` writes). A record compacted for the first time whose dropped
        # operations come from one node (the usual case) takes json_object of that node's number, the same
        # text, without the union, grouping and sorting per record (~8k instructions a record). While the
        # table holds no base at all (a replica's first compaction), no old numbers are looked up, nor a row
        # to replace.
        dropped_per_node = (
            "SELECT d.node_id AS node, d.seq FROM temp._offline_dropping d "
            "WHERE d.collection = k.collection AND d.record_id = k.record_id"
        )
        records = (
            "FROM (SELECT collection, record_id, count(*) AS nodes, max(node_id) AS node, max(seq) AS seq "
            "FROM temp._offline_dropping WHERE special = 0 GROUP BY collection, record_id) k "
            "JOIN _offline_state s ON s.collection = k.collection AND s.record_id = k.record_id "
        )
        if conn.execute("SELECT 1 FROM _offline_compacted LIMIT 1").fetchone() is None:
            conn.execute(
                "INSERT INTO _offline_compacted (collection, record_id, state, versions) "
                "SELECT k.collection, k.record_id, CAST(s.state AS TEXT), "
                "CASE WHEN k.nodes = 1 THEN json_object(k.node, k.seq) ELSE "
                f"(SELECT json_group_object(node, seq) FROM ({dropped_per_node} ORDER BY node)) END "
                + records
            )
        else:
            conn.execute(
                "INSERT OR REPLACE INTO _offline_compacted (collection, record_id, state, versions) "
                "SELECT k.collection, k.record_id, CAST(s.state AS TEXT), "
                "CASE WHEN c.versions IS NULL AND k.nodes = 1 THEN json_object(k.node, k.seq) ELSE "
                "(SELECT json_group_object(node, seq) FROM (SELECT node, max(seq) AS seq FROM ("
                f"SELECT key AS node, value AS seq FROM json_each(c.versions) UNION ALL {dropped_per_node}) "
                "GROUP BY node ORDER BY node)) END "
                + records
                + "LEFT JOIN _offline_compacted c ON c.collection = k.collection AND c.record_id = k.record_id"
            )
        out: list[tuple[str, str, str, str]] = []
        if special:
            keys = list(special)
            numbers = _versions_rows(app, keys)
            old_bases = {(c, r): state for c, r, state, _ in _rows(app, keys)}
            for key, items in special.items():
                versions_text = numbers.get(key)
                versions = _parse_versions(versions_text) if versions_text is not None else {}
                for node_id, seq in items:
                    if seq > versions.get(node_id, -1):
                        versions[node_id] = seq
                # Some stay: the base is what the dropped ones make of the old base.
                old_base = old_bases.get(key)
                state = RecordState.from_json(old_base) if old_base is not None else RecordState()
                if key[0] in app.codecs:
                    for (wire,) in conn.execute(
                        f"SELECT {WIRE} FROM _offline_ops WHERE collection = ? AND record_id = ? AND status = ?",
                        (*key, ACKED),
                    ):
                        engine.apply(state, operation_from_text(wire), want_conflicts=False)
                out.append((key[0], key[1], state.to_json(), _versions_text(versions)))
        conn.executemany(
            "INSERT OR REPLACE INTO _offline_compacted (collection, record_id, state, versions) "
            "VALUES (?, ?, ?, ?)",
            out,
        )
        if keeping:
            conn.execute(
                "DELETE FROM _offline_ops WHERE status = ? AND (collection, record_id) IN "
                "(SELECT collection, record_id FROM temp._offline_dropping)",
                (ACKED,),
            )
        else:
            # Every acknowledged operation goes (the temporary table holds all their records): one pass over
            # the log in its key order, not a seek per record (~12 % of an automatic compaction, issue 24).
            # When they are the whole log (nothing waits nor was refused), a DELETE without WHERE lets SQLite
            # clear the table's and the index's B-trees page by page instead of taking each row out of both:
            # the delete was a third of such a pass (callgrind, issue 24: 377.5k instructions per applied
            # operation instead of 384.8k on the bench's fold shape).
            (held,) = conn.execute("SELECT count(*) FROM _offline_ops").fetchone()
            if held == count:
                conn.execute("DELETE FROM _offline_ops")
            else:
                conn.execute("DELETE FROM _offline_ops WHERE status = ?", (ACKED,))
        conn.execute("DELETE FROM temp._offline_dropping")
        if own:
            # The sequence numbering at open reads the log and this vector: it must not go back.
            db.advance_vector({app.node_id: own})
            _note_dropped_own(app, own)
        db.set_meta(CLOCK_KEY, clock)
        db.set_meta(FLAG_KEY, "1")
        app._compacted = True
    app._log_growth = 0
    return int(count)


#: What one compaction drops, per record and node: highest number and clock, how many operations (a
#: connection's temporary table, emptied after use).
_DROPPING_TABLE = """CREATE TEMP TABLE IF NOT EXISTS _offline_dropping (
        collection TEXT NOT NULL,
        record_id TEXT NOT NULL,
        node_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        hlc TEXT NOT NULL,
        n INTEGER NOT NULL,
        special INTEGER NOT NULL,
        PRIMARY KEY (collection, record_id, node_id)
    ) WITHOUT ROWID"""


def _fill_dropping(conn: Any, node_id: str) -> None:
    """Fill ``temp._offline_dropping`` with each (record, node)'s highest number and count among the
    acknowledged operations of the log (its ``hlc`` column left empty).

    Read off the index by record (`RECORD_INDEX`: collection, record id, node, id key), which holds every
    row's key (node, number) and is already in record and node order, instead of the log's rows (each
    several hundred bytes of wire text) in key order, sorted again: the fill was about a quarter of a
    compaction (and with the id before the node in that index, a sort was most of the fill). The index has
    no status, but only this node's operations are ever other than acknowledged (a received operation is
    stored acknowledged, and only this node's are waiting or refused), so the records holding one of those,
    found by a walk of this node's part of the key, are counted again from their acknowledged rows."""
    conn.execute(
        "INSERT INTO temp._offline_dropping (collection, record_id, node_id, seq, hlc, n, special) "
        "SELECT collection, record_id, node_id, max(sequence_number), '', count(*), 0 "
        f"FROM _offline_ops INDEXED BY {RECORD_INDEX} GROUP BY collection, record_id, node_id"
    )
    inexact = "SELECT collection, record_id FROM _offline_ops WHERE node_id = ? AND status != ?"
    conn.execute(
        f"DELETE FROM temp._offline_dropping WHERE (collection, record_id) IN ({inexact})", (node_id, ACKED)
    )
    conn.execute(
        "INSERT INTO temp._offline_dropping (collection, record_id, node_id, seq, hlc, n, special) "
        "SELECT collection, record_id, node_id, max(sequence_number), '', count(*), 0 FROM _offline_ops "
        f"WHERE (collection, record_id) IN ({inexact}) AND status = ? "
        "GROUP BY collection, record_id, node_id",
        (node_id, ACKED, ACKED),
    )


def due(app: App) -> int:
    """How many more operations must become droppable before automatic compaction is worth running: 0 when
    it is now (see the module docstring: the acknowledged operations exceed the records they belong to by
    ``max(compact_after, twice those records)``). Each operation added raises that excess by one at most (a new
    record's first raises both sides), so nothing is due before this many more."""
    limit = app.compact_after
    assert limit is not None
    with app.db.lock:
        # (Both counts read the index by record (`RECORD_INDEX`): no operation text is read.)
        records, ops = app.db.conn.execute(
            "SELECT count(*), coalesce(sum(n), 0) FROM "
            "(SELECT count(*) AS n FROM _offline_ops GROUP BY collection, record_id)"
        ).fetchone()
        (refused,) = app.db.conn.execute("SELECT count(*) FROM _offline_rejected").fetchone()
        acked = int(ops) - app.db.pending_count(app.node_id) - int(refused)
    return max(0, max(limit, 2 * int(records)) - (acked - int(records)))


def dropped_own(app: App) -> int:
    """This node's highest sequence number among its own operations that left the log (0: none).

    A server acknowledged each of them (or held it in a state it sent), so a server whose version vector
    holds less of this node lost them: this replica cannot send them again (the sync client stops with
    ``COMPACTED_OPERATIONS_LOST`` then). Replicas compacted before this was recorded answer 0.
    """
    with app.db.lock:
        text = app.db.get_meta(OWN_KEY)
    if not text:
        return 0
    mark = json.loads(text)
    return int(mark["sequence"]) if mark.get("node") == app.node_id else 0


def _note_dropped_own(app: App, seq: int) -> None:
    """Raise the `dropped_own` mark to ``seq`` (called inside the transaction that drops the operations)."""
    if seq > dropped_own(app):
        app.db.set_meta(OWN_KEY, json.dumps({"node": app.node_id, "sequence": seq}))


def load(
    app: App, keys: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], tuple[RecordState, dict[str, int]]]:
    """The base state and per-node sequence numbers of each of these records that has them."""
    out: dict[tuple[str, str], tuple[RecordState, dict[str, int]]] = {}
    for collection, record_id, state, versions in _rows(app, keys):
        out[(collection, record_id)] = (RecordState.from_json(state), _parse_versions(versions))
    return out


def _rows(app: App, keys: Iterable[tuple[str, str]]) -> list[tuple[str, str, str, str]]:
    found: list[tuple[str, str, str, str]] = []
    for collection, chunk, marks in record_chunks(keys):
        found.extend(
            (collection, str(r), str(s), str(v))
            for r, s, v in app.db.conn.execute(
                f"SELECT record_id, state, versions FROM _offline_compacted WHERE collection = ? "
                f"AND record_id IN ({marks})",
                [collection, *chunk],
            )
        )
    return found


def _versions_rows(app: App, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The per-node numbers text of each of these records that was compacted."""
    found: dict[tuple[str, str], str] = {}
    for collection, chunk, marks in record_chunks(keys):
        for record_id, versions in app.db.conn.execute(
            f"SELECT record_id, versions FROM _offline_compacted WHERE collection = ? "
            f"AND record_id IN ({marks})",
            [collection, *chunk],
        ):
            found[(collection, str(record_id))] = str(versions)
    return found


def _one_operation_state(app: App, collection: str, record_id: str, op: Operation) -> str:
    """The state text one operation makes of a record (a state stored as a reference, written out): an
    insert's built directly where the engine covers it (`MergeEngine.insert_fold`, the same text)."""
    if op.type == "insert":
        made = app.engine.insert_fold(op, record_id, encode=True)
        if made is not None:
            return made.text
    return app._refold_one(collection, record_id, op).to_json()


def _write_out_dropping_references(app: App) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Write out as text each state stored as a reference to its operation (`STATE_REFERENCE` + id) among
    the records of ``temp._offline_dropping``, its operation read in the same statement (a join) and
    dropped once its state's text is made, so a compaction never holds thousands of operations at once.
    Returns, found by the same read of the records' states, those whose state is stored as their base
    (`STATE_BASE`) and those that have none."""
    made: list[tuple[str, str, str]] = []
    based: list[tuple[str, str]] = []
    stateless: list[tuple[str, str]] = []
    for collection, record_id, reference, wire in app.db.conn.execute(
        # (a state stored as bytes is never a reference: substr of a blob is a blob)
        f"SELECT k.collection, k.record_id, s.state, {wire_sql('o')} "
        "FROM (SELECT DISTINCT collection, record_id FROM temp._offline_dropping) k "
        "LEFT JOIN _offline_state s ON s.collection = k.collection AND s.record_id = k.record_id "
        "LEFT JOIN _offline_ops o ON o.collection = s.collection AND o.record_id = s.record_id "
        "AND o.id = substr(s.state, 2) "
        "WHERE s.state IS NULL OR substr(s.state, 1, 1) = ? OR s.state = ?",
        (STATE_REFERENCE, STATE_BASE),
    ):
        collection, record_id = str(collection), str(record_id)
        if reference is None:
            stateless.append((collection, record_id))
            continue
        if reference == STATE_BASE:
            based.append((collection, record_id))
            continue
        if wire is None:
            raise storage_error(
                "the operation a record's merge state refers to is missing from the operation log "
                "(the local database is damaged: restore it, or start a fresh one and sync it from "
                "the server)",
                collection=collection,
                recordId=record_id,
                operationId=str(reference)[1:],
            )
        op = operation_from_text(str(wire))
        made.append((collection, record_id, _one_operation_state(app, collection, record_id, op)))
    if made:
        app.db.save_states(made)
    return based, stateless


def held_versions(app: App, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[str, int]]:
    """The per-node numbers of each of these records that compaction (or a server's state) left a base of."""
    return {key: _parse_versions(text) for key, text in _versions_rows(app, keys).items()}


def repeats(app: App, ops: Sequence[Operation]) -> set[str]:
    """Ids of ``ops`` that a compacted record folded already: at or below their node's number for it.

    Only operations without a causal context are looked up: the record's merge state recognises one with a
    context by its number (`RecordState.holds`, exact: it keeps every number it folded), and the store
    checks every incoming operation against the state before folding it, compacted or not."""
    if not app._compacted or not ops:
        return set()
    ops = [op for op in ops if op.causal_context is None]
    if not ops:
        return set()
    versions = held_versions(app, {(op.collection, op.record_id) for op in ops})
    if not versions:
        return set()
    out: set[str] = set()
    for op in ops:
        known = versions.get((op.collection, op.record_id))
        if known is not None and op.sequence_number <= known.get(op.node_id, -1):
            out.add(op.id)
    return out


def refold(app: App, collection: str, record_id: str) -> tuple[RecordState, dict[str, Any] | None] | None:
    """The record's state and value from its base (if compacted) and the operations of the log that count;
    None when it has neither (it never existed as far as anyone else knows)."""
    ops = app.db.record_operations(collection, record_id)
    base = load(app, [(collection, record_id)]).get((collection, record_id)) if app._compacted else None
    if base is None:
        if not ops:
            return None
        return app.engine.fold(collection, record_id, ops)
    state = base[0]
    for op in ops:
        app.engine.apply(state, op, want_conflicts=False)
    return state, app.engine.materialize(collection, record_id, state)


def refold_and_persist(app: App, collection: str, record_id: str) -> None:
    """`refold` one record and write its state and row (inside the caller's transaction); a record with
    nothing left loses its state and row."""
    app._rows.pop((collection, record_id), None)
    done = refold(app, collection, record_id)
    if done is None:
        app.db.conn.execute(
            "DELETE FROM _offline_state WHERE collection = ? AND record_id = ?", (collection, record_id)
        )
        app.db.conn.execute(app.codecs[collection].delete_sql, (record_id,))
        return
    # A state of one operation is stored as a reference to it only while the log holds every operation.
    compacted = app._compacted and bool(_rows(app, [(collection, record_id)]))
    app._persist(collection, record_id, *done, reference=not compacted)


def forget(app: App, collection: str, record_ids: Sequence[str]) -> None:
    """Drop the base and numbers of records this replica forgets (inside the caller's transaction)."""
    if app._compacted:
        app.db.conn.executemany(
            "DELETE FROM _offline_compacted WHERE collection = ? AND record_id = ?",
            [(collection, r) for r in record_ids],
        )


def bases(app: App) -> dict[tuple[str, str], RecordState]:
    """Every compacted record's base state (for a rebuild of every record)."""
    if not app._compacted:
        return {}
    return {
        (str(c), str(r)): RecordState.from_json(s)
        for c, r, s in app.db.conn.execute("SELECT collection, record_id, state FROM _offline_compacted")
    }


def rename_fields(app: App, renames: Mapping[str, Sequence[tuple[str, str]]]) -> None:
    """Rename the fields of compacted records' base states as a schema migration renames them (``renames``:
    collection -> (old, new) names in order), inside the migration's transaction, before its rebuild: the
    operations of the log are read under their schema version's names, a base state under the names it was
    folded with."""
    if not app._compacted or not any(renames.values()):
        return
    conn = app.db.conn
    for collection, steps in renames.items():
        if not steps:
            continue
        rows = conn.execute(
            "SELECT record_id, state FROM _offline_compacted WHERE collection = ?", (collection,)
        ).fetchall()
        updated: list[tuple[str, str, str]] = []
        for record_id, text in rows:
            state = RecordState.from_json(text)
            for old, new in steps:
                if old in state.fields:
                    state.fields[new] = state.fields.pop(old)
            updated.append((state.to_json(), collection, str(record_id)))
        conn.executemany(
            "UPDATE _offline_compacted SET state = ? WHERE collection = ? AND record_id = ?", updated
        )


def adopt_states(
    app: App,
    states: Sequence[tuple[str, str, str, Mapping[str, int]]],
    *,
    stored: Callable[[], None] | None = None,
) -> list[tuple[str, str]]:
    """Take the server's state of these records (state-based catch-up after a server compaction, or a fresh
    replica's state-based first sync).

    Each item is (collection, record id, state JSON, versions: node -> highest sequence number folded into
    that state). The server's state holds every operation it delivered of the record up to it, so this
    replica's operations of the record it covers leave the log (this node's pending ones among them were
    stored by the server: they count as acknowledged), and those it does not cover (this node's writes the
    server has not stored yet, and anything newer) are folded on top of it. The per-node numbers make the
    operations streamed afterwards that the state holds already count as repeats. Returns the keys written.

    In bulk, one transaction for the message: a record with no operation left in the log (every record of
    a fresh replica) takes the server's state text as it is, as its base, its merge state referring to that
    (`STATE_BASE`), its row materialised from it, a statement per table for all of them; only the records with operations of their own left are refolded one by one.

    ``stored``: called inside that transaction once the states are stored (the sync client notes there how
    far the catch-up got), so a message costs one commit, not one for its states and one for its progress.
    """
    if not states and stored is None:
        return []
    app.flush()
    db = app.db
    known_collections = app.codecs
    parsed: dict[tuple[str, str], tuple[str, dict[str, int]]] = {}
    for collection, record_id, text, versions in states:
        if collection in known_collections:
            parsed[(collection, record_id)] = (text, {str(n): int(s) for n, s in versions.items()})
    if not parsed:
        if stored is not None:
            with db.lock, db.transaction():
                stored()
        return []
    written = list(parsed)
    # A bad state refuses the message with nothing stored: it is read (by SQLite or as a RecordState)
    # inside the one transaction, which a failure rolls back.
    with db.lock, db.transaction():
        conn = db.conn
        # (Only their numbers: the base states are replaced.)
        held = held_versions(app, written) if app._compacted else {}
        logged = _logged(app, written) if _any_logged(app) else {}
        compacted: list[tuple[str, str, str, str]] = []
        covered: list[tuple[str, int]] = []
        plain: list[tuple[str, str, str]] = []
        refold_keys: list[tuple[str, str]] = []
        own = 0
        for key, (text, known) in parsed.items():
            numbers = held.get(key)
            if numbers is not None:
                for node, seq in numbers.items():
                    known[node] = max(known.get(node, -1), seq)
            places = logged.get(key)
            if places:
                gone = [(n, s) for n, s in places if s <= known.get(n, -1)]
                covered.extend(gone)
                own = max(own, max((s for n, s in gone if n == app.node_id), default=0))
                if len(gone) < len(places):
                    refold_keys.append(key)
                else:
                    plain.append((key[0], key[1], text))
            else:
                plain.append((key[0], key[1], text))
            compacted.append((key[0], key[1], text, _versions_text(known)))
        if covered:
            conn.executemany("DELETE FROM _offline_ops WHERE node_id = ? AND sequence_number = ?", covered)
        if own:
            db.advance_vector({app.node_id: own})
            _note_dropped_own(app, own)
            # (Some of this node's waiting operations left the log: where the waiting ones start moved.)
            db.advance_pending(app.node_id)
        write_rows(
            conn,
            "INSERT OR REPLACE INTO _offline_compacted (collection, record_id, state, versions)",
            compacted,
        )
        if not app._compacted:
            db.set_meta(FLAG_KEY, "1")
            app._compacted = True
        _adopt_plain(app, plain)
        for key in refold_keys:
            refold_and_persist(app, *key)
        if stored is not None:
            stored()
    touched: dict[str, list[str]] = {}
    for collection, record_id in written:
        touched.setdefault(collection, []).append(record_id)
    for listener in list(app.subscriptions.change_listeners):
        for collection, ids in touched.items():
            listener(collection, ids)
    app.subscriptions.notify(set(touched), None, record_ids=touched)
    if app.events.has_listeners("sync:states"):
        app.events.emit("sync:states", records=[{"collection": c, "recordId": r} for c, r in written])
    return written


def _adopt_plain(app: App, plain: list[tuple[str, str, str]]) -> None:
    """Store these server states as they are, with their records' rows (inside the caller's transaction):
    records with no operation of their own left in the log. Their rows are read off the stored texts by
    SQLite (`state_rows`) where the collection allows it, else from each decoded state: so is a text with
    a \\u escape, which SQLite 3.39 reads otherwise than Python (a NUL ends its string, a lone surrogate
    becomes bytes Python refuses to store), and a record whose id holds a NUL."""
    rows = app._rows
    by_sql: dict[str, list[str]] = {}
    stored: list[tuple[str, str, str]] = []
    decoded: list[tuple[str, str, RecordState | str, list[Any] | None]] = []
    materialize = app.engine.materialize
    readable = {
        c: state_rows.statements(app.engine, app.codecs[c]) is not None for c in {item[0] for item in plain}
    }
    for item in plain:
        collection, record_id, text = item
        rows.pop((collection, record_id), None)
        if readable[collection] and "\\u" not in text and "\x00" not in record_id:
            by_sql.setdefault(collection, []).append(record_id)
            stored.append(item)
        else:
            state = RecordState.from_json(text)
            record = materialize(collection, record_id, state)
            decoded.append((collection, record_id, text, app._row(collection, state, record)))
    if stored:
        # Each state is its base, written just before (`STATE_BASE`: not the same text twice).
        app.db.save_states([(collection, record_id, STATE_BASE) for collection, record_id, _ in stored])
        for collection, ids in by_sql.items():
            found = state_rows.statements(app.engine, app.codecs[collection])
            assert found is not None
            state_rows.write(app.db.conn, found, collection, ids)
    if decoded:
        app._write_records(decoded)


def _any_logged(app: App) -> bool:
    """Whether the log holds any operation not refused (a fresh replica's holds none: nothing to look up)."""
    return (
        app.db.conn.execute("SELECT 1 FROM _offline_ops WHERE status != ? LIMIT 1", (REJECTED,)).fetchone()
        is not None
    )


def _logged(app: App, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[tuple[str, int]]]:
    """The (node id, sequence number) of each of these records' operations in the log, refused ones aside."""
    out: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for collection, chunk, marks in record_chunks(keys):
        for record_id, node_id, seq in app.db.conn.execute(
            f"SELECT record_id, node_id, sequence_number FROM _offline_ops WHERE collection = ? "
            f"AND record_id IN ({marks}) AND status != ?",
            [collection, *chunk, REJECTED],
        ):
            out.setdefault((collection, str(record_id)), []).append((str(node_id), int(seq)))
    return out


def _parse_versions(text: str) -> dict[str, int]:
    return {str(k): int(v) for k, v in json.loads(text).items()}


def _versions_text(versions: Mapping[str, int]) -> str:
    """``json.dumps`` of the numbers with sorted keys, compact (what `_parse_versions` reads); written once
    per record a state-based first sync brings, so the few node ids are encoded once each, not per record."""
    keys = _KEY_TEXTS
    if len(versions) == 1:  # (the usual: one node wrote the record)
        ((node, seq),) = versions.items()
        key = keys.get(node)
        if key is not None:
            return "{" + key + ":" + str(int(seq)) + "}"
    parts = []
    for node, seq in sorted(versions.items()):
        key = keys.get(node)
        if key is None:
            key = keys[node] = json.dumps(node)
            if len(keys) > 10_000:  # (ids of many nodes over a long life: keep the cache bounded)
                keys.clear()
        parts.append(f"{key}:{int(seq)}")
    return "{" + ",".join(parts) + "}"


_KEY_TEXTS: dict[str, str] = {}
