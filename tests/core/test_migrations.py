from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from offline.core.errors import (
    MIGRATION_ROLLBACK,
    SCHEMA_VALIDATION,
    STORAGE_ERROR,
    MigrationRollbackError,
    OfflineError,
    SchemaValidationError,
)
from offline.core.fields import t
from offline.core.frozen import FrozenDict
from offline.core.migrations import (
    STEP_TYPES,
    MigrationBuilder,
    MigrationDefinition,
    MigrationStep,
    ReversibleMigration,
    RollbackBuilder,
    apply_migration_steps,
    can_auto_rollback,
    create_reversible_migration,
    generate_rollback_steps,
    migrate,
    migration_steps_to_sql,
)
from offline.core.schema import define_schema

ORIGINAL_COLUMNS = [("id", "TEXT"), ("title", "TEXT"), ("done", "INTEGER")]
ORIGINAL_ROWS = [("a", "Write", 0), ("b", "Ship", 1), ("c", "O'Brien", 0)]


def _add_name(record: dict[str, Any]) -> dict[str, Any]:
    return {"name": record["name"] + "!"}


def _strip_name(record: dict[str, Any]) -> dict[str, Any]:
    return {"name": record["name"][:-1]}


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:")
    connection.execute('CREATE TABLE "todos" ("id" TEXT PRIMARY KEY, "title" TEXT, "done" INTEGER)')
    connection.executemany('INSERT INTO "todos" VALUES (?, ?, ?)', ORIGINAL_ROWS)
    connection.commit()
    yield connection
    connection.close()


def columns(connection: sqlite3.Connection, table: str = "todos") -> list[tuple[str, str]]:
    quoted = '"' + table.replace('"', '""') + '"'
    return [(row[1], row[2]) for row in connection.execute(f"PRAGMA table_info({quoted})")]


def indexes(connection: sqlite3.Connection, table: str = "todos") -> set[str]:
    quoted = '"' + table.replace('"', '""') + '"'
    # The primary key's automatic index is not one a migration manages.
    listed = connection.execute(f"PRAGMA index_list({quoted})")
    return {row[1] for row in listed if not row[1].startswith("sqlite_autoindex_")}


def rows(
    connection: sqlite3.Connection, sql: str = 'SELECT * FROM "todos" ORDER BY "id"'
) -> list[tuple[Any, ...]]:
    return connection.execute(sql).fetchall()


# -- builder -----------------------------------------------------------------------------------------------


def test_migrate_returns_an_empty_builder() -> None:
    builder = migrate()
    assert isinstance(builder, MigrationBuilder)
    assert builder.steps == ()
    assert builder.down_steps is None
    assert builder.build() == MigrationDefinition(steps=(), down=None)


def test_builder_is_immutable_and_every_method_returns_a_new_builder() -> None:
    empty = migrate()
    one = empty.add_field("todos", "priority", t.string().default("low"))
    two = one.rename_field("todos", "title", "name")
    three = two.add_index("todos", "name").remove_index("todos", "name")
    four = three.backfill("todos", {"priority": "high"}).remove_field("todos", "done")
    with_down = four.down(lambda r: r.add_field("todos", "done", t.boolean().default(False)))

    assert empty.steps == ()
    assert [s.type for s in one.steps] == ["addField"]
    assert [s.type for s in two.steps] == ["addField", "renameField"]
    assert [s.type for s in three.steps] == ["addField", "renameField", "addIndex", "removeIndex"]
    assert len(four.steps) == 6
    assert four.down_steps is None  # down() did not touch the builder it was called on
    assert with_down.down_steps is not None and [s.type for s in with_down.down_steps] == ["addField"]
    assert len({id(b) for b in (empty, one, two, three, four, with_down)}) == 6

    with pytest.raises(dataclasses.FrozenInstanceError):
        empty.steps = (one.steps[0],)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.steps[0].collection = "other"  # type: ignore[misc]


def test_branching_from_one_builder_keeps_both_branches_independent() -> None:
    base = migrate().add_index("todos", "title")
    left = base.add_index("todos", "done")
    right = base.remove_index("todos", "title")
    assert [s.type for s in base.steps] == ["addIndex"]
    assert [s.type for s in left.steps] == ["addIndex", "addIndex"]
    assert [s.type for s in right.steps] == ["addIndex", "removeIndex"]


