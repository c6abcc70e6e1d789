"""The WebSocket sync protocol codec (DESIGN.md section 4)."""

from __future__ import annotations

import contextlib
import json
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offline import HLCTimestamp, OfflineError, Operation, create_operation
from offline.sync import protocol as P
from offline.sync.protocol import (
    BATCH_TOO_LARGE,
    HASH_MISMATCH,
    INVALID_OPERATION,
    MALFORMED_MESSAGE,
    MAX_BATCH_OPERATIONS,
    MAX_DEPTH,
    MAX_FRAME_DEPTH,
    MAX_MESSAGE_BYTES,
    MAX_OPERATION_BYTES,
    MESSAGE_TOO_LARGE,
    MESSAGE_TYPES,
    OPERATION_TOO_LARGE,
    PROTOCOL_VERSION,
    RETRIABLE_CODES,
    UNKNOWN_MESSAGE_TYPE,
    Acknowledgment,
    ErrorMessage,
    Handshake,
    HandshakeResponse,
    Message,
    OperationBatch,
    OperationMessage,
    OperationRejected,
    ProtocolError,
    RecordStates,
    decode,
    decode_operation,
    encode,
    from_dict,
    new_message_id,
)

SAFE = 2**53 - 1
TS = HLCTimestamp(1_700_000_000_000, 0, "node-1")

# ------------------------------------------------------------------------------------------ strategies

texts = st.text(st.characters(codec="utf-8"), max_size=20)
ids = st.text(st.characters(codec="utf-8"), min_size=1, max_size=P.MAX_ID_LENGTH)
counters = st.integers(0, SAFE)
positives = st.integers(1, SAFE)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-SAFE, SAFE)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
json_objects = st.dictionaries(texts, json_values, max_size=3)
version_vectors = st.dictionaries(ids, counters, max_size=3)


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(
        Handshake,
        message_id=ids,
        node_id=ids,
        version_vector=version_vectors,
        schema_version=positives,
        last_delivery_sequence=counters,
        auth_token=optional(texts),
        sync_scope=optional(json_objects),
        protocol_version=positives,
    ),
    st.builds(
        HandshakeResponse,
        message_id=ids,
        accepted=st.booleans(),
        node_id=ids,
        version_vector=version_vectors,
        schema_version=positives,
        server_time=counters,
        server_max_delivery_sequence=counters,
        accepted_scope=optional(json_objects),
        reject_reason=optional(texts),
        supported_schema_min=optional(positives),
        supported_schema_max=optional(positives),
    ),
    st.builds(
        OperationBatch,
        message_id=ids,
        operations=st.lists(json_objects, max_size=3).map(tuple),
        is_final=st.booleans(),
        batch_index=counters,
        base_delivery_sequence=optional(counters),
        max_delivery_sequence=optional(counters),
    ),
    st.builds(OperationMessage, message_id=ids, operation=json_objects, delivery_sequence=optional(counters)),
    st.builds(
        Acknowledgment,
        message_id=ids,
        acknowledged_message_id=ids,
        last_sequence_number=counters,
        delivery_sequence=optional(counters),
    ),
    st.builds(
        OperationRejected,
        message_id=ids,
        operation_id=texts.filter(bool),
        code=texts.filter(bool),
        message=texts,
        retriable=st.booleans(),
    ),
    st.builds(ErrorMessage, message_id=ids, code=texts.filter(bool), message=texts, retriable=st.booleans()),
)


def make_op(**overrides: Any) -> Operation:
    values: dict[str, Any] = {
        "node_id": "node-1",
        "type": "insert",
        "collection": "todos",
        "record_id": "rec-1",
        "data": {"title": "Buy milk", "done": False, "tags": ["a", "b"], "blob": b"\x00\x01"},
        "timestamp": TS,
        "sequence_number": 3,
        "schema_version": 1,
    }
    values.update(overrides)
    return create_operation(values)


def wire_op(**overrides: Any) -> dict[str, Any]:
    return make_op(**overrides).to_wire()


# One fully populated and one minimal example of every message type.
FULL: dict[str, Message] = {
    "handshake": Handshake(
        "m1",
        "client-1",
        {"client-1": 3, "server": 7},
        2,
        41,
        "token",
        {"ownerId": "u1"},
        initial_sync="states",
    ),
    "handshake-response": HandshakeResponse(
        "m2", True, "server", {"server": 9}, 2, 1_700_000_000_000, 99, {"ownerId": "u1"}, "x", 1, 3, "epoch-1"
    ),
    "operation-batch": OperationBatch("m3", (wire_op(),), False, 0, 10, 11),
    "operation": OperationMessage("m4", wire_op(), 12),
    "acknowledgment": Acknowledgment("m5", "m3", 4, 12),
    "operation-rejected": OperationRejected("m6", "abc", P.SCOPE_VIOLATION, "out of scope", False),
    "error": ErrorMessage("m7", P.OVERLOADED, "busy", True),
    "record-states": RecordStates(
        "m8",
        ({"collection": "items", "recordId": "r1", "state": '{"g":{}}', "versions": {"n": 3}},),
        True,
        40,
        38,
    ),
}
MINIMAL: dict[str, Message] = {
    "handshake": Handshake("m1", "client-1", {}, 1, 0),
    "handshake-response": HandshakeResponse("m2", False, "server", {}, 1, 0, 0),
    "operation-batch": OperationBatch("m3", (), True, 0),
    "operation": OperationMessage("m4", wire_op()),
    "acknowledgment": Acknowledgment("m5", "m3", 0),
    "operation-rejected": FULL["operation-rejected"],
    "error": FULL["error"],
    "record-states": RecordStates("m8", (), False),
}

