"""Field type builders (`t`) and their modifiers (SPEC 2.4-2.7, DESIGN.md section 2).

A `FieldDescriptor` is immutable: every modifier returns a new descriptor, so a builder shared between two
schemas can never be changed behind one of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from .errors import INVALID_OPERATION, OfflineError, SchemaValidationError
from .frozen import FrozenDict, freeze

FieldType = Literal["string", "number", "boolean", "enum", "timestamp", "array", "richtext"]
FIELD_TYPES: Final = ("string", "number", "boolean", "enum", "timestamp", "array", "richtext")

MergeStrategy = Literal["lww", "counter", "max", "min", "union", "append-only", "server-authoritative"]
MERGE_STRATEGIES: Final = ("lww", "counter", "max", "min", "union", "append-only", "server-authoritative")

# SPEC 2.6 "valid on": which strategies each type accepts. richtext accepts none (it is always a CRDT).
_STRATEGIES_BY_TYPE: Final[Mapping[str, frozenset[str]]] = {
    "string": frozenset({"lww", "server-authoritative"}),
    "number": frozenset({"lww", "server-authoritative", "counter", "max", "min"}),
    "boolean": frozenset({"lww", "server-authoritative"}),
    "enum": frozenset({"lww", "server-authoritative"}),
    "timestamp": frozenset({"lww", "server-authoritative"}),
    "array": frozenset({"lww", "server-authoritative", "union", "append-only"}),
    "richtext": frozenset(),
}

#: SQLite storage class of each field type (SPEC 2.4); the local store and migrations share it.
STORAGE_TYPES: Final[Mapping[str, str]] = {
    "string": "TEXT",
    "number": "REAL",
    "boolean": "INTEGER",
    "enum": "TEXT",
    "timestamp": "INTEGER",
    "array": "TEXT",
    "richtext": "BLOB",
}

MAX_SAFE_INTEGER: Final = 2**53 - 1


class _AutoFlag:
    """`descriptor.auto`: reads as the boolean SPEC 2.7 names, and calling it is the `.auto()` modifier."""

    __slots__ = ("_owner", "_value")

    def __init__(self, owner: FieldDescriptor, value: bool) -> None:
        self._owner = owner
        self._value = value

    def __call__(self) -> FieldDescriptor:
        return self._owner._with_auto()

    def __bool__(self) -> bool:
        return self._value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _AutoFlag):
            return self._value == other._value
        if isinstance(other, bool):
            return self._value == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return repr(self._value)


class TransitionMap(FrozenDict[str, tuple[str, ...]]):
    """`descriptor.transitions`: the declared map (empty when none), and calling it is `.transitions(map)`."""

    __slots__ = ("_owner",)
    _owner: FieldDescriptor

    def __init__(self, owner: FieldDescriptor, data: Mapping[str, tuple[str, ...]]) -> None:
        super().__init__(data)
        object.__setattr__(self, "_owner", owner)

    def __call__(self, transition_map: Mapping[str, Sequence[str]]) -> FieldDescriptor:
        return self._owner._with_transitions(transition_map)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


class FieldDescriptor:
    """What a schema knows about one field (SPEC 2.7). Build it with `t`; it is immutable."""

    __slots__ = (
        "_auto",
        "_transitions",
        "default_value",
        "enum_values",
        "has_default",
        "inner",
        "merge_strategy",
        "required",
        "type",
    )

    type: FieldType
    required: bool
    default_value: Any
    has_default: bool
    enum_values: tuple[str, ...] | None
    inner: FieldDescriptor | None
    merge_strategy: MergeStrategy | None
    _auto: bool
    _transitions: FrozenDict[str, tuple[str, ...]]

    def __init__(
        self,
        type: FieldType,
        *,
        required: bool = True,
        default_value: Any = None,
        has_default: bool = False,
        auto: bool = False,
        enum_values: tuple[str, ...] | None = None,
        inner: FieldDescriptor | None = None,
        merge_strategy: MergeStrategy | None = None,
        transitions: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        values = {
            "type": type,
            "required": required,
            "default_value": default_value,
            "has_default": has_default,
            "_auto": bool(auto),
            "enum_values": enum_values,
            "inner": inner,
            "merge_strategy": merge_strategy,
            "_transitions": FrozenDict(transitions or {}),
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FieldDescriptor is immutable; modifiers return a new descriptor")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("FieldDescriptor is immutable")

    def _key(self) -> tuple[Any, ...]:
        return (
            self.type,
            self.required,
            self.has_default,
            self.default_value if self.has_default else None,
            self._auto,
            self.enum_values,
            self.inner,
            self.merge_strategy,
            self._transitions,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FieldDescriptor):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        if self.type == "enum":
            parts = [f"t.enum({list(self.enum_values or ())!r})"]
        elif self.type == "array":
            parts = [f"t.array({self.inner!r})"]
        else:
            parts = [f"t.{self.type}()"]
        if not self.required and self.type != "richtext":
            parts.append(".optional()")
        if self.has_default:
            parts.append(f".default({self.default_value!r})")
        if self._auto:
            parts.append(".auto()")
        if self.merge_strategy:
            parts.append(f".merge({self.merge_strategy!r})")
        if self._transitions:
            parts.append(f".transitions({dict(self._transitions)!r})")
        return "".join(parts)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_descriptor, (self._as_kwargs(),))

    def _as_kwargs(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "required": self.required,
            "default_value": self.default_value,
            "has_default": self.has_default,
            "auto": self._auto,
            "enum_values": self.enum_values,
            "inner": self.inner,
            "merge_strategy": self.merge_strategy,
            "transitions": self._transitions,
        }

    def _replace(self, **changes: Any) -> FieldDescriptor:
        kwargs = self._as_kwargs()
        kwargs.update(changes)
        return FieldDescriptor(**kwargs)

    @property
    def auto(self) -> _AutoFlag:
        return _AutoFlag(self, self._auto)

    @property
    def is_auto(self) -> bool:
        return self._auto

    @property
    def transitions(self) -> TransitionMap:
        return TransitionMap(self, self._transitions)

    @property
    def transition_map(self) -> FrozenDict[str, tuple[str, ...]] | None:
        """The declared transitions, or None when this field has no state machine."""
        return self._transitions or None

    # -- modifiers (SPEC 2.5) -------------------------------------------------------------------------------

    def optional(self) -> FieldDescriptor:
        self._refuse_on_richtext("optional")
        return self._replace(required=False)

    def default(self, value: Any) -> FieldDescriptor:
        self._refuse_on_richtext("default")
        if self._auto:
            raise SchemaValidationError(
                "an .auto() field is set by the system and cannot have a default",
                {"type": self.type, "modifier": "default"},
            )
        problem = value_problem(self, value)
        if problem is not None:
            raise SchemaValidationError(
                f"default value {value!r} does not fit a {self.type} field: {problem}",
                {"type": self.type, "modifier": "default", "value": repr(value)},
            )
        return self._replace(default_value=freeze(value), has_default=True)

    def _with_auto(self) -> FieldDescriptor:
        if self.type != "timestamp":
            raise SchemaValidationError(
                f".auto() is valid only on t.timestamp(), not on {self.type}",
                {"type": self.type, "modifier": "auto"},
            )
        if self.has_default:
            raise SchemaValidationError(
                "an .auto() field is set by the system and cannot have a default",
                {"type": self.type, "modifier": "auto"},
            )
        return self._replace(auto=True)

    def merge(self, strategy: str) -> FieldDescriptor:
        self._refuse_on_richtext("merge")
        if strategy not in MERGE_STRATEGIES:
            raise SchemaValidationError(
                f"unknown merge strategy {strategy!r}; expected one of {', '.join(MERGE_STRATEGIES)}",
                {"type": self.type, "modifier": "merge", "strategy": strategy},
            )
        allowed = _STRATEGIES_BY_TYPE[self.type]
        if strategy not in allowed:
            raise SchemaValidationError(
                f"merge strategy {strategy!r} is not valid on a {self.type} field "
                f"(valid: {', '.join(sorted(allowed))})",
                {"type": self.type, "modifier": "merge", "strategy": strategy},
            )
        return self._replace(merge_strategy=strategy)

    def _with_transitions(self, transition_map: Mapping[str, Sequence[str]]) -> FieldDescriptor:
        """Declare a state machine on an enum field (`onInvalidTransition: 'reject'`)."""
        if self.type != "enum" or not self.enum_values:
            raise SchemaValidationError(
                ".transitions() is valid only on t.enum([...]) with values",
                {"type": self.type, "modifier": "transitions"},
            )
        return self._replace(transitions=normalize_transition_map(transition_map, self.enum_values))

    # -- helpers ---------------------------------------------------------------------------------------------

    @property
    def storage_type(self) -> str:
        return STORAGE_TYPES[self.type]

    @property
    def effective_merge_strategy(self) -> str:
        """The strategy merges use: the declared one, else SPEC 2.6's default for the type."""
        if self.type == "richtext":
            return "crdt-text"
        if self.merge_strategy is not None:
            return self.merge_strategy
        return "union" if self.type == "array" else "lww"

    def _refuse_on_richtext(self, modifier: str) -> None:
        if self.type == "richtext":
            raise SchemaValidationError(
                f"t.richtext() does not accept .{modifier}(): rich text always starts empty",
                {"type": "richtext", "modifier": modifier},
            )