def test_every_step_type_carries_its_fields() -> None:
    desc = t.number().default(0)
    removed = t.boolean().optional()
    steps = (
        migrate()
        .add_field("todos", "estimate", desc)
        .remove_field("todos", "done", removed)
        .rename_field("todos", "title", "name")
        .add_index("todos", "name")
        .remove_index("todos", "name")
        .backfill("todos", _add_name, _strip_name)
        .build()
        .steps
    )
    add, remove, rename, add_idx, remove_idx, backfill = steps

    assert (add.type, add.collection, add.field, add.descriptor) == ("addField", "todos", "estimate", desc)
    assert (remove.type, remove.field, remove.descriptor) == ("removeField", "done", removed)
    assert (rename.type, rename.field, rename.from_, rename.to) == ("renameField", None, "title", "name")
    assert (add_idx.type, add_idx.field, add_idx.descriptor) == ("addIndex", "name", None)
    assert (remove_idx.type, remove_idx.field) == ("removeIndex", "name")
    assert (backfill.type, backfill.field) == ("backfill", None)
    assert backfill.transform is _add_name and backfill.reverse_transform is _strip_name

    # SPEC's camelCase keys read through __getitem__.
    assert rename["type"] == "renameField"
    assert rename["from"] == "title" and rename["to"] == "name"
    assert backfill["reverseTransform"] is _strip_name
    assert backfill["transform"] is _add_name
    assert add["descriptor"] == desc and add["collection"] == "todos"
    assert remove_idx["field"] == "name"
    with pytest.raises(KeyError):
        add["nope"]


def test_remove_field_descriptor_is_optional() -> None:
    step = migrate().remove_field("todos", "done").steps[0]
    assert step.descriptor is None
    assert step["descriptor"] is None


def test_constant_backfill_mapping_is_frozen() -> None:
    mapping: dict[str, Any] = {"priority": "high", "tags": ["a"]}
    step = migrate().backfill("todos", mapping).steps[0]
    mapping["priority"] = "changed"
    assert isinstance(step.transform, FrozenDict)
    assert step.transform == {"priority": "high", "tags": ("a",)}
    assert hash(step) == hash(step)  # hashable, like every frozen step


def test_step_types_constant_and_unknown_type() -> None:
    assert STEP_TYPES == ("addField", "removeField", "renameField", "addIndex", "removeIndex", "backfill")
    with pytest.raises(SchemaValidationError) as info:
        MigrationStep("dropTable", "todos")  # type: ignore[arg-type]
    assert info.value.code == SCHEMA_VALIDATION
    assert info.value.context is not None and info.value.context["stepType"] == "dropTable"


# -- validation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "collection", "field"),
    [
        (lambda: migrate().add_field("", "x", t.string().optional()), "", "x"),
        (lambda: migrate().add_field("todos", "1x", t.string().optional()), "todos", "1x"),
        (lambda: migrate().add_field("to-dos", "x", t.string().optional()), "to-dos", "x"),
        (lambda: migrate().remove_field("todos", "a b"), "todos", "a b"),
        (lambda: migrate().rename_field("todos", "title", "na me"), "todos", "na me"),
        (lambda: migrate().rename_field("todos", 'ti"tle', "name"), "todos", 'ti"tle'),
        (lambda: migrate().add_index("todos", "_x"), "todos", "_x"),
        (lambda: migrate().remove_index("t;odos", "x"), "t;odos", "x"),
        (lambda: migrate().backfill("", {"x": 1}), "", None),
        (lambda: migrate().backfill("todos", {"bad name": 1}), "todos", "bad name"),
    ],
)
def test_invalid_names_are_refused(call: Any, collection: str, field: str | None) -> None:
    with pytest.raises(SchemaValidationError) as info:
        call()
    assert info.value.context is not None
    assert info.value.context["collection"] == collection
    assert info.value.context["field"] == field


