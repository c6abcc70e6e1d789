"""Value normalisation shared by every replica, so equal values are equal byte for byte everywhere."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from offline.core.fields import FieldDescriptor, value_problem
from offline.core.frozen import FrozenDict, thaw
from offline.core.hlc import serialize_timestamp
from offline.core.json_text import ORJSON, c_compact_encoder
from offline.core.operations import Operation, encode_value, received_text

#: An operation's total-order key: HLC (wall, logical, node) then id. Lists, not strings, because
#: node ids differ in length and a concatenated string would not sort like HybridLogicalClock.compare.
OpKey = list[Any]

_SAFE = 2**53


def _make_compact_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, separators=(",", ":"), ensure_ascii=False)``, with the C encoder built once.

    ``json.dumps`` with non-default options constructs a JSONEncoder, and the encoder builds its C
    iterencoder, on every call; the state and the wire text of every operation pass through here.
    """
    public = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    sample = {"b": [1, 2.5, None, True, False, "\u00e9\n\x01\u2028", float("nan")], "a": {"z": -3}}
    return c_compact_encoder(json.JSONEncoder().default, public, sample)


#: Compact JSON text, identical to ``json.dumps(value, separators=(",", ":"), ensure_ascii=False)``.
compact_json: Callable[[Any], str] = _make_compact_encoder()


def _make_floatless_json() -> Callable[[Any], str]:
    """`compact_json` for a tree of dicts with str keys, lists, str, int, bool and None (no float): on
    orjson when installed, which writes those byte for byte the same (it writes floats in exponent form
    differently: "1e-7" for "1e-07"), several times faster (~1 us vs ~12 for a vector state of two fields).
    What orjson refuses (an integer past 64 bits, a lone surrogate, nesting past its limit) raises
    TypeError and takes `compact_json`."""
    fast = ORJSON
    if fast is None:  # pragma: no cover - Pyodide, or OFFLINE_NO_ORJSON
        return compact_json
    dumps = fast.dumps

    def encode(value: Any) -> str:
        try:
            text: str = dumps(value).decode()
        except TypeError:
            return compact_json(value)
        return text

    sample = {
        "b": [1, -(2**63), 2**64 - 1, None, True, False, '\u00e9\n\x01\x7f\u2028\U0001f600"\\'],
        "a": {"z": []},
    }
    return encode if encode(sample) == compact_json(sample) else compact_json


floatless_json: Callable[[Any], str] = _make_floatless_json()

# The scalars `floatless_json` writes as `compact_json` does (exact types: a subclass may write otherwise).
_FLOATLESS_SCALARS: frozenset[type] = frozenset((str, int, bool, type(None)))


def is_floatless(value: Any) -> bool:
    """Is ``value`` a tree `floatless_json` may write: dicts, lists and tuples of str, int, bool and None?
    A float, or any other type, says no (`compact_json` writes it, or refuses it, as before)."""
    kind = type(value)
    if kind in _FLOATLESS_SCALARS:
        return True
    if kind is dict:
        items: Any = value.values()
    elif kind is list or kind is tuple:
        items = value
    else:
        return False
    for item in items:  # noqa: SIM110 - a loop, not all() over a generator: once per local write
        if type(item) not in _FLOATLESS_SCALARS and not is_floatless(item):
            return False
    return True


def _encode_default(value: Any) -> Any:
    """What the wire encoder does with a value JSON has no form for: ``encode_value``'s conversions (a
    FrozenDict or other mapping, bytes), else the error ``json`` raises."""
    if type(value) is FrozenDict:
        return value._data
    if isinstance(value, (bytes, bytearray, memoryview, Mapping)):
        return encode_value(value)
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


def _make_wire_encoder() -> Callable[[Any], str]:
    """``compact_json(encode_value(value))`` in one pass: the C encoder writes tuples as arrays already, and
    reaches the default above for FrozenDicts and bytes, so nothing is copied first."""

    def slow(value: Any) -> str:
        return compact_json(encode_value(value))

    sample: FrozenDict[str, Any] = FrozenDict(
        {"b": (1, 2.5, None, True, b"\x00\xff", FrozenDict({"z": (-3,)})), "a": {"\u00e9": float("nan")}}
    )
    return c_compact_encoder(_encode_default, slow, sample)


#: ``compact_json(encode_value(value))``, byte for byte, in one pass (FrozenDicts and bytes as the wire writes them).
value_json: Callable[[Any], str] = _make_wire_encoder()


def wire_json(op: Operation) -> str:
    """The operation's compact wire text: ``compact_json(op.to_wire())``, byte for byte, without building the
    plain copy of its data first."""
    ts = op.timestamp
    wire = {
        "id": op.id,
        "nodeId": op.node_id,
        "type": op.type,
        "collection": op.collection,
        "recordId": op.record_id,
        "data": op.data,
        "previousData": op.previous_data,
        "timestamp": {"wallTime": ts.wall_time, "logical": ts.logical, "nodeId": ts.node_id},
        "sequenceNumber": op.sequence_number,
        "causalDeps": op.causal_deps,
        "schemaVersion": op.schema_version,
    }
    if op.causal_context is not None:
        wire["causalContext"] = op.causal_context
    return value_json(wire)


def operation_text(op: Operation) -> str:
    """The operation's compact wire text: the text it was received as when that was kept, else `wire_json`.

    Both read back (``Operation.from_wire(json.loads(text))``) as this operation; they can differ only in
    the order of the operation's own keys, as the writer's encoder chose it (its data keeps the writer's
    order either way). A server stores and relays the text it received instead of encoding every operation
    again.
    """
    text = received_text(op)
    return wire_json(op) if text is None else text


def op_key(op: Operation) -> OpKey:
    ts = op.timestamp
    return [ts.wall_time, ts.logical, ts.node_id, op.id]


def op_key_str(op: Operation) -> str:
    return f"{serialize_timestamp(op.timestamp)}|{op.id}"


def norm_number(value: Any) -> Any:
    # JSON (and every JavaScript peer) has one number type: 2.0 and 2 are the same value, so replicas
    # must not disagree on which spelling they keep. Integral floats become ints; -0.0 becomes 0.
    if isinstance(value, float) and value.is_integer() and abs(value) <= _SAFE:
        return int(value)
    return value


def normalize(descriptor: FieldDescriptor, value: Any) -> Any:
    """The canonical in-memory form of a field value (lists, ints for integral numbers)."""
    if value is None:
        return None
    kind = descriptor.type
    if kind == "number":
        return norm_number(value)
    if kind == "boolean":
        return bool(value)
    if kind == "timestamp":
        return int(value)
    if kind == "array":
        inner = descriptor.inner
        assert inner is not None
        return [normalize(inner, item) for item in value]
    if isinstance(value, (Mapping, list, tuple)):
        return thaw(value)
    return value


def fits(descriptor: FieldDescriptor, value: Any) -> bool:
    """Does a (thawed, non-null) value from an operation fit the field? Judged from the value and schema only,
    so every replica ignores the same values (a remote peer can send anything)."""
    if descriptor.type == "timestamp" and isinstance(value, float) and value.is_integer():
        value = int(value)
    return value_problem(descriptor, value) is None


def element_key(value: Any) -> str:
    """Identity of a set element: its canonical JSON text."""
    return json.dumps(norm_number(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fraction_to_number(numerator: int, denominator: int) -> int | float:
    if denominator == 1:
        return numerator
    value = numerator / denominator
    return norm_number(value) if math.isfinite(value) else value
