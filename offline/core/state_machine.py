"""Enum state machines (SPEC 2.10, 3.1, 4.4).

A state machine is declared either with `t.enum([...]).transitions(map)` (which means
`onInvalidTransition: 'reject'`) or with a collection-level `stateMachine` definition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from .errors import SchemaValidationError
from .fields import FieldDescriptor, normalize_transition_map
from .frozen import FrozenDict

if TYPE_CHECKING:
    from .schema import SchemaDefinition

OnInvalidTransition = Literal["reject", "last-valid-state"]
ON_INVALID_TRANSITION: Final = ("reject", "last-valid-state")


@dataclass(frozen=True, slots=True)
class StateMachineDefinition:
    """The validated `stateMachine` of a collection."""

    field: str
    transitions: FrozenDict[str, tuple[str, ...]]
    on_invalid_transition: OnInvalidTransition = "reject"

    def __getitem__(self, key: str) -> Any:
        # Readable with SPEC's camelCase keys as well as attributes.
        return getattr(self, _SM_KEYS.get(key, key))


_SM_KEYS: Final = {"onInvalidTransition": "on_invalid_transition"}


@dataclass(frozen=True, slots=True)
class StateMachineConstraint:
    """One enum field's transition rules (SPEC 2.10)."""

    field: str
    collection: str
    transitions: FrozenDict[str, tuple[str, ...]]
    on_invalid_transition: OnInvalidTransition = "reject"

    def allowed_targets(self, state: str) -> tuple[str, ...]:
        return self.transitions.get(state, ())


@dataclass(frozen=True, slots=True)
class TransitionValidationResult:
    valid: bool
    from_: str
    to: str
    field: str
    collection: str
    allowed_targets: list[str]


def _as_state(value: Any) -> str:
    # SPEC 3.1 rule 3 coerces both values to strings; None reads as JavaScript's String(null).
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def validate_transition(
    constraint: StateMachineConstraint | Mapping[str, Any], from_: Any, to: Any
) -> TransitionValidationResult:
    """Is moving ``constraint.field`` from ``from_`` to ``to`` allowed? (SPEC 3.1 rules 1, 3, 4).

    ``constraint`` may also be a plain dict with SPEC 2.10's keys (`field`, `collection`, `transitions`).
    """
    if isinstance(constraint, Mapping):
        field, collection = constraint.get("field"), constraint.get("collection")
        transitions: Mapping[str, Any] = constraint.get("transitions") or {}
    else:
        field, collection, transitions = constraint.field, constraint.collection, constraint.transitions
    source = _as_state(from_)
    target = _as_state(to)
    allowed = [_as_state(state) for state in transitions.get(source, ())]
    return TransitionValidationResult(
        valid=target in allowed,
        from_=source,
        to=target,
        field=str(field),
        collection=str(collection),
        allowed_targets=allowed,
    )


def validate_state_machine_definition(
    collection_name: str, sm: Any, fields: Mapping[str, FieldDescriptor]
) -> StateMachineDefinition:
    """Check a collection's `stateMachine` against its fields; raise SchemaValidationError when it is wrong.

    Returns the frozen definition (SPEC shows `void`; returning it lets `define_schema` reuse the work).
    """
    if isinstance(sm, StateMachineDefinition):
        sm = {
            "field": sm.field,
            "transitions": sm.transitions,
            "onInvalidTransition": sm.on_invalid_transition,
        }
    if not isinstance(sm, Mapping):
        raise SchemaValidationError(
            f"{collection_name}.stateMachine must be a mapping with field, transitions and onInvalidTransition",
            {"collection": collection_name},
        )
    field = sm.get("field")
    if not isinstance(field, str) or field not in fields:
        raise SchemaValidationError(
            f"state machine of {collection_name!r} names field {field!r}, which the collection does not have",
            {"collection": collection_name, "field": field},
        )
    descriptor = fields[field]
    if descriptor.type != "enum":
        raise SchemaValidationError(
            f"state machine field {collection_name}.{field} must be a t.enum(), not {descriptor.type}",
            {"collection": collection_name, "field": field, "type": descriptor.type},
        )
    if not descriptor.enum_values:
        raise SchemaValidationError(
            f"state machine field {collection_name}.{field} is an enum without values",
            {"collection": collection_name, "field": field},
        )
    on_invalid = sm.get("onInvalidTransition", sm.get("on_invalid_transition", "reject"))
    if on_invalid not in ON_INVALID_TRANSITION:
        raise SchemaValidationError(
            f"state machine of {collection_name!r}: onInvalidTransition must be 'reject' or "
            f"'last-valid-state', not {on_invalid!r}",
            {"collection": collection_name, "field": field, "onInvalidTransition": on_invalid},
        )
    transitions = sm.get("transitions")
    if not isinstance(transitions, Mapping):
        raise SchemaValidationError(
            f"state machine of {collection_name!r} needs a transitions mapping",
            {"collection": collection_name, "field": field},
        )
    try:
        frozen = normalize_transition_map(transitions, descriptor.enum_values)
    except SchemaValidationError as err:
        context = dict(err.context or {})
        context.update({"collection": collection_name, "field": field})
        raise SchemaValidationError(f"state machine of {collection_name!r}: {err.message}", context) from None
    return StateMachineDefinition(field=field, transitions=frozen, on_invalid_transition=on_invalid)


def build_state_machine_constraints(schema: SchemaDefinition) -> list[StateMachineConstraint]:
    """One constraint per enum field with transitions, in collection and field order (SPEC 4.4)."""
    out: list[StateMachineConstraint] = []
    for name, collection in schema.collections.items():
        sm = collection.state_machine
        for field_name, descriptor in collection.fields.items():
            if sm is not None and sm.field == field_name:
                out.append(StateMachineConstraint(field_name, name, sm.transitions, sm.on_invalid_transition))
            elif descriptor.type == "enum" and descriptor.transition_map is not None:
                out.append(StateMachineConstraint(field_name, name, descriptor.transition_map, "reject"))
    return out


def state_machine_constraint(
    schema: SchemaDefinition, collection: str, field: str
) -> StateMachineConstraint | None:
    """The constraint on one field, or None."""
    for constraint in build_state_machine_constraints(schema):
        if constraint.collection == collection and constraint.field == field:
            return constraint
    return None


def get_transition_map(schema: SchemaDefinition, collection: str, field: str) -> dict[str, list[str]] | None:
    """The field's TransitionMap as a plain copy, or None (SPEC 4.4 lists when)."""
    coll = schema.collections.get(collection)
    if coll is None:
        return None
    descriptor = coll.fields.get(field)
    if descriptor is None or descriptor.type != "enum":
        return None
    constraint = state_machine_constraint(schema, collection, field)
    if constraint is None:
        return None
    return {state: list(targets) for state, targets in constraint.transitions.items()}
