"""The merge engine: folds a record's operations into its state, in any order, with the same result.

DESIGN.md section 3's rule is the whole design: *a record's state is a deterministic function of the set of
operations held*. Every register below is a commutative, idempotent fold over writes:

- lww / state machines: the write with the highest (HLC, id) key wins.
- server-authoritative: the highest write from a server node (a marked node id, or a declared one) wins,
  else lww.
- counter: the latest insert's value plus the exact (Fraction) sum of every update's delta, so float
  rounding cannot depend on arrival order.
- max / min: the extreme of all written values.
- append-only: every element ever added; union: an add-wins observed-remove set, where a removal only
  removes the additions in its causal past (read from the operations' causal contexts; see below).
- richtext: a pycrdt (Yjs) document with every update applied.
- Tier 3 resolvers: the writes no other write had seen (the heads), combined in HLC order by
  `resolve(a, b, base)`; a write that had seen the current value replaces it.

The state of one record is a JSON-serialisable `RecordState`; the local store and the server keep it next
to the materialised row, so applying an operation costs one record, not the history.

Bounded state
-------------
A record's state is read and written whole on every write, so its size is the cost of a write. What each
register keeps is bounded by the record's content and its writers, not by its history: lww, max / min,
state machines and server-authoritative fields keep the winning write's key and value; a counter the
latest insert's value and the exact sum of the deltas; append-only sets their elements; rich text the
canonical encoding of its document (one struct per run of one client's typing; see `richtext`); an
add-wins set its live elements' additions and, per removed element, a version vector; a Tier 3 field its
heads and a version vector.

Causality without the graph. Two registers need causal order for their value: an add-wins set (a removal
removes the additions in its causal past) and a Tier 3 field (a write that had seen the current value
replaces it). Causal deps name operations by id, and which operations an id's causal past holds is only
known by remembering every id. So an operation carries a causal summary instead, its ``causal_context``
(wire ``causalContext``, hashed into its id; see offline.core.operations): the record's version vector as
its writer held it, counting per node the operations on this record it had folded as a contiguous prefix,
its own node's entry numbering the operation itself. An operation is thus named by a dot (node, number),
and "had R seen X" is ``R.causal_context[X.node] >= X.number``: a function of the two operations (the local
store and the server build the context from the record's state, `RecordState.next_context`). It is exact
because a node's writes to a record reach every replica in the node's order (the server stores and relays
them so; see offline.store.compaction); a number the server refused leaves a hole nothing fills, which a
writer's context steps over (it counts the highest number held). The record's clock then stops below it
and that node's later numbers are held beyond it, as runs ([node, first, last]): the state grows by a run
per hole, not by a number per later write (one refusal used to let a writer grow a shared record's state
by 45 bytes a write, without bound). Not done: filling a hole (the server telling replicas a number is
void), so removal vectors keep their entries above it. The state keeps, for the record: the clock (the
contiguous counts held, "c") and the runs held beyond it ("x"); the pointwise maximum of the held
operations' past vectors ("p": what some held operation had seen) and the heads, the operations nobody
held had seen ("h": the causal deps of the next local write). All are bounded by the number of writers
(and "x" by the holes).

Why these merge any future operation exactly as the whole graph did:
- Add-wins set. Additions a held removal had seen are dropped when it arrives; a removal of element e
  with a context joins e's removal vector ("m"[e], the pointwise maximum of the contexts of e's removals).
  An addition X of e is removed iff some removal R of e had seen it, iff max over R of R.ctx[X.node] >=
  X.number, iff m[e][X.node] >= X.number: the vector answers exactly what the graph did, for an addition
  arriving in any order. An entry m[e][n] <= clock[n] can be dropped: every operation of n numbered up to
  clock[n] is held, so an addition it would remove is held already and was removed when it arrived or
  when the removal did; no future addition has such a number. A removed element whose vector empties is
  forgotten, so in causal delivery (the usual case) the set keeps its live elements only.
- Tier 3 field. Its heads are the writes no other write of the field had seen; the value is the heads
  combined in HLC order with ``resolve(current, head, head's base)`` (one head: its value). A write W is
  covered iff some write of the field had seen it, iff the pointwise maximum of the field's writes' past
  vectors ("pv") reaches W's number: again exact for any arrival order, and a covered write can never
  become a head again (causal pasts only grow), so only heads are kept.
- Heads of the record: likewise with "p".
Every part of the state is then a function of the set of operations held (maxima, sums, sets, heads), and
the text is canonical JSON (sorted keys, sets sorted): replicas holding the same operations store the same
bytes, whatever the order and repetition of delivery (the property tests compare the texts). The one
exception is the rich text register, whose Yjs encoding keeps struct boundaries that follow the order its
updates were merged in (same text, different bytes).

A repeated operation is recognised by its dot (`RecordState.holds`). A buggy or hostile peer reusing a dot
for two different operations makes replicas disagree on which of the two counts; the server refuses an
operation whose number is not above the ones it holds of that node for the record.

Operations without a causal context (written before it existed, by old clients) are merged as before:
their causal graph is kept ("g", only theirs), trimmed to a window (below) when no register reads it, and
between two of them causality is read from it. Across the upgrade an operation with a context is taken to
have seen every operation without one that has an earlier HLC, and never to be seen by one: old clients
cannot hold operations with a context (their id check refuses the unknown field). A record holding such
operations keeps its removal vectors whole and the latest removal key per element ("mk"), and their
states keep the window's arrival-order dependence described below; an operation without a context arriving
at a record after its removal vectors were trimmed is judged against what is left.

The window (operations without a context only). For a collection whose registers never read causal
order, the graph serves the causal deps of the next write, conflict reports and repeats, so the state
keeps every head and the latest others up to `WINDOW_MAX` operations (`trim_window` drops the oldest
non-heads, in arrival order). Heads stay exact; an operation whose causal past runs beyond the window may
be reported as concurrent with a write it had seen (a spurious trace, never a different value); a repeat
beyond the window is recognised by the log (the local store finds operations by id within their record,
the server has a unique index), and `fold` / `state_of` fold a set.

Older states load as they are (a full graph is a window of any size: it is trimmed by the next write).
"""

from __future__ import annotations

import dataclasses
import json
import json.scanner
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import chain, repeat
from math import isfinite as _isfinite
from typing import Any, cast

from offline.core.fields import MAX_SAFE_INTEGER, FieldDescriptor
from offline.core.frozen import FrozenDict, thaw
from offline.core.json_text import exact_loads
from offline.core.operations import BYTES_MARKER, Operation
from offline.core.schema import CollectionDefinition, SchemaDefinition
from offline.core.server_nodes import is_server_node_id
from offline.core.state_machine import (
    StateMachineConstraint,
    build_state_machine_constraints,
    validate_transition,
)

from . import richtext
from .values import (
    OpKey,
    compact_json,
    element_key,
    fits,
    floatless_json,
    fraction_to_number,
    normalize,
)

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
    duration: float = dataclasses.field(default=0.0, compare=False)  # ms spent resolving (MergeTrace)
    #: Why a Tier 3 resolver's result was not used (it raised, or returned a value the field cannot hold):
    #: the field then holds the later write's value (MergeTrace.fallback).
    fallback: str | None = None