def test_add_field_needs_a_field_descriptor() -> None:
    with pytest.raises(SchemaValidationError) as info:
        migrate().add_field("todos", "x", "string")  # type: ignore[arg-type]
    assert info.value.context == {"stepType": "addField", "collection": "todos", "field": "x"}
    with pytest.raises(SchemaValidationError):
        migrate().remove_field("todos", "x", {"type": "string"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "descriptor",
    [
        t.string(),
        t.number(),
        t.boolean(),
        t.enum(["a"]),
        t.timestamp(),
        t.timestamp().auto(),
        t.array(t.string()),
    ],
)
def test_new_required_field_without_default_is_refused(descriptor: Any) -> None:
    with pytest.raises(SchemaValidationError) as info:
        migrate().add_field("todos", "priority", descriptor)
    assert info.value.context == {"stepType": "addField", "collection": "todos", "field": "priority"}
    assert "todos.priority" in info.value.message


@pytest.mark.parametrize(
    "descriptor",
    [t.string().optional(), t.string().default("x"), t.richtext(), t.timestamp().auto().optional()],
)
def test_optional_defaulted_and_richtext_fields_can_be_added(descriptor: Any) -> None:
    step = migrate().add_field("todos", "extra", descriptor).steps[0]
    assert step.descriptor == descriptor


def test_rename_to_the_same_name_is_refused() -> None:
    with pytest.raises(SchemaValidationError) as info:
        migrate().rename_field("todos", "title", "title")
    assert info.value.context == {"stepType": "renameField", "collection": "todos", "field": "title"}


@pytest.mark.parametrize(
    "call",
    [
        lambda: migrate().add_field("todos", "id", t.string().optional()),
        lambda: migrate().remove_field("todos", "id"),
        lambda: migrate().rename_field("todos", "id", "key"),
        lambda: migrate().rename_field("todos", "key", "id"),
        lambda: migrate().backfill("todos", {"id": "x"}),
    ],
)
def test_the_record_key_cannot_be_migrated(call: Any) -> None:
    with pytest.raises(SchemaValidationError) as info:
        call()
    assert info.value.context is not None and info.value.context["field"] == "id"


@pytest.mark.parametrize(
    ("transform", "reverse"),
    [
        ("not callable", None),
        (42, None),
        ({}, None),
        ({"x": object()}, None),
        ({"x": float("nan")}, None),
        ({"x": "a\x00b"}, None),
        (_add_name, "nope"),
        (_add_name, {}),
    ],
)
def test_backfill_transforms_are_validated(transform: Any, reverse: Any) -> None:
    with pytest.raises(SchemaValidationError) as info:
        migrate().backfill("todos", transform, reverse)
    assert info.value.context is not None and info.value.context["collection"] == "todos"
    assert info.value.context["stepType"] == "backfill"


def test_down_must_return_the_rollback_builder() -> None:
    builder = migrate().remove_field("todos", "done")
    with pytest.raises(SchemaValidationError):
        builder.down(lambda r: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(SchemaValidationError):
        builder.down("not a function")  # type: ignore[arg-type]
    seen: list[Any] = []

    def record(r: RollbackBuilder) -> RollbackBuilder:
        seen.append(r)
        return r.add_field("todos", "done", t.boolean().default(False))

    result = builder.down(record)
    assert isinstance(seen[0], RollbackBuilder) and seen[0].steps == ()
    assert result.down_steps is not None
    assert [(s.type, s.field) for s in result.down_steps] == [("addField", "done")]
    # The rollback builder validates like the migration builder.
    with pytest.raises(SchemaValidationError):
        builder.down(lambda r: r.add_field("todos", "done", t.boolean()))


def test_down_called_again_replaces_the_previous_down() -> None:
    builder = (
        migrate()
        .remove_field("todos", "done")
        .down(lambda r: r.add_index("todos", "x"))
        .down(lambda r: r.add_index("todos", "y"))
    )
    assert builder.down_steps is not None and [s.field for s in builder.down_steps] == ["y"]


# -- reversibility -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("builder", "expected"),
    [
        (migrate(), True),
        (migrate().add_field("todos", "x", t.string().optional()), True),
        (migrate().add_index("todos", "title").remove_index("todos", "title"), True),
        (migrate().rename_field("todos", "title", "name"), True),
        (migrate().remove_field("todos", "done"), False),
        (migrate().remove_field("todos", "done", t.boolean().optional()), True),
        (migrate().backfill("todos", _add_name), False),
        (migrate().backfill("todos", _add_name, _strip_name), True),
        (migrate().backfill("todos", {"title": "x"}, {"title": "y"}), True),
        (migrate().add_index("todos", "title").remove_field("todos", "done"), False),
        (migrate().remove_field("todos", "done").down(lambda r: r), True),
        (migrate().backfill("todos", _add_name).down(lambda r: r.backfill("todos", _strip_name)), True),
    ],
)
def test_safely_reversible(builder: MigrationBuilder, expected: bool) -> None:
    assert builder.safely_reversible is expected
    definition = builder.build()
    assert definition.safely_reversible is expected
    assert definition["safelyReversible"] is expected


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (MigrationStep("addField", "todos", field="x", descriptor=t.string().optional()), True),
        (MigrationStep("addIndex", "todos", field="x"), True),
        (MigrationStep("removeIndex", "todos", field="x"), True),
        (MigrationStep("renameField", "todos", from_="a", to="b"), True),
        (MigrationStep("removeField", "todos", field="x"), False),
        (MigrationStep("removeField", "todos", field="x", descriptor=t.string()), True),
        (MigrationStep("backfill", "todos", transform=_add_name), False),
        (MigrationStep("backfill", "todos", transform=_add_name, reverse_transform=_strip_name), True),
    ],
)
def test_can_auto_rollback_follows_the_spec_table(step: MigrationStep, expected: bool) -> None:
    assert can_auto_rollback(step) is expected


