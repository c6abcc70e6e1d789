"""Schema migrations: the `migrate()` builder, SQL generation, application and rollback (SPEC 2.11, 4.4).

A migration is an ordered tuple of frozen `MigrationStep`s. The builder that produces them is immutable (each
method returns a new builder), so a half-built migration shared between two schema versions can never change
behind either of them.

The local store keeps one SQLite table per collection, named after the collection, with one column per field,
named after the field (DESIGN.md section 2). `migration_steps_to_sql` and `apply_migration_steps` therefore
address exactly those names, always double-quoted, so a name that happens to be an SQL keyword (or, for steps
built by hand, contains a quote) still means the identifier and never SQL text.

Rollback follows SPEC 4.4's table: structural steps invert mechanically; dropping a column or rewriting
values loses information, so those steps can only be undone when they carry what is needed to rebuild it (the
field descriptor, a reverse transform) or when the migration declares explicit `.down()` steps.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, Self, TypeAlias

from .errors import STORAGE_ERROR, MigrationRollbackError, OfflineError, SchemaValidationError
from .fields import STORAGE_TYPES, FieldDescriptor
from .frozen import FrozenDict, freeze, thaw

__all__ = [
    "STEP_TYPES",
    "BackfillTransform",
    "MigrationBuilder",
    "MigrationDefinition",
    "MigrationStep",
    "RecordTransform",
    "ReversibleMigration",
    "RollbackBuilder",
    "StepType",
    "apply_migration_steps",
    "can_auto_rollback",
    "create_reversible_migration",
    "generate_rollback_steps",
    "migrate",
    "migration_steps_to_sql",
]

StepType = Literal["addField", "removeField", "renameField", "addIndex", "removeIndex", "backfill"]
STEP_TYPES: Final = ("addField", "removeField", "renameField", "addIndex", "removeIndex", "backfill")

#: A per-record backfill: receives the stored row (column -> raw SQLite value) and returns the changed fields
#: (or None / an empty mapping for "no change").
RecordTransform: TypeAlias = Callable[[dict[str, Any]], Mapping[str, Any] | None]
#: A backfill: a per-record function (runs in Python) or a constant `{field: value}` mapping (pure SQL).
BackfillTransform: TypeAlias = RecordTransform | Mapping[str, Any]

# Same rule define_schema applies to collection and field names, so a migration cannot create a column the
# schema itself could never declare.
_NAME_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_KEY_FIELD: Final = "id"
_SAVEPOINT: Final = '"offline_migration"'

# SPEC spells step keys in camelCase; `step["from"]` etc. map onto the Python attribute names.
_STEP_KEYS: Final[Mapping[str, str]] = {"from": "from_", "reverseTransform": "reverse_transform"}


# -- steps -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigrationStep:
    """One migration step (SPEC 2.11). Build steps with `migrate()`; the fields a type does not use are None.

    `field` is the field of addField/removeField/addIndex/removeIndex and None for renameField (which uses
    `from_` and `to`) and backfill (whose transform decides which fields change).
    """

    type: StepType
    collection: str
    field: str | None = None
    descriptor: FieldDescriptor | None = None
    from_: str | None = None
    to: str | None = None
    transform: BackfillTransform | None = None
    reverse_transform: BackfillTransform | None = None

    def __post_init__(self) -> None:
        if self.type not in STEP_TYPES:
            raise SchemaValidationError(
                f"unknown migration step type {self.type!r}; expected one of {', '.join(STEP_TYPES)}",
                {"stepType": self.type, "collection": self.collection, "field": self.field},
            )
        # Constant backfill mappings are frozen so a step stays immutable (and hashable) even when the caller
        # keeps and later mutates the dict it passed in.
        for attr in ("transform", "reverse_transform"):
            value = getattr(self, attr)
            if isinstance(value, Mapping) and not isinstance(value, FrozenDict):
                object.__setattr__(self, attr, freeze(value))

    def __getitem__(self, key: str) -> Any:
        name = _STEP_KEYS.get(key, key)
        if name not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, name)


def _describe(step: MigrationStep) -> str:
    """A short human label for messages: 'renameField todos.title -> name', 'backfill todos', ..."""
    if step.type == "renameField":
        return f"renameField {step.collection}.{step.from_} -> {step.to}"
    if step.field is None:
        return f"{step.type} {step.collection}"
    return f"{step.type} {step.collection}.{step.field}"


# -- validation --------------------------------------------------------------------------------------------


def _check_name(value: Any, what: str, step_type: str, collection: Any, field_name: Any) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise SchemaValidationError(
            f"{step_type}: {what} name {value!r} is invalid: it must start with a letter and contain only "
            "letters, digits and underscores",
            {"stepType": step_type, "collection": collection, "field": field_name},
        )
    return value


def _check_not_key(field_name: str, step_type: str, collection: str) -> None:
    # Every record already has an `id` column (the primary key the store addresses rows by); a migration
    # must not add, drop, rename or overwrite it.
    if field_name == _KEY_FIELD:
        raise SchemaValidationError(
            f"{step_type}: {collection}.id is the record key and cannot be changed by a migration",
            {"stepType": step_type, "collection": collection, "field": field_name},
        )


def _check_descriptor(value: Any, step_type: str, collection: str, field_name: str) -> FieldDescriptor:
    if not isinstance(value, FieldDescriptor):
        raise SchemaValidationError(
            f"{step_type} {collection}.{field_name} needs a field builder such as t.string(), got {value!r}",
            {"stepType": step_type, "collection": collection, "field": field_name},
        )
    return value


def _check_transform(value: Any, what: str, collection: str) -> BackfillTransform:
    if callable(value):
        return value  # type: ignore[no-any-return]
    if isinstance(value, Mapping):
        if not value:
            raise SchemaValidationError(
                f"backfill {collection}: {what} mapping is empty; name at least one field to set",
                {"stepType": "backfill", "collection": collection, "field": None},
            )
        for field_name, constant in value.items():
            _check_name(field_name, "field", "backfill", collection, field_name)
            _check_not_key(field_name, "backfill", collection)
            try:
                _sql_literal(constant)
            except (TypeError, ValueError) as exc:
                raise SchemaValidationError(
                    f"backfill {collection}.{field_name}: constant {constant!r} cannot be stored: {exc}",
                    {"stepType": "backfill", "collection": collection, "field": field_name},
                ) from None
        return FrozenDict(freeze(value))
    raise SchemaValidationError(
        f"backfill {collection}: {what} must be a function record -> changed fields, or a mapping "
        f"{{field: constant}}; got {value!r}",
        {"stepType": "backfill", "collection": collection, "field": None},
    )


# -- builders ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _StepBuilder:
    """The step methods shared by `MigrationBuilder` and `RollbackBuilder`. Every method returns a copy."""

    steps: tuple[MigrationStep, ...] = ()

    def _append(self, step: MigrationStep) -> Self:
        return replace(self, steps=(*self.steps, step))

    def add_field(self, collection: str, field: str, descriptor: FieldDescriptor) -> Self:
        _check_name(collection, "collection", "addField", collection, field)
        _check_name(field, "field", "addField", collection, field)
        _check_not_key(field, "addField", collection)
        desc = _check_descriptor(descriptor, "addField", collection, field)
        if desc.required and not desc.has_default:
            # SQLite cannot add a NOT NULL column without a default, and every existing row would hold null
            # in a field the schema says is required. richtext is never required, so it is always allowed.
            hint = " (an .auto() timestamp is only set on new writes)" if desc.is_auto else ""
            raise SchemaValidationError(
                f"addField {collection}.{field}: a new required field needs a .default(value), or make it "
                f".optional(); existing records would otherwise have no value{hint}",
                {"stepType": "addField", "collection": collection, "field": field},
            )
        return self._append(MigrationStep("addField", collection, field=field, descriptor=desc))

    def remove_field(self, collection: str, field: str, descriptor: FieldDescriptor | None = None) -> Self:
        _check_name(collection, "collection", "removeField", collection, field)
        _check_name(field, "field", "removeField", collection, field)
        _check_not_key(field, "removeField", collection)
        desc = None if descriptor is None else _check_descriptor(descriptor, "removeField", collection, field)
        return self._append(MigrationStep("removeField", collection, field=field, descriptor=desc))

    def rename_field(self, collection: str, from_: str, to: str) -> Self:
        _check_name(collection, "collection", "renameField", collection, from_)
        _check_name(from_, "field", "renameField", collection, from_)
        _check_name(to, "field", "renameField", collection, to)
        _check_not_key(from_, "renameField", collection)
        _check_not_key(to, "renameField", collection)
        if from_ == to:
            raise SchemaValidationError(
                f"renameField {collection}.{from_}: the new name is the same as the old one",
                {"stepType": "renameField", "collection": collection, "field": from_},
            )
        return self._append(MigrationStep("renameField", collection, from_=from_, to=to))

    def add_index(self, collection: str, field: str) -> Self:
        _check_name(collection, "collection", "addIndex", collection, field)
        _check_name(field, "field", "addIndex", collection, field)
        return self._append(MigrationStep("addIndex", collection, field=field))

    def remove_index(self, collection: str, field: str) -> Self:
        _check_name(collection, "collection", "removeIndex", collection, field)
        _check_name(field, "field", "removeIndex", collection, field)
        return self._append(MigrationStep("removeIndex", collection, field=field))

    def backfill(
        self,
        collection: str,
        transform: BackfillTransform,
        reverse_transform: BackfillTransform | None = None,
    ) -> Self:
        _check_name(collection, "collection", "backfill", collection, None)
        forward = _check_transform(transform, "transform", collection)
        reverse = None
        if reverse_transform is not None:
            reverse = _check_transform(reverse_transform, "reverse_transform", collection)
        return self._append(
            MigrationStep("backfill", collection, transform=forward, reverse_transform=reverse)
        )


@dataclass(frozen=True, slots=True)
class RollbackBuilder(_StepBuilder):
    """What `.down(fn)` hands to `fn`: the same step methods, collecting the explicit rollback steps."""


@dataclass(frozen=True, slots=True)
class MigrationDefinition:
    """`migrate()...build()` (SPEC 2.11): the ordered `steps` plus the explicit `down` steps, if any."""

    steps: tuple[MigrationStep, ...]
    down: tuple[MigrationStep, ...] | None = None

    @property
    def safely_reversible(self) -> bool:
        return self.down is not None or all(can_auto_rollback(step) for step in self.steps)

    def rollback_steps(self) -> list[MigrationStep]:
        """The explicit down steps when declared, else the auto-generated inverse (may raise
        MigrationRollbackError)."""
        if self.down is not None:
            return list(self.down)
        return generate_rollback_steps(self.steps)

    def __getitem__(self, key: str) -> Any:
        if key in ("safelyReversible", "safely_reversible"):
            return self.safely_reversible
        if key not in ("steps", "down"):
            raise KeyError(key)
        return getattr(self, key)


@dataclass(frozen=True, slots=True)
class MigrationBuilder(_StepBuilder):
    """The immutable builder `migrate()` returns; `build()` freezes it into a MigrationDefinition."""

    down_steps: tuple[MigrationStep, ...] | None = None

    def down(self, fn: Callable[[RollbackBuilder], RollbackBuilder]) -> MigrationBuilder:
        """Declare explicit rollback steps: ``fn`` gets an empty RollbackBuilder and returns the chained one.

        A later call replaces an earlier one (the builder is a value, so the last declaration wins).
        """
        if not callable(fn):
            raise SchemaValidationError(
                f"down() takes a function (rollback builder) -> rollback builder, got {fn!r}",
                {"stepType": None, "collection": None, "field": None},
            )
        result = fn(RollbackBuilder())
        if not isinstance(result, RollbackBuilder):
            # The builder is immutable, so a function that calls methods without returning the result would
            # silently declare nothing; refuse instead.
            raise SchemaValidationError(
                "down(fn): fn must return the rollback builder it built, e.g. "
                "lambda r: r.remove_field('todos', 'priority')",
                {"stepType": None, "collection": None, "field": None, "received": type(result).__name__},
            )
        return replace(self, down_steps=result.steps)

    @property
    def safely_reversible(self) -> bool:
        """True when explicit down steps exist or every step can be rolled back automatically."""
        return self.down_steps is not None or all(can_auto_rollback(step) for step in self.steps)

    def build(self) -> MigrationDefinition:
        return MigrationDefinition(steps=self.steps, down=self.down_steps)


def migrate() -> MigrationBuilder:
    """An empty, immutable migration builder (SPEC 4.4)."""
    return MigrationBuilder()


# -- SQL ---------------------------------------------------------------------------------------------------


def _quote(name: str) -> str:
    """Quote an SQLite identifier: wrap in double quotes and double any embedded double quote."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"invalid SQL identifier {name!r}")
    return '"' + name.replace('"', '""') + '"'


