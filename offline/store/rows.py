"""Records <-> SQLite rows, using SPEC 2.4's storage types (the same layout migrations assume)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from offline.core.fields import STORAGE_TYPES, FieldDescriptor
from offline.core.schema import CollectionDefinition, SchemaDefinition
from offline.merge import richtext
from offline.merge.values import compact_json, norm_number


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def create_table_sql(collection: CollectionDefinition) -> list[str]:
    columns = [f"{quote('id')} TEXT PRIMARY KEY NOT NULL"]
    for name, descriptor in collection.fields.items():
        column = f"{quote(name)} {STORAGE_TYPES[descriptor.type]}"
        if descriptor.type == "enum" and descriptor.enum_values:
            allowed = ", ".join(sql_literal(v) for v in descriptor.enum_values)
            column += f" CHECK ({quote(name)} IN ({allowed}))"
        elif descriptor.type == "boolean":
            column += f" CHECK ({quote(name)} IN (0, 1))"
        columns.append(column)
    statements = [f"CREATE TABLE IF NOT EXISTS {quote(collection.name)} ({', '.join(columns)})"]
    for field in collection.indexes:
        index = quote(f"idx_{collection.name}_{field}")
        statements.append(f"CREATE INDEX IF NOT EXISTS {index} ON {quote(collection.name)} ({quote(field)})")
    return statements


# -- what the engine looks records up by -----------------------------------------------------------------
#
# Constraint checks and relation planning look records up by field values on every write and delete (a
# unique field's value, a capacity group, the records pointing at a deleted parent). Without an index each
# such lookup reads the whole table, so a write's cost grew with the collection. The store keeps these
# lookups indexed on its own, whatever the schema declares: an index per scalar field set, and for an array
# of ids (a many-to-many relation, a referential constraint on an array field) a side table of
# (element, record) pairs that triggers keep equal to the column. These objects are derived from the schema
# alone: `sync_lookup_indexes` drops those the schema no longer asks for and creates the missing ones.

LOOKUP_PREFIX = "_offline_lookup_"


def lookup_field_sets(schema: SchemaDefinition, collection: str) -> list[tuple[str, ...]]:
    """The field sets of ``collection`` the engine looks records up by (scalar fields), without repeats."""
    definition = schema.collections[collection]
    wanted: list[tuple[str, ...]] = []
    for constraint in definition.constraints.values():
        fields = tuple(f for f in constraint.fields if f in definition.fields)
        if constraint.type == "referential":
            wanted.extend((f,) for f in fields if definition.fields[f].type != "array")
        elif fields and not any(definition.fields[f].type in ("array", "richtext") for f in fields):
            wanted.append(fields)
    for relation in schema.relations.values():
        field = definition.fields.get(relation.field) if relation.from_ == collection else None
        if field is not None and field.type not in ("array", "richtext"):
            wanted.append((relation.field,))
    declared = {(f,) for f in definition.indexes}
    out: list[tuple[str, ...]] = []
    for fields in wanted:
        if fields not in out and fields not in declared:
            out.append(fields)
    return out


def lookup_array_fields(schema: SchemaDefinition, collection: str) -> list[str]:
    """Array fields of ``collection`` holding ids that deletes of other records look up (by element)."""
    definition = schema.collections[collection]
    out: list[str] = []
    for constraint in definition.constraints.values():
        if constraint.type == "referential":
            out.extend(
                f
                for f in constraint.fields
                if f in definition.fields and definition.fields[f].type == "array"
            )
    for relation in schema.relations.values():
        field = definition.fields.get(relation.field) if relation.from_ == collection else None
        if field is not None and field.type == "array":
            out.append(relation.field)
    return list(dict.fromkeys(out))


def element_table(collection: str, field: str) -> str:
    """The side table of (element, record id) pairs of one array field (see `lookup_array_fields`)."""
    return quote(f"{LOOKUP_PREFIX}{collection}__{field}")


def _lookup_objects(schema: SchemaDefinition) -> dict[tuple[str, str], list[str]]:
    """(type, name) -> statements creating it, for every lookup object the schema asks for."""
    objects: dict[tuple[str, str], list[str]] = {}
    for name in schema.collections:
        table = quote(name)
        for fields in lookup_field_sets(schema, name):
            index = f"{LOOKUP_PREFIX}{name}__{'__'.join(fields)}"
            columns = ", ".join(quote(f) for f in fields)
            objects[("index", index)] = [f"CREATE INDEX IF NOT EXISTS {quote(index)} ON {table} ({columns})"]
        for field in lookup_array_fields(schema, name):
            side_name = f"{LOOKUP_PREFIX}{name}__{field}"
            side = quote(side_name)
            column = quote(field)
            fill = (
                f"INSERT OR IGNORE INTO {side} (record_id, element) "
                f"SELECT NEW.id, value FROM json_each(CASE WHEN json_valid(NEW.{column}) "
                f"THEN NEW.{column} ELSE '[]' END) WHERE type = 'text'"
            )
            objects[("table", side_name)] = [
                f"CREATE TABLE IF NOT EXISTS {side} (record_id TEXT NOT NULL, element TEXT NOT NULL, "
                "PRIMARY KEY (record_id, element)) WITHOUT ROWID",
                f"CREATE INDEX IF NOT EXISTS {quote(side_name + '__element')} ON {side} (element)",
                f"DELETE FROM {side}",
                f"INSERT OR IGNORE INTO {side} (record_id, element) SELECT t.id, j.value FROM {table} t, "
                f"json_each(CASE WHEN json_valid(t.{column}) THEN t.{column} ELSE '[]' END) j "
                "WHERE j.type = 'text'",
                # INSERT OR REPLACE fires no delete trigger (recursive triggers are off): the insert
                # trigger clears the record's old pairs itself.
                f"CREATE TRIGGER IF NOT EXISTS {quote(side_name + '__insert')} AFTER INSERT ON {table} "
                f"BEGIN DELETE FROM {side} WHERE record_id = NEW.id; {fill}; END",
                f"CREATE TRIGGER IF NOT EXISTS {quote(side_name + '__update')} AFTER UPDATE OF id, {column} "
                f"ON {table} "
                f"BEGIN DELETE FROM {side} WHERE record_id = OLD.id; {fill}; END",
                f"CREATE TRIGGER IF NOT EXISTS {quote(side_name + '__delete')} AFTER DELETE ON {table} "
                f"BEGIN DELETE FROM {side} WHERE record_id = OLD.id; END",
            ]
    return objects


def _present_lookup_objects(conn: Any) -> set[tuple[str, str]]:
    """The lookup tables and indexes in the database (a side table's own index and triggers go with it)."""
    return {
        (kind, name)
        for kind, name, table in conn.execute(
            "SELECT type, name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index') "
            "AND substr(name, 1, ?) = ?",
            (len(LOOKUP_PREFIX), LOOKUP_PREFIX),
        )
        if kind == "table" or not table.startswith(LOOKUP_PREFIX)
    }


def _drop(conn: Any, kind: str, name: str) -> None:
    if kind == "table":
        for suffix in ("__insert", "__update", "__delete"):
            conn.execute(f"DROP TRIGGER IF EXISTS {quote(name + suffix)}")
    conn.execute(f"DROP {kind.upper()} IF EXISTS {quote(name)}")


def drop_lookup_indexes(conn: Any) -> None:
    """Drop every lookup object (before migration steps: SQLite refuses to drop an indexed column)."""
    for kind, name in _present_lookup_objects(conn):
        _drop(conn, kind, name)


def sync_lookup_indexes(conn: Any, schema: SchemaDefinition) -> None:
    """Make the store's lookup objects those ``schema`` asks for: drop the others, create the missing ones."""
    wanted = _lookup_objects(schema)
    present = _present_lookup_objects(conn)
    for kind, name in present - set(wanted):
        _drop(conn, kind, name)
    for key, statements in wanted.items():
        if key not in present:
            for statement in statements:
                conn.execute(statement)


def to_column(descriptor: FieldDescriptor, value: Any) -> Any:
    """A field value in its storage form."""
    if value is None:
        return None
    kind = descriptor.type
    if kind == "boolean":
        return 1 if value else 0
    if kind == "array":
        # Compact JSON, the same text migrations write for array defaults.
        if type(value) is list and not value:
            return "[]"
        return compact_json(list(value))
    return value


def from_column(descriptor: FieldDescriptor, value: Any) -> Any:
    if value is None:
        return "" if descriptor.type == "richtext" else None
    kind = descriptor.type
    if kind == "number":
        return norm_number(value)
    if kind == "boolean":
        return bool(value)
    if kind == "array":
        items = json.loads(value)
        if descriptor.inner is not None and descriptor.inner.type == "number":
            return [norm_number(v) for v in items]
        return items
    if kind == "richtext":
        return richtext.text_of(value)
    return value


class RowCodec:
    """Converts one collection's records to rows and back."""

    def __init__(self, collection: CollectionDefinition) -> None:
        self.collection = collection
        self.names = list(collection.fields)
        self.descriptors = [collection.fields[n] for n in self.names]
        self.table = quote(collection.name)
        cols = ", ".join(quote(n) for n in ["id", *self.names])
        marks = ", ".join("?" for _ in range(len(self.names) + 1))
        self.select_columns = cols
        self.upsert_head = f"INSERT OR REPLACE INTO {self.table} ({cols})"
        self.upsert_sql = f"{self.upsert_head} VALUES ({marks})"
        self.delete_sql = f"DELETE FROM {self.table} WHERE {quote('id')} = ?"
        self.has_richtext = any(d.type == "richtext" for d in self.descriptors)
        # Per column, how row() and record() convert (the same results as to_column / from_column):
        # row: 0 = as is, 1 = boolean, 2 = rich text, 3 = to_column.
        self._to: list[tuple[str, int, FieldDescriptor]] = [
            (name, _to_how(d), d) for name, d in zip(self.names, self.descriptors, strict=True)
        ]
        # record: None = as is, else a function of the stored value.
        self._from: list[Any] = [
            None
            if d.type in _STORED_AS_IS
            else norm_number
            if d.type == "number"
            else _from_boolean
            if d.type == "boolean"
            else partial(from_column, d)
            for d in self.descriptors
        ]

    def row(
        self, record: Mapping[str, Any], richtext_states: Mapping[str, str | None] | None = None
    ) -> list[Any]:
        values: list[Any] = [record["id"]]
        append = values.append
        get = record.get
        for name, how, descriptor in self._to:
            if how == 0:
                append(get(name))
            elif how == 1:
                value = get(name)
                append(None if value is None else 1 if value else 0)
            elif how == 2:
                state = (richtext_states or {}).get(name)
                append(richtext.decode_state(state) if state else None)
            else:
                append(to_column(descriptor, get(name)))
        return values

    def record(self, row: Sequence[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"id": row[0]}
        for name, convert, value in zip(self.names, self._from, row[1:], strict=True):
            out[name] = value if convert is None else convert(value)
        return out


# Field types whose column holds the field value itself (to_column and from_column are the identity).
_STORED_AS_IS = frozenset({"string", "enum", "timestamp"})


def _to_how(descriptor: FieldDescriptor) -> int:
    if descriptor.type in _STORED_AS_IS or descriptor.type == "number":
        return 0
    if descriptor.type == "boolean":
        return 1
    if descriptor.type == "richtext":
        return 2
    return 3


def _from_boolean(value: Any) -> Any:
    return None if value is None else bool(value)