def test_generate_rollback_steps_inverts_in_reverse_order() -> None:
    desc = t.enum(["low", "high"]).default("low")
    removed = t.boolean().optional()
    forward = (
        migrate()
        .add_field("todos", "priority", desc)
        .rename_field("todos", "title", "name")
        .add_index("todos", "name")
        .remove_index("todos", "old")
        .backfill("todos", _add_name, _strip_name)
        .remove_field("todos", "done", removed)
        .build()
    )
    rollback = generate_rollback_steps(forward.steps)
    assert rollback == [
        MigrationStep("addField", "todos", field="done", descriptor=removed),
        MigrationStep("backfill", "todos", transform=_strip_name, reverse_transform=_add_name),
        MigrationStep("addIndex", "todos", field="old"),
        MigrationStep("removeIndex", "todos", field="name"),
        MigrationStep("renameField", "todos", from_="name", to="title"),
        MigrationStep("removeField", "todos", field="priority", descriptor=desc),
    ]
    # The inverse of the inverse is the original migration: the rollback is itself reversible.
    assert generate_rollback_steps(rollback) == list(forward.steps)
    # A MigrationDefinition is accepted directly, and its rollback_steps() is the same auto inverse.
    assert generate_rollback_steps(forward) == rollback
    assert forward.rollback_steps() == rollback
    assert generate_rollback_steps([]) == []


def test_explicit_down_wins_over_auto_generation() -> None:
    definition = (
        migrate()
        .add_field("todos", "x", t.string().optional())
        .down(lambda r: r.remove_field("todos", "x").add_index("todos", "title"))
        .build()
    )
    assert definition.down is not None
    assert definition.rollback_steps() == list(definition.down)
    assert [s.type for s in definition.rollback_steps()] == ["removeField", "addIndex"]


@pytest.mark.parametrize(
    ("builder", "step_type", "field"),
    [
        (migrate().add_index("todos", "title").remove_field("todos", "done"), "removeField", "done"),
        (migrate().add_index("todos", "title").backfill("todos", _add_name), "backfill", None),
        (migrate().backfill("todos", {"title": "x"}), "backfill", None),
    ],
)
def test_non_reversible_steps_raise_migration_rollback_error(
    builder: MigrationBuilder, step_type: str, field: str | None
) -> None:
    with pytest.raises(MigrationRollbackError) as info:
        generate_rollback_steps(builder.steps)
    err = info.value
    assert isinstance(err, OfflineError)
    assert err.code == MIGRATION_ROLLBACK and err.name == "OfflineError"
    assert step_type in err.message and "todos" in err.message
    assert err.context == {"stepType": step_type, "collection": "todos", "field": field}
    with pytest.raises(MigrationRollbackError):
        builder.build().rollback_steps()


def test_create_reversible_migration_with_explicit_down_uses_it_as_given() -> None:
    up = migrate().remove_field("todos", "done").build()
    down = [MigrationStep("addField", "todos", field="done", descriptor=t.boolean().optional())]
    migration = create_reversible_migration(up, down, 1, 2)
    assert isinstance(migration, ReversibleMigration)
    assert migration.up == up.steps
    assert migration.down == tuple(down)
    assert (migration.from_version, migration.to_version) == (1, 2)
    assert migration["fromVersion"] == 1 and migration["toVersion"] == 2
    assert migration["up"] == up.steps and migration["down"] == tuple(down)
    # An explicit (even empty) down is taken as given, and a definition works as down too.
    assert create_reversible_migration(up.steps, [], 1, 2).down == ()
    down_definition = migrate().add_index("todos", "title").build()
    assert create_reversible_migration(up, down_definition, 2, 3).down == down_definition.steps
    with pytest.raises(dataclasses.FrozenInstanceError):
        migration.to_version = 3  # type: ignore[misc]


def test_create_reversible_migration_auto_generates_down() -> None:
    up_steps = list(migrate().add_field("todos", "x", t.string().optional()).add_index("todos", "x").steps)
    migration = create_reversible_migration(up_steps, None, 2, 3)
    assert migration.up == tuple(up_steps)
    assert migration.down == tuple(generate_rollback_steps(up_steps))
    assert [s.type for s in migration.down] == ["removeIndex", "removeField"]

    with pytest.raises(MigrationRollbackError) as info:
        create_reversible_migration(migrate().remove_field("todos", "done").steps, None, 1, 2)
    assert "removeField" in info.value.message and "todos" in info.value.message

    # A definition with explicit down steps supplies them when down is None.
    with_down = migrate().remove_field("todos", "done").down(lambda r: r.add_index("todos", "title")).build()
    assert create_reversible_migration(with_down, None, 1, 2).down == with_down.down


@pytest.mark.parametrize(
    ("from_version", "to_version"), [(0, 1), (1, 0), (-1, 2), (True, 2), (1.0, 2), (2, 2)]
)
def test_create_reversible_migration_needs_positive_distinct_versions(
    from_version: Any, to_version: Any
) -> None:
    with pytest.raises(SchemaValidationError):
        create_reversible_migration([], [], from_version, to_version)


