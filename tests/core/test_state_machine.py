"""Enum state machines (SPEC 2.10, 3.1, 4.4; DESIGN.md section 2)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offline.core.errors import SCHEMA_VALIDATION, SchemaValidationError
from offline.core.fields import FieldDescriptor, t
from offline.core.frozen import FrozenDict
from offline.core.schema import SchemaDefinition, define_schema
from offline.core.state_machine import (
    StateMachineConstraint,
    StateMachineDefinition,
    TransitionValidationResult,
    build_state_machine_constraints,
    get_transition_map,
    validate_state_machine_definition,
    validate_transition,
)

STATES = ["todo", "doing", "done", "archived"]
TRANSITIONS: dict[str, list[str]] = {
    "todo": ["doing", "archived"],
    "doing": ["done", "todo"],
    "done": ["archived"],
    "archived": [],
}


def constraint(transitions: dict[str, Any] | None = None) -> StateMachineConstraint:
    frozen: FrozenDict[str, tuple[str, ...]] = FrozenDict(
        {k: tuple(v) for k, v in (TRANSITIONS if transitions is None else transitions).items()}
    )
    return StateMachineConstraint(field="status", collection="todos", transitions=frozen)


# -- validate_transition (SPEC 3.1) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "target"), [(s, tgt) for s, targets in TRANSITIONS.items() for tgt in targets]
)
def test_allowed_transition_is_valid(source: str, target: str) -> None:
    result = validate_transition(constraint(), source, target)
    assert isinstance(result, TransitionValidationResult)
    assert result.valid is True
    assert result.from_ == source
    assert result.to == target
    assert result.field == "status"
    assert result.collection == "todos"
    assert result.allowed_targets == TRANSITIONS[source]


@pytest.mark.parametrize(
    ("source", "target"),
    [(s, tgt) for s in STATES for tgt in STATES if tgt not in TRANSITIONS[s]],
)
def test_disallowed_transition_same_shape(source: str, target: str) -> None:
    result = validate_transition(constraint(), source, target)
    assert isinstance(result, TransitionValidationResult)
    assert result.valid is False
    assert result.from_ == source
    assert result.to == target
    assert result.field == "status"
    assert result.collection == "todos"
    assert result.allowed_targets == TRANSITIONS[source]


@pytest.mark.parametrize("target", STATES)
def test_terminal_state_allows_nothing(target: str) -> None:
    """Rule 1: a state with an empty list is terminal."""
    result = validate_transition(constraint(), "archived", target)
    assert result.valid is False
    assert result.allowed_targets == []


def test_self_transition_not_allowed_unless_listed() -> None:
    assert validate_transition(constraint(), "todo", "todo").valid is False
    looping = constraint({"todo": ["todo"]})
    assert validate_transition(looping, "todo", "todo").valid is True


def test_unlisted_source_state_has_no_targets() -> None:
    result = validate_transition(constraint({"todo": ["done"]}), "done", "todo")
    assert result.valid is False
    assert result.allowed_targets == []


def test_unknown_states_are_invalid_not_errors() -> None:
    result = validate_transition(constraint(), "nowhere", "todo")
    assert result.valid is False
    assert result.allowed_targets == []
    assert validate_transition(constraint(), "todo", "nowhere").valid is False


@pytest.mark.parametrize(
    ("value", "text"),
    [(1, "1"), (2, "2"), (-3, "-3"), (None, "null"), (True, "true"), (False, "false"), ("x", "x")],
    ids=repr,
)
def test_values_are_coerced_to_strings(value: Any, text: str) -> None:
    """Rule 3: both values are coerced to strings."""
    c = constraint({"1": ["2"], "2": [], "null": ["true"], "true": ["false"], "x": ["1"], "-3": ["x"]})
    result = validate_transition(c, value, value)
    assert result.from_ == text
    assert result.to == text
    assert isinstance(result.from_, str)
    assert isinstance(result.to, str)


def test_number_states_match_string_states() -> None:
    c = constraint({"1": ["2"], "2": []})
    ok = validate_transition(c, 1, 2)
    assert ok.valid is True
    assert (ok.from_, ok.to, ok.allowed_targets) == ("1", "2", ["2"])
    assert validate_transition(c, 2, 1).valid is False
    assert validate_transition(c, "1", 2).valid is True


def test_none_source_uses_null_state() -> None:
    c = constraint({"null": ["todo"], "todo": []})
    result = validate_transition(c, None, "todo")
    assert result.valid is True
    assert result.from_ == "null"
    assert validate_transition(constraint(), None, "todo").valid is False


def test_result_allowed_targets_is_a_fresh_list() -> None:
    c = constraint()
    first = validate_transition(c, "todo", "doing")
    first.allowed_targets.append("hacked")
    assert validate_transition(c, "todo", "doing").allowed_targets == ["doing", "archived"]
    assert c.transitions["todo"] == ("doing", "archived")


def test_constraint_may_be_a_plain_dict() -> None:
    c = {"field": "status", "collection": "todos", "transitions": {"a": ["b"], "b": []}}
    ok = validate_transition(c, "a", "b")
    assert (ok.valid, ok.field, ok.collection, ok.allowed_targets) == (True, "status", "todos", ["b"])
    assert validate_transition(c, "b", "a").valid is False


def test_constraint_with_plain_dict_transitions() -> None:
    c = StateMachineConstraint("status", "todos", {"a": ["b"]})  # type: ignore[arg-type]
    assert validate_transition(c, "a", "b").valid is True
    assert list(c.allowed_targets("a")) == ["b"]


@given(
    transitions=st.dictionaries(
        st.sampled_from(STATES), st.lists(st.sampled_from(STATES), unique=True), max_size=len(STATES)
    ),
    source=st.sampled_from([*STATES, "other"]),
    target=st.sampled_from([*STATES, "other"]),
)
def test_validate_transition_matches_the_map(
    transitions: dict[str, list[str]], source: str, target: str
) -> None:
    result = validate_transition(constraint(transitions), source, target)
    allowed = transitions.get(source, [])
    assert result.valid is (target in allowed)
    assert result.allowed_targets == allowed
    assert (result.from_, result.to) == (source, target)


# -- build_state_machine_constraints ---------------------------------------------------------------


def sm_schema() -> SchemaDefinition:
    return define_schema(
        {
            "version": 1,
            "collections": {
                "todos": {
                    "fields": {
                        "title": t.string(),
                        "status": t.enum(["todo", "done"]).transitions({"todo": ["done"], "done": []}),
                        "kind": t.enum(["a", "b"]),
                        "phase": t.enum(["x", "y", "z"]),
                    },
                    "stateMachine": {
                        "field": "phase",
                        "transitions": {"x": ["y"], "y": ["z"], "z": []},
                        "onInvalidTransition": "last-valid-state",
                    },
                },
                "plain": {"fields": {"name": t.string(), "mood": t.enum(["ok"])}},
                "orders": {
                    "fields": {"state": t.enum(["new", "paid"]).transitions({"new": ["paid"]})},
                },
            },
        }
    )


def test_build_constraints_one_per_enum_field_with_transitions_in_order() -> None:
    constraints = build_state_machine_constraints(sm_schema())
    assert [(c.collection, c.field) for c in constraints] == [
        ("todos", "status"),
        ("todos", "phase"),
        ("orders", "state"),
    ]
    for c in constraints:
        assert isinstance(c, StateMachineConstraint)


def test_build_constraints_from_field_transitions() -> None:
    status = build_state_machine_constraints(sm_schema())[0]
    assert dict(status.transitions) == {"todo": ("done",), "done": ()}
    assert status.on_invalid_transition == "reject"


def test_build_constraints_from_collection_state_machine() -> None:
    phase = build_state_machine_constraints(sm_schema())[1]
    assert phase.field == "phase"
    assert phase.collection == "todos"
    assert dict(phase.transitions) == {"x": ("y",), "y": ("z",), "z": ()}
    assert phase.on_invalid_transition == "last-valid-state"


def test_build_constraints_are_usable_with_validate_transition() -> None:
    constraints = {(c.collection, c.field): c for c in build_state_machine_constraints(sm_schema())}
    assert validate_transition(constraints[("todos", "phase")], "x", "y").valid is True
    assert validate_transition(constraints[("todos", "phase")], "x", "z").valid is False
    assert validate_transition(constraints[("orders", "state")], "new", "paid").valid is True
    assert validate_transition(constraints[("orders", "state")], "paid", "new").valid is False


def test_build_constraints_empty_when_none() -> None:
    schema = define_schema(
        {
            "version": 1,
            "collections": {"todos": {"fields": {"status": t.enum(["a", "b"]), "title": t.string()}}},
        }
    )
    assert build_state_machine_constraints(schema) == []


# -- get_transition_map ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("collection", "field"),
    [
        ("missing", "status"),  # collection does not exist
        ("todos", "missing"),  # field does not exist
        ("todos", "title"),  # not an enum
        ("todos", "kind"),  # enum without transitions
        ("plain", "mood"),
        ("plain", "name"),
    ],
)
def test_get_transition_map_none(collection: str, field: str) -> None:
    assert get_transition_map(sm_schema(), collection, field) is None


@pytest.mark.parametrize(
    ("collection", "field", "expected"),
    [
        ("todos", "status", {"todo": ["done"], "done": []}),
        ("todos", "phase", {"x": ["y"], "y": ["z"], "z": []}),
        ("orders", "state", {"new": ["paid"]}),
    ],
)
def test_get_transition_map_plain_dict(collection: str, field: str, expected: dict[str, list[str]]) -> None:
    schema = sm_schema()
    result = get_transition_map(schema, collection, field)
    assert type(result) is dict
    assert result == expected
    assert all(type(v) is list for v in result.values())
    # It is a copy: changing it leaves the schema alone.
    result.clear()
    assert get_transition_map(schema, collection, field) == expected


# -- validate_state_machine_definition -------------------------------------------------------------

FIELDS: dict[str, FieldDescriptor] = {
    "title": t.string(),
    "status": t.enum(["a", "b", "c"]),
    "count": t.number(),
    "empty": FieldDescriptor("enum"),  # an enum without values (only reachable by hand)
    "empty2": FieldDescriptor("enum", enum_values=()),
}


def test_validate_definition_returns_frozen_definition() -> None:
    raw = {"field": "status", "transitions": {"a": ["b"], "b": ["c", "a"], "c": []}}
    result = validate_state_machine_definition("todos", raw, FIELDS)
    assert isinstance(result, StateMachineDefinition)
    assert result.field == "status"
    assert result.on_invalid_transition == "reject"
    assert dict(result.transitions) == {"a": ("b",), "b": ("c", "a"), "c": ()}
    raw["transitions"]["c"].append("a")  # type: ignore[index]
    assert result.transitions["c"] == ()


@pytest.mark.parametrize("key", ["onInvalidTransition", "on_invalid_transition"])
@pytest.mark.parametrize("mode", ["reject", "last-valid-state"])
def test_validate_definition_modes(key: str, mode: str) -> None:
    result = validate_state_machine_definition(
        "todos", {"field": "status", "transitions": {}, key: mode}, FIELDS
    )
    assert result.on_invalid_transition == mode


def test_validate_definition_accepts_a_definition_object() -> None:
    first = validate_state_machine_definition(
        "todos",
        {"field": "status", "transitions": {"a": ["b"]}, "onInvalidTransition": "last-valid-state"},
        FIELDS,
    )
    assert validate_state_machine_definition("todos", first, FIELDS) == first


@pytest.mark.parametrize(
    ("sm", "field"),
    [
        ({"field": "missing", "transitions": {}}, "missing"),
        ({"transitions": {}}, None),
        ({"field": 3, "transitions": {}}, 3),
        ({"field": "title", "transitions": {}}, "title"),
        ({"field": "count", "transitions": {}}, "count"),
        ({"field": "empty", "transitions": {}}, "empty"),
        ({"field": "empty2", "transitions": {}}, "empty2"),
        ({"field": "status", "transitions": {"z": ["a"]}}, "status"),
        ({"field": "status", "transitions": {"a": ["z"]}}, "status"),
        ({"field": "status", "transitions": {"a": "b"}}, "status"),
        ({"field": "status", "transitions": None}, "status"),
        ({"field": "status"}, "status"),
        ({"field": "status", "transitions": {}, "onInvalidTransition": "ignore"}, "status"),
        ({"field": "status", "transitions": {}, "onInvalidTransition": None}, "status"),
        ({"field": "status", "transitions": {}, "on_invalid_transition": "last_valid_state"}, "status"),
    ],
    ids=repr,
)
def test_validate_definition_errors(sm: dict[str, Any], field: Any) -> None:
    with pytest.raises(SchemaValidationError) as info:
        validate_state_machine_definition("todos", sm, FIELDS)
    err = info.value
    assert err.code == SCHEMA_VALIDATION
    assert err.name == "OfflineError"
    assert err.context is not None
    assert err.context["collection"] == "todos"
    assert err.context["field"] == field


@pytest.mark.parametrize("sm", [None, "status", ["status"]], ids=repr)
def test_validate_definition_not_a_mapping(sm: Any) -> None:
    with pytest.raises(SchemaValidationError) as info:
        validate_state_machine_definition("todos", sm, FIELDS)
    assert info.value.context == {"collection": "todos"}


def test_validate_definition_error_names_bad_state() -> None:
    with pytest.raises(SchemaValidationError) as info:
        validate_state_machine_definition("todos", {"field": "status", "transitions": {"a": ["zz"]}}, FIELDS)
    assert info.value.context is not None
    assert info.value.context["state"] == "zz"
    assert "zz" in info.value.message


def test_definition_readable_with_camel_case_keys() -> None:
    sm = validate_state_machine_definition(
        "todos", {"field": "status", "transitions": {}, "onInvalidTransition": "last-valid-state"}, FIELDS
    )
    assert sm["onInvalidTransition"] == "last-valid-state"
    assert sm["field"] == "status"
