"""define_schema: validation and deep immutability (SPEC 2.1-2.3, 2.9, 7.2; DESIGN.md section 2)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from offline.core.errors import INVALID_SCHEMA, SCHEMA_VALIDATION, OfflineError, SchemaValidationError
from offline.core.fields import FieldDescriptor, t
from offline.core.schema import (
    CollectionDefinition,
    Constraint,
    RelationDefinition,
    SchemaDefinition,
    define_schema,
)
from offline.core.state_machine import StateMachineDefinition


def _resolve_title(a: Any, b: Any, base: Any) -> Any:
    return a if len(str(a)) >= len(str(b)) else b


def _pick_first(a: Any, b: Any, base: Any) -> Any:
    return a


def full_input() -> dict[str, Any]:
    """A schema input using every feature define_schema knows."""
    return {
        "version": 3,
        "collections": {
            "projects": {
                "fields": {
                    "name": t.string(),
                    "ownerId": t.string(),
                    "members": t.array(t.string()).default([]),
                    "budget": t.number().optional().merge("max"),
                },
                "indexes": ["ownerId"],
                "scope": {"ownerId": "userId"},
            },
            "todos": {
                "fields": {
                    "title": t.string().merge("server-authoritative"),
                    "done": t.boolean().default(False),
                    "count": t.number().default(0).merge("counter"),
                    "status": t.enum(["todo", "doing", "done"]).default("todo"),
                    "priority": t.enum(["low", "high"]).transitions({"low": ["high"], "high": []}),
                    "tags": t.array(t.string()).merge("append-only"),
                    "notes": t.richtext(),
                    "createdAt": t.timestamp().auto(),
                    "dueAt": t.timestamp().optional(),
                    "projectId": t.string().optional(),
                    "userId": t.string(),
                    "rank": t.number().optional(),
                },
                "indexes": ["projectId", "status"],
                "constraints": {
                    "uniqueTitle": {
                        "type": "unique",
                        "fields": ["title"],
                        "where": {"done": False, "status": ["todo", "doing"]},
                        "onConflict": "priority-field",
                        "priorityField": "rank",
                    },
                    "maxPerProject": {
                        "type": "capacity",
                        "fields": ["projectId"],
                        "limit": 10,
                        "on_conflict": "first-write-wins",
                    },
                    "projectExists": {
                        "type": "referential",
                        "fields": ["projectId"],
                        "collection": "projects",
                        "onConflict": "custom",
                        "resolve": _pick_first,
                    },
                },
                "resolve": {"title": _resolve_title},
                "stateMachine": {
                    "field": "status",
                    "transitions": {"todo": ["doing"], "doing": ["done", "todo"], "done": []},
                    "onInvalidTransition": "last-valid-state",
                },
            },
            "notes_2": {"fields": {"text": t.string()}},
        },
        "relations": {
            "todoProject": {
                "from": "todos",
                "to": "projects",
                "type": "many-to-one",
                "field": "projectId",
                "onDelete": "set-null",
            },
            "projectTodos": {
                "from": "projects",
                "to": "todos",
                "type": "one-to-many",
                "field": "ownerId",
            },
        },
        "sync": {"todos": {"where": {"userId": True, "projectId": "project"}}},
    }


def minimal(**collection: Any) -> dict[str, Any]:
    """One collection `todos` with a title, plus the given collection keys."""
    spec: dict[str, Any] = {"fields": {"title": t.string(), "status": t.enum(["a", "b"])}}
    spec.update(collection)
    return {"version": 1, "collections": {"todos": spec}}


def expect_error(schema_input: Any, code: str = INVALID_SCHEMA) -> OfflineError:
    with pytest.raises(OfflineError) as info:
        define_schema(schema_input)
    err = info.value
    assert err.code == code
    assert err.name == "OfflineError"
    assert err.context is not None
    if code == SCHEMA_VALIDATION:
        assert isinstance(err, SchemaValidationError)
    else:
        assert not isinstance(err, SchemaValidationError)
    return err


# -- a valid schema --------------------------------------------------------------------------------


def test_full_schema_is_accepted_and_exposes_everything() -> None:
    schema = define_schema(full_input())
    assert isinstance(schema, SchemaDefinition)
    assert schema.version == 3
    assert list(schema.collections) == ["projects", "todos", "notes_2"]

    todos = schema.collections["todos"]
    assert isinstance(todos, CollectionDefinition)
    assert todos.name == "todos"
    assert todos.fields["title"] == t.string().merge("server-authoritative")
    assert todos.fields["createdAt"].auto
    assert todos.fields["notes"].type == "richtext"
    assert todos.indexes == ("projectId", "status")
    assert todos.resolve["title"] is _resolve_title

    unique = todos.constraints["uniqueTitle"]
    assert isinstance(unique, Constraint)
    assert unique.type == "unique"
    assert unique.fields == ("title",)
    assert unique.on_conflict == "priority-field"
    assert unique.priority_field == "rank"
    assert unique["onConflict"] == "priority-field"
    assert unique["priorityField"] == "rank"
    assert unique.where == {"done": False, "status": ("todo", "doing")}

    capacity = todos.constraints["maxPerProject"]
    assert (capacity.type, capacity.limit, capacity.on_conflict) == ("capacity", 10, "first-write-wins")
    referential = todos.constraints["projectExists"]
    assert (referential.type, referential.collection) == ("referential", "projects")
    assert referential.resolve is _pick_first

    sm = todos.state_machine
    assert isinstance(sm, StateMachineDefinition)
    assert sm.field == "status"
    assert sm.on_invalid_transition == "last-valid-state"
    assert sm["onInvalidTransition"] == "last-valid-state"
    assert dict(sm.transitions) == {"todo": ("doing",), "doing": ("done", "todo"), "done": ()}
    assert todos["stateMachine"] is sm

    projects = schema.collections["projects"]
    assert projects.scope == {"ownerId": "userId"}
    assert projects.indexes == ("ownerId",)
    assert schema.collections["notes_2"].state_machine is None
    assert schema.collections["notes_2"].indexes == ()
    assert len(schema.collections["notes_2"].constraints) == 0

    rel = schema.relations["todoProject"]
    assert isinstance(rel, RelationDefinition)
    assert (rel.name, rel.from_, rel.to, rel.type, rel.field, rel.on_delete) == (
        "todoProject",
        "todos",
        "projects",
        "many-to-one",
        "projectId",
        "set-null",
    )
    assert rel["from"] == "todos"
    assert rel["onDelete"] == "set-null"
    assert schema.relations["projectTodos"].on_delete == "no-action"

    assert schema.sync is not None
    assert schema.sync["todos"].where == {"userId": True, "projectId": "project"}


def test_schema_mapping_style_access() -> None:
    schema = define_schema(full_input())
    assert schema["version"] == 3
    assert schema["collections"] is schema.collections
    assert schema.collection("todos") is schema.collections["todos"]
    with pytest.raises(OfflineError) as info:
        schema.collection("missing")
    assert info.value.code == INVALID_SCHEMA
    assert info.value.context == {"collection": "missing"}


def test_minimal_schema_defaults() -> None:
    schema = define_schema({"version": 1, "collections": {"todos": {"fields": {"title": t.string()}}}})
    assert schema.version == 1
    assert len(schema.relations) == 0
    assert schema.sync is None
    todos = schema.collections["todos"]
    assert todos.indexes == ()
    assert len(todos.constraints) == 0
    assert len(todos.resolve) == 0
    assert todos.state_machine is None
    assert todos.scope is None


def test_define_schema_is_deterministic() -> None:
    assert define_schema(full_input()).collections["todos"].fields == (
        define_schema(full_input()).collections["todos"].fields
    )


@pytest.mark.parametrize("name", ["todos", "T", "a1", "my_todos", "Todo_Items2", "a_"])
def test_valid_collection_names(name: str) -> None:
    schema = define_schema({"version": 1, "collections": {name: {"fields": {"x": t.string()}}}})
    assert name in schema.collections


@pytest.mark.parametrize("version", [1, 2, 99, 2**40])
def test_valid_versions(version: int) -> None:
    assert define_schema({"version": version, "collections": minimal()["collections"]}).version == version


# -- SPEC 7.2: version -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, -1, -7, 1.5, "1", True, False, None, [1]], ids=repr)
def test_version_not_positive_integer(version: Any) -> None:
    err = expect_error({"version": version, "collections": minimal()["collections"]})
    assert err.context == {"field": "version"}


def test_version_missing() -> None:
    err = expect_error({"collections": minimal()["collections"]})
    assert err.context == {"field": "version"}


# -- SPEC 7.2: collection names --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["", "my-todos", "1abc", "a b", "_todos", "todos!", "tödos", "a.b", " todos", 1], ids=repr
)
def test_invalid_collection_name(name: Any) -> None:
    err = expect_error({"version": 1, "collections": {name: {"fields": {"x": t.string()}}}})
    assert err.context is not None
    assert err.context["collection"] == name


def test_invalid_name_reported_even_after_valid_ones() -> None:
    err = expect_error(
        {"version": 1, "collections": {"ok": {"fields": {"x": t.string()}}, "not-ok": {"fields": {}}}}
    )
    assert err.context == {"collection": "not-ok"}


# -- SPEC 7.2: relations ---------------------------------------------------------------------------


def relation_input(**relation: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"from": "todos", "to": "projects", "type": "many-to-one", "field": "projectId"}
    base.update(relation)
    for key in [k for k, v in base.items() if v is None]:
        del base[key]
    return {
        "version": 1,
        "collections": {
            "projects": {"fields": {"name": t.string()}},
            "todos": {"fields": {"title": t.string(), "projectId": t.string().optional()}},
        },
        "relations": {"todoProject": base},
    }


def test_relation_valid_baseline() -> None:
    rel = define_schema(relation_input()).relations["todoProject"]
    assert rel.on_delete == "no-action"


@pytest.mark.parametrize("role", ["from", "to"])
def test_relation_to_missing_collection(role: str) -> None:
    err = expect_error(relation_input(**{role: "ghosts"}))
    assert err.context is not None
    assert err.context["relation"] == "todoProject"
    assert err.context["collection"] == "ghosts"
    assert err.context["role"] == role


@pytest.mark.parametrize("role", ["from", "to"])
def test_relation_without_collection(role: str) -> None:
    err = expect_error(relation_input(**{role: None}))
    assert err.context is not None
    assert err.context["relation"] == "todoProject"


@pytest.mark.parametrize("field", ["missing", "name", None, 1])
def test_relation_field_missing_on_source(field: Any) -> None:
    err = expect_error(relation_input(field=field))
    assert err.context is not None
    assert err.context["relation"] == "todoProject"
    assert err.context["collection"] == "todos"
    if field is not None:
        assert err.context["field"] == field


def test_relation_field_checked_on_source_not_target() -> None:
    # "name" exists on the target (projects) but not on the source (todos).
    err = expect_error(relation_input(field="name"))
    assert err.context is not None
    assert err.context["collection"] == "todos"


@pytest.mark.parametrize("on_delete", ["delete", "CASCADE", "", "setNull", 1])
def test_relation_on_delete_invalid(on_delete: Any) -> None:
    err = expect_error(relation_input(onDelete=on_delete))
    assert err.context is not None
    assert err.context["relation"] == "todoProject"


@pytest.mark.parametrize("on_delete", ["set-null", "cascade", "restrict", "no-action"])
@pytest.mark.parametrize("key", ["onDelete", "on_delete"])
def test_relation_on_delete_valid(on_delete: str, key: str) -> None:
    rel = define_schema(relation_input(**{key: on_delete})).relations["todoProject"]
    assert rel.on_delete == on_delete


def test_relation_set_null_needs_optional_field() -> None:
    schema_input = relation_input(onDelete="set-null")
    schema_input["collections"]["todos"]["fields"]["projectId"] = t.string()
    err = expect_error(schema_input)
    assert err.context is not None
    assert err.context["field"] == "projectId"


@pytest.mark.parametrize("rtype", ["one-to-one", "many_to_one", "", None, "MANY-TO-ONE"])
def test_relation_type_invalid(rtype: Any) -> None:
    schema_input = relation_input()
    schema_input["relations"]["todoProject"]["type"] = rtype
    err = expect_error(schema_input)
    assert err.context is not None
    assert err.context["relation"] == "todoProject"


@pytest.mark.parametrize("rtype", ["many-to-one", "one-to-many", "many-to-many"])
def test_relation_type_valid(rtype: str) -> None:
    assert define_schema(relation_input(type=rtype)).relations["todoProject"].type == rtype


@pytest.mark.parametrize("name", ["", "todo-project", "1rel"])
def test_relation_name_invalid(name: str) -> None:
    schema_input = relation_input()
    schema_input["relations"] = {name: schema_input["relations"]["todoProject"]}
    err = expect_error(schema_input)
    assert err.context == {"relation": name}


@pytest.mark.parametrize("relations", [[], "x", 1])
def test_relations_not_mapping(relations: Any) -> None:
    schema_input = relation_input()
    schema_input["relations"] = relations
    expect_error(schema_input)


def test_relation_not_mapping() -> None:
    schema_input = relation_input()
    schema_input["relations"]["todoProject"] = "todos->projects"
    err = expect_error(schema_input)
    assert err.context == {"relation": "todoProject"}


def test_relation_self_reference_allowed() -> None:
    schema = define_schema(
        {
            "version": 1,
            "collections": {"nodes": {"fields": {"parentId": t.string().optional()}}},
            "relations": {
                "parent": {
                    "from": "nodes",
                    "to": "nodes",
                    "type": "many-to-one",
                    "field": "parentId",
                    "on_delete": "cascade",
                }
            },
        }
    )
    assert schema.relations["parent"].on_delete == "cascade"


# -- SPEC 7.2: state machines ----------------------------------------------------------------------


def sm_input(**sm: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"field": "status", "transitions": {"a": ["b"], "b": []}}
    base.update(sm)
    return minimal(stateMachine=base)


def test_state_machine_valid_baseline() -> None:
    sm = define_schema(sm_input()).collections["todos"].state_machine
    assert sm is not None
    assert sm.on_invalid_transition == "reject"


@pytest.mark.parametrize(
    ("sm", "field"),
    [
        ({"field": "missing"}, "missing"),
        ({"field": None}, None),
        ({"field": "title"}, "title"),  # a string, not an enum
        ({"transitions": {"x": ["a"]}}, "status"),  # source not an enum value
        ({"transitions": {"a": ["x"]}}, "status"),  # target not an enum value
        ({"onInvalidTransition": "ignore"}, "status"),
        ({"onInvalidTransition": "REJECT"}, "status"),
        ({"on_invalid_transition": "drop"}, "status"),
        ({"transitions": None}, "status"),
        ({"transitions": ["a", "b"]}, "status"),
    ],
    ids=repr,
)
def test_state_machine_errors(sm: dict[str, Any], field: Any) -> None:
    err = expect_error(sm_input(**sm), SCHEMA_VALIDATION)
    assert err.context is not None
    assert err.context["collection"] == "todos"
    assert err.context["field"] == field


def test_state_machine_enum_without_values() -> None:
    schema_input = sm_input()
    schema_input["collections"]["todos"]["fields"]["status"] = FieldDescriptor("enum")
    err = expect_error(schema_input, SCHEMA_VALIDATION)
    assert err.context == {"collection": "todos", "field": "status"}


def test_state_machine_missing_field_key() -> None:
    err = expect_error(minimal(stateMachine={"transitions": {}}), SCHEMA_VALIDATION)
    assert err.context == {"collection": "todos", "field": None}


def test_state_machine_not_a_mapping() -> None:
    err = expect_error(minimal(stateMachine="status"), SCHEMA_VALIDATION)
    assert err.context == {"collection": "todos"}


@pytest.mark.parametrize("key", ["stateMachine", "state_machine"])
@pytest.mark.parametrize("oit_key", ["onInvalidTransition", "on_invalid_transition"])
@pytest.mark.parametrize("mode", ["reject", "last-valid-state"])
def test_state_machine_key_spellings(key: str, oit_key: str, mode: str) -> None:
    schema = define_schema(minimal(**{key: {"field": "status", "transitions": {"a": ["b"]}, oit_key: mode}}))
    sm = schema.collections["todos"].state_machine
    assert sm is not None
    assert sm.field == "status"
    assert sm.on_invalid_transition == mode


def test_state_machine_and_field_transitions_on_same_field() -> None:
    schema_input = minimal(stateMachine={"field": "status", "transitions": {"a": ["b"]}})
    schema_input["collections"]["todos"]["fields"]["status"] = t.enum(["a", "b"]).transitions({"b": ["a"]})
    err = expect_error(schema_input, SCHEMA_VALIDATION)
    assert err.context == {"collection": "todos", "field": "status"}


# -- structural extras -----------------------------------------------------------------------------


@pytest.mark.parametrize("collections", [{}, None, [], "todos"], ids=repr)
def test_empty_or_missing_collections(collections: Any) -> None:
    err = expect_error({"version": 1, "collections": collections})
    assert err.context == {"field": "collections"}


def test_collections_key_missing() -> None:
    err = expect_error({"version": 1})
    assert err.context == {"field": "collections"}


@pytest.mark.parametrize("schema_input", [None, [], "schema", 1], ids=repr)
def test_schema_input_not_mapping(schema_input: Any) -> None:
    expect_error(schema_input)


@pytest.mark.parametrize("spec", [{"fields": {}}, {}, {"fields": None}, {"fields": ["title"]}], ids=repr)
def test_collection_without_fields(spec: dict[str, Any]) -> None:
    err = expect_error({"version": 1, "collections": {"todos": spec}})
    assert err.context == {"collection": "todos"}


@pytest.mark.parametrize("spec", [None, [], "fields"], ids=repr)
def test_collection_definition_not_mapping(spec: Any) -> None:
    err = expect_error({"version": 1, "collections": {"todos": spec}})
    assert err.context == {"collection": "todos"}


def test_field_named_id() -> None:
    err = expect_error({"version": 1, "collections": {"todos": {"fields": {"id": t.string()}}}})
    assert err.context == {"collection": "todos", "field": "id"}


@pytest.mark.parametrize("field", ["my-field", "1st", "a b", ""])
def test_invalid_field_name(field: str) -> None:
    err = expect_error({"version": 1, "collections": {"todos": {"fields": {field: t.string()}}}})
    assert err.context == {"collection": "todos", "field": field}


@pytest.mark.parametrize("descriptor", ["string", str, None, {"type": "string"}, t.string], ids=repr)
def test_field_not_built_with_t(descriptor: Any) -> None:
    err = expect_error({"version": 1, "collections": {"todos": {"fields": {"title": descriptor}}}})
    assert err.context == {"collection": "todos", "field": "title"}


@pytest.mark.parametrize("key", ["field", "Fields", "state", "where", "onDelete"])
def test_unknown_collection_key(key: str) -> None:
    err = expect_error(minimal(**{key: {}}))
    assert err.context == {"collection": "todos", "key": key}


@pytest.mark.parametrize("key", ["collection", "Version", "schema", "extra"])
def test_unknown_schema_key(key: str) -> None:
    schema_input = minimal()
    schema_input[key] = {}
    err = expect_error(schema_input)
    assert err.context == {"key": key}


def test_index_names_missing_field() -> None:
    err = expect_error(minimal(indexes=["title", "nope"]))
    assert err.context == {"collection": "todos", "field": "nope"}


@pytest.mark.parametrize("indexes", ["title", [1], {"title": True}, None], ids=repr)
def test_indexes_not_list_of_names(indexes: Any) -> None:
    err = expect_error(minimal(indexes=indexes))
    assert err.context is not None
    assert err.context["collection"] == "todos"


def test_resolver_names_missing_field() -> None:
    err = expect_error(minimal(resolve={"nope": _pick_first}))
    assert err.context == {"collection": "todos", "field": "nope"}


def test_resolver_not_callable() -> None:
    err = expect_error(minimal(resolve={"title": "last"}))
    assert err.context == {"collection": "todos", "field": "title"}


# -- constraints -----------------------------------------------------------------------------------


def constraint_input(**constraint: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"type": "unique", "fields": ["title"]}
    base.update(constraint)
    for key in [k for k, v in base.items() if v is None]:
        del base[key]
    schema_input = minimal(constraints={"c1": base})
    schema_input["collections"]["todos"]["fields"]["rank"] = t.number()
    schema_input["collections"]["other"] = {"fields": {"x": t.string()}}
    return schema_input


def test_constraint_defaults() -> None:
    c = define_schema(constraint_input()).collections["todos"].constraints["c1"]
    assert c.name == "c1"
    assert c.on_conflict == "server-decides"
    assert c.where is None
    assert c.limit is None
    assert c.collection is None


@pytest.mark.parametrize("ctype", ["primary", "UNIQUE", "", None, 1])
def test_constraint_type_invalid(ctype: Any) -> None:
    err = expect_error(constraint_input(type=ctype))  # None: the key is left out
    assert err.context is not None
    assert err.context["collection"] == "todos"
    assert err.context["constraint"] == "c1"


@pytest.mark.parametrize("fields", [["nope"], ["title", "nope"]])
def test_constraint_field_missing(fields: list[str]) -> None:
    err = expect_error(constraint_input(fields=fields))
    assert err.context == {"collection": "todos", "constraint": "c1", "field": "nope"}


@pytest.mark.parametrize("fields", [[], "title", [1]], ids=repr)
def test_constraint_fields_malformed(fields: Any) -> None:
    err = expect_error(constraint_input(fields=fields))
    assert err.context is not None
    assert err.context["constraint"] == "c1"


def test_constraint_without_fields_key() -> None:
    schema_input = constraint_input()
    del schema_input["collections"]["todos"]["constraints"]["c1"]["fields"]
    err = expect_error(schema_input)
    assert err.context == {"collection": "todos", "constraint": "c1"}


def test_constraint_where_field_missing() -> None:
    err = expect_error(constraint_input(where={"nope": 1}))
    assert err.context == {"collection": "todos", "constraint": "c1", "field": "nope"}


def test_constraint_where_not_mapping() -> None:
    err = expect_error(constraint_input(where=["title"]))
    assert err.context == {"collection": "todos", "constraint": "c1"}


@pytest.mark.parametrize("on_conflict", ["lww", "first_write_wins", "", 1])
@pytest.mark.parametrize("key", ["onConflict", "on_conflict"])
def test_constraint_on_conflict_invalid(on_conflict: Any, key: str) -> None:
    err = expect_error(constraint_input(**{key: on_conflict}))
    assert err.context == {"collection": "todos", "constraint": "c1"}


@pytest.mark.parametrize(
    "on_conflict", ["first-write-wins", "last-write-wins", "server-decides", "priority-field", "custom"]
)
@pytest.mark.parametrize("key", ["onConflict", "on_conflict"])
def test_constraint_on_conflict_valid(on_conflict: str, key: str) -> None:
    extra: dict[str, Any] = {key: on_conflict}
    if on_conflict == "priority-field":
        extra["priorityField"] = "rank"
    if on_conflict == "custom":
        extra["resolve"] = _pick_first
    c = define_schema(constraint_input(**extra)).collections["todos"].constraints["c1"]
    assert c.on_conflict == on_conflict


@pytest.mark.parametrize("key", ["priorityField", "priority_field"])
def test_constraint_priority_field_spellings(key: str) -> None:
    c = define_schema(constraint_input(onConflict="priority-field", **{key: "rank"}))
    assert c.collections["todos"].constraints["c1"].priority_field == "rank"


@pytest.mark.parametrize("priority", [None, "nope", ["rank"], 1], ids=repr)
def test_constraint_priority_field_missing(priority: Any) -> None:
    err = expect_error(constraint_input(onConflict="priority-field", priorityField=priority))
    assert err.context is not None
    assert err.context["collection"] == "todos"
    assert err.context["constraint"] == "c1"


@pytest.mark.parametrize("resolve", [None, "fn", 1])
def test_constraint_custom_needs_callable(resolve: Any) -> None:
    err = expect_error(constraint_input(onConflict="custom", resolve=resolve))
    assert err.context == {"collection": "todos", "constraint": "c1"}


@pytest.mark.parametrize("limit", [None, 0, -1, 1.5, "3", True], ids=repr)
def test_constraint_capacity_limit_invalid(limit: Any) -> None:
    err = expect_error(constraint_input(type="capacity", limit=limit))
    assert err.context == {"collection": "todos", "constraint": "c1", "field": "limit"}


def test_constraint_capacity_limit_valid() -> None:
    c = define_schema(constraint_input(type="capacity", limit=3)).collections["todos"].constraints["c1"]
    assert c.limit == 3


@pytest.mark.parametrize("target", [None, "ghosts", 1, ["other"]], ids=repr)
def test_constraint_referential_target_missing(target: Any) -> None:
    err = expect_error(constraint_input(type="referential", collection=target))
    assert err.context is not None
    assert err.context["collection"] == "todos"
    assert err.context["constraint"] == "c1"


@pytest.mark.parametrize("target", ["other", "todos"])
def test_constraint_referential_target_valid(target: str) -> None:
    c = define_schema(constraint_input(type="referential", collection=target))
    assert c.collections["todos"].constraints["c1"].collection == target


def test_constraint_referential_to_later_collection() -> None:
    schema_input = constraint_input(type="referential", collection="zlast")
    schema_input["collections"]["zlast"] = {"fields": {"y": t.string()}}
    assert define_schema(schema_input).collections["todos"].constraints["c1"].collection == "zlast"


@pytest.mark.parametrize("name", ["unique-title", "1c", ""])
def test_constraint_name_invalid(name: str) -> None:
    schema_input = constraint_input()
    constraints = schema_input["collections"]["todos"]["constraints"]
    constraints[name] = constraints.pop("c1")
    err = expect_error(schema_input)
    assert err.context == {"collection": "todos", "constraint": name}


def test_constraint_not_mapping() -> None:
    err = expect_error(minimal(constraints={"c1": "unique"}))
    assert err.context == {"collection": "todos", "constraint": "c1"}


# -- sync rules and legacy scope -------------------------------------------------------------------


def test_sync_rule_names_missing_collection() -> None:
    schema_input = minimal()
    schema_input["sync"] = {"ghosts": {"where": {"title": True}}}
    err = expect_error(schema_input)
    assert err.context == {"collection": "ghosts"}


def test_sync_rule_names_missing_field() -> None:
    schema_input = minimal()
    schema_input["sync"] = {"todos": {"where": {"ownerId": True}}}
    err = expect_error(schema_input)
    assert err.context == {"collection": "todos", "field": "ownerId"}


@pytest.mark.parametrize("binding", [False, "", 1, None, ["userId"]], ids=repr)
def test_sync_rule_binding_invalid(binding: Any) -> None:
    schema_input = minimal()
    schema_input["sync"] = {"todos": {"where": {"title": binding}}}
    err = expect_error(schema_input)
    assert err.context == {"collection": "todos", "field": "title"}


@pytest.mark.parametrize(
    "rule", [{}, {"where": {"title": True}, "extra": 1}, "title", {"where": ["title"]}], ids=repr
)
def test_sync_rule_malformed(rule: Any) -> None:
    schema_input = minimal()
    schema_input["sync"] = {"todos": rule}
    err = expect_error(schema_input)
    assert err.context is not None
    assert err.context["collection"] == "todos"


def test_sync_not_mapping() -> None:
    schema_input = minimal()
    schema_input["sync"] = ["todos"]
    err = expect_error(schema_input)
    assert err.context == {"field": "sync"}


def test_sync_rule_may_bind_id() -> None:
    schema_input = minimal()
    schema_input["sync"] = {"todos": {"where": {"id": "recordId"}}}
    sync = define_schema(schema_input).sync
    assert sync is not None
    assert sync["todos"].where == {"id": "recordId"}


def test_scope_mapping_and_legacy_list() -> None:
    mapping = define_schema(minimal(scope={"title": True})).collections["todos"].scope
    listed = define_schema(minimal(scope=["title"])).collections["todos"].scope
    assert mapping == listed == {"title": True}


@pytest.mark.parametrize("scope", [{"nope": True}, ["nope"], [1], "title", {"title": False}], ids=repr)
def test_scope_invalid(scope: Any) -> None:
    err = expect_error(minimal(scope=scope))
    assert err.context is not None
    assert err.context["collection"] == "todos"


# -- deep immutability -----------------------------------------------------------------------------


@pytest.fixture
def schema() -> SchemaDefinition:
    return define_schema(full_input())


@pytest.mark.parametrize("attribute", ["version", "collections", "relations", "sync", "migrations"])
def test_schema_attributes_cannot_be_assigned(schema: SchemaDefinition, attribute: str) -> None:
    with pytest.raises(AttributeError):
        setattr(schema, attribute, 5)
    assert schema.version == 3


@pytest.mark.parametrize("attribute", ["version", "collections"])
def test_schema_attributes_cannot_be_deleted(schema: SchemaDefinition, attribute: str) -> None:
    with pytest.raises(AttributeError):
        delattr(schema, attribute)
    assert schema.version == 3


def test_no_new_attributes_on_schema_or_collection(schema: SchemaDefinition) -> None:
    # frozen slotted dataclasses: CPython 3.11 raises TypeError here, later versions AttributeError.
    for obj in (schema, schema.collections["todos"], schema.relations["todoProject"]):
        with pytest.raises((AttributeError, TypeError)):
            obj.other = 1  # type: ignore[union-attr]
        assert not hasattr(obj, "other")


@pytest.mark.parametrize(
    "attribute", ["name", "fields", "indexes", "constraints", "resolve", "state_machine", "scope"]
)
def test_collection_attributes_cannot_be_assigned(schema: SchemaDefinition, attribute: str) -> None:
    todos = schema.collections["todos"]
    with pytest.raises(AttributeError):
        setattr(todos, attribute, None)
    assert todos.name == "todos"


MUTATIONS: list[tuple[str, Callable[[Any], Any]]] = [
    ("collections-setitem", lambda s: s.collections.__setitem__("x", 1)),
    ("collections-delitem", lambda s: s.collections.__delitem__("todos")),
    ("collections-pop", lambda s: s.collections.pop("todos")),
    ("collections-update", lambda s: s.collections.update({})),
    ("collections-clear", lambda s: s.collections.clear()),
    ("fields-setitem", lambda s: s.collections["todos"].fields.__setitem__("x", t.string())),
    ("fields-delitem", lambda s: s.collections["todos"].fields.__delitem__("title")),
    ("fields-attr", lambda s: setattr(s.collections["todos"].fields, "_data", {})),
    ("field-descriptor", lambda s: setattr(s.collections["todos"].fields["title"], "required", False)),
    ("indexes-append", lambda s: s.collections["todos"].indexes.append("title")),
    ("indexes-setitem", lambda s: s.collections["todos"].indexes.__setitem__(0, "x")),
    ("relations-setitem", lambda s: s.relations.__setitem__("x", 1)),
    ("relations-delitem", lambda s: s.relations.__delitem__("todoProject")),
    ("relation-attr", lambda s: setattr(s.relations["todoProject"], "on_delete", "cascade")),
    ("constraints-setitem", lambda s: s.collections["todos"].constraints.__setitem__("x", 1)),
    ("constraint-attr", lambda s: setattr(s.collections["todos"].constraints["uniqueTitle"], "type", "x")),
    (
        "constraint-where",
        lambda s: s.collections["todos"].constraints["uniqueTitle"].where.__setitem__("done", True),
    ),
    (
        "constraint-where-nested",
        lambda s: s.collections["todos"].constraints["uniqueTitle"].where["status"].append("x"),
    ),
    (
        "constraint-fields",
        lambda s: s.collections["todos"].constraints["uniqueTitle"].fields.append("x"),
    ),
    ("resolve-setitem", lambda s: s.collections["todos"].resolve.__setitem__("title", None)),
    ("state-machine-attr", lambda s: setattr(s.collections["todos"].state_machine, "field", "x")),
    (
        "state-machine-transitions",
        lambda s: s.collections["todos"].state_machine.transitions.__setitem__("done", ("todo",)),
    ),
    (
        "state-machine-targets",
        lambda s: s.collections["todos"].state_machine.transitions["done"].append("todo"),
    ),
    ("scope-setitem", lambda s: s.collections["projects"].scope.__setitem__("x", True)),
    ("sync-setitem", lambda s: s.sync.__setitem__("x", 1)),
    ("sync-where", lambda s: s.sync["todos"].where.__setitem__("x", True)),
    ("sync-rule-attr", lambda s: setattr(s.sync["todos"], "where", {})),
]


@pytest.mark.parametrize("mutate", [m for _, m in MUTATIONS], ids=[name for name, _ in MUTATIONS])
def test_schema_is_deeply_immutable(schema: SchemaDefinition, mutate: Callable[[Any], Any]) -> None:
    before = repr(schema)
    with pytest.raises((TypeError, AttributeError)):
        mutate(schema)
    assert repr(schema) == before


def test_frozen_containers_are_hashable(schema: SchemaDefinition) -> None:
    todos = schema.collections["todos"]
    assert hash(todos.fields) == hash(todos.fields)
    assert hash(todos.indexes) == hash(("projectId", "status"))


def test_mutating_input_after_define_schema_changes_nothing() -> None:
    schema_input = full_input()
    schema = define_schema(schema_input)
    before = repr(schema)

    schema_input["version"] = 99
    collections = schema_input["collections"]
    todos = collections["todos"]
    todos["fields"]["extra"] = t.string()
    del todos["fields"]["title"]
    todos["indexes"].append("title")
    todos["constraints"]["uniqueTitle"]["fields"].append("done")
    todos["constraints"]["uniqueTitle"]["where"]["done"] = True
    todos["constraints"]["uniqueTitle"]["where"]["status"].append("done")
    todos["constraints"]["maxPerProject"]["limit"] = 1
    todos["resolve"]["done"] = _pick_first
    todos["stateMachine"]["transitions"]["done"].append("todo")
    todos["stateMachine"]["field"] = "priority"
    collections["projects"]["scope"]["name"] = True
    collections["projects"]["indexes"].clear()
    del collections["notes_2"]
    collections["added"] = {"fields": {"x": t.string()}}
    schema_input["relations"]["todoProject"]["onDelete"] = "cascade"
    del schema_input["relations"]["projectTodos"]
    schema_input["sync"]["todos"]["where"]["title"] = True
    schema_input["sync"]["projects"] = {"where": {"ownerId": True}}

    assert repr(schema) == before
    assert schema.version == 3
    assert "title" in schema.collections["todos"].fields
    assert "extra" not in schema.collections["todos"].fields
    assert schema.collections["todos"].indexes == ("projectId", "status")
    assert schema.collections["todos"].constraints["uniqueTitle"].where == {
        "done": False,
        "status": ("todo", "doing"),
    }
    assert schema.collections["todos"].state_machine is not None
    assert schema.collections["todos"].state_machine.transitions["done"] == ()
    assert list(schema.collections) == ["projects", "todos", "notes_2"]
    assert schema.relations["todoProject"].on_delete == "set-null"
    assert schema.sync is not None
    assert set(schema.sync) == {"todos"}


def test_schema_survives_deepcopy(schema: SchemaDefinition) -> None:
    dup = copy.deepcopy(schema)
    assert dup.version == schema.version
    assert dup.collections["todos"].fields == schema.collections["todos"].fields


# -- camelCase and snake_case keys -----------------------------------------------------------------


def test_snake_and_camel_spellings_give_the_same_schema() -> None:
    def build(camel: bool) -> SchemaDefinition:
        def k(c: str, s: str) -> str:
            return c if camel else s

        return define_schema(
            {
                "version": 1,
                "collections": {
                    "projects": {"fields": {"name": t.string()}},
                    "todos": {
                        "fields": {
                            "title": t.string(),
                            "rank": t.number(),
                            "status": t.enum(["a", "b"]),
                            "projectId": t.string().optional(),
                        },
                        "constraints": {
                            "u": {
                                "type": "unique",
                                "fields": ["title"],
                                k("onConflict", "on_conflict"): "priority-field",
                                k("priorityField", "priority_field"): "rank",
                            }
                        },
                        k("stateMachine", "state_machine"): {
                            "field": "status",
                            "transitions": {"a": ["b"]},
                            k("onInvalidTransition", "on_invalid_transition"): "last-valid-state",
                        },
                    },
                },
                "relations": {
                    "r": {
                        k("from", "from_"): "todos",
                        "to": "projects",
                        "type": "many-to-one",
                        "field": "projectId",
                        k("onDelete", "on_delete"): "set-null",
                    }
                },
            }
        )

    camel, snake = build(True), build(False)
    assert repr(camel) == repr(snake)
    sm = snake.collections["todos"].state_machine
    assert sm is not None and sm.on_invalid_transition == "last-valid-state"
    c = snake.collections["todos"].constraints["u"]
    assert (c.on_conflict, c.priority_field) == ("priority-field", "rank")
    assert snake.relations["r"].on_delete == "set-null"
    assert snake.relations["r"].from_ == "todos"


def test_collection_readable_with_spec_keys(schema: SchemaDefinition) -> None:
    todos = schema.collections["todos"]
    assert todos["stateMachine"] is todos.state_machine
    assert todos["state_machine"] is todos.state_machine
    assert todos["fields"] is todos.fields
    assert todos["indexes"] == todos.indexes