def test_steps_must_be_migration_steps() -> None:
    with pytest.raises(SchemaValidationError):
        migration_steps_to_sql([{"type": "addIndex"}])  # type: ignore[list-item]
    with pytest.raises(SchemaValidationError):
        generate_rollback_steps(["addIndex"])  # type: ignore[list-item]


# -- SQL ---------------------------------------------------------------------------------------------------


def test_sql_for_each_step_type() -> None:
    steps = (
        migrate()
        .add_field("todos", "priority", t.enum(["low", "it's"]).default("low"))
        .remove_field("todos", "done")
        .rename_field("todos", "title", "name")
        .add_index("todos", "name")
        .remove_index("todos", "name")
        .backfill("todos", {"priority": "it's", "estimate": 2.5, "flag": True, "tags": ["a", "b'c"]})
        .backfill("todos", _add_name)
        .steps
    )
    assert migration_steps_to_sql(steps) == [
        """ALTER TABLE "todos" ADD COLUMN "priority" TEXT NOT NULL DEFAULT 'low' """
        """CHECK ("priority" IN ('low','it''s'))""",
        'ALTER TABLE "todos" DROP COLUMN "done"',
        'ALTER TABLE "todos" RENAME COLUMN "title" TO "name"',
        'CREATE INDEX IF NOT EXISTS "idx_todos_name" ON "todos" ("name")',
        'DROP INDEX IF EXISTS "idx_todos_name"',
        """UPDATE "todos" SET "priority" = 'it''s', "estimate" = 2.5, "flag" = 1, "tags" = '["a","b''c"]'""",
        '-- backfill "todos": runs in Python (apply_migration_steps)',
    ]


@pytest.mark.parametrize(
    ("descriptor", "column"),
    [
        (t.string().default("x"), """"f" TEXT NOT NULL DEFAULT 'x'"""),
        (t.string().optional(), '"f" TEXT'),
        (t.string().optional().default("x"), """"f" TEXT DEFAULT 'x'"""),
        (t.number().default(3), '"f" REAL NOT NULL DEFAULT 3'),
        (t.number().default(-1.5), '"f" REAL NOT NULL DEFAULT -1.5'),
        (t.boolean().default(False), '"f" INTEGER NOT NULL DEFAULT 0 CHECK ("f" IN (0,1))'),
        (t.boolean().default(True), '"f" INTEGER NOT NULL DEFAULT 1 CHECK ("f" IN (0,1))'),
        (t.boolean().optional(), '"f" INTEGER CHECK ("f" IN (0,1))'),
        (t.enum(["a", "b"]).optional(), """"f" TEXT CHECK ("f" IN ('a','b'))"""),
        (t.timestamp().default(1700000000000), '"f" INTEGER NOT NULL DEFAULT 1700000000000'),
        (t.timestamp().auto().optional(), '"f" INTEGER'),
        (t.array(t.string()).default(["x", "y"]), """"f" TEXT NOT NULL DEFAULT '["x","y"]'"""),
        (t.array(t.number()).default([]), """"f" TEXT NOT NULL DEFAULT '[]'"""),
        (t.richtext(), '"f" BLOB'),
    ],
)
def test_add_field_column_definitions(descriptor: Any, column: str) -> None:
    [sql] = migration_steps_to_sql(migrate().add_field("c", "f", descriptor).steps)
    assert sql == f'ALTER TABLE "c" ADD COLUMN {column}'


def test_identifiers_with_double_quotes_are_escaped() -> None:
    steps = [
        MigrationStep("addField", 'we"ird', field='c"d', descriptor=t.enum(['x"y', "it's"]).default("it's")),
        MigrationStep("renameField", 'we"ird', from_='a"b', to='e"f'),
        MigrationStep("addIndex", 'we"ird', field='e"f'),
        MigrationStep("backfill", 'we"ird', transform={'c"d': 'x"y'}),
        MigrationStep("backfill", 'we"ird', transform=_add_name),
        MigrationStep("removeIndex", 'we"ird', field='e"f'),
        MigrationStep("removeField", 'we"ird', field='c"d'),
    ]
    assert migration_steps_to_sql(steps) == [
        """ALTER TABLE "we""ird" ADD COLUMN "c""d" TEXT NOT NULL DEFAULT 'it''s' """
        """CHECK ("c""d" IN ('x"y','it''s'))""",
        'ALTER TABLE "we""ird" RENAME COLUMN "a""b" TO "e""f"',
        'CREATE INDEX IF NOT EXISTS "idx_we""ird_e""f" ON "we""ird" ("e""f")',
        """UPDATE "we""ird" SET "c""d" = 'x"y'""",
        '-- backfill "we""ird": runs in Python (apply_migration_steps)',
        'DROP INDEX IF EXISTS "idx_we""ird_e""f"',
        'ALTER TABLE "we""ird" DROP COLUMN "c""d"',
    ]