# DESIGN.md section 4, table: every field of every message type, optional ones marked with "?".
DESIGN_FIELDS = {
    "handshake": "nodeId versionVector schemaVersion authToken? syncScope? lastDeliverySequence",
    "handshake-response": "accepted nodeId versionVector schemaVersion serverTime serverMaxDeliverySequence "
    "acceptedScope? rejectReason? supportedSchemaMin? supportedSchemaMax?",
    "operation-batch": "operations isFinal batchIndex baseDeliverySequence? maxDeliverySequence?",
    "operation": "operation",
    "acknowledgment": "acknowledgedMessageId lastSequenceNumber deliverySequence?",
    "operation-rejected": "operationId code message retriable",
    "error": "code message retriable",
    # Not in DESIGN.md's table: the state-based catch-up after a server compaction (see RecordStates).
    "record-states": "states isFinal horizon? through?",
}
# Fields beyond the DESIGN table: the handshake carries the protocol version and may ask for the state-based
# first sync, a streamed operation its delivery sequence (S->C), a restored server's answer its numbering of
# deliveries (see HandshakeResponse).
EXTRA_FIELDS = {
    "handshake": {"protocolVersion", "initialSync?"},
    "operation": {"deliverySequence?"},
    "handshake-response": {"deliveryEpoch?"},
}


def design_fields(type_: str) -> tuple[set[str], set[str]]:
    """(every field, required fields) of ``type_``."""
    names = set(DESIGN_FIELDS[type_].split()) | EXTRA_FIELDS.get(type_, set()) | {"type", "messageId"}
    return {n.rstrip("?") for n in names}, {n for n in names if not n.endswith("?")}


