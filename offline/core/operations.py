"""Immutable, content-addressed operations (SPEC 2.8, DESIGN.md section 3).

An operation's id is the SHA-256 of the RFC 8785 canonical JSON of the fields that define *what happened*
(type, collection, recordId, data, timestamp, nodeId, and causalContext when the operation carries one).
Every replica recomputes it on receipt, so an id doubles as an integrity check and as the key that makes
re-delivery idempotent. The bookkeeping fields (previousData, sequenceNumber, causalDeps, schemaVersion) are
deliberately outside the hash.

``causalContext`` (`Operation.causal_context`) is the record's version vector as the writer held it: for
each node, how many of that node's operations on this record it had folded (a contiguous prefix), the
writing node's own count including this operation (so ``causal_context[node_id]`` numbers the operation among
its node's writes to the record). The merge engine decides "had this write seen that one" from it without
the record's causal graph (see offline/merge/engine.py, "Bounded state"). It decides merge results, so it is
hashed: a relay cannot alter it. Operations written before it existed have none (None, no wire key, the
same id as before) and are merged as they always were.

Bytes values inside ``data`` travel (and are hashed) as ``{"__offline_bytes__": <standard base64>}``;
that key is therefore reserved and refused in user data.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from .canonical import canonical_operation_payload, quoted_name
from .errors import INVALID_OPERATION, OfflineError
from .frozen import FrozenDict, adopt, freeze
from .hlc import MAX_LOGICAL, MAX_WALL_TIME, HLCTimestamp, serialize_timestamp
from .json_text import exact_loads

__all__ = [
    "BYTES_MARKER",
    "CONTEXT_WIRE_KEYS",
    "MAX_SAFE_INTEGER",
    "OPERATION_TYPES",
    "WIRE_KEYS",
    "Operation",
    "OperationType",
    "compute_operation_id",
    "create_operation",
    "decode_value",
    "encode_value",
    "keep_received_text",
    "plain_wire_keys",
    "received_text",
    "verify_operation",
]

OperationType = Literal["insert", "update", "delete"]
OPERATION_TYPES: Final[tuple[str, ...]] = ("insert", "update", "delete")

#: Reserved key of the wire/hash encoding of bytes.
BYTES_MARKER: Final = "__offline_bytes__"
#: Integers beyond this lose precision as JSON numbers in JavaScript peers, and RFC 8785 refuses them.
MAX_SAFE_INTEGER: Final = 2**53 - 1
# Nesting limit for data values: every layer (validation, canonical JSON, freeze) recurses, and Pyodide's
# stack is far shallower than CPython's, so hostile input must be refused before it can exhaust it.
_MAX_DEPTH: Final = 64

# Python attribute name -> wire name; both spellings are accepted on input.
_WIRE_NAMES: Final = {
    "node_id": "nodeId",
    "type": "type",
    "collection": "collection",
    "record_id": "recordId",
    "data": "data",
    "previous_data": "previousData",
    "timestamp": "timestamp",
    "sequence_number": "sequenceNumber",
    "causal_deps": "causalDeps",
    "schema_version": "schemaVersion",
    "causal_context": "causalContext",
}
_MISSING: Final = object()
# Exact types that are JSON scalars as they are (subclasses take the generic, isinstance-based paths).
_SCALAR_TYPES: Final = frozenset({str, int, float, bool, type(None)})
_isfinite: Final = math.isfinite


def _error(field: str, message: str, **context: Any) -> OfflineError:
    return OfflineError(f"operation {field}: {message}", INVALID_OPERATION, {"field": field, **context})


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


# --------------------------------------------------------------------------------------------- bytes codec


def encode_value(value: Any) -> Any:
    """Plain JSON-ready copy of ``value``: mappings -> dict, sequences -> list, bytes -> the bytes marker.

    Already-encoded markers pass through unchanged, so encoding is idempotent.
    """
    # Exact-type fast paths first (this runs for every stored and hashed operation); they give the same
    # result as the generic isinstance-based code below, which handles everything else.
    kind = type(value)
    if kind in _SCALAR_TYPES:
        return value
    if kind is FrozenDict or kind is dict:
        items = value._data.items() if kind is FrozenDict else value.items()
        return {k: v if type(v) in _SCALAR_TYPES else encode_value(v) for k, v in items}
    if kind is tuple or kind is list:
        return [v if type(v) in _SCALAR_TYPES else encode_value(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {BYTES_MARKER: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {k: encode_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    return value


def _decode(value: Any, field: str, path: str) -> Any:
    if isinstance(value, Mapping):
        if BYTES_MARKER in value and len(value) == 1:
            encoded = value[BYTES_MARKER]
            if isinstance(encoded, str):
                try:
                    raw = base64.b64decode(encoded, validate=True)
                except (binascii.Error, ValueError):
                    raw = None
                # Only the canonical spelling is accepted: two spellings of the same bytes would let a
                # relay alter an operation's wire form without changing its id.
                if raw is not None and base64.b64encode(raw).decode("ascii") == encoded:
                    return raw
            raise _error(field, f"invalid bytes encoding at {path}", path=path, reason="INVALID_BYTES")
        return {k: _decode(v, field, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_decode(v, field, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def decode_value(value: Any) -> Any:
    """Inverse of ``encode_value``: bytes markers become ``bytes``; everything else is copied as is."""
    return _decode(value, "data", "data")


# ------------------------------------------------------------------------------------------- validation


def _check_str(field: str, value: object) -> str:
    if type(value) is str and value and value.isascii():
        return value
    if not isinstance(value, str) or not value:
        raise _error(
            field,
            "must be a non-empty string",
            expected="non-empty string",
            received=_type_name(value) if not isinstance(value, str) else "empty string",
        )
    _check_utf8(field, value, field)
    return value


def _check_utf8(field: str, value: str, path: str) -> None:
    # Lone surrogates cannot be encoded as UTF-8, so the operation could never be hashed or sent.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _error(
            field, f"string at {path} is not valid Unicode", path=path, reason="INVALID_STRING"
        ) from None


def _check_value(field: str, value: Any, path: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise _error(field, f"nested deeper than {_MAX_DEPTH} levels at {path}", path=path, reason="TOO_DEEP")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise _error(
                field,
                f"integer at {path} is outside the safe range ±(2**53-1)",
                path=path,
                expected="safe integer",
                received=value,
            )
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _error(
                field, f"number at {path} is not finite", path=path, expected="finite number", received=value
            )
        return
    if isinstance(value, str):
        _check_utf8(field, value, path)
        return
    if isinstance(value, (bytes, bytearray)):
        return
    if isinstance(value, Mapping):
        _check_mapping(field, value, path, depth)
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(field, item, f"{path}[{i}]", depth + 1)
        return
    raise _error(
        field,
        f"unsupported value of type {type(value).__name__} at {path}",
        path=path,
        expected="null, boolean, number, string, bytes, list or object",
        received=type(value).__name__,
    )


def _check_mapping(field: str, value: Mapping[Any, Any], path: str, depth: int) -> None:
    for key, item in value.items():
        if not isinstance(key, str):
            raise _error(
                field,
                f"object key {key!r} at {path} is not a string",
                path=path,
                expected="string key",
                received=type(key).__name__,
            )
        if key == BYTES_MARKER:
            raise _error(
                field, f"key {BYTES_MARKER!r} at {path} is reserved", path=path, reason="RESERVED_KEY"
            )
        _check_utf8(field, key, path)
        _check_value(field, item, f"{path}.{key}", depth + 1)


def _check_record(field: str, value: object) -> tuple[FrozenDict[str, Any], dict[str, Any]]:
    """Validate a data record; return its frozen copy and its hash form (``encode_value`` of that copy)."""
    if not isinstance(value, Mapping):
        raise _error(field, "must be an object", expected="object", received=_type_name(value))
    if type(value) is dict or type(value) is FrozenDict:
        try:
            return _fast_mapping(value, 1)
        except _Unusual:
            pass
    _check_mapping(field, value, field, 1)
    frozen: FrozenDict[str, Any] = freeze(value)
    return frozen, encode_value(frozen)


# The fast path of _check_record: one walk that validates, freezes and encodes plain, common values
# (exact built-in types, nothing to report). Anything else raises _Unusual, and the complete walk above
# (_check_mapping, freeze, encode_value) then runs instead; it alone builds error paths and messages. So
# the fast path may only ever accept values that the complete walk accepts, with the same results.


class _Unusual(Exception):
    """Raised by the fast path for whatever it leaves to the complete validation walk."""


def _is_utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _fast_scalar(value: Any) -> bool:
    """True for a valid exact-type JSON scalar, False for a non-scalar; raise for an invalid scalar."""
    kind = type(value)
    if kind is str:
        valid = value.isascii() or _is_utf8(value)
    elif kind is int:
        valid = -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    elif kind is float:
        valid = _isfinite(value)
    else:
        return kind is bool or value is None
    if valid:
        return True
    raise _Unusual


def _fast_container(value: Any, depth: int) -> tuple[Any, Any]:
    """(frozen, hash form) of a non-scalar value found at ``depth``."""
    kind = type(value)
    if kind is dict or kind is FrozenDict:
        return _fast_mapping(value, depth)
    if kind is list or kind is tuple:
        return _fast_sequence(value, depth)
    if kind is bytes or kind is bytearray:
        return (value if kind is bytes else bytes(value)), encode_value(value)
    raise _Unusual


def _fast_mapping(value: Any, depth: int) -> tuple[FrozenDict[str, Any], dict[str, Any]]:
    """``value`` is an exact dict or FrozenDict found at ``depth``."""
    # The items sit one level deeper; stopping one level early is conservative but simple.
    if depth >= _MAX_DEPTH:
        raise _Unusual
    is_frozen = type(value) is FrozenDict
    items: dict[str, Any] = value._data if is_frozen else value
    frozen_changes: dict[str, Any] | None = None
    plain_changes: dict[str, Any] | None = None
    for key, item in items.items():
        if type(key) is not str or key == BYTES_MARKER or not (key.isascii() or _is_utf8(key)):
            raise _Unusual
        if _fast_scalar(item):
            continue
        frozen_item, plain_item = _fast_container(item, depth + 1)
        if frozen_item is not item:
            if frozen_changes is None:
                frozen_changes = {}
            frozen_changes[key] = frozen_item
        if plain_changes is None:
            plain_changes = {}
        plain_changes[key] = plain_item
    frozen: FrozenDict[str, Any]
    if is_frozen:
        frozen = value  # freeze() returns a FrozenDict as it is
    else:
        frozen = adopt(dict(items) if frozen_changes is None else {**items, **frozen_changes})
    # Always a fresh dict: the hash form must not share mutable containers with the caller's input.
    plain = dict(items) if plain_changes is None else {**items, **plain_changes}
    return frozen, plain


def _fast_sequence(value: list[Any] | tuple[Any, ...], depth: int) -> tuple[tuple[Any, ...], list[Any]]:
    if depth >= _MAX_DEPTH:
        raise _Unusual
    frozen_items: list[Any] | None = None
    plain = list(value)
    for index, item in enumerate(value):
        if _fast_scalar(item):
            continue
        frozen_item, plain[index] = _fast_container(item, depth + 1)
        if frozen_item is not item:
            if frozen_items is None:
                frozen_items = list(value)
            frozen_items[index] = frozen_item
    return tuple(value if frozen_items is None else frozen_items), plain


def _check_int(field: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _error(field, "must be an integer", expected="integer", received=_type_name(value))
    if not minimum <= value <= MAX_SAFE_INTEGER:
        raise _error(
            field, f"must be an integer >= {minimum}", expected=f"integer >= {minimum}", received=value
        )
    return value


def _check_timestamp(value: object) -> HLCTimestamp:
    if isinstance(value, HLCTimestamp):
        return value
    if value is None:
        raise _error("timestamp", "is required", expected="HLCTimestamp", received="null")
    try:
        return HLCTimestamp.from_wire(value)
    except OfflineError as exc:
        raise OfflineError(f"operation timestamp: {exc.message}", INVALID_OPERATION, exc.context) from None


def _check_deps(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise _error("causalDeps", "must be a list of strings", expected="list", received=_type_name(value))
    for i, dep in enumerate(value):
        if not isinstance(dep, str):
            raise _error(
                "causalDeps",
                f"item {i} must be a string",
                path=f"causalDeps[{i}]",
                expected="string",
                received=_type_name(dep),
            )
    return tuple(value)


def _check_context(value: object, node_id: str) -> FrozenDict[str, int] | None:
    """A causal context: node id -> count (a whole number >= 0), holding the writing node at >= 1."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _error("causalContext", "must be an object", expected="object", received=_type_name(value))
    for key, count in value.items():
        if not isinstance(key, str) or not key:
            raise _error("causalContext", "keys must be node ids", expected="non-empty string")
        _check_utf8("causalContext", key, "causalContext")
        if type(count) is not int or not 0 <= count <= MAX_SAFE_INTEGER:
            raise _error(
                "causalContext",
                f"count of node {key!r} must be a whole number >= 0",
                path=f"causalContext.{key}",
                expected="integer >= 0",
                received=count if isinstance(count, (int, float)) else _type_name(count),
            )
    if not value.get(node_id):
        raise _error(
            "causalContext",
            "must number the operation among its node's writes to the record (a count >= 1 for its nodeId)",
            reason="MISSING_OWN_COUNT",
        )
    return value if type(value) is FrozenDict else FrozenDict(dict(value))