def test_quoted_identifiers_work_in_sqlite() -> None:
    connection = sqlite3.connect(":memory:")
    connection.execute('CREATE TABLE "we""ird" ("id" TEXT PRIMARY KEY, "a""b" TEXT)')
    connection.execute("INSERT INTO \"we\"\"ird\" VALUES ('1', 'v')")
    connection.commit()
    seen: list[dict[str, Any]] = []

    def touch(record: dict[str, Any]) -> dict[str, Any]:
        seen.append(record)
        return {'e"f': record['e"f'] + "!"}

    apply_migration_steps(
        connection,
        [
            MigrationStep(
                "addField", 'we"ird', field='c"d', descriptor=t.enum(['x"y', "it's"]).default("it's")
            ),
            MigrationStep("renameField", 'we"ird', from_='a"b', to='e"f'),
            MigrationStep("addIndex", 'we"ird', field='e"f'),
            MigrationStep("backfill", 'we"ird', transform={'c"d': 'x"y'}),
            MigrationStep("backfill", 'we"ird', transform=touch),
        ],
    )
    assert columns(connection, 'we"ird') == [("id", "TEXT"), ('e"f', "TEXT"), ('c"d', "TEXT")]
    assert indexes(connection, 'we"ird') >= {'idx_we"ird_e"f'}
    assert rows(connection, 'SELECT * FROM "we""ird"') == [("1", "v!", 'x"y')]
    assert seen == [{"id": "1", 'e"f': "v", 'c"d': 'x"y'}]
    with pytest.raises(sqlite3.IntegrityError):
        connection.execute("""INSERT INTO "we""ird" VALUES ('2', 'w', 'other')""")
    connection.close()


def test_hostile_names_cannot_inject_sql(conn: sqlite3.Connection) -> None:
    hostile = 'x"; DROP TABLE "todos"; --'
    with pytest.raises(OfflineError) as info:
        apply_migration_steps(conn, [MigrationStep("addIndex", hostile, field="title")])
    assert info.value.code == STORAGE_ERROR
    [comment] = migration_steps_to_sql(
        [MigrationStep("backfill", 'x\nDROP TABLE "todos";', transform=_add_name)]
    )
    assert "\n" not in comment and comment.startswith("--")
    conn.executescript(comment)
    assert rows(conn) == ORIGINAL_ROWS


def test_sql_statements_are_executable_one_by_one(conn: sqlite3.Connection) -> None:
    definition = (
        migrate()
        .add_field("todos", "priority", t.enum(["low", "high"]).default("low"))
        .backfill("todos", _add_name)  # a comment statement: a no-op here
        .rename_field("todos", "title", "name")
        .add_index("todos", "name")
        .backfill("todos", {"priority": "high"})
        .build()
    )
    for statement in migration_steps_to_sql(definition):
        conn.execute(statement)
    conn.commit()
    assert columns(conn) == [("id", "TEXT"), ("name", "TEXT"), ("done", "INTEGER"), ("priority", "TEXT")]
    assert rows(conn) == [(i, title, done, "high") for i, title, done in ORIGINAL_ROWS]
    assert "idx_todos_name" in indexes(conn)


# -- applying against SQLite -------------------------------------------------------------------------------


def full_migration() -> MigrationDefinition:
    return (
        migrate()
        .add_field("todos", "priority", t.enum(["low", "high"]).default("low"))
        .add_field("todos", "estimate", t.number().default(1.5))
        .add_field("todos", "archived", t.boolean().default(False))
        .add_field("todos", "label", t.string().default("none"))
        .add_field("todos", "due", t.timestamp().default(1700000000000))
        .add_field("todos", "tags", t.array(t.string()).default(["x"]))
        .add_field("todos", "body", t.richtext())
        .rename_field("todos", "title", "name")
        .add_index("todos", "name")
        .backfill("todos", _add_name, _strip_name)
        .backfill("todos", {"priority": "high", "tags": ["a", "b"]}, {"priority": "low", "tags": ["x"]})
        .remove_field("todos", "done", t.boolean().default(False))
        .build()
    )


MIGRATED_COLUMNS = [
    ("id", "TEXT"),
    ("name", "TEXT"),
    ("priority", "TEXT"),
    ("estimate", "REAL"),
    ("archived", "INTEGER"),
    ("label", "TEXT"),
    ("due", "INTEGER"),
    ("tags", "TEXT"),
    ("body", "BLOB"),
]