def reject(frame: Any, code: str = MALFORMED_MESSAGE, field: str | None = None, **kw: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(frame, **kw)
    assert info.value.code == code, info.value
    if field is not None:
        assert info.value.context is not None
        assert info.value.context["field"] == field, info.value.context
    return info.value


def frame_with(type_: str, **changes: Any) -> str:
    """The full example of ``type_`` as JSON, with fields changed (``...`` deletes a field)."""
    d = FULL[type_].to_dict()
    for key, value in changes.items():
        if value is ...:
            d.pop(key, None)
        else:
            d[key] = value
    return json.dumps(d)


# ----------------------------------------------------------------------------------- names, round trips


def test_message_types() -> None:
    assert set(MESSAGE_TYPES) == set(DESIGN_FIELDS)
    for type_, cls in MESSAGE_TYPES.items():
        assert type_ == cls.TYPE
        assert type(FULL[type_]) is cls
    assert PROTOCOL_VERSION == 1
    assert MAX_MESSAGE_BYTES == 4 * 1024 * 1024
    assert MAX_BATCH_OPERATIONS == 1000
    assert MAX_OPERATION_BYTES == 256 * 1024
    assert MAX_DEPTH == 64


@pytest.mark.parametrize("type_", sorted(DESIGN_FIELDS))
def test_wire_field_names_match_design(type_: str) -> None:
    every, required = design_fields(type_)
    full = FULL[type_].to_dict()
    assert set(full) == every
    assert full["type"] == type_
    minimal = MINIMAL[type_].to_dict()
    assert set(minimal) == required  # optional fields that are None are omitted
    assert None not in minimal.values()


def test_wire_values() -> None:
    assert json.loads(encode(FULL["handshake"])) == {
        "type": "handshake",
        "messageId": "m1",
        "nodeId": "client-1",
        "versionVector": {"client-1": 3, "server": 7},
        "schemaVersion": 2,
        "lastDeliverySequence": 41,
        "authToken": "token",
        "syncScope": {"ownerId": "u1"},
        "protocolVersion": 1,
        "initialSync": "states",
    }
    assert json.loads(encode(FULL["operation-batch"])) == {
        "type": "operation-batch",
        "messageId": "m3",
        "operations": [wire_op()],
        "isFinal": False,
        "batchIndex": 0,
        "baseDeliverySequence": 10,
        "maxDeliverySequence": 11,
    }
    assert json.loads(encode(FULL["error"])) == {
        "type": "error",
        "messageId": "m7",
        "code": "OVERLOADED",
        "message": "busy",
        "retriable": True,
    }


def test_encode_is_compact_text() -> None:
    text = encode(ErrorMessage("m", "X", "é ü", False))
    assert isinstance(text, str)
    assert text == '{"type":"error","messageId":"m","code":"X","message":"é ü","retriable":false}'


@pytest.mark.parametrize("type_", sorted(DESIGN_FIELDS))
def test_examples_round_trip(type_: str) -> None:
    for message in (FULL[type_], MINIMAL[type_]):
        assert decode(encode(message)) == message
        assert decode(encode(message).encode("utf-8")) == message
        assert from_dict(message.to_dict()) == message


@settings(max_examples=300, deadline=None)
@given(messages)
def test_round_trip(message: Message) -> None:
    text = encode(message)
    assert decode(text) == message
    assert decode(text.encode("utf-8")) == message
    assert encode(decode(text)) == text


@pytest.mark.parametrize(
    ("states", "field"),
    [
        ("nope", "states"),
        (["nope"], "states[0]"),
        ([{"collection": "items", "recordId": "r1", "versions": {}}], "states[0].state"),
        ([{"collection": "", "recordId": "r1", "state": "{}", "versions": {}}], "states[0].collection"),
        ([{"collection": "items", "recordId": "r1", "state": "{}", "versions": {"n": -1}}], "versions.n"),
    ],
)
def test_malformed_record_states_are_refused_naming_the_field(states: Any, field: str) -> None:
    reject(frame_with("record-states", states=states), field=field)


def test_batch_operations_become_a_tuple() -> None:
    batch = OperationBatch("m", [wire_op()], True, 0)  # type: ignore[arg-type]
    assert isinstance(batch.operations, tuple)


def test_handshake_protocol_version_defaults_to_1() -> None:
    message = decode(frame_with("handshake", protocolVersion=...))
    assert isinstance(message, Handshake)
    assert message.protocol_version == 1
    assert isinstance(decode(frame_with("handshake", protocolVersion=2)), Handshake)
    reject(frame_with("handshake", protocolVersion=0), field="protocolVersion")


def test_new_message_id() -> None:
    a, b = new_message_id(), new_message_id()
    assert a != b
    assert isinstance(a, str)
    assert 0 < len(a) <= P.MAX_ID_LENGTH


def test_encode_refuses_what_cannot_be_sent() -> None:
    with pytest.raises(ProtocolError) as info:
        encode(OperationMessage("m", {"x": float("nan")}))
    assert info.value.code == MALFORMED_MESSAGE
    with pytest.raises(ProtocolError):
        encode({"type": "error"})  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ ProtocolError


def test_protocol_error() -> None:
    err = ProtocolError(MALFORMED_MESSAGE, "bad", field="nodeId", context={"reason": "MISSING"})
    assert isinstance(err, OfflineError)
    assert err.code == MALFORMED_MESSAGE
    assert err.message == "bad"
    assert err.retriable is False
    assert err.context == {"field": "nodeId", "reason": "MISSING"}
    assert err.field == "nodeId"
    assert err.name == "OfflineError"
    for code in RETRIABLE_CODES:
        assert ProtocolError(code, "x").retriable is True
    assert ProtocolError(MALFORMED_MESSAGE, "x", True).retriable is True
    retriable = {P.OVERLOADED, P.SERVER_SHUTDOWN, P.INTERNAL_ERROR, P.RESYNC_REQUIRED, P.TOKEN_EXPIRED}
    assert retriable == RETRIABLE_CODES
    assert P.CONNECTION_ERROR_CODES.isdisjoint(P.OPERATION_ERROR_CODES)
    assert ProtocolError(P.OVERLOADED, "x").context == {"field": None}

    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is ProtocolError
    assert (copy.code, copy.message, copy.retriable, copy.context) == (
        err.code,
        err.message,
        err.retriable,
        err.context,
    )

    error = ProtocolError(P.OVERLOADED, "busy").to_error_message("e1")
    assert error == ErrorMessage("e1", P.OVERLOADED, "busy", True)
    rejection = ProtocolError(HASH_MISMATCH, "tampered").to_rejection("op1", "r1")
    assert rejection == OperationRejected("r1", "op1", HASH_MISMATCH, "tampered", False)
    assert ProtocolError(P.AUTH_FAILED, "no").to_error_message().message_id


# ----------------------------------------------------------------------------------------------- decode


@pytest.mark.parametrize(
    "frame",
    ["", " ", "null", "[]", '"handshake"', "1", "true", "{", '{"type": "error"', "[1,]", "{'a': 1}"],
)
def test_not_a_json_object(frame: str) -> None:
    reject(frame, field="frame")


def test_type_field() -> None:
    reject(frame_with("error", type=...), field="type")
    reject(frame_with("error", type=5), field="type")
    reject(frame_with("error", type=None), field="type")
    err = reject(frame_with("error", type="nope"), UNKNOWN_MESSAGE_TYPE, "type")
    assert err.context is not None
    assert err.context["messageId"] == "m7"
    assert err.retriable is False


@pytest.mark.parametrize("field", ["messageId", "nodeId"])
def test_id_fields(field: str) -> None:
    for bad in (..., None, "", "x" * 129, 5, True, ["a"], {"a": 1}, "\ud800"):
        reject(frame_with("handshake", **{field: bad}), field=field)
    message = decode(frame_with("handshake", **{field: "x" * 128}))
    assert isinstance(message, Handshake)
    reject(frame_with("acknowledgment", acknowledgedMessageId=""), field="acknowledgedMessageId")


@pytest.mark.parametrize(
    ("type_", "field"),
    [
        ("handshake", "schemaVersion"),
        ("handshake", "lastDeliverySequence"),
        ("handshake-response", "serverTime"),
        ("handshake-response", "serverMaxDeliverySequence"),
        ("handshake-response", "supportedSchemaMin"),
        ("operation-batch", "batchIndex"),
        ("operation-batch", "baseDeliverySequence"),
        ("operation-batch", "maxDeliverySequence"),
        ("operation", "deliverySequence"),
        ("acknowledgment", "lastSequenceNumber"),
        ("acknowledgment", "deliverySequence"),
    ],
)
def test_counter_fields(type_: str, field: str) -> None:
    for bad in (True, False, 1.0, 1.5, "1", -1, 2**53, 10**30, -(10**30), [1], {"a": 1}):
        reject(frame_with(type_, **{field: bad}), field=field)
    message = decode(frame_with(type_, **{field: SAFE}))
    assert SAFE in message.to_dict().values()
    _, required = design_fields(type_)
    if field in required:
        reject(frame_with(type_, **{field: ...}), field=field)
        reject(frame_with(type_, **{field: None}), field=field)
    else:
        assert field not in decode(frame_with(type_, **{field: None})).to_dict()
        assert field not in decode(frame_with(type_, **{field: ...})).to_dict()


def test_schema_versions_are_positive() -> None:
    reject(frame_with("handshake", schemaVersion=0), field="schemaVersion")
    reject(frame_with("handshake-response", schemaVersion=0), field="schemaVersion")
    reject(frame_with("handshake-response", supportedSchemaMax=0), field="supportedSchemaMax")
    assert decode(frame_with("handshake", lastDeliverySequence=0))


@pytest.mark.parametrize(
    ("type_", "field"),
    [
        ("handshake-response", "accepted"),
        ("operation-batch", "isFinal"),
        ("operation-rejected", "retriable"),
        ("error", "retriable"),
    ],
)
def test_boolean_fields(type_: str, field: str) -> None:
    bads: tuple[Any, ...] = (..., None, 0, 1, "true", [], {})
    for bad in bads:
        reject(frame_with(type_, **{field: bad}), field=field)


@pytest.mark.parametrize(
    ("type_", "field", "required", "non_empty"),
    [
        ("handshake", "authToken", False, False),
        ("handshake-response", "rejectReason", False, False),
        ("operation-rejected", "operationId", True, True),
        ("operation-rejected", "code", True, True),
        ("operation-rejected", "message", True, False),
        ("error", "code", True, True),
        ("error", "message", True, False),
    ],
)
def test_string_fields(type_: str, field: str, required: bool, non_empty: bool) -> None:
    bads: tuple[Any, ...] = (5, True, [], {}, "\udc00")
    for bad in bads:
        reject(frame_with(type_, **{field: bad}), field=field)
    if required:
        reject(frame_with(type_, **{field: ...}), field=field)
    else:
        assert field not in decode(frame_with(type_, **{field: None})).to_dict()
    if non_empty:
        reject(frame_with(type_, **{field: ""}), field=field)
    else:
        assert decode(frame_with(type_, **{field: ""})).to_dict()[field] == ""


@pytest.mark.parametrize(
    ("type_", "field", "required"),
    [
        ("handshake", "syncScope", False),
        ("handshake-response", "acceptedScope", False),
        ("operation", "operation", True),
    ],
)
def test_object_fields(type_: str, field: str, required: bool) -> None:
    bads: tuple[Any, ...] = (5, "x", [], [{}], True)
    for bad in bads:
        reject(frame_with(type_, **{field: bad}), field=field)
    if required:
        reject(frame_with(type_, **{field: ...}), field=field)
        reject(frame_with(type_, **{field: None}), field=field)


@pytest.mark.parametrize("type_", ["handshake", "handshake-response"])
def test_version_vectors(type_: str) -> None:
    for bad in (..., None, [], [["a", 1]], "a", 1):
        reject(frame_with(type_, versionVector=bad), field="versionVector")
    for bad_vv, path in [
        ({"a": -1}, "versionVector.a"),
        ({"a": True}, "versionVector.a"),
        ({"a": 1.0}, "versionVector.a"),
        ({"a": "1"}, "versionVector.a"),
        ({"a": None}, "versionVector.a"),
        ({"a": 2**53}, "versionVector.a"),
        ({"ok": 1, "": 1}, "versionVector."),
    ]:
        reject(frame_with(type_, versionVector=bad_vv), field=path)
    message = decode(frame_with(type_, versionVector={"a": 0, "b": SAFE}))
    assert isinstance(message, (Handshake, HandshakeResponse))
    assert message.version_vector == {"a": 0, "b": SAFE}


def test_batch_operations() -> None:
    bads: tuple[Any, ...] = (..., None, {}, "ops", 5)
    for bad in bads:
        reject(frame_with("operation-batch", operations=bad), field="operations")
    reject(frame_with("operation-batch", operations=[{}, 5]), field="operations[1]")
    reject(frame_with("operation-batch", operations=[[]]), field="operations[0]")
    reject(frame_with("operation-batch", operations=[None]), field="operations[0]")
    # Operations are only required to be objects: their content is checked one by one later.
    message = decode(frame_with("operation-batch", operations=[{}, {"id": 5}, wire_op()]))
    assert isinstance(message, OperationBatch)
    assert message.operations == ({}, {"id": 5}, wire_op())


def test_batch_size_limit() -> None:
    ops = [wire_op()] * 3
    assert decode(frame_with("operation-batch", operations=ops), max_batch=3)
    err = reject(frame_with("operation-batch", operations=ops), BATCH_TOO_LARGE, "operations", max_batch=2)
    assert err.context is not None
    assert err.context["limit"] == 2
    assert err.context["received"] == 3
    over: list[dict[str, Any]] = [{}] * (MAX_BATCH_OPERATIONS + 1)
    reject(frame_with("operation-batch", operations=over), BATCH_TOO_LARGE, "operations")
    assert decode(frame_with("operation-batch", operations=over[:-1]))


def test_message_size_limit() -> None:
    text = encode(FULL["error"])
    size = len(text.encode("utf-8"))
    assert decode(text, max_bytes=size) == FULL["error"]
    assert decode(text.encode(), max_bytes=size) == FULL["error"]
    reject(text, MESSAGE_TOO_LARGE, "frame", max_bytes=size - 1)
    reject(text.encode(), MESSAGE_TOO_LARGE, "frame", max_bytes=size - 1)
    reject(bytearray(text.encode()), MESSAGE_TOO_LARGE, "frame", max_bytes=size - 1)
    # The limit counts UTF-8 bytes, not characters.
    wide = encode(ErrorMessage("m", "X", "é" * 100, False))
    assert len(wide) < len(wide.encode()) == len(wide) + 100
    reject(wide, MESSAGE_TOO_LARGE, max_bytes=len(wide))
    assert decode(wide, max_bytes=len(wide) + 100)
    # The default limit.
    huge = frame_with("error", message="x" * MAX_MESSAGE_BYTES)
    err = reject(huge, MESSAGE_TOO_LARGE)
    assert err.retriable is False


def test_encoding_errors() -> None:
    text = encode(FULL["error"])
    reject(b"\xff" + text.encode(), field="frame")
    reject(text.encode("utf-16"), field="frame")
    reject(text.encode()[:-1] + b"\xc3", field="frame")
    reject(text.replace("busy", "\ud800"), field="frame")  # a lone surrogate cannot be UTF-8
    reject(text.replace("busy", "\\ud800"), field="message")  # ...nor escaped in a message field
    reject("\ufeff" + text, field="frame")  # no BOM
    reject(12, field="frame")
    reject(None, field="frame")
    reject({"type": "error"}, field="frame")
    assert decode(memoryview(text.encode())) == FULL["error"]
    assert decode(text.replace("busy", "b\\u00fcsy")) == ErrorMessage("m7", "OVERLOADED", "büsy", True)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_non_finite_numbers(token: str) -> None:
    frame = frame_with("handshake").replace('"u1"', token)
    assert token in frame
    reject(frame, field="frame")
    reject(frame_with("error").replace('"busy"', token), field="frame")


def test_huge_integers() -> None:
    reject(frame_with("error").replace('"busy"', "1" * 5000), field="frame")
    reject(frame_with("acknowledgment").replace("12", "9" * 5000), field="frame")
    reject(frame_with("acknowledgment").replace("12", "9" * 101), field="frame")
    # A long integer is read (and then refused where a counter is expected, or by decode_operation).
    reject(frame_with("acknowledgment").replace("12", "9" * 100), field="deliverySequence")
    reject(frame_with("acknowledgment").replace("12", "-" + "9" * 99), field="deliverySequence")


def test_duplicate_keys() -> None:
    reject('{"type":"error","type":"error","messageId":"m","code":"X","message":"","retriable":true}')
    frame = frame_with("handshake").replace('{"ownerId": "u1"}', '{"a": 1, "a": 1}')
    err = reject(frame)
    assert err.context is not None
    assert err.context["reason"] == "DUPLICATE_KEY"
    # Inside an operation too: JSON parsers disagree on which duplicate wins, so the id could not be trusted.
    frame = frame_with("operation").replace('"collection": "todos"', '"collection": "a", "collection": "b"')
    assert '"collection": "a", "collection": "b"' in frame
    reject(frame)


def test_from_dict() -> None:
    for type_, message in FULL.items():
        assert from_dict(message.to_dict()) == message, type_
    bads: tuple[Any, ...] = (None, [], "x", 1)
    for bad in bads:
        with pytest.raises(ProtocolError):
            from_dict(bad)
    d = FULL["handshake"].to_dict()
    with pytest.raises(ProtocolError) as info:
        from_dict({**d, "versionVector": {1: 2}})
    assert info.value.context is not None
    assert info.value.context["field"] == "versionVector.1"


def test_unknown_fields_are_ignored() -> None:
    for type_, message in FULL.items():
        d = message.to_dict()
        d.update({"future": [1, {"x": None}], "zzz": "y"})
        assert decode(json.dumps(d)) == message, type_


def test_optional_null_fields_read_as_absent() -> None:
    d = MINIMAL["handshake-response"].to_dict()
    d.update(acceptedScope=None, rejectReason=None, supportedSchemaMin=None, supportedSchemaMax=None)
    assert decode(json.dumps(d)) == MINIMAL["handshake-response"]


def test_field_errors_carry_the_message_id() -> None:
    err = reject(frame_with("acknowledgment", lastSequenceNumber=-1), field="lastSequenceNumber")
    assert err.context is not None
    assert err.context["messageId"] == "m5"
    assert "lastSequenceNumber" in err.message


# ------------------------------------------------------------------------------------------------ depth


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = {"k": value} if (depth - i) % 2 else [value]  # the outermost is an object
    return value


def test_depth_limit() -> None:
    assert MAX_FRAME_DEPTH == MAX_DEPTH + 3
    # The message object is level 1, so its scope may hold MAX_FRAME_DEPTH - 1 levels.
    ok = frame_with("handshake", syncScope=nested(MAX_FRAME_DEPTH - 1))
    assert isinstance(decode(ok), Handshake)
    err = reject(frame_with("handshake", syncScope=nested(MAX_FRAME_DEPTH)), field="frame")
    assert err.context is not None
    assert err.context["reason"] == "TOO_DEEP"
    reject(frame_with("handshake", syncScope=nested(5)), max_depth=5)
    assert decode(frame_with("handshake", syncScope=nested(5)), max_depth=6)


@pytest.mark.parametrize(
    "frame",
    [
        "[" * 100_000,
        "{" * 100_000,
        '{"a":' * 100_000,
        "[" * 100_000 + "]" * 100_000,
        '{"type":"operation","messageId":"m","operation":' + '{"a":' * 50_000 + "1" + "}" * 50_001,
        "[" * 50_000 + '"' + "]" * 50_000,
        "]" * 50_000 + "[" * 50_000,
        "[" * 50_000 + "}" * 50_000,
        '["\\\\"' + "[" * 50_000,
    ],
)
def test_deep_nesting_never_recurses(frame: str) -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # the parser must never get anywhere near the stack's end
    try:
        reject(frame, field="frame")
    finally:
        sys.setrecursionlimit(limit)


def test_brackets_inside_strings_do_not_count() -> None:
    scope = {
        "a": "[" * 1000,
        "b": "{" * 1000 + '"\\' * 300,
        "c": ["\\", "\\\\[[[", '"[[[', "]]]]]]" * 100, '\\"' * 50],
        "[[[[": "\\\\\\" + "{{{" * 100,
    }
    for ensure_ascii in (True, False):
        frame = json.dumps(FULL["handshake"].to_dict() | {"syncScope": scope}, ensure_ascii=ensure_ascii)
        message = decode(frame, max_depth=3)
        assert isinstance(message, Handshake)
        assert message.sync_scope == scope
    # Closing brackets inside strings cannot hide real nesting either.
    deep = {"x": "]" * 500, "y": nested(MAX_FRAME_DEPTH)}
    reject(json.dumps(FULL["handshake"].to_dict() | {"syncScope": deep}), field="frame")


def json_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(json_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(json_depth, value), default=0)
    return 0


tricky_text = st.text(st.sampled_from('[]{}"\\/ab\n\u00e9\u2028'), max_size=12)
tricky_json = st.recursive(
    st.none() | st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(tricky_json, st.integers(0, 8), st.booleans())
def test_depth_scan_matches_the_parsed_depth(value: Any, limit: int, ensure_ascii: bool) -> None:
    data = json.dumps(value, ensure_ascii=ensure_ascii).encode("utf-8")
    if json_depth(value) > limit:
        with pytest.raises(ProtocolError):
            P._check_depth(data, limit)
    else:
        P._check_depth(data, limit)


def prefix_depth(data: bytes) -> int:
    """The depth ``_check_depth`` measures, one byte at a time: the deepest prefix of the brackets outside
    strings, escaped backslashes and quotes paired up from the left first (the lexer's reading; a backslash
    outside a string is a parse error anyway), unbalanced input measured as it stands."""
    depth = deepest = 0
    inside = False
    for byte in data.replace(b"\\\\", b"").replace(b'\\"', b""):
        char = chr(byte)
        if char == '"':
            inside = not inside
        elif inside:
            continue
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


@settings(max_examples=600, deadline=None)
@given(
    st.lists(
        st.sampled_from(["[", "]", "{", "}", '"', "\\", "a", ",", '""', "[]", "{}", "[[", "]]"]), max_size=80
    ),
    st.integers(0, 8),
    st.integers(0, 5000),
)
def test_depth_scan_matches_a_byte_by_byte_scan_on_any_input(
    pieces: list[str], limit: int, padding: int
) -> None:
    """Unbalanced and malformed input too (the parser reports it later; its nesting up to there counts), also
    past the size where the scan stops counting brackets first."""
    data = "".join(pieces).encode() + b" " * padding
    if prefix_depth(data) > limit:
        with pytest.raises(ProtocolError):
            P._check_depth(data, limit)
    else:
        P._check_depth(data, limit)


# -------------------------------------------------------------------------------------------- fuzzing

KNOWN_KEYS = sorted(
    {name.rstrip("?") for fields in DESIGN_FIELDS.values() for name in fields.split()}
    | {"type", "messageId", "protocolVersion", "deliverySequence", "id", "nodeId"}
)
hostile_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(sorted(MESSAGE_TYPES))
    | st.sampled_from([2**53, 2**53 - 1, -1, 0, 10**400, "", "x" * 200])
)
hostile_json = st.recursive(
    hostile_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=5), inner, max_size=6)
    ),
    max_leaves=25,
)


