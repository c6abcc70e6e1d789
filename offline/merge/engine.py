"""The merge engine: folds a record's operations into its state, in any order, with the same result.

DESIGN.md section 3's rule is the whole design: *a record's state is a deterministic function of the set of
operations held*. Every register below is a commutative, idempotent fold over writes:

- lww / state machines: the write with the highest (HLC, id) key wins.
- server-authoritative: the highest write from a server node wins, else lww.
- counter: the latest insert's value plus the exact (Fraction) sum of every update's delta, so float
  rounding cannot depend on arrival order.
- max / min: the extreme of all written values.
- append-only: every element ever added; union: an add-wins observed-remove set, where a removal only
  removes the additions in its causal past (the record's causal graph comes from `causal_deps`).
- richtext: a pycrdt (Yjs) document with every update applied.
- Tier 3 resolvers: writes folded in HLC order; a write that had not seen the current value is combined
  with it by `resolve(a, b, base)`.

The state of one record is a JSON-serialisable `RecordState`; the local store and the server keep it next
to the materialised row, so applying an operation costs one record, not the history.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import chain, repeat
from typing import Any

from offline.core.fields import MAX_SAFE_INTEGER, FieldDescriptor
from offline.core.frozen import FrozenDict, thaw
from offline.core.operations import Operation
from offline.core.schema import CollectionDefinition, SchemaDefinition
from offline.core.state_machine import (
    StateMachineConstraint,
    build_state_machine_constraints,
    validate_transition,
)

from . import richtext
from .values import OpKey, compact_json, element_key, fits, fraction_to_number, normalize, op_key

log = logging.getLogger("offline.merge")

# Names SPEC 2.12 uses for MergeTrace.strategy.
_TRACE_STRATEGY = {"union": "add-wins-set", "richtext": "crdt-text"}

# Exact value types that op_fields keeps as they are, by field type: for these, thaw() and normalize() are
# the identity and fits() holds (ints only within the safe range), so the generic checks can be skipped.
_IDENTITY_TYPES: dict[str, frozenset[type]] = {
    "string": frozenset({str}),
    "boolean": frozenset({bool}),
    "number": frozenset({int}),
    "timestamp": frozenset({int}),
    "richtext": frozenset({str, bytes}),
}


@dataclass(slots=True)
class Conflict:
    """Two concurrent writes to one field, and what the merge made of them (becomes a MergeTrace)."""

    field: str
    strategy: str
    tier: int
    earlier_op: str
    later_op: str
    input_a: Any
    input_b: Any
    base: Any
    output: Any = None


@dataclass(slots=True)
class RecordState:
    """Everything needed to fold further operations into one record."""

    graph: dict[str, list[str]] = field(default_factory=dict)  # op id -> causal deps (this record's ops)
    exist: list[Any] | None = None  # [OpKey, op type] of the latest insert/update/delete that counted
    has_insert: bool = False
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        """Compact JSON text of the state; `from_json` reads it (and the plain form, see `_encode_state`)."""
        return _encode_state(self.graph, self.exist, self.has_insert, self.fields)

    @classmethod
    def from_json(cls, text: str | bytes) -> RecordState:
        raw = json.loads(text)
        graph = raw["g"]
        if type(graph) is dict:  # the plain form
            return cls(graph=graph, exist=raw["e"], has_insert=raw["i"], fields=raw["f"])
        return _decode_state(cls, raw)

    @property
    def alive(self) -> bool:
        return self.has_insert and self.exist is not None and self.exist[1] != "delete"

    def heads(self) -> list[str]:
        """Ops of this record that no other held op depends on: the causal deps of the next local write."""
        referenced = {dep for deps in self.graph.values() for dep in deps}
        return sorted(op_id for op_id in self.graph if op_id not in referenced)

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        """Is ``ancestor`` in the causal past of ``descendant``?"""
        if ancestor == descendant:
            return False
        stack = list(self.graph.get(descendant, ()))
        seen: set[str] = set()
        while stack:
            current = stack.pop()
            if current == ancestor:
                return True
            if current in seen:
                continue
            seen.add(current)
            stack.extend(self.graph.get(current, ()))
        return False

    def ancestors(self, op_id: str) -> set[str]:
        out: set[str] = set()
        stack = list(self.graph.get(op_id, ()))
        while stack:
            current = stack.pop()
            if current in out:
                continue
            out.add(current)
            stack.extend(self.graph.get(current, ()))
        return out


# -- state text ------------------------------------------------------------------------------------------
#
# The plain form is the state as it is: {"g": {op id: [dep ids]}, "e": [OpKey, type] | null, "i": bool,
# "f": {field: register}}. Op keys ([wall, logical, node, op id]) and op ids repeat in it many times (each
# register holds its "k" and "lk" keys), which makes a record's state several times larger than the record
# and too large for SQLite to keep inside its b-tree page. The compact form names each op once:
#
#   "g": [[op id, [dep, ...]] or [op id, [dep, ...], wall, logical, node], ...]  (in the graph's order)
#
# a dep is the index of its entry in "g" (or its id when the graph does not hold it), and an op key whose op
# is in "g" is written as that index (its entry then carries the key's wall, logical and node) in "e"[0] and
# in every register's "k" and "lk". An add-wins set register ("a": {element: {op id: [*OpKey, index]}},
# "r": {element: [op id, ...]}) lists each element's additions as [[entry index, index], ...] and its
# removals as entry indices. Other keys and ids stay inline. "g" being a list tells the forms apart; a
# state with anything unexpected where a key belongs is written in the plain form.


_ABSENT: Any = object()


class _Irregular(Exception):
    """A state the compact form does not describe (it is then written in the plain form)."""


def _encode_state(
    graph: dict[str, list[str]], exist: list[Any] | None, has_insert: bool, fields: dict[str, dict[str, Any]]
) -> str:
    plain = {"g": graph, "e": exist, "i": has_insert, "f": fields}
    # Op ids and deps are strings (an int would read as an index).
    if not all(map(isinstance, graph, repeat(str))) or not all(
        map(isinstance, chain.from_iterable(graph.values()), repeat(str))
    ):
        return compact_json(plain)
    if len(graph) == 1:
        single = _encode_single(graph, exist, has_insert, fields)
        if single is not None:
            return single
    index = {op_id: i for i, op_id in enumerate(graph)}
    get = index.get
    entries: list[list[Any]] = [[op_id, list(map(get, deps, deps))] for op_id, deps in graph.items()]
    refs: dict[int, Any] = {}  # id(key) -> what stands for it; registers share key lists

    def ref(key: Any) -> Any:
        # Only for keys the state holds (alive while this runs, so their ids are not reused).
        known = refs.get(id(key))
        if known is None:
            known = refs[id(key)] = locate(key)
        return known

    def locate(key: Any) -> Any:
        if type(key) is not list or len(key) != 4:
            raise _Irregular
        wall, logical, node, op_id = key
        i = get(op_id) if type(op_id) is str else None
        out: Any = key
        if i is not None and type(wall) is int and type(logical) is int and type(node) is str:
            entry = entries[i]
            if len(entry) == 2:
                entry += (wall, logical, node)
                out = i
            elif entry[2] == wall and entry[3] == logical and entry[4] == node:
                out = i
        return out

    try:
        compact_exist = exist
        if exist is not None:
            if type(exist) is not list or not exist:
                raise _Irregular
            compact_exist = [ref(exist[0]), *exist[1:]]
        registers: dict[str, Any] = {}
        known = refs.get
        for name, reg in fields.items():
            # The same key list usually stands in "k", "lk" and "e" alike: look it up by identity first.
            key = reg.get("k", _ABSENT)
            last = reg.get("lk", _ABSENT)
            if key is not _ABSENT or last is not _ABSENT:
                reg = reg.copy()
                if key is not _ABSENT:
                    found = known(id(key))
                    reg["k"] = found if found is not None else ref(key)
                if last is not _ABSENT:
                    found = known(id(last))
                    reg["lk"] = found if found is not None else ref(last)
            added = reg.get("a")
            if type(added) is dict and (added or reg.get("r")):  # an add-wins set that holds something
                reg = dict(reg)
                reg["a"] = {
                    element: _compact_additions(additions, locate) for element, additions in added.items()
                }
                removed = reg.get("r")
                if type(removed) is not dict:
                    raise _Irregular
                reg["r"] = {element: _compact_removals(ids, get) for element, ids in removed.items()}
            registers[name] = reg
    except (_Irregular, TypeError):
        return compact_json(plain)
    return compact_json({"g": entries, "e": compact_exist, "i": has_insert, "f": registers})


def _encode_single(
    graph: dict[str, list[str]], exist: list[Any] | None, has_insert: bool, fields: dict[str, dict[str, Any]]
) -> str | None:
    """The compact text of a state made by one operation (a record just inserted), as `_encode_state`
    writes it, without its general machinery; None when the state is not of that plain shape."""
    ((op_id, deps),) = graph.items()
    if op_id in deps or type(exist) is not list or not exist:
        return None
    key = exist[0]
    if type(key) is not list or len(key) != 4 or key[3] != op_id:
        return None
    wall, logical, node, _ = key
    if type(wall) is not int or type(logical) is not int or type(node) is not str:
        return None
    registers: dict[str, Any] = {}
    for name, reg in fields.items():
        if "a" in reg:
            added = reg["a"]
            if type(added) is not dict or added or reg.get("r"):
                return None
        k = reg.get("k", _ABSENT)
        last = reg.get("lk", _ABSENT)
        if k is not _ABSENT or last is not _ABSENT:
            reg = reg.copy()
            if k is not _ABSENT:
                if k is not key and k != key:
                    return None
                reg["k"] = 0
            if last is not _ABSENT:
                if last is not key and last != key:
                    return None
                reg["lk"] = 0
        registers[name] = reg
    return compact_json(
        {
            "g": [[op_id, list(deps), wall, logical, node]],
            "e": [0, *exist[1:]],
            "i": has_insert,
            "f": registers,
        }
    )


def _compact_additions(additions: Any, locate: Callable[[Any], Any]) -> list[Any]:
    if type(additions) is not dict:
        raise _Irregular
    out: list[Any] = []
    for op_id, order in additions.items():
        if type(order) is not list or len(order) != 5 or order[3] != op_id or type(order[4]) is not int:
            raise _Irregular
        i = locate(order[:4])
        out.append([i, order[4]] if type(i) is int else [op_id, order])
    return out


def _compact_removals(ids: Any, get: Callable[..., Any]) -> list[Any]:
    if type(ids) is not list or not all(map(isinstance, ids, repeat(str))):
        raise _Irregular
    return list(map(get, ids, ids))


def _decode_state(cls: type[RecordState], raw: dict[str, Any]) -> RecordState:
    entries = raw["g"]
    ids = [entry[0] for entry in entries]
    at = ids.__getitem__
    graph: dict[str, list[str]] = {}
    keys: list[Any] = []
    for entry in entries:
        op_id = entry[0]
        deps = entry[1]
        try:
            graph[op_id] = list(map(at, deps))  # deps held in the graph: all indices
        except TypeError:  # some dep is an id the graph does not hold
            graph[op_id] = [dep if type(dep) is str else ids[dep] for dep in deps]
        keys.append([entry[2], entry[3], entry[4], op_id] if len(entry) > 2 else None)
    exist = raw["e"]
    if exist is not None and type(exist[0]) is int:
        exist[0] = keys[exist[0]]
    fields = raw["f"]
    for reg in fields.values():
        key = reg.get("k")
        if type(key) is int:
            reg["k"] = keys[key]
        key = reg.get("lk")
        if type(key) is int:
            reg["lk"] = keys[key]
        added = reg.get("a")
        if type(added) is dict:
            for element, additions in added.items():
                if type(additions) is list:  # compact: [[entry index, index] or [op id, order], ...]
                    added[element] = {
                        (ids[a] if type(a) is int else a): ([*keys[a], b] if type(a) is int else b)
                        for a, b in additions
                    }
            removed = reg.get("r")
            if type(removed) is dict:
                for element, ops in removed.items():
                    removed[element] = [ids[i] if type(i) is int else i for i in ops]
    return cls(graph=graph, exist=exist, has_insert=raw["i"], fields=fields)


class _Plan:
    """Per-collection facts the fold needs, computed once per schema."""

    def __init__(self, schema: SchemaDefinition, collection: CollectionDefinition) -> None:
        self.collection = collection
        self.fields = collection.fields
        self.state_machines: dict[str, StateMachineConstraint] = {
            c.field: c for c in build_state_machine_constraints(schema) if c.collection == collection.name
        }
        self.resolvers = dict(collection.resolve)
        self.kinds: dict[str, str] = {}
        for name, descriptor in collection.fields.items():
            if name in self.resolvers:
                self.kinds[name] = "resolve"
            elif descriptor.type == "richtext":
                self.kinds[name] = "richtext"
            else:
                self.kinds[name] = descriptor.effective_merge_strategy
        # Field -> exact value types op_fields passes through unchanged (see _IDENTITY_TYPES).
        self.identity_types: dict[str, frozenset[type]] = {
            name: _IDENTITY_TYPES[descriptor.type]
            for name, descriptor in collection.fields.items()
            if descriptor.type in _IDENTITY_TYPES
        }
        # Renames and removals between schema versions, so an operation written under an older schema is
        # read with today's field names (operations are immutable; their meaning is upgraded on read).
        self.upgrades: dict[int, list[tuple[str, str, str | None]]] = {}
        for version, migration in schema.migrations.items():
            steps: list[tuple[str, str, str | None]] = []
            for step in getattr(migration, "steps", ()):
                if step.collection != collection.name:
                    continue
                if step.type == "renameField":
                    steps.append(("rename", step.from_, step.to))
                elif step.type == "removeField":
                    steps.append(("remove", step.field, None))
            self.upgrades[version] = steps
        self.schema_version = schema.version

    def upgrade(self, data: Mapping[str, Any], schema_version: int) -> dict[str, Any]:
        out = dict(data)
        for version in range(schema_version + 1, self.schema_version + 1):
            for kind, name, target in self.upgrades.get(version, ()):
                if name not in out:
                    continue
                value = out.pop(name)
                if kind == "rename" and target is not None:
                    out[target] = value
        return out


class MergeEngine:
    """Folds operations into `RecordState`s and materialises records for one schema."""

    def __init__(
        self,
        schema: SchemaDefinition,
        *,
        authoritative_nodes: Callable[[], Iterable[str]] | Iterable[str] = (),
    ) -> None:
        self.schema = schema
        self._plans = {name: _Plan(schema, coll) for name, coll in schema.collections.items()}
        self._authoritative = authoritative_nodes

    def authoritative_nodes(self) -> frozenset[str]:
        source = self._authoritative
        return frozenset(source() if callable(source) else source)

    def plan(self, collection: str) -> _Plan:
        return self._plans[collection]

    # -- reading operations ----------------------------------------------------------------------------

    def op_fields(self, op: Operation, which: str = "data") -> dict[str, Any]:
        """An operation's data (or previous data) as today's schema reads it: known fields, normalised."""
        plan = self._plans[op.collection]
        raw = op.data if which == "data" else op.previous_data
        if not raw:
            return {}
        if op.schema_version < plan.schema_version:
            items = plan.upgrade(raw, op.schema_version).items()
        else:
            items = raw._data.items() if type(raw) is FrozenDict else dict(raw).items()
        identity = plan.identity_types
        out: dict[str, Any] = {}
        for name, value in items:
            kinds = identity.get(name)
            if kinds is not None:
                kind = type(value)
                if kind in kinds and (kind is not int or -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER):
                    out[name] = value
                    continue
            descriptor = plan.fields.get(name)
            if descriptor is None:
                continue
            value = thaw(value)
            if value is None:
                if which == "data" and descriptor.required and descriptor.type != "richtext":
                    continue  # a required field cannot be cleared (the local store refuses it too)
                out[name] = None
            elif not fits(descriptor, value):
                # A value of the wrong type (a buggy or hostile peer) is ignored, the same way on every
                # replica, instead of corrupting the record or making the fold raise.
                continue
            elif descriptor.type == "richtext":
                out[name] = value
            else:
                out[name] = normalize(descriptor, value)
        return out

    def transition_problem(self, op: Operation) -> tuple[str, str, list[str], str] | None:
        """(field, from, allowed, policy) when ``op`` moves a state machine along a forbidden edge.

        When several machines object, a 'reject' one is reported first: it decides the fate of the write.
        """
        problems = self.transition_problems(op)
        return problems[0] if problems else None

    def transition_problems(self, op: Operation) -> list[tuple[str, str, list[str], str]]:
        """Every forbidden edge ``op`` takes, 'reject' machines first (see `transition_problem`)."""
        if op.type != "update" or not op.data:
            return []
        plan = self._plans[op.collection]
        if not plan.state_machines:
            return []
        data = self.op_fields(op)
        previous = self.op_fields(op, "previous")
        problems: list[tuple[str, str, list[str], str]] = []
        for name, constraint in plan.state_machines.items():
            if name not in data:
                continue
            before = previous.get(name)
            after = data[name]
            if before is None or before == after:
                continue
            result = validate_transition(constraint, before, after)
            if not result.valid:
                problems.append((name, str(before), result.allowed_targets, constraint.on_invalid_transition))
        problems.sort(key=lambda problem: problem[3] != "reject")  # stable: schema order within a policy
        return problems

    # -- folding ----------------------------------------------------------------------------------------

    def apply(self, state: RecordState, op: Operation, *, want_conflicts: bool = True) -> list[Conflict]:
        """Fold ``op`` into ``state`` (in place). Idempotent; returns the conflicts it resolved."""
        if op.id in state.graph:
            return []
        state.graph[op.id] = list(op.causal_deps)
        plan = self._plans.get(op.collection)
        if plan is None:
            return []
        data = self.op_fields(op) if op.type != "delete" else {}
        for name, _, _, policy in self.transition_problems(op):
            if policy == "reject":
                # A write its author could not legally make contributes nothing, on every replica alike
                # (the local store refuses the whole write when any 'reject' machine objects).
                return []
            data.pop(name, None)  # 'last-valid-state': the field keeps its value, the rest applies

        key = op_key(op)
        if state.exist is None or key > state.exist[0]:
            state.exist = [key, op.type]
        if op.type == "insert":
            state.has_insert = True
        if op.type == "delete":
            return []

        previous = self.op_fields(op, "previous") if op.type == "update" else {}
        conflicts: list[Conflict] = []
        for name, value in data.items():
            kind = plan.kinds[name]
            register = state.fields.get(name)
            conflict = self._apply_field(
                plan, state, name, kind, register, op, key, value, previous, want_conflicts
            )
            if conflict is not None:
                conflicts.append(conflict)
        return conflicts

    def _concurrent(self, state: RecordState, other_key: OpKey, key: OpKey) -> bool:
        """Were the writes with these keys concurrent (neither in the other's causal past)?"""
        earlier, later = (other_key, key) if other_key < key else (key, other_key)
        # HLC respects causality, so only the earlier one can be an ancestor of the later one.
        return not state.is_ancestor(earlier[3], later[3])

    def _apply_field(
        self,
        plan: _Plan,
        state: RecordState,
        name: str,
        kind: str,
        register: dict[str, Any] | None,
        op: Operation,
        key: OpKey,
        value: Any,
        previous: dict[str, Any],
        want_conflict: bool = True,
    ) -> Conflict | None:
        fields = state.fields
        last_key: OpKey | None = register.get("lk") if register else None
        base = previous.get(name)
        # Concurrency only decides whether a conflict is reported, never the value: a caller that does not
        # want the conflicts skips the walk of the causal graph.
        concurrent = want_conflict and last_key is not None and self._concurrent(state, last_key, key)
        # The losing side's value is only needed for a trace; read it before the register changes.
        last_value = self.value_of(plan, name, register, state) if concurrent else None

        if kind in ("lww", "server-authoritative"):
            reg = register or {}
            if kind == "lww":
                if "k" not in reg or key > reg["k"]:
                    reg.update(k=key, v=value)
            else:
                is_server = op.node_id in self.authoritative_nodes()
                slot = "a" if is_server else "c"
                current = reg.get(slot)
                if current is None or key > current[0]:
                    reg[slot] = [key, value]
        elif kind == "counter":
            reg = register or {"n": 0, "d": 1}
            if op.type == "insert":
                if "k" not in reg or key > reg["k"]:
                    reg.update(k=key, v=value)
            else:
                after, before, n, d = value or 0, previous.get(name) or 0, reg["n"], reg["d"]
                if (
                    type(after) is int
                    and type(before) is int
                    and type(n) is int
                    and type(d) is int
                    and d == 1
                ):
                    reg["n"] = n + after - before  # whole numbers: the exact sum without Fractions
                else:
                    total = Fraction(n, d) + (Fraction(after) - Fraction(before))
                    reg["n"], reg["d"] = total.numerator, total.denominator
        elif kind in ("max", "min"):
            reg = register or {}
            if value is None:
                pass  # clearing cannot lower a maximum (or raise a minimum) that others wrote
            elif reg.get("v") is None or ((value > reg["v"]) if kind == "max" else (value < reg["v"])):
                reg["v"] = value
        elif kind == "append-only":
            reg = register or {"e": {}}
            elements = reg["e"]
            before_keys = {element_key(v) for v in (previous.get(name) or ())}
            for index, item in enumerate(value or ()):
                ek = element_key(item)
                if ek in before_keys:
                    continue
                order = [*key, index]
                if ek not in elements or order < elements[ek][0]:
                    elements[ek] = [order, item]
        elif kind == "union":
            reg = register or {"a": {}, "r": {}, "v": {}}
            before_items = previous.get(name) or []
            before_keys = {element_key(v) for v in before_items}
            after_keys = set()
            for index, item in enumerate(value or ()):
                ek = element_key(item)
                after_keys.add(ek)
                if ek in before_keys:
                    continue
                reg["a"].setdefault(ek, {})[op.id] = [*key, index]
                reg["v"][ek] = item
            for ek in before_keys - after_keys:
                reg["r"].setdefault(ek, []).append(op.id)
        elif kind == "richtext":
            reg = register or {}
            reg["s"] = richtext.merge_update(reg.get("s"), value)
        elif kind == "resolve":
            reg = register or {"w": []}
            reg["w"].append([key, value, base])
            reg["w"].sort(key=lambda w: w[0])
        else:  # pragma: no cover - kinds come from the schema
            raise AssertionError(kind)

        conflict = None
        if concurrent and last_key is not None:
            earlier_first = last_key < key
            a, b = (last_value, value) if earlier_first else (value, last_value)
            conflict = Conflict(
                field=name,
                strategy=_TRACE_STRATEGY.get(kind, "custom" if kind == "resolve" else kind),
                tier=3 if kind == "resolve" else 1,
                earlier_op=(last_key if earlier_first else key)[3],
                later_op=(key if earlier_first else last_key)[3],
                input_a=a,
                input_b=b,
                base=base,
            )
        if last_key is None or key > last_key:
            reg["lk"] = key
        fields[name] = reg
        if conflict is not None:
            conflict.output = self.value_of(plan, name, reg, state)
        return conflict

    # -- materialising ----------------------------------------------------------------------------------

    def value_of(
        self, plan: _Plan, name: str, reg: dict[str, Any] | None, state: RecordState | None = None
    ) -> Any:
        """The current value of one field's register."""
        descriptor = plan.fields[name]
        if reg is None:
            return _initial(descriptor)
        kind = plan.kinds[name]
        if kind == "lww":
            return reg.get("v")
        if kind == "server-authoritative":
            chosen = reg.get("a") or reg.get("c")
            return chosen[1] if chosen else None
        if kind == "counter":
            base, n, d = reg.get("v") or 0, reg["n"], reg["d"]
            if type(base) is int and type(n) is int and type(d) is int and d == 1:
                return base + n
            total = Fraction(base) + Fraction(n, d)
            return fraction_to_number(total.numerator, total.denominator)
        if kind in ("max", "min"):
            return reg.get("v")
        if kind == "append-only":
            return [item for _, item in sorted(reg["e"].values(), key=lambda pair: pair[0])]
        if kind == "union":
            return _or_set_value(reg, state)
        if kind == "richtext":
            return richtext.text_of(reg.get("s"))
        if kind == "resolve":
            return self._resolved_value(plan, name, reg, state)
        raise AssertionError(kind)  # pragma: no cover

    def _resolved_value(self, plan: _Plan, name: str, reg: dict[str, Any], state: RecordState | None) -> Any:
        writes = reg["w"]
        if not writes:
            return _initial(plan.fields[name])
        resolver = plan.resolvers[name]
        current = writes[0][1]
        contributors = [writes[0][0][3]]
        for key, value, base in writes[1:]:
            op_id = key[3]
            seen_all = state is not None and all(state.is_ancestor(c, op_id) for c in contributors)
            if seen_all:
                current, contributors = value, [op_id]
                continue
            try:
                current = resolver(current, value, base)
            except Exception:
                # A resolver that raises must not wedge the record: fall back to last-writer-wins.
                log.exception("resolver for %s.%s raised; using the later value", plan.collection.name, name)
                current = value
            contributors.append(op_id)
        return current

    def materialize(self, collection: str, record_id: str, state: RecordState) -> dict[str, Any] | None:
        """The record as applications see it (`id` plus every field), or None when it does not exist."""
        if not state.alive:
            return None
        plan = self._plans[collection]
        kinds = plan.kinds
        registers = state.fields
        record: dict[str, Any] = {"id": record_id}
        for name in plan.fields:
            reg = registers.get(name)
            if reg is not None and kinds[name] == "lww":
                record[name] = reg.get("v")  # the common case of value_of, inlined
            else:
                record[name] = self.value_of(plan, name, reg, state)
        return record

    def fold(self, collection: str, record_id: str, ops: Iterable[Operation]) -> tuple[RecordState, Any]:
        """Build a record's state from scratch (any order of ``ops`` gives the same result)."""
        state = RecordState()
        for op in ops:
            self.apply(state, op, want_conflicts=False)
        return state, self.materialize(collection, record_id, state)


def _initial(descriptor: FieldDescriptor) -> Any:
    if descriptor.type == "richtext":
        return ""
    if descriptor.has_default:
        return thaw(descriptor.default_value)
    return None


def _or_set_value(reg: dict[str, Any], state: RecordState | None) -> list[Any]:
    survivors: list[tuple[list[Any], Any]] = []
    closures: dict[str, set[str]] = {}
    for ek, additions in reg["a"].items():
        removals = reg["r"].get(ek, ())
        best: list[Any] | None = None
        for add_id, order in additions.items():
            removed = False
            for rem_id in removals:
                if state is None:
                    removed = True
                    break
                if rem_id not in closures:
                    closures[rem_id] = state.ancestors(rem_id)
                if add_id in closures[rem_id]:
                    removed = True
                    break
            if not removed and (best is None or order < best):
                best = order
        if best is not None:
            survivors.append((best, reg["v"][ek]))
    survivors.sort(key=lambda pair: pair[0])
    return [item for _, item in survivors]


__all__ = ["Conflict", "MergeEngine", "RecordState"]