def test_apply_full_migration_and_auto_rollback(conn: sqlite3.Connection) -> None:
    definition = full_migration()
    assert definition.safely_reversible
    apply_migration_steps(conn, definition)

    assert not conn.in_transaction  # committed
    assert columns(conn) == MIGRATED_COLUMNS
    assert "idx_todos_name" in indexes(conn)
    assert rows(conn) == [
        ("a", "Write!", "high", 1.5, 0, "none", 1700000000000, '["a","b"]', None),
        ("b", "Ship!", "high", 1.5, 0, "none", 1700000000000, '["a","b"]', None),
        ("c", "O'Brien!", "high", 1.5, 0, "none", 1700000000000, '["a","b"]', None),
    ]
    # The enum and boolean CHECK constraints hold for new writes.
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute('INSERT INTO "todos" ("id", "name", "priority") VALUES (\'d\', \'x\', \'urgent\')')
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute('INSERT INTO "todos" ("id", "name", "archived") VALUES (\'d\', \'x\', 2)')
    conn.execute('INSERT INTO "todos" ("id", "name") VALUES (\'d\', \'New!\')')
    assert rows(conn, 'SELECT "priority", "archived", "tags" FROM "todos" WHERE "id" = \'d\'') == [
        ("low", 0, '["x"]')
    ]
    conn.execute('DELETE FROM "todos" WHERE "id" = \'d\'')
    conn.commit()

    rollback = definition.rollback_steps()
    # Undo only the first two rollback steps (done re-added, constant backfill reversed) to see them work.
    apply_migration_steps(conn, rollback[:2])
    assert rows(conn, 'SELECT "priority", "tags", "done" FROM "todos"') == [("low", '["x"]', 0)] * 3
    apply_migration_steps(conn, rollback[2:])

    assert columns(conn) == ORIGINAL_COLUMNS
    assert "idx_todos_name" not in indexes(conn)
    # Titles are restored by the reverse transform; dropped `done` values come back as the column default.
    assert rows(conn) == [("a", "Write", 0), ("b", "Ship", 0), ("c", "O'Brien", 0)]


def test_apply_explicit_down(conn: sqlite3.Connection) -> None:
    def restore_done(record: dict[str, Any]) -> dict[str, Any]:
        return {"done": 1 if record["id"] == "b" else 0}

    definition = (
        migrate()
        .remove_field("todos", "done")
        .backfill("todos", {"title": "same"})
        .down(lambda r: r.add_field("todos", "done", t.boolean().optional()).backfill("todos", restore_done))
        .build()
    )
    assert not all(can_auto_rollback(s) for s in definition.steps) and definition.safely_reversible
    apply_migration_steps(conn, definition)
    assert columns(conn) == [("id", "TEXT"), ("title", "TEXT")]
    assert rows(conn) == [("a", "same"), ("b", "same"), ("c", "same")]

    apply_migration_steps(conn, definition.rollback_steps())
    assert columns(conn) == ORIGINAL_COLUMNS
    assert rows(conn) == [("a", "same", 0), ("b", "same", 1), ("c", "same", 0)]


def test_reversible_migration_round_trip(conn: sqlite3.Connection) -> None:
    migration = create_reversible_migration(
        migrate().rename_field("todos", "title", "name").add_index("todos", "name").build(), None, 1, 2
    )
    apply_migration_steps(conn, migration.up)
    assert columns(conn)[1] == ("name", "TEXT") and "idx_todos_name" in indexes(conn)
    apply_migration_steps(conn, migration.down)
    assert columns(conn) == ORIGINAL_COLUMNS and indexes(conn) == set()
    assert rows(conn) == ORIGINAL_ROWS


def test_callable_backfill_gets_raw_values_and_stores_python_values(conn: sqlite3.Connection) -> None:
    seen: list[dict[str, Any]] = []

    def transform(record: dict[str, Any]) -> dict[str, Any] | None:
        seen.append(record)
        if record["id"] == "c":
            return None  # no change
        return {"id": record["id"], "tags": [record["title"], "t"], "flag": not record["done"]}

    apply_migration_steps(
        conn,
        migrate()
        .add_field("todos", "tags", t.array(t.string()).default([]))
        .add_field("todos", "flag", t.boolean().optional())
        .backfill("todos", transform)
        .build(),
    )
    # Raw storage values: booleans as 0/1 integers, arrays as JSON text.
    assert sorted(seen, key=lambda r: r["id"]) == [
        {"id": i, "title": title, "done": done, "tags": "[]", "flag": None}
        for i, title, done in ORIGINAL_ROWS
    ]
    assert rows(conn) == [
        ("a", "Write", 0, '["Write","t"]', 1),
        ("b", "Ship", 1, '["Ship","t"]', 0),
        ("c", "O'Brien", 0, "[]", None),
    ]


def test_callable_backfill_uses_key_column(conn: sqlite3.Connection) -> None:
    conn.execute('CREATE TABLE "notes" ("key" TEXT PRIMARY KEY, "text" TEXT)')
    conn.execute("INSERT INTO \"notes\" VALUES ('k1', 'hi')")
    conn.commit()
    step = MigrationStep("backfill", "notes", transform=lambda r: {"text": r["text"].upper()})
    with pytest.raises(OfflineError) as info:
        apply_migration_steps(conn, [step])  # default key column "id" is missing
    assert info.value.code == STORAGE_ERROR
    apply_migration_steps(conn, [step], key_column="key")
    assert rows(conn, 'SELECT * FROM "notes"') == [("k1", "HI")]