def decode_or_refuse(frame: Any, **kw: Any) -> Message | None:
    """decode, which may only ever return a message or raise ProtocolError."""
    try:
        message = decode(frame, **kw)
    except ProtocolError as err:
        assert err.code in P.CONNECTION_ERROR_CODES
        assert err.context is not None
        assert "field" in err.context
        return None
    assert isinstance(message, tuple(MESSAGE_TYPES.values()))
    assert decode(encode(message)) == message
    return message


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fuzz(1500)
@given(st.text() | st.binary())
def test_fuzz_arbitrary_frames(frame: str | bytes) -> None:
    decode_or_refuse(frame)


@fuzz(400)
@given(hostile_json, st.booleans())
def test_fuzz_json_structures(value: Any, ascii_only: bool) -> None:
    try:
        frame = json.dumps(value, ensure_ascii=ascii_only)
    except (UnicodeEncodeError, ValueError):  # pragma: no cover - json.dumps accepts all of these
        return
    decode_or_refuse(frame)
    decode_or_refuse(frame.encode("utf-8", "surrogatepass"))


mutations = st.lists(
    st.tuples(st.sampled_from(["set", "delete", "retype"]), st.sampled_from(KNOWN_KEYS), hostile_json),
    min_size=1,
    max_size=3,
)


