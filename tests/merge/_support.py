"""Shared schema and helpers for the merge tests: one field per merge strategy."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from offline import create_app, create_operation, define_schema, t
from offline.core.hlc import HLCTimestamp
from offline.core.operations import Operation
from offline.core.schema import SchemaDefinition
from offline.store.app import App

STATUS_TRANSITIONS = {"todo": ["doing"], "doing": ["done", "todo"], "done": []}
PHASE_TRANSITIONS = {"a": ["b"], "b": ["c", "a"], "c": []}


def sorted_concat(a: Any, b: Any, base: Any) -> str:
    """A deterministic Tier 3 resolver: the sorted union of '|'-separated words of both sides."""
    words = {w for side in (a, b) for w in (side or "").split("|") if w}
    return "|".join(sorted(words))


def make_schema(*, resolver: Any = sorted_concat, causal: bool = True) -> SchemaDefinition:
    """One field per strategy; ``causal=False`` leaves out the add-wins set and the resolver (the fields
    whose value depends on causal order), so the engine keeps only a window of each record's history."""
    if not causal:
        full = make_schema(resolver=resolver).collections["items"]
        fields = {name: d for name, d in full.fields.items() if name not in ("tags", "notes")}
        machine = full.state_machine
        items: dict[str, Any] = {"fields": fields}
        if machine is not None:
            items["stateMachine"] = {
                "field": machine.field,
                "transitions": {k: list(v) for k, v in machine.transitions.items()},
                "onInvalidTransition": machine.on_invalid_transition,
            }
        return define_schema({"version": 1, "collections": {"items": items}})
    return define_schema(
        {
            "version": 1,
            "collections": {
                "items": {
                    "fields": {
                        "title": t.string().optional(),
                        "count": t.number().merge("counter").default(0),
                        "hi": t.number().merge("max").optional(),
                        "lo": t.number().merge("min").optional(),
                        "tags": t.array(t.string()).default([]),
                        "log": t.array(t.string()).merge("append-only").default([]),
                        "owner": t.string().merge("server-authoritative").optional(),
                        "status": t.enum(["todo", "doing", "done"])
                        .transitions(STATUS_TRANSITIONS)
                        .default("todo"),
                        "phase": t.enum(["a", "b", "c"]).default("a"),
                        "notes": t.string().optional(),
                        "body": t.richtext(),
                    },
                    "stateMachine": {
                        "field": "phase",
                        "transitions": PHASE_TRANSITIONS,
                        "onInvalidTransition": "last-valid-state",
                    },
                    "resolve": {"notes": resolver},
                }
            },
        }
    )


SCHEMA = make_schema()
WINDOWED_SCHEMA = make_schema(causal=False)

#: field -> the strategy it exercises (the name a test reports).
STRATEGY_FIELDS = {
    "lww": "title",
    "counter": "count",
    "max": "hi",
    "min": "lo",
    "union": "tags",
    "append-only": "log",
    "server-authoritative": "owner",
    "enum-transitions": "status",
    "state-machine-last-valid": "phase",
    "custom-resolve": "notes",
    "richtext": "body",
}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class FakeClock:
    """A physical clock shared by test replicas: it only moves when a test says so (many HLC ties)."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.ms = start

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int = 1) -> None:
        self.ms += ms


def new_apps(count: int, schema: SchemaDefinition = SCHEMA, *, clock: FakeClock | None = None) -> list[App]:
    return [create_app(schema, path=":memory:", now=clock) for _ in range(count)]


def exchange_all(apps: Iterable[App]) -> None:
    """Deliver every operation to every replica."""
    apps = list(apps)
    everything = [op for app in apps for op in app.operations()]
    for app in apps:
        app.apply(everything)


def make_op(
    *,
    node: str,
    seq: int,
    type: str,
    data: Mapping[str, Any] | None = None,
    previous: Mapping[str, Any] | None = None,
    wall: int = 1_700_000_000_000,
    logical: int = 0,
    deps: Iterable[str] = (),
    record_id: str = "r1",
    collection: str = "items",
    schema_version: int = 1,
) -> Operation:
    return create_operation(
        {
            "node_id": node,
            "type": type,
            "collection": collection,
            "record_id": record_id,
            "data": None if type == "delete" else dict(data or {}),
            "previous_data": dict(previous or {}) if type == "update" else None,
            "timestamp": HLCTimestamp(wall, logical, node),
            "sequence_number": seq,
            "causal_deps": list(deps),
            "schema_version": schema_version,
        }
    )