@pytest.mark.parametrize(
    "transform",
    [
        lambda r: {"id": "changed"},
        lambda r: "not a mapping",
        lambda r: {"missing_column": 1},
        lambda r: {"title": object()},
    ],
)
def test_bad_backfill_results_roll_back(conn: sqlite3.Connection, transform: Any) -> None:
    steps = migrate().add_field("todos", "x", t.string().optional()).backfill("todos", transform).steps
    with pytest.raises(OfflineError) as info:
        apply_migration_steps(conn, steps)
    assert info.value.code == STORAGE_ERROR
    assert info.value.context is not None and info.value.context["stepType"] == "backfill"
    assert columns(conn) == ORIGINAL_COLUMNS
    assert rows(conn) == ORIGINAL_ROWS


def test_failing_step_in_the_middle_leaves_the_database_unchanged(conn: sqlite3.Connection) -> None:
    steps = (
        migrate()
        .add_field("todos", "priority", t.string().default("low"))
        .backfill("todos", {"title": "overwritten"})
        .add_index("todos", "title")
        .rename_field("todos", "missing", "other")
        .add_index("todos", "done")
        .steps
    )
    with pytest.raises(OfflineError) as info:
        apply_migration_steps(conn, steps)
    err = info.value
    assert err.code == STORAGE_ERROR
    assert "renameField todos.missing" in err.message
    assert err.context is not None
    assert err.context["step"] == 3 and err.context["stepType"] == "renameField"
    assert err.context["collection"] == "todos" and err.context["field"] == "missing"
    assert isinstance(err.__cause__, sqlite3.Error)
    assert not conn.in_transaction
    assert columns(conn) == ORIGINAL_COLUMNS
    assert indexes(conn) == set()
    assert rows(conn) == ORIGINAL_ROWS


def test_failing_python_transform_rolls_back(conn: sqlite3.Connection) -> None:
    def boom(record: dict[str, Any]) -> dict[str, Any]:
        if record["id"] == "b":
            raise ValueError("bad row")
        return {"title": "changed"}

    steps = migrate().add_field("todos", "x", t.string().optional()).backfill("todos", boom).steps
    with pytest.raises(OfflineError) as info:
        apply_migration_steps(conn, steps)
    assert info.value.code == STORAGE_ERROR and isinstance(info.value.__cause__, ValueError)
    assert "bad row" in info.value.message
    assert columns(conn) == ORIGINAL_COLUMNS
    assert rows(conn) == ORIGINAL_ROWS


def test_inside_a_caller_transaction_a_savepoint_is_used(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN")
    conn.execute("INSERT INTO \"todos\" VALUES ('d', 'Mine', 0)")
    with pytest.raises(OfflineError):
        apply_migration_steps(
            conn, migrate().add_index("todos", "title").rename_field("todos", "nope", "x").steps
        )
    # The failed migration was undone, but the caller's own pending insert survives, uncommitted.
    assert conn.in_transaction
    assert indexes(conn) == set()
    assert len(rows(conn)) == 4

    apply_migration_steps(conn, migrate().add_index("todos", "title").steps)
    assert conn.in_transaction and "idx_todos_title" in indexes(conn)
    conn.execute("ROLLBACK")  # the caller decides: the migration was part of its transaction
    assert indexes(conn) == set()
    assert rows(conn) == ORIGINAL_ROWS


def test_remove_field_drops_the_column_and_data(conn: sqlite3.Connection) -> None:
    apply_migration_steps(conn, migrate().remove_field("todos", "done").remove_field("todos", "title").steps)
    assert columns(conn) == [("id", "TEXT")]
    assert rows(conn) == [("a",), ("b",), ("c",)]


def test_empty_migration_is_a_no_op(conn: sqlite3.Connection) -> None:
    apply_migration_steps(conn, [])
    assert not conn.in_transaction
    assert rows(conn) == ORIGINAL_ROWS


def test_define_schema_accepts_built_migrations() -> None:
    definition = migrate().add_field("todos", "priority", t.string().default("low")).build()
    schema = define_schema(
        {
            "version": 2,
            "collections": {
                "todos": {"fields": {"title": t.string(), "priority": t.string().default("low")}}
            },
            "migrations": {2: definition},
        }
    )
    assert schema.migrations[2] is definition
    assert migration_steps_to_sql(schema.migrations[2].steps) == [
        """ALTER TABLE "todos" ADD COLUMN "priority" TEXT NOT NULL DEFAULT 'low'"""
    ]
