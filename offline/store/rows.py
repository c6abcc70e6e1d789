"""Records <-> SQLite rows, using SPEC 2.4's storage types (the same layout migrations assume)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from offline.core.fields import STORAGE_TYPES, FieldDescriptor
from offline.core.schema import CollectionDefinition
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