@dataclass(slots=True)
class RecordState:
    """Everything needed to fold further operations into one record."""

    #: Operations without a causal context (see "Bounded state"): op id -> causal deps.
    graph: dict[str, list[str]] = field(default_factory=dict)
    exist: list[Any] | None = None  # [OpKey, op type] of the latest insert/update/delete that counted
    has_insert: bool = False
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Operations with a causal context: per node, how many of its operations on the record are held, as a
    #: contiguous prefix ("c")...
    clock: dict[str, int] = field(default_factory=dict)
    #: ...the ones held beyond it, sorted: [node, number], or [node, first, last] for a run of numbers ("x";
    #: runs are whole, and none starts right after the node's prefix: see `_whole_runs`)...
    extra: list[list[Any]] = field(default_factory=list)
    #: ...the pointwise maximum of their past vectors: what some held operation had seen ("p")...
    past: dict[str, int] = field(default_factory=dict)
    #: ...and the heads among them: op id -> [node, number] ("h").
    tips: dict[str, list[Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        """Compact JSON text of the state; `from_json` reads it (and the plain form, see `_encode_state`)."""
        if self.clock or self.extra:
            return _encode_vector_state(self)
        return _encode_state(self.graph, self.exist, self.has_insert, self.fields)

    @classmethod
    def from_json(cls, text: str | bytes) -> RecordState:
        raw = _loads(text)
        if "c" in raw:  # the form of a state holding operations with a causal context
            return _decode_vector_state(cls, raw)
        graph = raw["g"]
        if type(graph) is dict:  # the plain form
            return cls(graph=graph, exist=raw["e"], has_insert=raw["i"], fields=raw["f"])
        return _decode_state(cls, raw)

    def copy(self) -> RecordState:
        """An independent copy (what ``from_json(to_json())`` gives), without encoding the causal graph: its
        dependency lists are never changed in place, so the copy shares them; registers are copied whole,
        but for rich text documents (`_copy_registers`)."""
        return RecordState(
            graph=dict(self.graph),
            exist=None if self.exist is None else list(self.exist),
            has_insert=self.has_insert,
            fields=_copy_registers(self.fields),
            clock=dict(self.clock),
            extra=[list(dot) for dot in self.extra],
            past=dict(self.past),
            tips={op_id: list(dot) for op_id, dot in self.tips.items()},
        )

    @property
    def alive(self) -> bool:
        return self.has_insert and self.exist is not None and self.exist[1] != "delete"

    def heads(self) -> list[str]:
        """Ops of this record that no other held op depends on: the causal deps of the next local write.
        Once operations with a causal context are held, their heads (operations without one are older: an
        operation with a context has seen them, by the rule of `seen`)."""
        if self.clock or self.extra:
            return sorted(self.tips)
        if not self.graph:
            return []
        referenced = {dep for deps in self.graph.values() for dep in deps}
        return sorted(op_id for op_id in self.graph if op_id not in referenced)

    def holds_dot(self, node: str, number: int) -> bool:
        """Is the operation numbered ``number`` among ``node``'s writes to the record held?"""
        return number <= self.clock.get(node, 0) or (
            bool(self.extra) and _held_beyond(self.extra, node, number)
        )

    def opens_a_gap_too_many(self, node: str, number: int) -> bool:
        """Would holding ``number`` of ``node`` leave a gap below it when the state holds `MAX_GAPS` of that
        node's runs beyond its prefix already? (What the server refuses: see `MAX_GAPS`.)"""
        if self.holds_dot(node, number - 1) or number <= 1:
            return False
        return sum(1 for dot in self.extra if dot[0] == node) >= MAX_GAPS

    def next_context(self, node_id: str) -> dict[str, int]:
        """The causal context of the next write of ``node_id`` to the record: per node the highest number
        held, and the node's own one higher. Beyond the clock's prefix only when a number is missing: one
        in transit (a node's writes to a record reach a replica in order, so rarely) or one the server
        refused (it will never come; the writes after it must still be removable by others)."""
        context = dict(self.clock)
        for dot in self.extra:
            node, number = dot[0], dot[-1]
            if number > context.get(node, 0):
                context[node] = number
        context[node_id] = context.get(node_id, 0) + 1
        return context

    def holds(self, op: Operation) -> bool:
        """Does the state hold ``op`` (by its number when it has a causal context, else in the graph)?"""
        context = op.causal_context
        if context is None:
            return op.id in self.graph
        return self.holds_dot(op.node_id, context[op.node_id])

    def single_operation(self) -> str | None:
        """The id of the one operation the state holds, when it holds exactly one (else None)."""
        if self.clock or self.extra:
            if self.graph or self.extra or len(self.tips) != 1 or sum(self.clock.values()) != 1:
                return None
            return next(iter(self.tips))
        if len(self.graph) == 1:
            return next(iter(self.graph))
        return None

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


def _copy_registers(fields: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a state's registers (through JSON, the fastest deep copy of small nested values),
    sharing each rich text register's document (``"s"``, its base64 text): a string, never changed in
    place (a fold stores a new one), and the size of the document. Encoding it too made every local
    keystroke cost the document: ~170 us of a ~1 ms write at 20,000 characters, against 8 us at 10."""
    documents: dict[str, str] = {}
    plain = fields
    for name, register in fields.items():
        if type(register) is dict and type(register.get("s")) is str:
            if plain is fields:
                plain = dict(fields)
            plain[name] = {key: value for key, value in register.items() if key != "s"}
            documents[name] = register["s"]
    copied: dict[str, Any] = _loads(compact_json(plain))
    for name, document in documents.items():
        rest = copied[name]
        # The register's own key order, so the copy encodes as the original does.
        copied[name] = {key: document if key == "s" else rest[key] for key in fields[name]}
    return copied


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
_scan_once: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(cast(Any, json.JSONDecoder()))


def _loads(text: str | bytes) -> Any:
    """``json.loads(text)``: a state text (compact, no surrounding whitespace) is read by orjson when that is
    exact (`exact_loads`), else goes straight to the scanner, skipping the checks and whitespace matching
    around it; anything else takes ``json.loads`` itself."""
    if type(text) is str:
        value = exact_loads(text)
        if value is not None:
            return value
        try:
            value, end = _scan_once(text, 0)
        except StopIteration:
            pass
        else:
            if end == len(text):
                return value
    return json.loads(text)


class _FloatInText(Exception):
    """`_scan_floatless` met a number with a fraction or an exponent, or NaN/Infinity."""


def _refuse_float(_text: str) -> Any:
    raise _FloatInText


#: `_scan_once` for `apply_to_text`, raising _FloatInText at a float: a state decoded without one is
#: written back by `floatless_json`. (The C scanner calls these hooks only for such numbers.)
_scan_floatless: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    cast(Any, json.JSONDecoder(parse_float=_refuse_float, parse_constant=_refuse_float))
)


#: The text of a state holding operations with a causal context: canonical JSON (sorted keys), so equal
#: states are equal texts, whatever order their operations arrived in.
_canonical_json: Callable[[Any], str] = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False
).encode


def _encode_vector_state(state: RecordState) -> str:
    for reg in state.fields.values():
        # Lists used as sets, in arrival order: sorted, so the text is a function of the operation set.
        removed = reg.get("r")
        if type(removed) is dict:
            for ids in removed.values():
                if type(ids) is list:
                    ids.sort()
    # The keys standing in "e" and in registers' "k" and "lk" (mostly one operation's, many times) are
    # written once, in a sorted table ("K"), and referred to by their index there.
    slots: list[tuple[dict[str, Any] | list[Any], Any]] = []
    exist = state.exist
    if exist is not None and _is_key(exist[0]):
        slots.append((exist, 0))
    for reg in state.fields.values():
        for slot in ("k", "lk"):
            if _is_key(reg.get(slot)):
                slots.append((reg, slot))
    table = sorted({tuple(cast(Any, holder)[slot]) for holder, slot in slots})
    index = {key: i for i, key in enumerate(table)}
    fields: dict[str, Any] = {}
    for name, reg in state.fields.items():
        if _is_key(reg.get("k")) or _is_key(reg.get("lk")):
            reg = dict(reg)
            for slot in ("k", "lk"):
                if _is_key(reg.get(slot)):
                    reg[slot] = index[tuple(reg[slot])]
        fields[name] = reg
    if exist is not None and _is_key(exist[0]):
        exist = [index[tuple(exist[0])], *exist[1:]]
    return _canonical_json(
        {
            "c": state.clock,
            "x": sorted(state.extra),
            "p": state.past,
            "h": state.tips,
            "g": state.graph,
            "e": exist,
            "i": state.has_insert,
            "f": fields,
            "K": [list(key) for key in table],
        }
    )


def numbers_listed(text: str) -> str:
    """A state text with the runs of its "x" written number by number, as readers from before runs read
    it (they take each entry for one [node, number]): what the server sends clients, which may be that old,
    in record states and snapshots. Bounded in its store, so a state's text grows with the numbers held
    beyond a hole only on the way to a client; one that knows runs reads them back as runs. Any other text
    is returned as it is."""
    if not text.endswith(',"x":[]}') and '"x":[[' in text:
        state = RecordState.from_json(text)
        if any(len(dot) != 2 for dot in state.extra):
            state.extra = [[dot[0], n] for dot in state.extra for n in range(dot[1], dot[-1] + 1)]
            return _encode_vector_state(state)
    return text


def _is_key(value: Any) -> bool:
    return type(value) is list and 4 <= len(value) <= 5


def _decode_vector_state(cls: type[RecordState], raw: dict[str, Any]) -> RecordState:
    table = raw.get("K") or []
    exist = raw["e"]
    if exist is not None and type(exist[0]) is int:
        exist[0] = table[exist[0]]
    for reg in raw["f"].values():
        for slot in ("k", "lk"):
            ref = reg.get(slot)
            if type(ref) is int:
                reg[slot] = table[ref]
    clock, extra = raw["c"], raw["x"]
    if extra:
        extra = _whole_runs(clock, extra)  # (texts written before runs list each number alone)
    return cls(
        graph=raw["g"],
        exist=exist,
        has_insert=raw["i"],
        fields=raw["f"],
        clock=clock,
        extra=extra,
        past=raw["p"],
        tips=raw["h"],
    )


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
    graph: dict[str, list[str]]
    try:
        graph = {entry[0]: list(map(at, entry[1])) for entry in entries}  # deps held in the graph: indices
    except TypeError:  # some dep is an id the graph does not hold
        graph = {}
        for entry in entries:
            deps = entry[1]
            try:
                graph[entry[0]] = list(map(at, deps))
            except TypeError:
                graph[entry[0]] = [dep if type(dep) is str else ids[dep] for dep in deps]
    keys: list[Any] = [
        [entry[2], entry[3], entry[4], entry[0]] if len(entry) > 2 else None for entry in entries
    ]
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
        # Every register's value is a function of the writes alone, not of their causal order: the state
        # keeps a window of the causal graph (see the module's "Bounded state"), not all of it.
        self.windowed = not any(kind in ("union", "resolve") for kind in self.kinds.values())
        self.sets = [name for name, kind in self.kinds.items() if kind == "union"]
        # Field -> exact value types op_fields passes through unchanged (see _IDENTITY_TYPES).
        self.identity_types: dict[str, frozenset[type]] = {
            name: _IDENTITY_TYPES[descriptor.type]
            for name, descriptor in collection.fields.items()
            if descriptor.type in _IDENTITY_TYPES
        }
        self.arrays = frozenset(name for name, d in collection.fields.items() if d.type == "array")
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
        # Per field, in schema order, what materialize() needs: (name, merge kind, the value of a field no
        # write has touched when it is immutable, else _FRESH: a new copy is made each time).
        self.shape: list[tuple[str, str, Any]] = []
        for name, descriptor in collection.fields.items():
            initial = _initial(descriptor)
            if type(initial) not in _SCALARS:
                initial = _FRESH
            self.shape.append((name, self.kinds[name], initial))

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
        arrays = plan.arrays
        out: dict[str, Any] = {}
        for name, value in items:
            kinds = identity.get(name)
            if kinds is not None:
                kind = type(value)
                if kind in kinds and (kind is not int or -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER):
                    out[name] = value
                    continue
            elif type(value) is tuple and not value and name in arrays:
                out[name] = []  # an empty list fits every array field, and thaw/normalize give a new []
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
        """Fold ``op`` into ``state`` (in place); returns the conflicts it resolved. A repeat of an operation
        the state holds (in its window of the causal graph, when it keeps one) changes nothing."""
        plan = self._plans.get(op.collection)
        if plan is None or not (plan.sets or plan.resolvers):
            return self._apply(state, op, want_conflicts)
        # Removals come only from an update's previous data: an operation of another type folded into a
        # state with no registers (a record's first write, every local insert) leaves no removal for
        # `after_fold` to drop or settle, so unless a Tier 3 field needs settling it is not called.
        settle = bool(plan.resolvers or state.fields or op.type == "update")
        conflicts = self._apply(state, op, want_conflicts)
        if settle:
            self.after_fold(plan, state, op, conflicts)
        return conflicts

    def after_fold(self, plan: _Plan, state: RecordState, op: Operation, conflicts: list[Conflict]) -> None:
        """What follows the fold of ``op`` into a record of ``plan``'s collection: removed additions of
        add-wins sets are forgotten, Tier 3 fields settled. Only registers ``op`` may have changed: those it
        writes, or all of them when it arrived after an operation that depends on it (it may complete the
        causal order between earlier writes)."""
        if not state.fields:
            return
        graph = state.graph
        op_id = op.id
        context = op.causal_context
        if context is None:
            late = any(op_id in deps for deps in graph.values())
        else:
            late = state.past.get(op.node_id, 0) >= context[op.node_id]
        late = late or op.schema_version != plan.schema_version
        written: Mapping[str, Any] = op.data or {}
        if plan.sets:
            names = plan.sets if late else [n for n in plan.sets if n in written]
            if names and graph:
                _drop_removed_additions(names, state)
            if not graph and (state.clock or state.extra):
                _forget_settled_removals(plan.sets, state)
        if plan.resolvers:
            settle = [
                name
                for name in plan.resolvers
                if late or name in written or "rv" not in (state.fields.get(name) or {"rv": None})
            ]
            if settle:
                self._settle_resolvers(plan, state, conflicts, settle)

    def _settle_resolvers(
        self, plan: _Plan, state: RecordState, conflicts: list[Conflict], names: list[str]
    ) -> None:
        """Resolve Tier 3 fields ``names`` of ``state`` once, now, and keep each value in its register
        ("rv"), so reads do not call resolvers."""
        for name in names:
            reg = state.fields.get(name)
            if not reg:
                continue
            if "w" in reg:
                _upgrade_resolver(reg, state)
            heads = reg.get("h")
            if not heads:
                continue
            if state.graph:  # an operation without a context may have completed the graph: heads again
                reg["h"] = [h for h in heads if not _write_covered(reg, state, h[0])]
            value, fallbacks = self._resolve_writes(plan, name, reg, state)
            reg["rv"] = [value]
            if fallbacks:
                reason = "; ".join(fallbacks)
                log.warning("resolver for %s.%s: %s", plan.collection.name, name, reason)
                for conflict in conflicts:
                    if conflict.field == name:
                        conflict.fallback = reason
                        conflict.output = value

    def _apply(self, state: RecordState, op: Operation, want_conflicts: bool) -> list[Conflict]:
        graph = state.graph
        op_id = op.id
        context = op.causal_context
        plan = self._plans.get(op.collection)
        if context is None:
            if op_id in graph:
                return []
            if plan is not None and plan.windowed and len(graph) >= WINDOW_MAX:
                trim_window(graph)
            graph[op_id] = list(op.causal_deps)
        else:
            number = context[op.node_id]
            if state.holds_dot(op.node_id, number):
                return []  # a repeat (see "Bounded state" for a peer reusing a number)
            if state.clock or state.extra or state.past or state.tips:
                _add_dot(state, op_id, op.node_id, number, context)
            else:
                _first_dot(state, op_id, op.node_id, number, context)
        if plan is None:
            return []
        op_type = op.type
        data = self.op_fields(op) if op_type != "delete" else {}
        if plan.state_machines:
            for name, _, _, policy in self.transition_problems(op):
                if policy == "reject":
                    # A write its author could not legally make contributes nothing, on every replica alike
                    # (the local store refuses the whole write when any 'reject' machine objects).
                    return []
                data.pop(name, None)  # 'last-valid-state': the field keeps its value, the rest applies

        ts = op.timestamp
        key = [ts.wall_time, ts.logical, ts.node_id, op_id]  # op_key(op)
        if context is not None:
            key.append(number)  # its number: whether a write had seen it (`_seen`)
        exist = state.exist
        if exist is None or key > exist[0]:
            state.exist = [key, op_type]
        if op_type == "insert":
            state.has_insert = True
        elif op_type == "delete":
            return []

        previous = self.op_fields(op, "previous") if op_type == "update" and op.previous_data else {}
        conflicts: list[Conflict] = []
        kinds = plan.kinds
        fields = state.fields
        for name, value in data.items():
            kind = kinds[name]
            register = fields.get(name)
            # The common registers, inlined: exactly what _apply_field does for them when no conflict is
            # reported (none wanted, or no earlier write to the field).
            if not register:
                if kind == "lww":
                    fields[name] = {"k": key, "v": value, "lk": key}
                    continue
                if kind == "counter":
                    if op_type == "insert":
                        fields[name] = {"n": 0, "d": 1, "k": key, "v": value, "lk": key}
                        continue
                    after = value or 0
                    before = previous.get(name) or 0
                    if type(after) is int and type(before) is int:
                        fields[name] = {"n": after - before, "d": 1, "lk": key}
                        continue
                elif kind == "union" and not value and not previous.get(name):
                    fields[name] = {"a": {}, "r": {}, "v": {}, "lk": key}  # nothing added nor removed
                    continue
            elif not want_conflicts:
                if kind == "lww":
                    if "k" not in register or key > register["k"]:
                        register["k"] = key
                        register["v"] = value
                    last = register.get("lk")
                    if last is None or key > last:
                        register["lk"] = key
                    continue
                if kind == "counter" and op_type != "insert":
                    after = value or 0
                    before = previous.get(name) or 0
                    n = register["n"]
                    if (
                        type(after) is int
                        and type(before) is int
                        and type(n) is int
                        and type(register["d"]) is int
                        and register["d"] == 1
                    ):
                        register["n"] = n + after - before
                        last = register.get("lk")
                        if last is None or key > last:
                            register["lk"] = key
                        continue
            started = time.perf_counter() if want_conflicts else 0.0
            conflict = self._apply_field(
                plan, state, name, kind, register, op, key, value, previous, want_conflicts
            )
            if conflict is not None:
                conflict.duration = (time.perf_counter() - started) * 1000
                conflicts.append(conflict)
        return conflicts

    def _concurrent(self, state: RecordState, other_key: OpKey, key: OpKey, op: Operation) -> bool:
        """Were the writes with these keys concurrent (neither in the other's causal past)? ``key`` is
        ``op``'s, just folded; ``other_key`` a held write's."""
        earlier, later = (other_key, key) if other_key < key else (key, other_key)
        # HLC respects causality, so only the earlier one can be in the later one's causal past.
        if len(later) == 5 and len(earlier) == 5 and later is not key:
            # ``op`` arrived after a later write: whether some held write had seen it (for a trace).
            return bool(state.past.get(earlier[2], 0) < earlier[4])
        return not _seen(state, earlier, later, op.causal_context)

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
        concurrent = want_conflict and last_key is not None and self._concurrent(state, last_key, key, op)
        # The losing side's value is only needed for a trace; read it before the register changes.
        last_value = self.value_of(plan, name, register, state) if concurrent else None

        if kind in ("lww", "server-authoritative"):
            reg = register or {}
            if kind == "lww":
                if "k" not in reg or key > reg["k"]:
                    reg.update(k=key, v=value)
            else:
                # Marked server ids (offline.core.server_nodes) are authoritative for every replica,
                # whatever it was told; the declared nodes cover servers from before the marker.
                is_server = is_server_node_id(op.node_id) or op.node_id in self.authoritative_nodes()
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
                if ek in before_keys or _removed_by_summary(reg, ek, key):
                    continue
                reg["a"].setdefault(ek, {})[op.id] = [*key, index]
                reg["v"][ek] = item
            context = op.causal_context
            for ek in sorted(before_keys - after_keys):
                if context is None:
                    reg["r"].setdefault(ek, []).append(op.id)
                else:
                    _summarise_removal(reg, state, ek, context, key)
        elif kind == "richtext":
            reg = register or {}
            reg["s"] = richtext.fold_update(reg.get("s"), value)
        elif kind == "resolve":
            reg = register or {"h": []}
            if "w" in reg:
                _upgrade_resolver(reg, state)
            reg.pop("rv", None)  # settled again once the operation is folded (_settle_resolvers)
            _add_resolver_write(reg, state, op, key, value, base)
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
            settled = reg.get("rv")
            if settled is not None:
                return settled[0]
            return self._resolve_writes(plan, name, reg, state)[0]
        raise AssertionError(kind)  # pragma: no cover

    def _resolve_writes(
        self, plan: _Plan, name: str, reg: dict[str, Any], state: RecordState | None
    ) -> tuple[Any, list[str]]:
        """A Tier 3 field's value from its heads (HLC order), and why a resolver's result was not used.

        The heads are the writes no other write of the field had seen (a write that had seen the value
        replaces it): one head is the value; several are combined in HLC order, ``resolve(current, head,
        head's base)``. A resolver that raises, or returns a value
        the field cannot hold, must not wedge the record or store an ill-typed value: the later write's
        value is used instead, the same on every replica (the result depends on the writes alone)."""
        if "w" in reg:  # a register stored before heads (upgraded on the next fold)
            reg = dict(reg)
            _upgrade_resolver(reg, state if state is not None else RecordState())
        writes = reg.get("h") or []
        if not writes:
            return _initial(plan.fields[name]), []
        resolver = plan.resolvers[name]
        descriptor = plan.fields[name]
        fallbacks: list[str] = []
        current = writes[0][1]
        for _key, value, base in writes[1:]:
            try:
                out = thaw(resolver(current, value, base))
            except Exception as exc:
                fallbacks.append(f"raised {type(exc).__name__}: {exc}; kept the later value")
                current = value
            else:
                if out is None and descriptor.required:
                    fallbacks.append("returned None for a required field; kept the later value")
                    current = value
                elif out is not None and not fits(descriptor, out):
                    fallbacks.append(
                        f"returned a {type(out).__name__}, not a {descriptor.type}; kept the later value"
                    )
                    current = value
                else:
                    current = out if out is None else normalize(descriptor, out)
        return current, fallbacks

    def register_values(self, collection: str) -> list[tuple[str, Any]] | None:
        """Each field of ``collection`` with its value when no write touched it, in schema order, when every
        field materialises as its register's ``"v"`` (last-writer-wins, no resolver, a scalar initial value);
        None otherwise. A record of such a collection can then be read off its state text without folding it
        (`offline.store.state_rows`)."""
        plan = self._plans.get(collection)
        if plan is None or any(kind != "lww" or initial is _FRESH for _, kind, initial in plan.shape):
            return None
        return [(name, initial) for name, _, initial in plan.shape]

    def materialize(self, collection: str, record_id: str, state: RecordState) -> dict[str, Any] | None:
        """The record as applications see it (`id` plus every field), or None when it does not exist."""
        if not state.alive:
            return None
        return self._record(self._plans[collection], record_id, state.fields, state)

    def last_values(self, collection: str, record_id: str, state: RecordState) -> dict[str, Any] | None:
        """The record as its fields stand, alive or deleted (a delete keeps them): what a deleted record was
        before its delete. None when the state holds no insert."""
        if not state.has_insert:
            return None
        return self._record(self._plans[collection], record_id, state.fields, state)

    def _record(
        self, plan: _Plan, record_id: str, registers: Mapping[str, Any], state: RecordState | None
    ) -> dict[str, Any]:
        """`id` plus every field's value from its register; ``state`` None when no register left depends
        on the causal graph (`apply_to_text`'s records)."""
        record: dict[str, Any] = {"id": record_id}
        # The common cases of value_of, inlined (the same values).
        for name, kind, initial in plan.shape:
            reg = registers.get(name)
            if reg is None:
                record[name] = initial if initial is not _FRESH else _initial(plan.fields[name])
            elif kind == "lww":
                record[name] = reg.get("v")
            elif kind == "counter":
                base, n, d = reg.get("v") or 0, reg["n"], reg["d"]
                if type(base) is int and type(n) is int and type(d) is int and d == 1:
                    record[name] = base + n
                else:
                    record[name] = self.value_of(plan, name, reg, state)
            elif kind == "union" and not reg["a"]:
                record[name] = []  # nothing ever added
            else:
                record[name] = self.value_of(plan, name, reg, state)
        return record

    def apply_to_text(self, op: Operation, text: str | bytes | None, record_id: str) -> TextFold | None:
        """`apply` of one operation to a stored state text (None: a record with no state yet), without
        building its `RecordState`: the new state text and the record, exactly as ``apply`` +
        ``materialize`` + ``to_json`` of the decoded state give them (no conflicts are reported). None when
        the state or the operation is outside the common case this covers (the caller then takes the
        general path); REPEATED when the state holds ``op`` already.

        Covered: the insert of a new record writing lww fields, counters and empty add-wins sets; and on a
        compact state text as `to_json` writes it, whose keys all stand as entry indices, with no add-wins
        set element, resolver writes or dangling dependency: an update (no state machine in the
        collection) writing only lww fields and whole-number counters.
        """
        if text is None:
            return self._insert_text(op, record_id) if op.type == "insert" else None
        if op.type != "update" or type(text) is not str:
            return None
        plan = self._plans.get(op.collection)
        if plan is None or plan.state_machines:
            return None
        floats = False
        # orjson's read, when it writes the state back exactly: the floats it holds (if any) `floatless_json`
        # then writes as the canonical text does, so the fold need not know of them (`exact_loads`).
        raw = exact_loads(text)
        if raw is not None:
            end = len(text)
        else:
            try:
                raw, end = _scan_floatless(text, 0)
            except StopIteration:
                return None
            except _FloatInText:
                floats = True
                try:
                    raw, end = _scan_once(text, 0)
                except StopIteration:
                    return None
        if end != len(text) or type(raw) is not dict:
            return None
        if op.causal_context is not None:
            return self._fold_vector_update(plan, op, record_id, raw, floats)
        if tuple(raw) != _COMPACT_KEYS:
            return None
        entries = raw["g"]
        exist = raw["e"]
        fields = raw["f"]
        if (
            type(entries) is not list
            or type(exist) is not list
            or len(exist) != 2
            or raw["i"] is not True
            or type(fields) is not dict
        ):
            return None
        size = len(entries)
        index: dict[str, int] = {}
        keyed: set[int] = set()
        dangling: list[str] = []
        for i, entry in enumerate(entries):
            if type(entry) is not list:
                return None
            width = len(entry)
            if width == 5:
                if type(entry[2]) is not int or type(entry[3]) is not int or type(entry[4]) is not str:
                    return None
                keyed.add(i)
            elif width != 2:
                return None
            entry_id, deps = entry[0], entry[1]
            if type(entry_id) is not str or entry_id in index or type(deps) is not list:
                return None
            for dep in deps:
                if type(dep) is str:
                    dangling.append(dep)  # a dependency the graph does not hold: written as its id
                elif type(dep) is not int or not 0 <= dep < size:
                    return None  # something irregular
            index[entry_id] = i
        if any(dep in index for dep in dangling):
            return None  # an id where to_json writes an index
        op_id = op.id
        if op_id in index:
            return REPEATED
        if op_id in dangling:
            return None  # an entry's dependency arriving: to_json writes it as an index from now on
        if plan.windowed and size >= WINDOW_MAX:
            return None  # the general path trims the window

        # Every key is an index of a keyed entry, and every keyed entry is referred to (as to_json writes).
        if type(exist[0]) is not int:
            return None
        referenced = {exist[0]}
        for reg in fields.values():
            if type(reg) is not dict:
                return None
            for slot in ("k", "lk"):
                if slot in reg:
                    ref = reg[slot]
                    if type(ref) is not int:
                        return None
                    referenced.add(ref)
            if "a" in reg:
                added = reg["a"]
                if type(added) is dict and (added or reg.get("r")):
                    return None  # an add-wins set that holds something: its additions name entries
            if "w" in reg or "h" in reg:
                return None  # resolver writes: their value depends on the causal graph
        if referenced != keyed:
            return None
        return self._fold_update(plan, op, record_id, raw, index, keyed)

    def apply_to_insert(self, op: Operation, insert: Operation, record_id: str) -> TextFold | None:
        """`apply_to_text` of ``op`` on the state text the insert of a new record (``insert``) makes, without
        that text: for a store that keeps such a state as a reference to its operation. None outside the
        common case (as `apply_to_text`)."""
        if op.causal_context is not None and insert.causal_context is not None:
            if op.type != "update" or op.id == insert.id:
                return None
            plan = self._plans.get(op.collection)
            if plan is None or plan.state_machines:
                return None
            document = self._vector_insert_document(plan, insert)
            if document is None:
                return None
            floats = any(type(reg.get("v")) is float for reg in document["f"].values())
            return self._fold_vector_update(plan, op, record_id, document, floats)
        if (
            op.type != "update"
            or insert.causal_deps
            or op.id == insert.id
            or op.causal_context is not None
            or insert.causal_context is not None
        ):
            # apply_to_text takes none of these either: a dependency its graph does not hold; a repeat is
            # found by the general path.
            return None
        plan = self._plans.get(op.collection)
        if plan is None or plan.state_machines:
            return None
        made = self.insert_fold(insert, record_id)
        if made is None:
            return None
        ts = insert.timestamp
        raw = {
            "g": [[insert.id, [], ts.wall_time, ts.logical, ts.node_id]],
            "e": [0, "insert"],
            "i": True,
            "f": made.fields,
        }
        return self._fold_update(plan, op, record_id, raw, {insert.id: 0}, {0})

    def _fold_update(
        self,
        plan: _Plan,
        op: Operation,
        record_id: str,
        raw: dict[str, Any],
        index: dict[str, int],
        keyed: set[int],
    ) -> TextFold | None:
        """The fold of `apply_to_text` on a compact state it checked (``raw``, parsed; ``index``: entry index
        of each op id; ``keyed``: the entries carrying their key)."""
        entries: list[list[Any]] = raw["g"]
        exist: list[Any] = raw["e"]
        fields: dict[str, dict[str, Any]] = raw["f"]
        size = len(entries)
        op_id = op.id
        ts = op.timestamp
        wall, logical, node = ts.wall_time, ts.logical, ts.node_id
        if type(wall) is not int or type(logical) is not int or type(node) is not str:
            return None
        data = self.op_fields(op)
        previous = self.op_fields(op, "previous") if op.previous_data else {}
        kinds = plan.kinds
        for name, value in data.items():
            kind = kinds[name]
            if kind == "lww":
                continue
            if kind != "counter" or type(value or 0) is not int or type(previous.get(name) or 0) is not int:
                return None
            reg = fields.get(name)
            if reg and (type(reg.get("n")) is not int or type(reg.get("d")) is not int or reg["d"] != 1):
                return None

        # The fold (what apply does), with keys as entry indices: the new operation is entry ``size``.
        key = [wall, logical, node, op_id]

        def key_at(i: int) -> list[Any]:
            entry = entries[i]
            return [entry[2], entry[3], entry[4], entry[0]]

        if key > key_at(exist[0]):
            raw["e"] = exist = [size, "update"]
        for name, value in data.items():
            reg = fields.get(name)
            if kinds[name] == "lww":
                if not reg:
                    fields[name] = {"k": size, "v": value, "lk": size}
                    continue
                if "k" not in reg or key > key_at(reg["k"]):
                    reg["k"] = size
                    reg["v"] = value
            else:
                delta = (value or 0) - (previous.get(name) or 0)
                if not reg:
                    fields[name] = {"n": delta, "d": 1, "lk": size}
                    continue
                reg["n"] += delta
            last = reg.get("lk")
            if last is None or key > key_at(last):
                reg["lk"] = size
        index[op_id] = size
        get = index.get
        new_entry: list[Any] = [op_id, [get(dep, dep) for dep in op.causal_deps]]
        entries.append(new_entry)

        # Entries carry their key's HLC exactly while something refers to them.
        now_referenced = {exist[0]}
        for reg in fields.values():
            for slot in ("k", "lk"):
                if slot in reg:
                    now_referenced.add(reg[slot])
        for i in keyed - now_referenced:
            del entries[i][2:]
        if size in now_referenced:
            new_entry += (wall, logical, node)

        # No register left whose value depends on the causal graph (checked above): no state needed.
        record = self._record(plan, record_id, fields, None) if exist[1] != "delete" else None
        return TextFold(compact_json(raw), record, fields)

    def wire_insert_text(self, wire: Mapping[str, Any]) -> str | None:
        """The state text (`RecordState.to_json`'s) that the insert with this decoded wire form makes of a new
        record, read off the wire form without building its `Operation`: for a stored operation (validated
        when it was taken in) that is its node's first write to the record, with a causal context and
        JSON scalars as its values; None otherwise (decode the operation and take `insert_fold`). A
        state-based first sync asks this of every record written once, where decoding the operation was
        most of the cost."""
        get = wire.get
        if get("type") != "insert" or get("previousData") is not None or get("causalDeps"):
            return None
        collection: Any = get("collection")
        plan = self._plans.get(collection) if type(collection) is str else None
        context, node, stamp, data = get("causalContext"), get("nodeId"), get("timestamp"), get("data")
        if plan is None or type(context) is not dict or type(stamp) is not dict or type(data) is not dict:
            return None
        op_id, version = get("id"), get("schemaVersion")
        if type(node) is not str or type(op_id) is not str or type(version) is not int:
            return None
        for name, value in data.items():
            kind = type(value)
            if kind not in _SCALARS or name == BYTES_MARKER:
                return None
            if (kind is int and not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER) or (
                kind is float and not _isfinite(value)
            ):
                return None
        insert = _WireInsert(
            op_id,
            node,
            collection,
            version,
            context,
            _WireStamp(stamp.get("wallTime"), stamp.get("logical"), stamp.get("nodeId")),
            data,
        )
        made = self._vector_insert_document(plan, cast(Operation, insert))
        return None if made is None else compact_json(made)

    def _vector_insert_document(self, plan: _Plan, insert: Operation) -> dict[str, Any] | None:
        """The decoded canonical text (`_encode_vector_state`'s, keys in its sorted order) of the state the
        insert ``insert`` (with a causal context) makes of a new record, built directly; None outside the
        common case of `_fold_vector_update` (and unless it is its node's first write to the record)."""
        context = insert.causal_context
        assert context is not None
        node = insert.node_id
        if insert.type != "insert" or context.get(node) != 1 or insert.schema_version != plan.schema_version:
            return None
        ts = insert.timestamp
        wall, logical = ts.wall_time, ts.logical
        if type(wall) is not int or type(logical) is not int or ts.node_id != node:
            return None
        kinds = plan.kinds
        registers: dict[str, dict[str, Any]] = {}
        for name, value in self.op_fields(insert).items():
            kind = kinds[name]
            # Registers as `_apply` makes them on a new state, their slots in sorted order; key index 0.
            if kind == "lww" and type(value) in _SCALARS:
                registers[name] = {"k": 0, "lk": 0, "v": value}
            elif kind == "counter" and type(value) in _SCALARS:
                registers[name] = {"d": 1, "k": 0, "lk": 0, "n": 0, "v": value}
            elif kind == "union" and not value:
                registers[name] = {"a": {}, "lk": 0, "r": {}, "v": {}}
            else:
                return None
        # `_add_dot` on a new state: what the insert had seen of others (its own number is not its past).
        past = {other: count for other, count in context.items() if other != node and count > 0}
        return {
            "K": [[wall, logical, node, insert.id, 1]],
            "c": {node: 1},
            "e": [0, "insert"],
            "f": dict(sorted(registers.items())),
            "g": {},
            "h": {insert.id: [node, 1]},
            "i": True,
            "p": dict(sorted(past.items())),
            "x": [],
        }

    def _fold_vector_update(
        self, plan: _Plan, op: Operation, record_id: str, raw: dict[str, Any], floats: bool
    ) -> TextFold | None:
        """`apply_to_text` of an update with a causal context on a state of operations with one (``raw``: its
        text decoded, changed in place).

        Covered: the next operation of its node on the record (no held operation had seen it), of the
        schema's version, onto a state holding no operation without a context nor any beyond the clock, in
        a collection without state machines, whose add-wins sets are empty and whose Tier 3 fields are
        settled; writing lww fields (scalar values) and whole-number counters that have registers already.
        Then the fold changes the clock, the past, the heads, the written registers and the key table, and
        nothing else (`after_fold` has nothing to do). The text is canonical (only `_encode_vector_state`
        writes this form): every object's keys stand in sorted order, and stay so here (a new key re-sorts
        its object), so the compact encoding of ``raw`` is the canonical text `to_json` writes. ``floats``: ``raw``
        may hold a float (else `floatless_json` writes it, unless the operation writes one)."""
        if tuple(raw) != _VECTOR_KEYS or op.schema_version != plan.schema_version:
            return None
        table = raw["K"]
        clock = raw["c"]
        exist = raw["e"]
        fields = raw["f"]
        tips = raw["h"]
        past = raw["p"]
        if (
            raw["g"]
            or raw["x"]
            or raw["i"] is not True
            or type(table) is not list
            or type(clock) is not dict
            or type(exist) is not list
            or len(exist) != 2
            or type(fields) is not dict
            or type(tips) is not dict
            or type(past) is not dict
        ):
            return None
        context = op.causal_context
        assert context is not None
        node = op.node_id
        number = context[node]
        held = clock.get(node, 0)
        if type(held) is not int:
            return None
        if number <= held:
            return REPEATED
        if number != held + 1:
            return None  # a number missing in between: the general path keeps it beyond the clock
        ts = op.timestamp
        wall, logical = ts.wall_time, ts.logical
        if type(wall) is not int or type(logical) is not int or ts.node_id != node:
            return None
        size = len(table)
        # The key table's references: the latest write's (exist) and the registers' "k" and "lk".
        refs: list[tuple[Any, Any]] = [(exist, 0)]
        kinds = plan.kinds
        for name, reg in fields.items():
            if type(reg) is not dict:
                return None
            kind = kinds.get(name)
            if kind == "union" and (reg.get("a") or reg.get("r") or "m" in reg):
                return None  # elements, or removals `after_fold` may settle: the general path
            if kind == "resolve" and "rv" not in reg:
                return None  # not settled: `after_fold` settles it
            if "k" in reg:
                refs.append((reg, "k"))
            if "lk" in reg:
                refs.append((reg, "lk"))
        for holder, slot in refs:
            ref = holder[slot]
            if type(ref) is not int or not 0 <= ref < size or type(table[ref]) is not list:
                return None
        data = self.op_fields(op)
        previous = self.op_fields(op, "previous") if op.previous_data else {}
        for name, value in data.items():
            reg = fields.get(name)
            if reg is None or "lk" not in reg:
                return None  # a register (or a slot) to create: a new key in its object
            kind = kinds[name]
            if kind == "lww":
                if type(value) not in _SCALARS or "k" not in reg:
                    return None  # (an object value's keys would need sorting)
                floats = floats or type(value) is float
            elif (
                kind != "counter"
                or type(value or 0) is not int
                or type(previous.get(name) or 0) is not int
                or type(reg.get("n")) is not int
                or type(reg.get("d")) is not int
                or reg["d"] != 1
            ):
                return None

        # `_add_dot` (the clock's next number; nothing beyond it).
        if node in clock:
            clock[node] = number
        else:
            raw["c"] = dict(sorted({**clock, node: number}.items()))
        grew = False
        for other, count in context.items():
            seen = count - 1 if other == node else count
            if seen > past.get(other, 0):
                grew = grew or other not in past
                past[other] = seen
        if grew:
            raw["p"] = past = dict(sorted(past.items()))
        if past.get(node, 0) >= number:
            return None  # a held operation had seen it: `after_fold` settles every register again
        for tip, dot in list(tips.items()):
            if type(dot) is not list or len(dot) != 2:
                return None
            if past.get(dot[0], 0) >= dot[1]:
                del tips[tip]
        tips[op.id] = [node, number]
        if len(tips) > 1:  # (one head, the usual case after a node's next write, is in order already)
            raw["h"] = dict(sorted(tips.items()))

        # The fold of `_apply`: a slot taking this operation's key refers to NEW until the table is redone.
        key: list[Any] = [wall, logical, node, op.id, number]
        if key > table[exist[0]]:
            exist[0] = _NEW_KEY
            exist[1] = "update"
        for name, value in data.items():
            reg = fields[name]
            if kinds[name] == "lww":
                if key > table[reg["k"]]:
                    reg["k"] = _NEW_KEY
                    reg["v"] = value
            else:
                reg["n"] += (value or 0) - (previous.get(name) or 0)
            last = reg["lk"]
            if last != _NEW_KEY and key > table[last]:
                reg["lk"] = _NEW_KEY
        # The key table again, as `_encode_vector_state` writes it: the referenced keys, sorted (the table
        # was; the new key goes in its place), referred to by index.
        used = sorted({holder[slot] for holder, slot in refs})
        new_table = [table[i] for i in used if i != _NEW_KEY]
        if used[0] == _NEW_KEY:
            place = len(new_table)
            while place and new_table[place - 1] > key:
                place -= 1
            new_table.insert(place, key)
        index = {old: i for i, old in enumerate(i for i in used if i != _NEW_KEY)}
        if used[0] == _NEW_KEY:
            index = {old: (i if i < place else i + 1) for old, i in index.items()}
            index[_NEW_KEY] = place
        raw["K"] = new_table
        for holder, slot in refs:
            holder[slot] = index[holder[slot]]
        record = self._record(plan, record_id, fields, None) if exist[1] != "delete" else None
        return TextFold((compact_json if floats else floatless_json)(raw), record, fields)

    def _insert_text(self, op: Operation, record_id: str) -> TextFold | None:
        """`apply_to_text` of the insert of a record with no state: what ``apply`` makes of it in a new
        `RecordState`, as `to_json` (its one-operation form) and ``materialize`` write it."""
        return self.insert_fold(op, record_id, encode=True)

    def insert_fold(self, op: Operation, record_id: str, *, encode: bool = False) -> TextFold | None:
        """`apply_to_text` of the insert of a record with no state; its text is "" unless ``encode`` (for a
        store that keeps such a state as a reference to the operation). None outside the common case."""
        plan = self._plans.get(op.collection)
        if op.causal_context is not None and plan is not None and op.type == "insert" and encode:
            made = self._vector_insert_document(plan, op)
            if made is not None:  # the canonical text, built directly
                return TextFold(compact_json(made), self._record(plan, record_id, made["f"], None), made["f"])
            # The general fold, on a new state (its text is the canonical one).
            state = RecordState()
            self.apply(state, op, want_conflicts=False)
            return TextFold(
                state.to_json() if encode else "",
                self._record(plan, record_id, state.fields, state),
                state.fields,
            )
        deps = list(op.causal_deps)
        ts = op.timestamp
        wall, logical, node = ts.wall_time, ts.logical, ts.node_id
        if (
            plan is None
            or op.type != "insert"
            or op.id in deps
            or type(wall) is not int
            or type(logical) is not int
            or type(node) is not str
        ):
            return None
        kinds = plan.kinds
        registers: dict[str, dict[str, Any]] = {}
        for name, value in self.op_fields(op).items():
            kind = kinds[name]
            if kind == "lww":
                registers[name] = {"k": 0, "v": value, "lk": 0}
            elif kind == "counter":
                registers[name] = {"n": 0, "d": 1, "k": 0, "v": value, "lk": 0}
            elif kind == "union" and not value:
                registers[name] = {"a": {}, "r": {}, "v": {}, "lk": 0}
            else:
                return None
        record = self._record(plan, record_id, registers, None)
        text = (
            compact_json(
                {"g": [[op.id, deps, wall, logical, node]], "e": [0, "insert"], "i": True, "f": registers}
            )
            if encode
            else ""
        )
        return TextFold(text, record, registers)

    def state_of(self, ops: Iterable[Operation]) -> RecordState:
        """The state ``ops`` make of a record with none (any order gives the same result); how a state kept
        as a reference to its one operation is read back.

        Folded in their clock's order, whatever order they come in: causal order, so each node's numbers
        come up one by one and the prefix takes them (in another order, such as the log's by id, the numbers
        beyond it made thousands of runs, each number looked through them all)."""
        state = RecordState()
        seen: set[str] = set()  # the set of operations: a repeat beyond the state's window is one too
        for op in sorted(ops, key=_clock_order):
            if op.id not in seen:
                seen.add(op.id)
                self.apply(state, op, want_conflicts=False)
        return state

    def fold(self, collection: str, record_id: str, ops: Iterable[Operation]) -> tuple[RecordState, Any]:
        """Build a record's state from scratch (any order of ``ops`` gives the same result)."""
        state = self.state_of(ops)
        return state, self.materialize(collection, record_id, state)


def _clock_order(op: Operation) -> tuple[int, int, str, str]:
    ts = op.timestamp
    return (ts.wall_time, ts.logical, ts.node_id, op.id)


#: The gaps in one node's numbers a record's state takes (each keeps a run of the numbers after it, "x"): a
#: gap comes from a number the server refused while the node's later writes were on their way, so a few
#: at most; a client skipping numbers at will (its causal context is its own to write) would otherwise grow
#: the state by a run a write. The server refuses a write that would open one more.
MAX_GAPS = 16

#: A windowed state (see "Bounded state") holds at most this many operations of its causal graph...
WINDOW_MAX = 16
#: ...and a trim leaves this many: the heads and the latest others. More than one: a state whose graph holds
#: one operation is what that operation makes of an empty state (the local store keeps such a state as a
#: reference to its operation).
WINDOW_KEEP = 12


def trim_window(graph: dict[str, list[str]], keep: int = WINDOW_KEEP) -> None:
    """Drop the oldest operations of ``graph`` (in the order it received them) until ``keep`` remain, never
    a head (an operation no other held one depends on: the causal deps of the next local write)."""
    referenced = {dep for deps in graph.values() for dep in deps}
    excess = len(graph) - keep
    if excess <= 0:
        return
    old = [op_id for op_id in graph if op_id in referenced]
    for op_id in old[:excess]:
        del graph[op_id]


@dataclass(slots=True)
class TextFold:
    """`MergeEngine.apply_to_text`'s result: the new state text, the record (None: it does not exist) and
    the state's registers (read-only; rich text rows take their document from them)."""

    text: str
    record: dict[str, Any] | None
    fields: dict[str, dict[str, Any]]


#: `MergeEngine.apply_to_text`: the state holds this operation already (compared by identity).
REPEATED = TextFold("", None, {})
_COMPACT_KEYS = ("g", "e", "i", "f")
#: The keys of a state text of operations with a causal context, in their canonical (sorted) order.
_VECTOR_KEYS = ("K", "c", "e", "f", "g", "h", "i", "p", "x")
#: `_fold_vector_update`: a key slot referring to the folded operation's key (not yet in the table).
_NEW_KEY = -1
#: Values whose compact JSON text is canonical as it is (no object keys to sort).
_SCALARS = frozenset({str, int, float, bool, type(None)})


@dataclass(slots=True)
class _WireStamp:
    """The timestamp fields `_vector_insert_document` reads, from a wire form (`wire_insert_text`)."""

    wall_time: Any
    logical: Any
    node_id: Any


@dataclass(slots=True)  # (not frozen: a frozen dataclass's __init__ was a third of `wire_insert_text`)
class _WireInsert:
    """The fields of an insert that `_vector_insert_document` (and `op_fields`) read, taken from its wire
    form as they are (`wire_insert_text` checked them): standing in for the decoded `Operation`."""

    id: str
    node_id: str
    collection: str
    schema_version: int
    causal_context: dict[str, Any]
    timestamp: _WireStamp
    data: dict[str, Any]
    type: str = "insert"
    previous_data: None = None


_FRESH: Any = object()


def _initial(descriptor: FieldDescriptor) -> Any:
    if descriptor.type == "richtext":
        return ""
    if descriptor.has_default:
        return thaw(descriptor.default_value)
    return None


def _drop_removed_additions(names: list[str], state: RecordState) -> None:
    """Forget the additions of add-wins sets that a removal has seen, after each fold.

    Whether a removal has seen an addition only changes from no to yes (a causal past only grows), so an
    addition once removed stays removed: keeping it would only make every later materialisation check it
    against the removals again (which made a set with many removed elements quadratic). Removals are kept:
    an addition that arrives after a removal that had seen it (out of causal order) is judged by them."""
    for name in names:
        reg = state.fields.get(name)
        if not reg or not reg.get("r") or type(reg.get("a")) is not dict:
            continue
        added, removed, values = reg["a"], reg["r"], reg["v"]
        closures: dict[str, set[str]] = {}
        for ek in [ek for ek in added if ek in removed]:
            additions = added[ek]
            for add_id in list(additions):
                for rem_id in removed[ek]:
                    closure = closures.get(rem_id)
                    if closure is None:
                        closure = closures[rem_id] = state.ancestors(rem_id)
                    if add_id in closure:
                        del additions[add_id]
                        break
            if not additions:
                del added[ek]
                values.pop(ek, None)


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


def _add_dot(state: RecordState, op_id: str, node: str, number: int, context: Mapping[str, int]) -> None:
    """Hold the operation ``op_id``, numbered ``number`` among ``node``'s writes, with its causal context."""
    clock = state.clock
    if number == clock.get(node, 0) + 1 and not state.extra:
        clock[node] = number  # (the usual case: the next number, nothing held beyond)
    else:
        state.extra = _whole_runs(clock, [*state.extra, [node, number]])
    past = state.past
    for other, count in context.items():
        seen = count - 1 if other == node else count  # its past: its own number is not
        if seen > past.get(other, 0):
            past[other] = seen
    tips = state.tips
    for tip, (tip_node, tip_number) in list(tips.items()):
        if past.get(tip_node, 0) >= tip_number:
            del tips[tip]
    if past.get(node, 0) < number:
        tips[op_id] = [node, number]


def _held_beyond(extra: list[list[Any]], node: str, number: int) -> bool:
    """Is ``number`` of ``node`` among the dots held beyond the prefix (``extra``, runs; see `_whole_runs`)?"""
    return any(dot[0] == node and dot[1] <= number <= dot[-1] for dot in extra)


def _whole_runs(clock: dict[str, int], extra: list[list[Any]]) -> list[list[Any]]:
    """The numbers held beyond each node's prefix (``extra``, entries of any shape) as a state keeps them:
    whole runs, [node, first, last] (a lone number [node, number]), sorted, none joining its node's prefix
    (``clock`` takes those in). Whole and sorted, so the text is a function of the held set.

    Beyond the prefix means a number is missing below: one in transit, or one the server refused, which no
    replica will ever hold. After a refusal every later write of that node to the record lands here, so
    the state grows with the holes, not with the writes. Works on the runs' ends, so its cost follows the
    entries, not the numbers they stand for; a text written before runs lists each number alone."""
    runs: dict[str, list[tuple[int, int]]] = {}
    for dot in extra:
        runs.setdefault(dot[0], []).append((dot[1], dot[-1]))
    out: list[list[Any]] = []
    for node in sorted(runs):
        held = clock.get(node, 0)
        merged: list[list[int]] = []
        for first, last in sorted(runs[node]):
            if not merged and first <= held + 1:
                held = clock[node] = max(held, last)  # joins the prefix
            elif merged and first <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        out.extend([node, first] if first == last else [node, first, last] for first, last in merged)
    return out


def _first_dot(state: RecordState, op_id: str, node: str, number: int, context: Mapping[str, int]) -> None:
    """`_add_dot` into a state that holds no operation with a causal context yet (every local insert's
    fold): nothing to merge with, so the same result without its lookups (``past`` in the context's order,
    as `_add_dot` fills it)."""
    if number == 1:
        state.clock[node] = 1
    else:
        state.extra.append([node, number])
    state.past = {
        other: seen for other, count in context.items() if (seen := count - 1 if other == node else count) > 0
    }
    state.tips[op_id] = [node, number]


def _seen(state: RecordState, earlier: OpKey, later: OpKey, later_context: Mapping[str, int] | None) -> bool:
    """Had the write with key ``later`` (and causal context ``later_context``) seen the one with key
    ``earlier``? Keys of operations with a causal context carry their number (a fifth item)."""
    if len(later) == 5:
        if len(earlier) == 4:
            return True  # an operation without a context is older than any with one (see "Bounded state")
        assert later_context is not None
        return bool(later_context.get(earlier[2], 0) >= earlier[4])
    if len(earlier) == 5:
        return False  # an operation without a context never saw one with
    return state.is_ancestor(earlier[3], later[3])


def _removed_by_summary(reg: dict[str, Any], ek: str, key: OpKey) -> bool:
    """Had a removal of element ``ek`` with a causal context seen the addition with key ``key``?"""
    summary = reg.get("m")
    if not summary or ek not in summary:
        return False
    if len(key) == 5:
        return bool(summary[ek].get(key[2], 0) >= key[4])
    latest = (reg.get("mk") or {}).get(ek)
    return latest is not None and key < latest


def _summarise_removal(
    reg: dict[str, Any], state: RecordState, ek: str, context: Mapping[str, int], key: OpKey
) -> None:
    """Fold a removal of ``ek`` with a causal context: its context joins the element's removal vector ("m",
    the pointwise maximum; and "mk", the latest such removal's key, while the record holds operations
    without a context), and the additions it had seen go."""
    vector = reg.setdefault("m", {}).setdefault(ek, {})
    for node, count in context.items():
        if count > vector.get(node, 0):
            vector[node] = count
    if state.graph:
        latest = reg.setdefault("mk", {})
        if ek not in latest or key > latest[ek]:
            latest[ek] = key
    additions = reg["a"].get(ek)
    if additions:
        for add_id, order in list(additions.items()):
            if _removed_by_summary(reg, ek, order[:-1]):
                del additions[add_id]
        if not additions:
            del reg["a"][ek]
            reg["v"].pop(ek, None)


def _forget_settled_removals(names: list[str], state: RecordState) -> None:
    """Drop from add-wins sets' removal vectors what every future addition is beyond: a count the clock
    covers (all those operations are held, so none can still arrive); an element whose vector is left
    empty is forgotten. Only while the record holds no operation without a context."""
    clock = state.clock
    for name in names:
        reg = state.fields.get(name)
        summary = reg.get("m") if reg else None
        if not summary:
            continue
        assert reg is not None
        for ek in list(summary):
            vector = summary[ek]
            for node in [node for node, count in vector.items() if count <= clock.get(node, 0)]:
                del vector[node]
            if not vector:
                del summary[ek]
        if not summary:
            del reg["m"]
            reg.pop("mk", None)


def _write_covered(reg: dict[str, Any], state: RecordState, key: OpKey) -> bool:
    """Had another write of this Tier 3 field seen the write with key ``key``?"""
    if len(key) == 5:
        return bool((reg.get("pv") or {}).get(key[2], 0) >= key[4])
    latest = reg.get("pk")
    if latest is not None and key < latest:
        return True
    return any(key[3] in state.ancestors(other) for other in reg.get("lw") or () if other != key[3])


def _add_resolver_write(
    reg: dict[str, Any], state: RecordState, op: Operation, key: OpKey, value: Any, base: Any
) -> None:
    """Fold a write of a Tier 3 field: the field keeps its heads (the writes no other had seen) and what
    tells whether a write arriving later had been seen: the pointwise maximum of its writes' past vectors
    ("pv") and the latest one's key ("pk"), and the ids of its writes without a context ("lw")."""
    context = op.causal_context
    if context is None:
        written = reg.setdefault("lw", [])
        written.append(op.id)
        written.sort()
    else:
        past = reg.setdefault("pv", {})
        for node, count in context.items():
            seen = count - 1 if node == op.node_id else count
            if seen > past.get(node, 0):
                past[node] = seen
        latest = reg.get("pk")
        if latest is None or key > latest:
            reg["pk"] = key
    heads = [*reg.get("h", ()), [key, value, base]]
    reg["h"] = sorted((h for h in heads if not _write_covered(reg, state, h[0])), key=lambda h: h[0])


def _upgrade_resolver(reg: dict[str, Any], state: RecordState) -> None:
    """A Tier 3 register stored with all its writes ("w", before heads): its heads and its writes' ids."""
    writes = reg.pop("w")
    reg["lw"] = sorted(w[0][3] for w in writes)
    reg["h"] = sorted((w for w in writes if not _write_covered(reg, state, w[0])), key=lambda w: w[0])


__all__ = ["REPEATED", "Conflict", "MergeEngine", "RecordState", "TextFold"]