@fuzz(300)
@given(messages, mutations)
def test_fuzz_mutated_messages(message: Message, changes: list[tuple[str, str, Any]]) -> None:
    d: dict[str, Any] = message.to_dict()
    for action, key, value in changes:
        if action == "delete":
            d.pop(key, None)
        elif action == "retype":
            d["type"] = value if isinstance(value, str) else sorted(MESSAGE_TYPES)[len(key) % 7]
        else:
            d[key] = value
    decode_or_refuse(json.dumps(d))


@fuzz(400)
@given(messages, st.lists(st.tuples(st.integers(0, 10**6), st.binary(max_size=3)), min_size=1, max_size=4))
def test_fuzz_corrupted_frames(message: Message, edits: list[tuple[int, bytes]]) -> None:
    data = bytearray(encode(message).encode("utf-8"))
    for position, replacement in edits:
        at = position % (len(data) + 1)
        data[at : at + len(replacement) % 2] = replacement  # overwrite or insert
    decode_or_refuse(bytes(data))
    decode_or_refuse(bytes(data[: len(data) // 2]))
    decode_or_refuse(bytes(data), max_bytes=len(data) - 1, max_batch=1, max_depth=2)


# ------------------------------------------------------------------------------------ decode_operation


def reject_op(raw: Any, code: str = INVALID_OPERATION, field: str | None = None, **kw: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_operation(raw, **kw)
    assert info.value.code == code, info.value
    assert info.value.retriable is False
    assert info.value.context is not None
    if field is not None:
        assert info.value.context["field"] == field, info.value.context
    return info.value


def test_decode_valid_operations() -> None:
    insert = make_op()
    update = make_op(type="update", data={"done": True}, previous_data={"done": False}, sequence_number=4)
    delete = make_op(type="delete", data=None, sequence_number=5)
    for op in (insert, update, delete):
        assert decode_operation(op.to_wire()) == op
    # Through a batch frame and back.
    batch = decode(
        encode(OperationBatch("m", tuple(op.to_wire() for op in (insert, update, delete)), True, 0))
    )
    assert isinstance(batch, OperationBatch)
    assert [decode_operation(raw) for raw in batch.operations] == [insert, update, delete]
    message = decode(encode(OperationMessage("m", insert.to_wire(), 7)))
    assert isinstance(message, OperationMessage)
    assert decode_operation(message.operation) == insert


def test_tampered_operations() -> None:
    raw = wire_op()
    for change in (
        {"data": {**raw["data"], "title": "Buy beer"}},
        {"collection": "other"},
        {"recordId": "rec-2"},
        {"nodeId": "node-2"},
        {"type": "update", "previousData": {"done": True}},
        {"timestamp": {**raw["timestamp"], "logical": 1}},
        {"id": "0" * 64},
    ):
        err = reject_op({**raw, **change}, HASH_MISMATCH, "id")
        assert err.context is not None
        assert err.context["operationId"] == {**raw, **change}["id"]
    # Fields outside the hash may change (they are bookkeeping).
    assert decode_operation({**raw, "sequenceNumber": 99}).sequence_number == 99


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"nodeId": 5}, "nodeId"),
        ({"nodeId": ""}, "nodeId"),
        ({"collection": ...}, "collection"),
        ({"recordId": None}, "recordId"),
        ({"type": "upsert"}, "type"),
        ({"data": [1]}, "data"),
        ({"data": None}, "data"),
        ({"data": {"n": 2**53}}, "data"),
        ({"data": {"b": {"__offline_bytes__": "!!"}}}, "data"),
        ({"timestamp": "yesterday"}, "timestamp"),
        ({"timestamp": {"wallTime": -1, "logical": 0, "nodeId": "n"}}, "timestamp"),
        ({"sequenceNumber": "1"}, "sequenceNumber"),
        ({"sequenceNumber": True}, "sequenceNumber"),
        ({"sequenceNumber": -1}, "sequenceNumber"),
        ({"schemaVersion": 0}, "schemaVersion"),
        ({"causalDeps": [1]}, "causalDeps"),
        ({"causalDeps": "abc"}, "causalDeps"),
        ({"id": 5}, "id"),
        ({"id": ""}, "id"),
        ({"id": ...}, "id"),
    ],
)
def test_invalid_operations(change: dict[str, Any], field: str) -> None:
    raw = wire_op()
    for key, value in change.items():
        if value is ...:
            del raw[key]
        else:
            raw[key] = value
    err = reject_op(raw, INVALID_OPERATION, field)
    assert field in err.message


