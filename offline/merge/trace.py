"""`MergeTrace`: the record of one resolved conflict (SPEC 2.12)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from offline.core.operations import Operation

Tier = Literal[1, 2, 3]


@dataclass(frozen=True, slots=True)
class MergeTrace:
    operation_a: Operation
    operation_b: Operation
    field: str
    #: 'lww' / 'crdt-text' / 'add-wins-set' / 'unique-constraint' / 'custom', or the field's strategy name.
    strategy: str
    input_a: Any
    input_b: Any
    base: Any
    output: Any
    tier: Tier
    constraint_violated: str | None = None
    duration: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """SPEC's camelCase shape, with operations in wire form (for events and the dashboard)."""
        return {
            "operationA": self.operation_a.to_wire(),
            "operationB": self.operation_b.to_wire(),
            "field": self.field,
            "strategy": self.strategy,
            "inputA": self.input_a,
            "inputB": self.input_b,
            "base": self.base,
            "output": self.output,
            "tier": self.tier,
            "constraintViolated": self.constraint_violated,
            "duration": self.duration,
        }