def _index_name(collection: str, field_name: str) -> str:
    return _quote(f"idx_{collection}_{field_name}")


def _json_text(value: Any) -> str:
    # Compact JSON, the text form arrays are stored in (SPEC 2.4).
    return json.dumps(thaw(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _sql_literal(value: Any) -> str:
    """Render a constant as an SQLite literal, stored the way the local store stores that type (SPEC 2.4)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):  # before int: bool is an int subclass, and booleans are stored 0/1
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("non-finite numbers cannot be stored")
        return repr(value)
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("text containing NUL cannot be written as an SQL literal")
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (bytes, bytearray)):
        return "X'" + bytes(value).hex() + "'"
    if isinstance(value, (list, tuple)):
        # Arrays are stored as JSON text (SPEC 2.4).
        return _sql_literal(_json_text(value))
    raise TypeError(f"unsupported value type {type(value).__name__}")


def _column_definition(field_name: str, descriptor: FieldDescriptor) -> str:
    parts = [_quote(field_name), STORAGE_TYPES[descriptor.type]]
    if descriptor.has_default:
        # NOT NULL only with a default: SQLite needs one to fill existing rows, and an .optional() field keeps
        # accepting null even when it has a default.
        if descriptor.required:
            parts.append("NOT NULL")
        parts.append(f"DEFAULT {_sql_literal(descriptor.default_value)}")
    column = _quote(field_name)
    if descriptor.type == "enum" and descriptor.enum_values:
        allowed = ",".join(_sql_literal(v) for v in descriptor.enum_values)
        parts.append(f"CHECK ({column} IN ({allowed}))")
    elif descriptor.type == "boolean":
        parts.append(f"CHECK ({column} IN (0,1))")
    return " ".join(parts)


def _comment_safe(text: str) -> str:
    # A `--` comment ends at a line break; dropping them keeps a hostile name from starting a new statement.
    return text.replace("\r", " ").replace("\n", " ")


def _step_sql(step: MigrationStep) -> str:
    table = _quote(step.collection)
    if step.type == "addField":
        assert step.field is not None and step.descriptor is not None, "addField needs field and descriptor"
        return f"ALTER TABLE {table} ADD COLUMN {_column_definition(step.field, step.descriptor)}"
    if step.type == "removeField":
        assert step.field is not None, "removeField needs a field"
        return f"ALTER TABLE {table} DROP COLUMN {_quote(step.field)}"
    if step.type == "renameField":
        assert step.from_ is not None and step.to is not None, "renameField needs from_ and to"
        return f"ALTER TABLE {table} RENAME COLUMN {_quote(step.from_)} TO {_quote(step.to)}"
    if step.type == "addIndex":
        assert step.field is not None, "addIndex needs a field"
        return (
            f"CREATE INDEX IF NOT EXISTS {_index_name(step.collection, step.field)} "
            f"ON {table} ({_quote(step.field)})"
        )
    if step.type == "removeIndex":
        assert step.field is not None, "removeIndex needs a field"
        return f"DROP INDEX IF EXISTS {_index_name(step.collection, step.field)}"
    # backfill
    transform = step.transform
    if isinstance(transform, Mapping) and transform:
        assignments = ", ".join(f"{_quote(k)} = {_sql_literal(v)}" for k, v in transform.items())
        return f"UPDATE {table} SET {assignments}"
    # A per-record function cannot be expressed in SQL. A comment keeps one item per step and executes as a
    # no-op, so a caller running the list blindly does not fail (the data change needs apply_migration_steps).
    return f"-- backfill {_comment_safe(table)}: runs in Python (apply_migration_steps)"


def _as_steps(steps: Iterable[MigrationStep] | MigrationDefinition) -> tuple[MigrationStep, ...]:
    items = steps.steps if isinstance(steps, MigrationDefinition) else tuple(steps)
    for item in items:
        if not isinstance(item, MigrationStep):
            raise SchemaValidationError(
                f"expected migration steps built with migrate(), got {item!r}",
                {"received": type(item).__name__},
            )
    return items


def migration_steps_to_sql(steps: Iterable[MigrationStep] | MigrationDefinition) -> list[str]:
    """One SQLite statement per step (SPEC 4.4), on the tables/columns the local store uses."""
    return [_step_sql(step) for step in _as_steps(steps)]


# -- applying ----------------------------------------------------------------------------------------------


def _storable(value: Any) -> Any:
    """Adapt a Python value returned by a backfill to what the store keeps in SQLite (SPEC 2.4)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (list, tuple)):
        return _json_text(value)
    return value


def _run_record_backfill(
    connection: sqlite3.Connection, step: MigrationStep, transform: RecordTransform, key_column: str
) -> None:
    table = _quote(step.collection)
    cursor = connection.execute(f"SELECT * FROM {table}")
    columns = [d[0] for d in cursor.description]
    if key_column not in columns:
        raise LookupError(f"table {table} has no key column {key_column!r}")
    # Read everything first: updating a table while a cursor over it is still stepping can revisit rows.
    rows = cursor.fetchall()
    for row in rows:
        record = dict(zip(columns, row, strict=True))
        key = record[key_column]
        changes = transform(dict(record))
        if changes is None:
            continue
        if not isinstance(changes, Mapping):
            raise TypeError(
                f"the backfill transform must return a mapping of changed fields (or None), got {changes!r}"
            )
        updates = {k: v for k, v in changes.items() if not (k == key_column and v == key)}
        if key_column in updates:
            raise ValueError(f"the backfill transform tried to change the record key {key_column!r}")
        if not updates:
            continue
        assignments = ", ".join(f"{_quote(str(k))} = ?" for k in updates)
        connection.execute(
            f"UPDATE {table} SET {assignments} WHERE {_quote(key_column)} = ?",
            [*(_storable(v) for v in updates.values()), key],
        )


def apply_migration_steps(
    connection: sqlite3.Connection,
    steps: Iterable[MigrationStep] | MigrationDefinition,
    *,
    key_column: str = "id",
) -> None:
    """Run ``steps`` against ``connection`` atomically: all of them, or none (the database is left unchanged).

    SQLite DDL is transactional, so one transaction covers every step. When the caller already has a
    transaction open, a savepoint is used instead, so the caller's own work is neither committed nor lost.
    Any failure rolls back and is raised as OfflineError code STORAGE_ERROR naming the failing step.

    Per-record backfills run in Python, row by row: the transform receives the row as a dict of column ->
    raw SQLite value (arrays are JSON text, booleans 0/1, richtext a BLOB; no decoding, because the step
    does not know the collection's descriptors) and returns the fields to change (None or {} for none).
    Returned booleans are stored as 0/1 and lists as JSON text; the row is updated by ``key_column``.
    """
    items = _as_steps(steps)
    nested = connection.in_transaction
    connection.execute(f"SAVEPOINT {_SAVEPOINT}" if nested else "BEGIN")

    def rollback() -> None:
        # A failed statement may already have ended the transaction (SQLite rolls back on some errors);
        # a failing ROLLBACK must not hide the original error.
        with suppress(sqlite3.Error):
            if nested:
                connection.execute(f"ROLLBACK TO {_SAVEPOINT}")
                connection.execute(f"RELEASE {_SAVEPOINT}")
            elif connection.in_transaction:
                connection.execute("ROLLBACK")

    for index, step in enumerate(items):
        try:
            transform = step.transform
            if step.type == "backfill" and transform is not None and not isinstance(transform, Mapping):
                _run_record_backfill(connection, step, transform, key_column)
            else:
                connection.execute(_step_sql(step))
        except Exception as exc:
            rollback()
            raise OfflineError(
                f"migration step {index + 1} of {len(items)} ({_describe(step)}) failed: {exc}; "
                "no step was applied",
                STORAGE_ERROR,
                {
                    "step": index,
                    "stepType": step.type,
                    "collection": step.collection,
                    "field": step.field if step.field is not None else step.from_,
                    "cause": str(exc),
                },
            ) from exc
        except BaseException:
            rollback()
            raise
    try:
        connection.execute(f"RELEASE {_SAVEPOINT}" if nested else "COMMIT")
    except sqlite3.Error as exc:
        rollback()
        raise OfflineError(
            f"committing the migration failed: {exc}; no step was applied",
            STORAGE_ERROR,
            {"step": None, "stepType": None, "collection": None, "field": None, "cause": str(exc)},
        ) from exc


# -- rollback ----------------------------------------------------------------------------------------------


def can_auto_rollback(step: MigrationStep) -> bool:
    """Whether ``step`` can be undone without an explicit `.down()` (SPEC 4.4's auto-rollback table)."""
    if step.type == "removeField":
        return step.descriptor is not None
    if step.type == "backfill":
        return step.reverse_transform is not None
    return step.type in ("addField", "addIndex", "removeIndex", "renameField")


def _inverse(step: MigrationStep) -> MigrationStep:
    if step.type == "addField":
        # Carry the descriptor so the rollback is itself reversible.
        return MigrationStep("removeField", step.collection, field=step.field, descriptor=step.descriptor)
    if step.type == "removeField" and step.descriptor is not None:
        # Restores the column (with its default, if any); the dropped values themselves are gone.
        return MigrationStep("addField", step.collection, field=step.field, descriptor=step.descriptor)
    if step.type == "addIndex":
        return MigrationStep("removeIndex", step.collection, field=step.field)
    if step.type == "removeIndex":
        return MigrationStep("addIndex", step.collection, field=step.field)
    if step.type == "renameField":
        return MigrationStep("renameField", step.collection, from_=step.to, to=step.from_)
    if step.type == "backfill" and step.reverse_transform is not None:
        return MigrationStep(
            "backfill", step.collection, transform=step.reverse_transform, reverse_transform=step.transform
        )
    reason = (
        "it carries no field descriptor (pass one to remove_field())"
        if step.type == "removeField"
        else "it has no reverse_transform"
    )
    target = step.collection if step.field is None else f"{step.collection}.{step.field}"
    raise MigrationRollbackError(
        f"cannot auto-rollback {step.type} on collection {step.collection!r} ({target}): {reason}; "
        "declare explicit rollback steps with .down()",
        {"stepType": step.type, "collection": step.collection, "field": step.field},
    )


def generate_rollback_steps(
    forward_steps: Iterable[MigrationStep] | MigrationDefinition,
) -> list[MigrationStep]:
    """The inverse of ``forward_steps``, last step first; MigrationRollbackError if one cannot be inverted."""
    return [_inverse(step) for step in reversed(_as_steps(forward_steps))]


@dataclass(frozen=True, slots=True)
class ReversibleMigration:
    """A migration between two schema versions with both directions resolved (SPEC 2.11)."""

    up: tuple[MigrationStep, ...]
    down: tuple[MigrationStep, ...]
    from_version: int
    to_version: int

    def __getitem__(self, key: str) -> Any:
        name = {"fromVersion": "from_version", "toVersion": "to_version"}.get(key, key)
        if name not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, name)