def normalize_transition_map(
    transition_map: Mapping[str, Sequence[str]], enum_values: Sequence[str]
) -> FrozenDict[str, tuple[str, ...]]:
    """Validate a TransitionMap against enum values and freeze it (SPEC 3.1 rule 2)."""
    if not isinstance(transition_map, Mapping):
        raise SchemaValidationError(
            "transitions must be a mapping of state -> list of next states",
            {"received": type(transition_map).__name__},
        )
    values = set(enum_values)
    out: dict[str, tuple[str, ...]] = {}
    for source, targets in transition_map.items():
        if source not in values:
            raise SchemaValidationError(
                f"transition source state {source!r} is not one of the enum values {list(enum_values)}",
                {"state": source, "allowed": list(enum_values)},
            )
        if isinstance(targets, (str, bytes)) or not isinstance(targets, Sequence):
            raise SchemaValidationError(
                f"transitions[{source!r}] must be a list of states",
                {"state": source},
            )
        for target in targets:
            if not isinstance(target, str) or target not in values:
                raise SchemaValidationError(
                    f"transition target state {target!r} (from {source!r}) is not one of the enum values "
                    f"{list(enum_values)}",
                    {"state": target, "from": source, "allowed": list(enum_values)},
                )
        out[source] = tuple(dict.fromkeys(targets))
    return FrozenDict(out)


