"""Field type builders `t`, their modifiers and FieldDescriptor (SPEC 2.4-2.7, 8; DESIGN.md section 2)."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offline.core.errors import INVALID_OPERATION, SCHEMA_VALIDATION, OfflineError, SchemaValidationError
from offline.core.fields import (
    FIELD_TYPES,
    MERGE_STRATEGIES,
    FieldDescriptor,
    t,
    type_name,
    validate_field_value,
)

# One builder per type; enum and array need arguments.
BUILDERS: dict[str, Callable[[], FieldDescriptor]] = {
    "string": t.string,
    "number": t.number,
    "boolean": t.boolean,
    "enum": lambda: t.enum(["todo", "doing", "done"]),
    "timestamp": t.timestamp,
    "array": lambda: t.array(t.string()),
    "richtext": t.richtext,
}
NON_RICHTEXT = [name for name in BUILDERS if name != "richtext"]

# DESIGN.md section 2 / SPEC 2.6 "valid on".
VALID_MERGE: dict[str, set[str]] = {
    "string": {"lww", "server-authoritative"},
    "number": {"lww", "server-authoritative", "counter", "max", "min"},
    "boolean": {"lww", "server-authoritative"},
    "enum": {"lww", "server-authoritative"},
    "timestamp": {"lww", "server-authoritative"},
    "array": {"lww", "server-authoritative", "union", "append-only"},
    "richtext": set(),
}

# A value that fits each type, used as a default.
GOOD_DEFAULT: dict[str, Any] = {
    "string": "hello",
    "number": 3.5,
    "boolean": False,
    "enum": "doing",
    "timestamp": 1_700_000_000_000,
    "array": ["a", "b"],
}


def test_constants_list_every_type_and_strategy() -> None:
    assert set(FIELD_TYPES) == set(BUILDERS)
    assert set(MERGE_STRATEGIES) == {
        "lww",
        "counter",
        "max",
        "min",
        "union",
        "append-only",
        "server-authoritative",
    }


# -- builders --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["string", "number", "boolean", "timestamp"])
def test_scalar_builder_descriptor(kind: str) -> None:
    d = BUILDERS[kind]()
    assert isinstance(d, FieldDescriptor)
    assert d.type == kind
    assert d.required is True
    assert d.default_value is None
    assert d.has_default is False
    assert d.auto == False  # noqa: E712 - `auto` is a flag object that compares like a bool
    assert not d.auto
    assert d.enum_values is None
    assert d.inner is None
    assert d.merge_strategy is None
    assert len(d.transitions) == 0
    assert d.transition_map is None


def test_enum_builder_descriptor() -> None:
    d = t.enum(["todo", "doing", "done"])
    assert d.type == "enum"
    assert d.enum_values == ("todo", "doing", "done")
    assert d.required is True
    assert d.default_value is None
    assert not d.auto
    assert d.inner is None
    assert d.merge_strategy is None


def test_enum_builder_accepts_tuple_and_copies_values() -> None:
    values = ["a", "b"]
    d = t.enum(values)
    values.append("c")
    assert d.enum_values == ("a", "b")
    assert t.enum(("a", "b")) == d


def test_array_builder_descriptor() -> None:
    inner = t.number()
    d = t.array(inner)
    assert d.type == "array"
    assert d.inner == inner
    assert d.inner is not None and d.inner.type == "number"
    assert d.required is True
    assert d.enum_values is None
    assert d.merge_strategy is None
    assert d.effective_merge_strategy == "union"


def test_array_of_enum_keeps_inner_values() -> None:
    d = t.array(t.enum(["x", "y"]))
    assert d.inner is not None
    assert d.inner.enum_values == ("x", "y")


def test_richtext_builder_descriptor() -> None:
    d = t.richtext()
    assert d.type == "richtext"
    assert d.required is False  # always exists, starts empty
    assert d.default_value is None
    assert d.has_default is False
    assert not d.auto
    assert d.merge_strategy is None
    assert d.effective_merge_strategy == "crdt-text"


@pytest.mark.parametrize(
    ("kind", "storage"),
    [
        ("string", "TEXT"),
        ("number", "REAL"),
        ("boolean", "INTEGER"),
        ("enum", "TEXT"),
        ("timestamp", "INTEGER"),
        ("array", "TEXT"),
        ("richtext", "BLOB"),
    ],
)
def test_storage_type(kind: str, storage: str) -> None:
    assert BUILDERS[kind]().storage_type == storage


@pytest.mark.parametrize("kind", ["string", "number", "boolean", "enum", "timestamp"])
def test_default_merge_strategy_of_scalars_is_lww(kind: str) -> None:
    assert BUILDERS[kind]().effective_merge_strategy == "lww"


# -- t.enum validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        [],
        (),
        ["a", "a"],
        ["a", "b", "a"],
        ["a", 1],
        [None],
        ["a", b"b"],
        [""],
        "abc",
        b"abc",
        None,
        42,
        {"a", "b"},
    ],
    ids=repr,
)
def test_enum_rejects_bad_values(values: Any) -> None:
    with pytest.raises(SchemaValidationError) as info:
        t.enum(values)
    assert info.value.code == SCHEMA_VALIDATION


# -- t.array validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "inner",
    [
        pytest.param(lambda: t.array(t.string()), id="nested-array"),
        pytest.param(t.richtext, id="richtext"),
    ],
)
def test_array_refuses_nested_arrays_and_richtext(inner: Callable[[], FieldDescriptor]) -> None:
    with pytest.raises(SchemaValidationError) as info:
        t.array(inner())
    assert info.value.code == SCHEMA_VALIDATION


@pytest.mark.parametrize("inner", ["string", str, None, 1, {"type": "string"}, t.string], ids=repr)
def test_array_refuses_non_descriptors(inner: Any) -> None:
    with pytest.raises(SchemaValidationError):
        t.array(inner)


@pytest.mark.parametrize("kind", ["string", "number", "boolean", "enum", "timestamp"])
def test_array_accepts_every_scalar(kind: str) -> None:
    assert t.array(BUILDERS[kind]()).inner == BUILDERS[kind]()


# -- modifiers return new descriptors --------------------------------------------------------------


@pytest.mark.parametrize("kind", NON_RICHTEXT)
def test_optional_returns_new_descriptor(kind: str) -> None:
    original = BUILDERS[kind]()
    changed = original.optional()
    assert changed is not original
    assert changed.required is False
    assert original.required is True
    assert changed.type == original.type
    assert changed != original


@pytest.mark.parametrize("kind", NON_RICHTEXT)
def test_default_returns_new_descriptor(kind: str) -> None:
    original = BUILDERS[kind]()
    changed = original.default(GOOD_DEFAULT[kind])
    assert changed is not original
    assert changed.has_default is True
    assert original.has_default is False
    assert original.default_value is None
    assert changed.required is original.required
    assert changed != original


@pytest.mark.parametrize("kind", NON_RICHTEXT)
def test_default_value_stored(kind: str) -> None:
    d = BUILDERS[kind]().default(GOOD_DEFAULT[kind])
    if kind == "array":
        assert list(d.default_value) == GOOD_DEFAULT[kind]
    else:
        assert d.default_value == GOOD_DEFAULT[kind]


def test_array_default_is_frozen_copy() -> None:
    value = ["a"]
    d = t.array(t.string()).default(value)
    value.append("b")
    assert list(d.default_value) == ["a"]
    with pytest.raises((TypeError, AttributeError)):
        d.default_value.append("c")


def test_auto_returns_new_descriptor() -> None:
    original = t.timestamp()
    changed = original.auto()
    assert changed is not original
    assert changed.auto == True  # noqa: E712
    assert bool(changed.auto) is True
    assert changed.is_auto is True
    assert bool(original.auto) is False
    assert original.is_auto is False


@pytest.mark.parametrize("kind", NON_RICHTEXT)
@pytest.mark.parametrize("strategy", ["lww", "server-authoritative"])
def test_merge_returns_new_descriptor(kind: str, strategy: str) -> None:
    original = BUILDERS[kind]()
    changed = original.merge(strategy)
    assert changed is not original
    assert changed.merge_strategy == strategy
    assert original.merge_strategy is None
    assert changed.effective_merge_strategy == strategy


def test_transitions_returns_new_descriptor() -> None:
    original = t.enum(["a", "b"])
    changed = original.transitions({"a": ["b"], "b": []})
    assert changed is not original
    assert dict(changed.transitions) == {"a": ("b",), "b": ()}
    assert len(original.transitions) == 0
    assert original.transition_map is None


def test_optional_then_default_chain() -> None:
    d = t.string().optional().default("x")
    assert d.required is False
    assert d.has_default is True
    assert d.default_value == "x"


def test_default_then_optional_chain() -> None:
    assert t.string().default("x").optional() == t.string().optional().default("x")


def test_long_chain_keeps_every_modifier() -> None:
    d = t.number().optional().default(0).merge("counter")
    assert (d.type, d.required, d.default_value, d.merge_strategy) == ("number", False, 0, "counter")
    d2 = t.timestamp().optional().auto().merge("server-authoritative")
    assert d2.auto and not d2.required and d2.merge_strategy == "server-authoritative"
    d3 = t.enum(["a", "b"]).optional().default("a").transitions({"a": ["b"]}).merge("lww")
    assert d3.required is False
    assert d3.default_value == "a"
    assert d3.transition_map == {"a": ("b",)}
    assert d3.merge_strategy == "lww"


def test_later_modifier_replaces_earlier() -> None:
    d = t.number().merge("max").merge("min")
    assert d.merge_strategy == "min"
    d2 = t.string().default("a").default("b")
    assert d2.default_value == "b"


def test_shared_builder_never_changes_behind_a_user() -> None:
    base = t.string()
    a = base.optional()
    b = base.default("x")
    assert base == t.string()
    assert a.has_default is False
    assert b.required is True


# -- .auto() ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["string", "number", "boolean", "enum", "array", "richtext"])
def test_auto_only_on_timestamp(kind: str) -> None:
    with pytest.raises(SchemaValidationError) as info:
        BUILDERS[kind]().auto()
    assert info.value.code == SCHEMA_VALIDATION


def test_auto_refuses_default_in_either_order() -> None:
    with pytest.raises(SchemaValidationError):
        t.timestamp().auto().default(1)
    with pytest.raises(SchemaValidationError):
        t.timestamp().default(1).auto()


def test_auto_flag_behaves_like_a_bool() -> None:
    plain, auto = t.timestamp(), t.timestamp().auto()
    assert plain.auto == False  # noqa: E712
    assert auto.auto == True  # noqa: E712
    assert auto.auto != plain.auto
    assert hash(auto.auto) == hash(True)
    assert repr(auto.auto) == "True"
    assert callable(plain.auto)
    assert auto.auto() == auto  # calling it again is idempotent


# -- .merge() matrix -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("strategy", [*MERGE_STRATEGIES, "unknown", "LWW", ""])
def test_merge_matrix(kind: str, strategy: str) -> None:
    descriptor = BUILDERS[kind]()
    if strategy in VALID_MERGE[kind]:
        assert descriptor.merge(strategy).merge_strategy == strategy
    else:
        with pytest.raises(SchemaValidationError) as info:
            descriptor.merge(strategy)
        assert info.value.code == SCHEMA_VALIDATION
        assert descriptor.merge_strategy is None


@given(kind=st.sampled_from(list(BUILDERS)), strategy=st.text(max_size=25))
def test_merge_refuses_any_unknown_strategy(kind: str, strategy: str) -> None:
    descriptor = BUILDERS[kind]()
    if strategy in VALID_MERGE[kind]:
        assert descriptor.merge(strategy).merge_strategy == strategy
    else:
        with pytest.raises(SchemaValidationError):
            descriptor.merge(strategy)


@pytest.mark.parametrize("strategy", [None, 1, ["lww"]], ids=repr)
def test_merge_refuses_non_string_strategy(strategy: Any) -> None:
    with pytest.raises(SchemaValidationError):
        t.string().merge(strategy)


# -- richtext --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "apply",
    [
        pytest.param(lambda d: d.default(""), id="default-empty"),
        pytest.param(lambda d: d.default("text"), id="default"),
        pytest.param(lambda d: d.optional(), id="optional"),
        pytest.param(lambda d: d.merge("lww"), id="merge-lww"),
        pytest.param(lambda d: d.merge("server-authoritative"), id="merge-sa"),
        pytest.param(lambda d: d.auto(), id="auto"),
        pytest.param(lambda d: d.transitions({}), id="transitions"),
    ],
)
def test_richtext_refuses_modifiers(apply: Callable[[FieldDescriptor], Any]) -> None:
    with pytest.raises(SchemaValidationError) as info:
        apply(t.richtext())
    assert info.value.code == SCHEMA_VALIDATION


# -- .default() type checks ------------------------------------------------------------------------

BAD_DEFAULTS: list[tuple[str, Any]] = [
    ("string", 1),
    ("string", None),
    ("string", True),
    ("string", ["a"]),
    ("number", "1"),
    ("number", True),
    ("number", None),
    ("number", float("nan")),
    ("number", float("inf")),
    ("number", 2**53),
    ("boolean", 0),
    ("boolean", 1),
    ("boolean", "true"),
    ("enum", "nope"),
    ("enum", 1),
    ("enum", "TODO"),
    ("timestamp", "2024-01-01"),
    ("timestamp", 1.5),
    ("timestamp", True),
    ("array", "ab"),
    ("array", [1]),
    ("array", ["a", None]),
    ("array", ["a", 2]),
    ("array", {"a": 1}),
]


@pytest.mark.parametrize(("kind", "value"), BAD_DEFAULTS, ids=repr)
def test_default_refuses_wrong_type(kind: str, value: Any) -> None:
    with pytest.raises(SchemaValidationError) as info:
        BUILDERS[kind]().default(value)
    assert info.value.code == SCHEMA_VALIDATION


GOOD_DEFAULTS: list[tuple[str, Any]] = [
    ("string", ""),
    ("number", 0),
    ("number", -2.25),
    ("number", 2**53 - 1),
    ("boolean", True),
    ("enum", "todo"),
    ("enum", "done"),
    ("timestamp", 0),
    ("array", []),
    ("array", ("a",)),
]


@pytest.mark.parametrize(("kind", "value"), GOOD_DEFAULTS, ids=repr)
def test_default_accepts_fitting_values(kind: str, value: Any) -> None:
    d = BUILDERS[kind]().default(value)
    assert d.has_default is True


def test_array_default_checks_items_against_inner() -> None:
    assert list(t.array(t.number()).default([1, 2.5]).default_value) == [1, 2.5]
    assert list(t.array(t.enum(["x", "y"])).default(["y"]).default_value) == ["y"]
    with pytest.raises(SchemaValidationError):
        t.array(t.enum(["x", "y"])).default(["z"])
    with pytest.raises(SchemaValidationError):
        t.array(t.boolean()).default([1])


# -- .transitions() --------------------------------------------------------------------------------


def test_transitions_accepts_declared_states() -> None:
    d = t.enum(["todo", "doing", "done"]).transitions(
        {"todo": ["doing"], "doing": ["done", "todo"], "done": []}
    )
    assert d.transition_map == {"todo": ("doing",), "doing": ("done", "todo"), "done": ()}
    assert d.transitions["done"] == ()


def test_transitions_removes_duplicate_targets() -> None:
    d = t.enum(["a", "b"]).transitions({"a": ["b", "b"]})
    assert d.transitions["a"] == ("b",)


def test_transitions_copy_of_input() -> None:
    raw = {"a": ["b"]}
    d = t.enum(["a", "b"]).transitions(raw)
    raw["a"].append("a")
    raw["b"] = ["a"]
    assert d.transition_map == {"a": ("b",)}


@pytest.mark.parametrize(
    "transition_map",
    [
        {"unknown": ["a"]},
        {"a": ["unknown"]},
        {"a": ["b"], "b": ["zzz"]},
        {"A": ["b"]},
        {1: ["a"]},
        {"a": [1]},
        {"a": [None]},
        {"a": [["b"]]},
        {"a": "b"},
        {"a": None},
        {"a": {"b"}},
        [("a", ["b"])],
        None,
    ],
    ids=repr,
)
def test_transitions_refuses_unknown_states(transition_map: Any) -> None:
    with pytest.raises(SchemaValidationError) as info:
        t.enum(["a", "b"]).transitions(transition_map)
    assert info.value.code == SCHEMA_VALIDATION


def test_transitions_error_context_names_state() -> None:
    with pytest.raises(SchemaValidationError) as info:
        t.enum(["a", "b"]).transitions({"a": ["c"]})
    assert info.value.context is not None
    assert info.value.context["state"] == "c"


@pytest.mark.parametrize("kind", ["string", "number", "boolean", "timestamp", "array", "richtext"])
def test_transitions_only_on_enum(kind: str) -> None:
    with pytest.raises(SchemaValidationError):
        BUILDERS[kind]().transitions({})


# -- immutability, hashing, equality ---------------------------------------------------------------


@pytest.mark.parametrize(
    "attribute",
    [
        "type",
        "required",
        "default_value",
        "has_default",
        "auto",
        "enum_values",
        "inner",
        "merge_strategy",
        "transitions",
        "new_attribute",
    ],
)
def test_descriptor_attributes_cannot_be_set(attribute: str) -> None:
    d = t.enum(["a", "b"])
    with pytest.raises(AttributeError):
        setattr(d, attribute, "x")
    assert d == t.enum(["a", "b"])


@pytest.mark.parametrize("attribute", ["type", "required"])
def test_descriptor_attributes_cannot_be_deleted(attribute: str) -> None:
    d = t.string()
    with pytest.raises(AttributeError):
        delattr(d, attribute)
    assert d.type == "string"


def test_transitions_map_is_read_only() -> None:
    d = t.enum(["a", "b"]).transitions({"a": ["b"]})
    with pytest.raises(TypeError):
        d.transitions["b"] = ("a",)  # type: ignore[index]
    with pytest.raises((TypeError, AttributeError)):
        d.transitions["a"].append("a")  # type: ignore[attr-defined]
    assert d.transition_map == {"a": ("b",)}


def _same_builds() -> list[Callable[[], FieldDescriptor]]:
    return [
        t.string,
        lambda: t.string().optional(),
        lambda: t.number().default(1).merge("counter"),
        lambda: t.timestamp().auto(),
        lambda: t.enum(["a", "b"]),
        lambda: t.enum(["a", "b"]).transitions({"a": ["b"]}),
        lambda: t.array(t.string()).default(["x"]),
        t.richtext,
    ]


@pytest.mark.parametrize("build", _same_builds())
def test_equal_and_hashable_when_built_the_same(build: Callable[[], FieldDescriptor]) -> None:
    a, b = build(), build()
    assert a is not b
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert {a: 1}[b] == 1


def test_all_builds_differ_from_each_other() -> None:
    built = [build() for build in _same_builds()]
    assert len(set(built)) == len(built)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (lambda: t.string(), lambda: t.number()),
        (lambda: t.string(), lambda: t.string().optional()),
        (lambda: t.string(), lambda: t.string().default("")),
        (lambda: t.string().default("a"), lambda: t.string().default("b")),
        (lambda: t.number(), lambda: t.number().merge("max")),
        (lambda: t.timestamp(), lambda: t.timestamp().auto()),
        (lambda: t.enum(["a", "b"]), lambda: t.enum(["b", "a"])),
        (lambda: t.enum(["a", "b"]), lambda: t.enum(["a", "b"]).transitions({"a": ["b"]})),
        (lambda: t.array(t.string()), lambda: t.array(t.number())),
    ],
)
def test_different_builds_are_not_equal(
    a: Callable[[], FieldDescriptor], b: Callable[[], FieldDescriptor]
) -> None:
    assert a() != b()


def test_descriptor_not_equal_to_other_objects() -> None:
    assert t.string() != "string"
    assert t.string() != {"type": "string"}


@pytest.mark.parametrize("build", _same_builds())
def test_descriptor_pickles_and_copies(build: Callable[[], FieldDescriptor]) -> None:
    d = build()
    assert pickle.loads(pickle.dumps(d)) == d
    assert copy.copy(d) == d
    assert copy.deepcopy(d) == d


def test_repr_mentions_builder_and_modifiers() -> None:
    text = repr(t.number().optional().default(2).merge("max"))
    assert "t.number()" in text
    assert ".optional()" in text
    assert ".default(2)" in text
    assert "max" in text


# -- validate_field_value --------------------------------------------------------------------------

WRONG_VALUES: list[tuple[str, Any, str]] = [
    ("string", 1, "number"),
    ("string", True, "boolean"),
    ("number", "1", "string"),
    ("number", False, "boolean"),
    ("number", [1], "array"),
    ("boolean", 1, "number"),
    ("enum", "nope", "string"),
    ("enum", 3, "number"),
    ("timestamp", "now", "string"),
    ("timestamp", 1.5, "number"),
    ("array", "abc", "string"),
    ("array", {"a": 1}, "object"),
    ("array", [1], "array"),
    ("richtext", 5, "number"),
]


@pytest.mark.parametrize(("kind", "value", "received"), WRONG_VALUES, ids=repr)
def test_validate_field_value_error_context(kind: str, value: Any, received: str) -> None:
    with pytest.raises(OfflineError) as info:
        validate_field_value("todos", "myField", BUILDERS[kind](), value)
    err = info.value
    assert err.code == INVALID_OPERATION
    assert err.name == "OfflineError"
    assert err.context is not None
    assert err.context["field"] == "myField"
    assert err.context["collection"] == "todos"
    assert err.context["expected"] == kind
    assert err.context["received"] == received
    assert "myField" in err.message


@pytest.mark.parametrize("kind", ["string", "number", "boolean", "enum", "timestamp", "array"])
def test_validate_field_value_required_null(kind: str) -> None:
    with pytest.raises(OfflineError) as info:
        validate_field_value("todos", "f", BUILDERS[kind](), None)
    assert info.value.code == INVALID_OPERATION
    assert info.value.context == {"collection": "todos", "field": "f", "expected": kind, "received": "null"}


@pytest.mark.parametrize("kind", NON_RICHTEXT)
def test_validate_field_value_optional_null_is_fine(kind: str) -> None:
    validate_field_value("todos", "f", BUILDERS[kind]().optional(), None)


def test_validate_field_value_richtext_null_is_fine() -> None:
    validate_field_value("todos", "body", t.richtext(), None)


@pytest.mark.parametrize(("kind", "value"), [*GOOD_DEFAULTS, ("richtext", "hello")], ids=repr)
def test_validate_field_value_accepts_fitting_values(kind: str, value: Any) -> None:
    validate_field_value("todos", "f", BUILDERS[kind](), value)


@given(st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1))
def test_validate_number_accepts_safe_integers(value: int) -> None:
    validate_field_value("c", "n", t.number(), value)
    validate_field_value("c", "ts", t.timestamp(), value)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_validate_number_accepts_finite_floats(value: float) -> None:
    validate_field_value("c", "n", t.number(), value)


@given(st.text())
def test_validate_string_accepts_any_text_and_rejects_it_as_number(value: str) -> None:
    validate_field_value("c", "s", t.string(), value)
    with pytest.raises(OfflineError) as info:
        validate_field_value("c", "n", t.number(), value)
    assert info.value.context is not None
    assert info.value.context["received"] == "string"


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (None, "null"),
        (True, "boolean"),
        (1, "number"),
        (1.5, "number"),
        ("s", "string"),
        ([1], "array"),
        ((1,), "array"),
        ({"a": 1}, "object"),
        (b"x", "bytes"),
    ],
    ids=repr,
)
def test_type_name(value: Any, name: str) -> None:
    assert type_name(value) == name