def _check_version(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchemaValidationError(
            f"{what} must be a positive integer schema version, got {value!r}", {"field": what}
        )
    return value


def create_reversible_migration(
    up: MigrationDefinition | Iterable[MigrationStep],
    down: MigrationDefinition | Iterable[MigrationStep] | None,
    from_version: int,
    to_version: int,
) -> ReversibleMigration:
    """Pair ``up`` with its rollback (SPEC 4.4).

    An explicit ``down`` is used as given. ``down=None`` uses the explicit `.down()` steps of an ``up``
    MigrationDefinition when it declares them, otherwise auto-generates them with `generate_rollback_steps`
    (MigrationRollbackError propagates).
    """
    _check_version(from_version, "from_version")
    _check_version(to_version, "to_version")
    if from_version == to_version:
        raise SchemaValidationError(
            f"a migration must change the schema version, got {from_version} -> {to_version}",
            {"field": "to_version"},
        )
    up_steps = _as_steps(up)
    if down is not None:
        down_steps = _as_steps(down)
    elif isinstance(up, MigrationDefinition):
        down_steps = tuple(up.rollback_steps())
    else:
        down_steps = tuple(generate_rollback_steps(up_steps))
    return ReversibleMigration(up=up_steps, down=down_steps, from_version=from_version, to_version=to_version)