class _Types:
    """The `t` namespace of field builders."""

    @staticmethod
    def string() -> FieldDescriptor:
        return FieldDescriptor("string")

    @staticmethod
    def number() -> FieldDescriptor:
        return FieldDescriptor("number")

    @staticmethod
    def boolean() -> FieldDescriptor:
        return FieldDescriptor("boolean")

    @staticmethod
    def timestamp() -> FieldDescriptor:
        return FieldDescriptor("timestamp")

    @staticmethod
    def richtext() -> FieldDescriptor:
        # Optional by nature: it always exists and starts as an empty document.
        return FieldDescriptor("richtext", required=False)

    @staticmethod
    def enum(values: Sequence[str]) -> FieldDescriptor:
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise SchemaValidationError("t.enum() takes a list of strings", {"received": repr(values)})
        vals = tuple(values)
        if not vals:
            raise SchemaValidationError("t.enum() needs at least one value", {"values": []})
        for v in vals:
            if not isinstance(v, str) or not v:
                raise SchemaValidationError(
                    f"enum values must be non-empty strings, got {v!r}", {"value": repr(v)}
                )
        if len(set(vals)) != len(vals):
            raise SchemaValidationError("enum values must be unique", {"values": list(vals)})
        return FieldDescriptor("enum", enum_values=vals)

    @staticmethod
    def array(inner: FieldDescriptor) -> FieldDescriptor:
        if not isinstance(inner, FieldDescriptor):
            raise SchemaValidationError(
                "t.array() takes a field builder such as t.string()", {"received": repr(inner)}
            )
        if inner.type in ("array", "richtext"):
            raise SchemaValidationError(
                f"t.array() items must be scalar; {inner.type} is not allowed inside an array",
                {"inner": inner.type},
            )
        return FieldDescriptor("array", inner=inner)


t: Final = _Types()


def value_problem(descriptor: FieldDescriptor, value: Any) -> str | None:
    """Return why ``value`` does not fit ``descriptor`` (None when it fits). ``None`` is judged elsewhere."""
    kind = descriptor.type
    if kind == "string":
        return None if isinstance(value, str) else "expected a string"
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "expected a number"
        if isinstance(value, float) and not math.isfinite(value):
            return "expected a finite number"
        if isinstance(value, int) and abs(value) > MAX_SAFE_INTEGER:
            return "integer outside the safe range ±(2**53-1)"
        return None
    if kind == "boolean":
        return None if isinstance(value, bool) else "expected a boolean"
    if kind == "enum":
        if not isinstance(value, str):
            return "expected a string enum value"
        if descriptor.enum_values is not None and value not in descriptor.enum_values:
            return f"expected one of {list(descriptor.enum_values)}"
        return None
    if kind == "timestamp":
        if isinstance(value, bool) or not isinstance(value, int):
            return "expected an integer timestamp in milliseconds since the epoch"
        return None if abs(value) <= MAX_SAFE_INTEGER else "timestamp outside the safe integer range"
    if kind == "array":
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            return "expected a list"
        assert descriptor.inner is not None
        for item in value:
            if item is None:
                return "array items cannot be null"
            problem = value_problem(descriptor.inner, item)
            if problem is not None:
                return f"array item {item!r}: {problem}"
        return None
    if kind == "richtext":
        return None if isinstance(value, (str, bytes)) else "expected text"
    return f"unknown field type {kind}"


def type_name(value: Any) -> str:
    """A JSON-ish name of a Python value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    return type(value).__name__


def validate_field_value(collection: str, field: str, descriptor: FieldDescriptor, value: Any) -> None:
    """Raise INVALID_OPERATION naming the field, the expected and the received type when ``value`` is wrong."""
    if value is None:
        if descriptor.required and descriptor.type != "richtext":
            raise OfflineError(
                f"{collection}.{field} is required and cannot be null",
                INVALID_OPERATION,
                {"collection": collection, "field": field, "expected": descriptor.type, "received": "null"},
            )
        return
    problem = value_problem(descriptor, value)
    if problem is not None:
        raise OfflineError(
            f"{collection}.{field}: {problem} (expected {descriptor.type}, received {type_name(value)})",
            INVALID_OPERATION,
            {
                "collection": collection,
                "field": field,
                "expected": descriptor.type,
                "received": type_name(value),
            },
        )


def _rebuild_descriptor(kwargs: dict[str, Any]) -> FieldDescriptor:
    return FieldDescriptor(**kwargs)
