"""`MergeTrace`: the record of one resolved conflict (SPEC 2.12)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Literal

from offline.core.operations import BYTES_MARKER, Operation

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
    #: Set when a Tier 3 resolver raised or returned a value the field cannot hold: why, and that the later
    #: write's value was kept instead (``output``), the same on every replica.
    fallback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """SPEC's camelCase shape (plus ``fallback`` when set), with operations in wire form (for events and the dashboard); JSON-ready:
        bytes (a rich text field's Yjs updates) take their wire form ``{"__offline_bytes__": base64}``."""
        out = {
            "operationA": self.operation_a.to_wire(),
            "operationB": self.operation_b.to_wire(),
            "field": self.field,
            "strategy": self.strategy,
            "inputA": _json_ready(self.input_a),
            "inputB": _json_ready(self.input_b),
            "base": _json_ready(self.base),
            "output": _json_ready(self.output),
            "tier": self.tier,
            "constraintViolated": self.constraint_violated,
            "duration": self.duration,
        }
        if self.fallback is not None:
            out["fallback"] = self.fallback  # only on a resolver's fallback: SPEC's shape otherwise
        return out


def _json_ready(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {BYTES_MARKER: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(item) for item in value]
    return value