def _get(source: Mapping[str, Any], name: str) -> Any:
    """Read ``name`` under its snake_case or its camelCase spelling."""
    wire = _WIRE_NAMES[name]
    snake = source.get(name, _MISSING)
    camel = source.get(wire, _MISSING) if wire != name else _MISSING
    if snake is not _MISSING and camel is not _MISSING and snake != camel:
        raise _error(wire, f"given as both {name!r} and {wire!r} with different values", reason="AMBIGUOUS")
    return snake if snake is not _MISSING else camel


def _require(source: Mapping[str, Any], name: str) -> Any:
    value = _get(source, name)
    if value is _MISSING:
        wire = _WIRE_NAMES[name]
        raise _error(wire, "is required", reason="MISSING", expected=wire)
    return value


def _check_source(source: object) -> Mapping[str, Any]:
    if not isinstance(source, Mapping):
        raise _error("input", "must be a mapping of operation fields", received=_type_name(source))
    return source


# ---------------------------------------------------------------------------------------------- hashing


def _content_id(
    type_: str,
    collection: str,
    record_id: str,
    data: Any,
    timestamp: HLCTimestamp,
    node_id: str,
    context: Mapping[str, int] | None = None,
) -> str:
    """Id of the given fields; ``data`` is already in hash form (``encode_value``'d)."""
    return _text_content_id(
        type_, collection, record_id, data, serialize_timestamp(timestamp), node_id, context
    )


