"""Rows materialised by SQLite from merge state texts already stored, without folding them in Python.

A state-based first sync stores the server's state of thousands of records (`compaction.adopt_states`).
Decoding each state into a `RecordState`, materialising its record and converting it to a row cost about
three quarters of the adoption's time (issue 28: ~75 us per record in the browser's worker, where Python is
slowest). For a collection whose every field is a last-writer-wins register with a scalar initial value
(`MergeEngine.register_values`), a record is only its registers' ``"v"`` values, and whether it is alive:
the same keys in every form `RecordState.to_json` writes ("i" the insert held, "e"[1] the existence kind,
each register's "v" inline). SQLite's JSON functions read those from the stored text, for a whole batch in
one statement, in C.

The values are converted as `RowCodec.row` converts them (a boolean field to 0/1 by Python truthiness; the
others as they are) and a field without a register takes its initial value. A text that is not a state
(not JSON, or without the boolean "i" every form holds) refuses the batch, as decoding it would.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from typing import Any
from weakref import WeakKeyDictionary

from offline.merge.engine import MergeEngine

from .rows import RowCodec, quote, sql_literal

# Field types `RowCodec.row` stores as they are (0) or as 0/1 (1); others take `to_column`, not done here.
_AS_IS = frozenset({"string", "enum", "timestamp", "number"})

# Whether the record is alive (RecordState.alive: the insert held, an existence whose kind is not a
# delete), and a text that is not a state (not JSON, or no boolean "i", which every form holds) stopping the
# statement with an error (json() of what is not JSON), which rolls the batch back. A statement's JSON
# functions share a small cache of parsed texts (json.c's, in SQLite long before Pyodide's 3.39): the first
# call on a state parses it, the next ones look it up. Measured on 500 to-do states (SQLite 3.40.1): one
# call 1.6 us a state, each further call ~0.6 us; one json_extract of all the paths, its array then read
# field by field under a MATERIALIZED CTE (so as to parse each state once), took twice as long in all.
_ALIVE = (
    "CASE json_type(s.state, '$.i') WHEN 'true' THEN coalesce(json_extract(s.state, '$.e[1]'), 'delete') "
    "!= 'delete' WHEN 'false' THEN 0 ELSE json('not a record state') END"
)
# The stored states of the batch's records (``?1`` the collection, ``?2`` a JSON array of record ids), read
# where `adopt_states` keeps them, as their compaction base (their merge state refers to it: `STATE_BASE`);
# a CROSS JOIN keeps the ids the outer loop (SQLite's planner, knowing nothing of json_each's size, would
# scan every state of the collection and the ids for each).
_FROM = "FROM json_each(?2) AS j CROSS JOIN _offline_compacted AS s ON s.collection = ?1 AND s.record_id = j.value"


class _Statements:
    def __init__(self, codec: RowCodec, upsert: str) -> None:
        self.delete = f"DELETE FROM {codec.table} WHERE {quote('id')} IN (SELECT value FROM json_each(?2))"
        self.upsert = upsert


_CACHE: WeakKeyDictionary[RowCodec, _Statements | None] = WeakKeyDictionary()


def statements(engine: MergeEngine, codec: RowCodec) -> _Statements | None:
    """The statements materialising ``codec``'s collection from states, or None when it has fields they
    cannot read (another merge kind, a computed initial value, a type stored converted)."""
    if codec in _CACHE:
        return _CACHE[codec]
    _CACHE[codec] = found = _build(engine, codec)
    return found


def _build(engine: MergeEngine, codec: RowCodec) -> _Statements | None:
    fields = engine.register_values(codec.collection.name)
    if fields is None or [name for name, _ in fields] != codec.names:
        return None
    columns = ["s.record_id"]
    for (name, initial), descriptor in zip(fields, codec.descriptors, strict=True):
        if '"' in name or "\\" in name:
            return None  # (not a plain JSON path label)
        if descriptor.type == "boolean":
            initial = None if initial is None else bool(initial)
        elif descriptor.type not in _AS_IS:
            return None
        literal = _literal(initial)
        if literal is None:
            return None
        value = f"'$.f.\"{name}\".v'"
        # (A last-writer-wins register always holds its "v": a value missing is a register missing.)
        if descriptor.type == "boolean":
            # Python's truthiness of the JSON value (RowCodec.row: 1 if value else 0), None kept.
            read = (
                f"CASE json_type(s.state, {value}) WHEN 'true' THEN 1 WHEN 'false' THEN 0 "
                f"WHEN 'null' THEN NULL WHEN 'text' THEN json_extract(s.state, {value}) != '' "
                f"WHEN 'array' THEN json_array_length(s.state, {value}) > 0 "
                f"WHEN 'object' THEN json_extract(s.state, {value}) != '{{}}' "
                f"WHEN 'integer' THEN json_extract(s.state, {value}) != 0 "
                f"WHEN 'real' THEN json_extract(s.state, {value}) != 0 ELSE {literal} END"
            )
        elif literal == "NULL":
            read = f"json_extract(s.state, {value})"
        else:
            read = f"CASE WHEN json_type(s.state, {value}) IS NULL THEN {literal} ELSE json_extract(s.state, {value}) END"
        columns.append(read)
    upsert = f"{codec.upsert_head} SELECT {', '.join(columns)} {_FROM} WHERE {_ALIVE}"
    return _Statements(codec, upsert)


def _literal(value: Any) -> str | None:
    """SQL for the value as the row would bind it, or None when there is no exact literal."""
    if value is None:
        return "NULL"
    if type(value) is bool:
        return "1" if value else "0"
    if type(value) is int or type(value) is str:
        return sql_literal(value)
    if type(value) is float and math.isfinite(value):
        return repr(value)
    return None


def write(conn: Any, found: _Statements, collection: str, record_ids: Sequence[str]) -> None:
    """Replace the rows of these records (whose states are stored as their compaction bases) by what their states hold: removed,
    then written again for those alive. Raises ValueError when a state is not a state (the caller's
    transaction then rolls everything back)."""
    # (Characters outside ASCII as they are, not as \u escapes: no surrogate pair for SQLite to read.)
    ids = json.dumps(list(record_ids), ensure_ascii=False)
    conn.execute(found.delete, (collection, ids))
    try:
        conn.execute(found.upsert, (collection, ids))
    except sqlite3.OperationalError as exc:
        if "JSON" not in str(exc):
            raise
        raise ValueError(f"a state of these {collection} records is not a record state ({exc})") from None
