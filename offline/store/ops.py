"""Atomic field operations (`op`, SPEC 4.5).

Each helper is resolved against the field's current value on this replica before the operation is
created, so the stored operation carries a plain value and its previous value and merges like any write
(a counter field then adds both replicas' deltas). They promise no distributed atomicity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from offline.core.errors import INVALID_OPERATION, OfflineError
from offline.core.fields import FieldDescriptor, type_name
from offline.merge.values import element_key, norm_number


@dataclass(frozen=True, slots=True)
class AtomicOp:
    kind: str  # increment | max | min | append | remove
    value: Any

    def resolve(self, collection: str, field: str, descriptor: FieldDescriptor, current: Any) -> Any:
        numeric = self.kind in ("increment", "max", "min")
        expected = "number" if numeric else "array"
        if descriptor.type != expected:
            raise OfflineError(
                f"op.{self.kind}() works on {expected} fields; {collection}.{field} is {descriptor.type}",
                INVALID_OPERATION,
                {"collection": collection, "field": field, "expected": expected, "received": descriptor.type},
            )
        if numeric and (isinstance(self.value, bool) or not isinstance(self.value, (int, float))):
            raise OfflineError(
                f"op.{self.kind}() needs a number, got {self.value!r}",
                INVALID_OPERATION,
                {
                    "collection": collection,
                    "field": field,
                    "expected": "number",
                    "received": type_name(self.value),
                },
            )
        if self.kind == "increment":
            return norm_number((current or 0) + self.value)
        if self.kind == "max":
            return self.value if current is None or self.value > current else current
        if self.kind == "min":
            return self.value if current is None or self.value < current else current
        items = list(current or [])
        if self.kind == "append":
            return [*items, self.value]
        target = element_key(self.value)
        return [item for item in items if element_key(item) != target]


class _Ops:
    """The `op` namespace."""

    @staticmethod
    def increment(amount: int | float = 1) -> AtomicOp:
        return AtomicOp("increment", amount)

    @staticmethod
    def decrement(amount: int | float = 1) -> AtomicOp:
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            return AtomicOp("increment", amount)  # resolve() reports the wrong type
        return AtomicOp("increment", -amount)

    @staticmethod
    def max(value: int | float) -> AtomicOp:
        return AtomicOp("max", value)

    @staticmethod
    def min(value: int | float) -> AtomicOp:
        return AtomicOp("min", value)

    @staticmethod
    def append(item: Any) -> AtomicOp:
        return AtomicOp("append", item)

    @staticmethod
    def remove(item: Any) -> AtomicOp:
        return AtomicOp("remove", item)


op = _Ops()