def _plain_context(context: Mapping[str, int] | None) -> dict[str, int] | None:
    """``context`` as a plain dict, for reading only: an operation's own (a FrozenDict) without a copy."""
    if context is None or type(context) is dict:
        return context
    if type(context) is FrozenDict:
        return context._data  # read only: hashed, never changed nor handed on
    return dict(context)


def _text_content_id(
    type_: str,
    collection: str,
    record_id: str,
    data: Any,
    timestamp: str,
    node_id: str,
    context: Mapping[str, int] | None = None,
    context_text: str | None = None,
) -> str:
    """`_content_id` of a timestamp already serialized (and ``context``'s canonical text, when known)."""
    try:
        canonical = canonical_operation_payload(
            type_,
            collection,
            record_id,
            data,
            timestamp,
            node_id,
            _plain_context(context),
            context_text,
        )
    except ValueError as exc:
        # Only reachable for an Operation built directly, bypassing validation (e.g. holding NaN).
        raise _error("data", f"cannot be canonicalized: {exc}", reason="NOT_CANONICALIZABLE") from None
    return hashlib.sha256(canonical).hexdigest()


def compute_operation_id(op_or_fields: Operation | Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of the hashed fields.

    Accepts an ``Operation`` or a mapping in either spelling (an input dict or a wire dict; bytes may be raw
    or already encoded, both hash alike).
    """
    if isinstance(op_or_fields, Operation):
        op = op_or_fields
        data = encode_value(op.data)
        return _content_id(
            op.type, op.collection, op.record_id, data, op.timestamp, op.node_id, op.causal_context
        )
    source = _check_source(op_or_fields)
    data = _get(source, "data")
    data = None if data is _MISSING else data
    if data is not None:
        _, data = _check_record("data", _decode(data, "data", "data"))
    node_id = _check_str("nodeId", _require(source, "node_id"))
    context = _get(source, "causal_context")
    return _content_id(
        _check_type(_require(source, "type")),
        _check_str("collection", _require(source, "collection")),
        _check_str("recordId", _require(source, "record_id")),
        data,
        _check_timestamp(_require(source, "timestamp")),
        node_id,
        _check_context(None if context is _MISSING else context, node_id),
    )


def verify_operation(op: Operation | Mapping[str, Any]) -> bool:
    """True when ``op``'s id is the content hash of its fields (never raises for malformed input)."""
    try:
        given = op.id if isinstance(op, Operation) else _check_source(op).get("id")
        return isinstance(given, str) and given == compute_operation_id(op)
    except OfflineError:
        return False


def _check_type(value: object) -> str:
    if value not in OPERATION_TYPES or not isinstance(value, str):
        raise _error(
            "type",
            f"must be one of {', '.join(OPERATION_TYPES)}",
            expected=list(OPERATION_TYPES),
            received=value if isinstance(value, str) else _type_name(value),
        )
    return value


# -------------------------------------------------------------------------------------------- operation


@dataclass(frozen=True)
class Operation:
    """One immutable change to one record. Build with ``create_operation`` or ``Operation.from_wire``."""

    id: str
    node_id: str
    type: str
    collection: str
    record_id: str
    data: FrozenDict[str, Any] | None
    previous_data: FrozenDict[str, Any] | None
    timestamp: HLCTimestamp
    sequence_number: int
    causal_deps: tuple[str, ...] = ()
    schema_version: int = 1
    #: The record's version vector its writer held (see the module docstring); None for operations written
    #: before it existed.
    causal_context: FrozenDict[str, int] | None = None

    def __post_init__(self) -> None:
        # Direct construction must not leave a mutable dict or list reachable from a "frozen" operation.
        if self.data is not None and not isinstance(self.data, FrozenDict):
            object.__setattr__(self, "data", freeze(self.data))
        if self.previous_data is not None and not isinstance(self.previous_data, FrozenDict):
            object.__setattr__(self, "previous_data", freeze(self.previous_data))
        if not isinstance(self.causal_deps, tuple):
            object.__setattr__(self, "causal_deps", tuple(self.causal_deps))
        if self.causal_context is not None and not isinstance(self.causal_context, FrozenDict):
            object.__setattr__(self, "causal_context", FrozenDict(dict(self.causal_context)))

    def __hash__(self) -> int:
        # Equal operations share an id, and hashing the id avoids walking the whole data tree.
        return hash(self.id)

    def to_wire(self) -> dict[str, Any]:
        """The camelCase JSON form (plain dicts and lists, bytes encoded), ready for ``json.dumps``."""
        wire = {
            "id": self.id,
            "nodeId": self.node_id,
            "type": self.type,
            "collection": self.collection,
            "recordId": self.record_id,
            "data": encode_value(self.data),
            "previousData": encode_value(self.previous_data),
            "timestamp": self.timestamp.to_wire(),
            "sequenceNumber": self.sequence_number,
            "causalDeps": list(self.causal_deps),
            "schemaVersion": self.schema_version,
        }
        if self.causal_context is not None:
            wire["causalContext"] = dict(self.causal_context)
        return wire

    @classmethod
    def from_wire(cls, d: Mapping[str, Any], *, verify: bool = True) -> Operation:
        """Read and validate the wire form; with ``verify`` the id must equal the content hash."""
        if type(d) is dict and (d.keys() == WIRE_KEYS or d.keys() == CONTEXT_WIRE_KEYS):
            op = _from_plain_wire(d, verify)
            if op is not None:
                return op
        source = dict(_check_source(d))
        given_id = source.get("id")
        if not isinstance(given_id, str) or not given_id:
            raise _error("id", "must be a non-empty string", expected="string", received=_type_name(given_id))
        for name in ("data", "previous_data"):
            wire = _WIRE_NAMES[name]
            for key in {name, wire}:
                if key in source and source[key] is not None:
                    source[key] = _decode(source[key], wire, wire)
        op = _build(source, given_id if not verify else None)
        if verify and op.id != given_id:
            raise OfflineError(
                f"operation id: {given_id} does not match the content hash {op.id}",
                INVALID_OPERATION,
                {"field": "id", "reason": "HASH_MISMATCH", "expected": op.id, "received": given_id},
            )
        return op


#: The keys of an operation's wire form, all of them required (``previousData`` may be null)...
WIRE_KEYS: Final = frozenset({"id", *_WIRE_NAMES.values()} - {"causalContext"})
#: ...and of one carrying a causal context.
CONTEXT_WIRE_KEYS: Final = WIRE_KEYS | {"causalContext"}


def plain_wire_keys(raw: Any) -> bool:
    """Does ``raw`` (a decoded wire form) hold exactly an operation's wire keys?"""
    return type(raw) is dict and (raw.keys() == WIRE_KEYS or raw.keys() == CONTEXT_WIRE_KEYS)


# Key, in an operation's instance dict, of the compact wire text it was received as (not a dataclass field:
# not compared, not hashed, not carried by copies made with dataclasses.replace).
_RECEIVED_TEXT: Final = "_received_wire_text"


def keep_received_text(op: Operation, text: str) -> None:
    """Remember the compact wire text ``op`` was decoded from (see ``offline.merge.values.operation_text``).
    Only for a text that is the compact JSON of exactly ``op``'s wire fields, as ``protocol.decode_operation_text``
    makes sure."""
    op.__dict__[_RECEIVED_TEXT] = text


def received_text(op: Operation) -> str | None:
    """The text `keep_received_text` kept for ``op``, if any."""
    text: str | None = op.__dict__.get(_RECEIVED_TEXT)
    return text


def operation_from_text(text: str) -> Operation:
    """The operation a store kept as its compact wire text (not verified again: it was when it was taken in).

    The text is kept on the operation (`received_text`) when it holds exactly the wire fields, so storing the
    operation elsewhere (``app.apply`` on another replica) or sending it uses it instead of encoding it again.
    """
    raw = exact_loads(text)
    if raw is None:
        raw = json.loads(text)
    op = Operation.from_wire(raw, verify=False)
    if plain_wire_keys(raw):
        keep_received_text(op, text)
    return op


# Key, in an operation's instance dict, of its timestamp's serialized form when decoding computed it.
_TIMESTAMP_TEXT: Final = "_serialized_timestamp"


def timestamp_text(op: Operation) -> str:
    """``serialize_timestamp(op.timestamp)``, computed once for an operation decoded from the wire (its
    hash needed it already)."""
    text: str | None = op.__dict__.get(_TIMESTAMP_TEXT)
    return serialize_timestamp(op.timestamp) if text is None else text


_new_operation: Final = object.__new__
_new_timestamp: Final = object.__new__
_set_slot: Final = object.__setattr__


def _plain_timestamp(stamp: dict[str, Any]) -> HLCTimestamp | None:
    """The wire timestamp when its fields are exactly what ``HLCTimestamp`` accepts (else None): built
    without the dataclass ``__init__``, whose checks these are."""
    wall = stamp.get("wallTime")
    logical = stamp.get("logical")
    node = stamp.get("nodeId")
    if not (
        type(wall) is int
        and 0 <= wall <= MAX_WALL_TIME
        and type(logical) is int
        and 0 <= logical <= MAX_LOGICAL
        and type(node) is str
        and node
    ):
        return None
    timestamp: HLCTimestamp = _new_timestamp(HLCTimestamp)
    _set_slot(timestamp, "wall_time", wall)
    _set_slot(timestamp, "logical", logical)
    _set_slot(timestamp, "node_id", node)
    return timestamp


def _plain_str(value: object) -> bool:
    return type(value) is str and bool(value) and value.isascii()


def _plain_int(value: object, minimum: int) -> bool:
    return type(value) is int and minimum <= value <= MAX_SAFE_INTEGER


def _from_plain_wire(d: dict[str, Any], verify: bool) -> Operation | None:
    """``from_wire`` of the usual wire dict (exactly the wire keys, exact JSON types, no bytes), or None.

    One pass that validates, freezes and hashes, with nothing to report: whatever it does not accept as it
    is (any invalid field, a bytes marker, ...) returns None, and the complete path then decides, so errors
    are built (and worded) in one place only. Accepting means the complete path would accept the same
    operation, with the same fields.
    """
    given_id = d["id"]
    node_id = d["nodeId"]
    type_ = d["type"]
    collection = d["collection"]
    record_id = d["recordId"]
    stamp = d["timestamp"]
    sequence_number = d["sequenceNumber"]
    schema_version = d["schemaVersion"]
    deps = d["causalDeps"]
    if not (
        type(given_id) is str
        and given_id
        and _plain_str(node_id)
        and _plain_str(collection)
        and _plain_str(record_id)
        and _plain_int(sequence_number, 0)
        and _plain_int(schema_version, 1)
        and type(stamp) is dict
        and len(stamp) == 3
        and type(deps) is list
    ):
        return None
    for dep in deps:
        if type(dep) is not str:
            return None
    context = d.get("causalContext")
    context_text = None
    if context is not None:
        if type(context) is not dict or not context.get(node_id):
            return None
        for key, count in context.items():
            if not (
                type(key) is str
                and key
                and key.isascii()
                and type(count) is int
                and 0 <= count <= MAX_SAFE_INTEGER
            ):
                return None
        if len(context) == 1:
            # Checked above: an ASCII key and a safe whole number, so this is its canonical text (the usual
            # context, an insert's); the id's payload need not check and encode it again.
            context_text = f"{{{quoted_name(key)}:{count}}}"
        context = FrozenDict(context)
    raw_data = d["data"]
    raw_previous = d["previousData"]
    try:
        if type_ == "delete":
            if raw_data is not None:
                return None
            data = hashed = None
        elif (type_ == "insert" or type_ == "update") and type(raw_data) is dict:
            # A bytes marker is a key _fast_mapping refuses: such data takes the complete path.
            data, hashed = _fast_mapping(raw_data, 1)
        else:
            return None
        if raw_previous is None:
            if type_ == "update":
                return None
            previous = None
        elif type(raw_previous) is dict:
            previous = _fast_mapping(raw_previous, 1)[0]
        else:
            return None
    except (_Unusual, KeyError, OfflineError):
        return None
    timestamp = _plain_timestamp(stamp)
    if timestamp is None:
        return None
    stamp_text = serialize_timestamp(timestamp)
    if verify:
        op_id = _text_content_id(
            type_, collection, record_id, hashed, stamp_text, node_id, context, context_text
        )
        if op_id != given_id:
            return None  # the complete path raises the mismatch
    else:
        op_id = given_id
    # The fields are checked and frozen already: skip the dataclass __init__/__post_init__.
    op: Operation = _new_operation(Operation)
    op.__dict__.update(
        id=op_id,
        node_id=node_id,
        type=type_,
        collection=collection,
        record_id=record_id,
        data=data,
        previous_data=previous,
        timestamp=timestamp,
        sequence_number=sequence_number,
        causal_deps=tuple(deps),
        schema_version=schema_version,
        causal_context=context,
        **{_TIMESTAMP_TEXT: stamp_text},
    )
    return op


def _build(source: Mapping[str, Any], given_id: str | None) -> Operation:
    node_id = _check_str("nodeId", _require(source, "node_id"))
    type_ = _check_type(_require(source, "type"))
    collection = _check_str("collection", _require(source, "collection"))
    record_id = _check_str("recordId", _require(source, "record_id"))

    raw_data = _get(source, "data")
    raw_data = None if raw_data is _MISSING else raw_data
    raw_previous = _get(source, "previous_data")
    raw_previous = None if raw_previous is _MISSING else raw_previous

    data: FrozenDict[str, Any] | None
    hashed_data: dict[str, Any] | None
    if type_ == "delete":
        if raw_data is not None:
            raise _error("data", "must be null for a delete", expected="null", received=_type_name(raw_data))
        data = hashed_data = None
    else:
        if raw_data is None:
            raise _error("data", f"is required for an {type_}", expected="object", received="null")
        data, hashed_data = _check_record("data", raw_data)

    previous: FrozenDict[str, Any] | None
    if raw_previous is None:
        if type_ == "update":
            raise _error("previousData", "is required for an update", expected="object", received="null")
        previous = None
    else:
        previous, _ = _check_record("previousData", raw_previous)

    timestamp = _check_timestamp(_require(source, "timestamp"))
    sequence_number = _check_int("sequenceNumber", _require(source, "sequence_number"), 0)
    schema_version = _check_int("schemaVersion", _require(source, "schema_version"), 1)
    deps = _get(source, "causal_deps")
    causal_deps = _check_deps(None if deps is _MISSING else deps)
    raw_context = _get(source, "causal_context")
    context = _check_context(None if raw_context is _MISSING else raw_context, node_id)

    op_id = given_id or _content_id(type_, collection, record_id, hashed_data, timestamp, node_id, context)
    return Operation(
        id=op_id,
        node_id=node_id,
        type=type_,
        collection=collection,
        record_id=record_id,
        data=data,
        previous_data=previous,
        timestamp=timestamp,
        sequence_number=sequence_number,
        causal_deps=causal_deps,
        schema_version=schema_version,
        causal_context=context,
    )


def create_operation(input: Mapping[str, Any]) -> Operation:
    """Validate an operation input (snake_case or camelCase keys) and return it with its content id."""
    return _build(_check_source(input), None)