def test_operation_id_in_context() -> None:
    raw = wire_op()
    err = reject_op({**raw, "nodeId": 5}, field="nodeId")
    assert err.context is not None
    assert err.context["operationId"] == raw["id"]
    assert err.to_rejection(raw["id"]).code == INVALID_OPERATION
    err = reject_op({**raw, "id": 5}, field="id")
    assert err.context is not None
    assert "operationId" not in err.context


@pytest.mark.parametrize("raw", [None, 5, "op", [], [("id", "x")], b"{}"])
def test_operation_must_be_an_object(raw: Any) -> None:
    reject_op(raw, INVALID_OPERATION, "operation")


def test_operation_size_limit() -> None:
    raw = wire_op()
    size = len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())
    assert decode_operation(raw, max_bytes=size) == make_op()
    err = reject_op(raw, OPERATION_TOO_LARGE, "operation", max_bytes=size - 1)
    assert err.context is not None
    assert err.context["limit"] == size - 1
    assert err.context["operationId"] == raw["id"]
    big = wire_op(data={"text": "é" * (MAX_OPERATION_BYTES // 2)})
    reject_op(big, OPERATION_TOO_LARGE, "operation")
    assert decode_operation(big, max_bytes=MAX_OPERATION_BYTES + 1000).data == {
        "text": "é" * (MAX_OPERATION_BYTES // 2)
    }
    # Many small values are counted without serializing first.
    reject_op(wire_op(data={"items": [0] * 200_000}), OPERATION_TOO_LARGE, "operation")


def test_operation_nesting() -> None:
    # The deepest data an operation may hold travels in a batch frame and decodes.
    data: dict[str, Any] = {}
    for _ in range(MAX_DEPTH - 1):
        data = {"a": data}
    op = make_op(data=data)
    with pytest.raises(OfflineError):
        make_op(data={"a": data})
    batch = decode(encode(OperationBatch("m", (op.to_wire(),), True, 0)))
    assert isinstance(batch, OperationBatch)
    assert decode_operation(batch.operations[0]) == op
    # Deeper data is refused without recursing.
    raw = wire_op()
    raw["data"] = nested(10_000)
    reject_op(raw, INVALID_OPERATION, "data")
    raw["data"] = {"a": 1}
    raw["data"]["self"] = raw["data"]  # a cycle
    reject_op(raw, INVALID_OPERATION)


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), object(), b"raw", {1: "x"}, {("a",): 1}, "\ud800", 2**64]
)
def test_operation_with_non_json_values(value: Any) -> None:
    raw = wire_op()
    raw["data"] = {"v": value}
    reject_op(raw, INVALID_OPERATION)


def test_one_bad_operation_does_not_spoil_its_batch() -> None:
    good = wire_op()
    bad = {**wire_op(record_id="rec-2"), "data": {"n": 2**60}}
    batch = decode(encode(OperationBatch("m", (good, bad, {"junk": True}), True, 0)))
    assert isinstance(batch, OperationBatch)
    assert decode_operation(batch.operations[0]) == make_op()
    reject_op(batch.operations[1], INVALID_OPERATION, "data")
    reject_op(batch.operations[2], INVALID_OPERATION)


@fuzz(250)
@given(
    st.lists(
        st.tuples(st.sampled_from([*wire_op(), "data.title", "timestamp.logical", "x"]), hostile_json),
        min_size=1,
        max_size=3,
    )
)
def test_fuzz_decode_operation(changes: list[tuple[str, Any]]) -> None:
    raw = wire_op()
    for key, value in changes:
        if "." in key:
            outer, inner = key.split(".")
            if isinstance(raw[outer], dict):
                raw[outer] = {**raw[outer], inner: value}
        else:
            raw[key] = value
    try:
        op = decode_operation(raw)
    except ProtocolError as err:
        assert err.code in {INVALID_OPERATION, HASH_MISMATCH, OPERATION_TOO_LARGE}
        assert err.context is not None
        assert "field" in err.context
    else:
        assert isinstance(op, Operation)


# ------------------------------------------------------------------ compact batch frames (decode's fast path)


def decode_strictly(frame: str | bytes, **kw: Any) -> Message:
    """``decode`` with its compact-batch fast path turned off: the parser with every check as a hook."""
    fast = P._compact_batch
    P._compact_batch = lambda *args: None  # type: ignore[assignment]
    try:
        return decode(frame, **kw)
    finally:
        P._compact_batch = fast  # type: ignore[assignment]


@contextlib.contextmanager
def json_library(name: str) -> Iterator[None]:
    """Run ``decode``'s fast path on orjson (as installed) or on the standard library alone."""
    saved = P._orjson
    if name == "orjson":
        if saved is None:
            pytest.skip("orjson is not installed here (it is a dependency everywhere but Pyodide)")
    else:
        P._orjson = None
    try:
        yield
    finally:
        P._orjson = saved


JSON_LIBRARIES = ["orjson", "json"]


def outcome(decoder: Any, frame: str | bytes, **kw: Any) -> tuple[str, Any]:
    try:
        return "message", decoder(frame, **kw)
    except ProtocolError as exc:
        return "refused", (exc.code, (exc.context or {}).get("field"), (exc.context or {}).get("reason"))


def batch_frame(ops: list[Any], **head: Any) -> str:
    texts = [json.dumps(op, ensure_ascii=False, separators=(",", ":")) for op in ops]
    return P.encode_batch_frame(
        head.get("message_id", "m1"),
        texts,
        is_final=head.get("is_final", True),
        batch_index=head.get("batch_index", 0),
        base_delivery_sequence=head.get("base"),
        max_delivery_sequence=head.get("top"),
    )


@pytest.mark.parametrize("library", JSON_LIBRARIES)
def test_compact_batches_carry_their_operation_texts(library: str) -> None:
    with json_library(library):
        check_compact_batch_texts()


def check_compact_batch_texts() -> None:
    ops = [wire_op(), wire_op(record_id="rec-2", data={"title": 'é ☃ \u2028 "q" \\ \n'}), {"id": "x"}]
    frame = batch_frame(ops, base=3, top=9)
    message = decode(frame)
    assert isinstance(message, OperationBatch)
    assert message == decode_strictly(frame)
    texts = [json.dumps(op, ensure_ascii=False, separators=(",", ":")) for op in ops]
    assert message.operation_texts == tuple(texts)
    for raw, text in zip(message.operations[:2], texts[:2], strict=True):
        assert P.decode_operation_text(raw, text=text) == P.decode_operation_text(raw)
    assert encode(message) == frame  # encode() writes the same text
    # Any other form (operations not last, any spacing) takes the strict path: no texts.
    for other in (json.dumps(message.to_dict(), sort_keys=True), json.dumps(json.loads(frame))):
        again = decode(other)
        assert again == message and isinstance(again, OperationBatch) and again.operation_texts is None


@pytest.mark.parametrize(
    "edit",
    [
        ('"title":"Buy milk"', '"title":"Buy milk","title":"Sell milk"'),  # a key twice, inside an operation
        ('"isFinal":true', '"isFinal":true,"isFinal":false'),  # ... in the envelope
        ('"sequenceNumber":3', '"sequenceNumber":1' + "0" * 120),  # an integer literal too long to read
        ('"title":"Buy milk"', '"title":-' + "9" * 101),  # ... where orjson would read a float
        ('"title":"Buy milk"', '"title":1.' + "0" * 120 + "1"),  # a float literal as long
        ('"sequenceNumber":3', '"sequenceNumber":1e999'),  # not finite
        ('"sequenceNumber":3', '"sequenceNumber":NaN'),
        ('"sequenceNumber":3', '"sequenceNumber":3.0'),  # valid, but not how it is encoded
        ('"title":"Buy milk"', '"title":"Buy \\u006dilk"'),  # valid escape, written the long way
        ('"title":"Buy milk"', '"title":"\\ud800"'),  # a lone surrogate
        ('"title":"Buy milk"', '"title": "Buy milk"'),  # spacing
        ('"title":"Buy milk"', '"title":"' + "7" * 150 + '"'),  # a long run of digits inside a string
    ],
)
@pytest.mark.parametrize("library", JSON_LIBRARIES)
def test_frames_that_are_not_plain_compact_batches_decode_as_before(
    library: str, edit: tuple[str, str]
) -> None:
    frame = batch_frame([wire_op(), wire_op(record_id="rec-2")], top=2)
    assert edit[0] in frame
    edited = frame.replace(edit[0], edit[1], 1)
    with json_library(library):
        result = outcome(decode, edited)
    assert result == outcome(decode_strictly, edited)
    if result[0] == "message":
        assert result[1].operation_texts is None or result[1].operation_texts == tuple(
            json.dumps(op, ensure_ascii=False, separators=(",", ":")) for op in result[1].operations
        )


@fuzz(300)
@given(
    st.lists(json_objects, max_size=4),
    st.lists(st.tuples(st.integers(0, 10**6), st.binary(max_size=3)), max_size=3),
    optional(counters),
)
def test_fuzz_compact_batches_decode_as_the_strict_parser_does(
    ops: list[dict[str, Any]], edits: list[tuple[int, bytes]], top: int | None
) -> None:
    """Random batch frames as senders write them, then corrupted: the fast path and the strict parser agree
    on every frame (the same message, or the same refusal), and texts it hands out are the operations'."""
    try:
        data = bytearray(batch_frame(ops, top=top).encode("utf-8"))
    except UnicodeEncodeError:
        return  # a lone surrogate in a generated string: not a frame a sender can write
    if not edits:  # as sent: the fast path takes it
        message = decode(bytes(data))
        assert isinstance(message, OperationBatch) and message.operation_texts is not None
    for position, replacement in edits:
        at = position % (len(data) + 1)
        data[at : at + len(replacement) % 2] = replacement
    for frame in (bytes(data), bytes(data).decode("utf-8", "replace")):
        strict = outcome(decode_strictly, frame)
        for library in JSON_LIBRARIES if P._orjson is not None else ["json"]:
            with json_library(library):
                result = outcome(decode, frame)
            assert result == strict, library
            if result[0] == "message" and isinstance(result[1], OperationBatch) and result[1].operation_texts:
                assert result[1].operation_texts == tuple(
                    json.dumps(op, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
                    for op in result[1].operations
                )


@pytest.mark.parametrize(
    "value",
    [
        1e-07,
        1e16,
        2.5e-300,
        -0.0,
        0.1 + 0.2,
        2**63,
        2**64 + 1,
        -(2**70),
        "\x1f\x7f\u2028 é ☃ 😀",
        [1e22, {"k": 5e-324}],
    ],
)
def test_batches_orjson_writes_another_way_take_the_standard_library(value: Any) -> None:
    """Values orjson reads or writes differently from the standard library (exponents, integers past 64
    bits) still decode on the fast path, to the same message and texts as without orjson."""
    first = wire_op()
    first["data"] = {"title": "t", "v": value}  # frames carry operations raw: their checks come later
    frame = batch_frame([first, wire_op(record_id="rec-2")], top=2)
    results = []
    for library in JSON_LIBRARIES:
        with json_library(library):
            message = decode(frame)
        assert isinstance(message, OperationBatch) and message.operation_texts is not None
        results.append(message)
    assert results[0] == results[1] == decode_strictly(frame)
    assert results[0].operation_texts == results[1].operation_texts
    assert results[0].operations[0]["data"]["v"] == value and type(
        results[0].operations[0]["data"]["v"]
    ) is type(value)


@fuzz(200)
@given(st.lists(json_objects, min_size=1, max_size=4), optional(counters))
def test_fuzz_batches_decode_alike_with_and_without_orjson(
    ops: list[dict[str, Any]], top: int | None
) -> None:
    try:
        frame = batch_frame([{**wire_op(), "data": data} for data in ops], top=top).encode("utf-8")
    except UnicodeEncodeError:
        return  # a lone surrogate: not a frame a sender can write
    found = []
    for library in JSON_LIBRARIES if P._orjson is not None else ["json"]:
        with json_library(library):
            message = decode(frame)
        assert isinstance(message, OperationBatch) and message.operation_texts is not None
        found.append((message, message.operation_texts))
    assert all(item == found[0] for item in found)


def test_decoded_operations_keep_the_text_they_came_as() -> None:
    """``decode_operation_text`` keeps the text on the operation (``operation_text`` returns it) only when the
    raw operation holds exactly the wire fields; copies and other operations are encoded as usual."""
    import dataclasses

    from offline.merge.values import operation_text, wire_json

    raw = dict(reversed(list(wire_op().items())))  # the writer's own key order
    op, text = P.decode_operation_text(raw)
    assert text != wire_json(op) and operation_text(op) == text
    assert Operation.from_wire(json.loads(operation_text(op))) == op
    assert operation_text(dataclasses.replace(op)) == wire_json(op)
    extra, extra_text = P.decode_operation_text({**raw, "future": 1})  # a field this version does not know
    assert "future" in extra_text and operation_text(extra) == wire_json(extra)
    assert operation_text(make_op()) == wire_json(make_op())
