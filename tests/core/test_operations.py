from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offline.core.errors import INVALID_OPERATION, OfflineError
from offline.core.frozen import FrozenDict, adopt, thaw
from offline.core.hlc import HLCTimestamp, serialize_timestamp
from offline.core.operations import (
    BYTES_MARKER,
    MAX_SAFE_INTEGER,
    OPERATION_TYPES,
    Operation,
    compute_operation_id,
    create_operation,
    decode_value,
    encode_value,
    timestamp_text,
    verify_operation,
)

TS = HLCTimestamp(1_700_000_000_000, 0, "node-1")
DELETE = object()


def base_input(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "node_id": "node-1",
        "type": "insert",
        "collection": "todos",
        "record_id": "rec-1",
        "data": {"title": "Buy milk", "done": False},
        "timestamp": TS,
        "sequence_number": 0,
        "schema_version": 1,
    }
    for key, value in overrides.items():
        if value is DELETE:
            values.pop(key, None)
        else:
            values[key] = value
    return values


def update_input(**overrides: Any) -> dict[str, Any]:
    return base_input(
        **{"type": "update", "data": {"done": True}, "previous_data": {"done": False}, **overrides}
    )


def delete_input(**overrides: Any) -> dict[str, Any]:
    return base_input(**{"type": "delete", "data": None, **overrides})


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical(data_json: str, ts: str = "001700000000000:00000:node-1") -> str:
    """Hand-built RFC 8785 form of the hashed fields of ``base_input`` with the given canonical data."""
    return (
        '{"collection":"todos","data":' + data_json + ',"nodeId":"node-1","recordId":"rec-1",'
        '"timestamp":"' + ts + '","type":"insert"}'
    )


# ------------------------------------------------------------------------------------------- creation


def test_create_operation_fields_and_defaults() -> None:
    op = create_operation(base_input())
    assert op.node_id == "node-1"
    assert op.type == "insert"
    assert op.collection == "todos"
    assert op.record_id == "rec-1"
    assert op.data == {"title": "Buy milk", "done": False}
    assert op.previous_data is None
    assert op.causal_deps == ()
    assert op.timestamp == TS
    assert op.sequence_number == 0
    assert op.schema_version == 1
    assert len(op.id) == 64
    assert int(op.id, 16) >= 0
    assert "insert" in OPERATION_TYPES


def test_operation_is_deeply_frozen_and_detached_from_input() -> None:
    source = base_input(data={"tags": ["a", "b"], "meta": {"k": 1}}, causal_deps=["x"])
    op = create_operation(source)
    source["data"]["tags"].append("c")
    source["causal_deps"].append("y")
    assert op.data == {"tags": ("a", "b"), "meta": {"k": 1}}
    assert isinstance(op.data, FrozenDict)
    assert isinstance(op.data["meta"], FrozenDict)
    assert op.data["tags"] == ("a", "b")
    assert op.causal_deps == ("x",)
    with pytest.raises(AttributeError):
        op.id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        op.data["title"] = "x"  # type: ignore[index]


def test_camel_case_keys_are_accepted() -> None:
    snake = create_operation(update_input(causal_deps=["d1"], sequence_number=4, schema_version=2))
    camel = create_operation(
        {
            "nodeId": "node-1",
            "type": "update",
            "collection": "todos",
            "recordId": "rec-1",
            "data": {"done": True},
            "previousData": {"done": False},
            "timestamp": TS.to_wire(),
            "sequenceNumber": 4,
            "causalDeps": ["d1"],
            "schemaVersion": 2,
        }
    )
    assert camel == snake


def test_same_key_in_both_spellings_must_agree() -> None:
    assert create_operation(base_input(nodeId="node-1")).node_id == "node-1"
    with pytest.raises(OfflineError) as info:
        create_operation(base_input(nodeId="node-2"))
    assert info.value.context is not None
    assert info.value.context["field"] == "nodeId"


def test_timestamp_as_wire_dict() -> None:
    assert create_operation(base_input(timestamp=TS.to_wire())) == create_operation(base_input())


def test_update_and_delete_shapes() -> None:
    upd = create_operation(update_input())
    assert upd.previous_data == {"done": False}
    deleted = create_operation(delete_input())
    assert deleted.data is None
    assert create_operation(delete_input(data=DELETE)).data is None


@pytest.mark.parametrize(
    ("source", "field"),
    [
        (base_input(node_id=""), "nodeId"),
        (base_input(node_id=5), "nodeId"),
        (base_input(node_id=DELETE), "nodeId"),
        (base_input(type="upsert"), "type"),
        (base_input(type=None), "type"),
        (base_input(type=DELETE), "type"),
        (base_input(collection=""), "collection"),
        (base_input(collection=DELETE), "collection"),
        (base_input(record_id=""), "recordId"),
        (base_input(record_id=3), "recordId"),
        (base_input(data=None), "data"),
        (base_input(data=DELETE), "data"),
        (base_input(data=["not", "a", "dict"]), "data"),
        (update_input(data=None), "data"),
        (update_input(previous_data=DELETE), "previousData"),
        (update_input(previous_data=None), "previousData"),
        (update_input(previous_data="x"), "previousData"),
        (delete_input(data={"x": 1}), "data"),
        (delete_input(data={}), "data"),
        (base_input(sequence_number=-1), "sequenceNumber"),
        (base_input(sequence_number=1.0), "sequenceNumber"),
        (base_input(sequence_number=True), "sequenceNumber"),
        (base_input(sequence_number="1"), "sequenceNumber"),
        (base_input(sequence_number=DELETE), "sequenceNumber"),
        (base_input(schema_version=0), "schemaVersion"),
        (base_input(schema_version=1.5), "schemaVersion"),
        (base_input(schema_version=True), "schemaVersion"),
        (base_input(schema_version=DELETE), "schemaVersion"),
        (base_input(causal_deps="abc"), "causalDeps"),
        (base_input(causal_deps=[1, 2]), "causalDeps"),
        (base_input(causal_deps={"a": 1}), "causalDeps"),
        (base_input(timestamp=DELETE), "timestamp"),
        (base_input(timestamp=None), "timestamp"),
        (base_input(timestamp="001700000000000:00000:node-1"), "timestamp"),
        (base_input(timestamp={"wallTime": "1", "logical": 0, "nodeId": "n"}), "timestamp"),
        (base_input(timestamp={"wallTime": 1, "logical": True, "nodeId": "n"}), "timestamp"),
        (base_input(data={"x": math.nan}), "data"),
        (base_input(data={"x": math.inf}), "data"),
        (base_input(data={"x": [1, -math.inf]}), "data"),
        (base_input(data={"x": 2**53}), "data"),
        (base_input(data={"x": -(2**53)}), "data"),
        (base_input(data={"x": {1, 2}}), "data"),
        (base_input(data={"x": object()}), "data"),
        (base_input(data={"x": {1: "int key"}}), "data"),
        (base_input(data={1: "int key"}), "data"),
        (base_input(data={"x": "lone \ud800 surrogate"}), "data"),
        (base_input(data={"x": {BYTES_MARKER: "AA=="}}), "data"),
        (update_input(previous_data={"done": math.nan}), "previousData"),
    ],
)
def test_invalid_input_names_its_field(source: dict[str, Any], field: str) -> None:
    with pytest.raises(OfflineError) as info:
        create_operation(source)
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None
    assert info.value.context["field"] == field
    assert field in info.value.message


def test_wrong_type_error_names_expected_and_received() -> None:
    with pytest.raises(OfflineError) as info:
        create_operation(base_input(sequence_number="7"))
    assert info.value.context == {"field": "sequenceNumber", "expected": "integer", "received": "str"}


def test_nested_value_error_has_path() -> None:
    with pytest.raises(OfflineError) as info:
        create_operation(base_input(data={"a": [1, {"b": math.nan}]}))
    assert info.value.context is not None
    assert info.value.context["path"] == "data.a[1].b"


def test_non_mapping_input_is_refused() -> None:
    with pytest.raises(OfflineError) as info:
        create_operation(["not", "a", "mapping"])  # type: ignore[arg-type]
    assert info.value.code == INVALID_OPERATION


def test_excessive_nesting_is_refused() -> None:
    deep: Any = 1
    for _ in range(200):
        deep = [deep]
    with pytest.raises(OfflineError) as info:
        create_operation(base_input(data={"deep": deep}))
    assert info.value.context is not None
    assert info.value.context["field"] == "data"
    assert info.value.context["reason"] == "TOO_DEEP"


def test_boundary_values_are_accepted() -> None:
    data = {"max": MAX_SAFE_INTEGER, "min": -MAX_SAFE_INTEGER, "f": 1e308, "b": b"\x00", "n": None, "e": []}
    op = create_operation(base_input(data=data))
    assert thaw(op.data) == data


# ------------------------------------------------------------------------------------------ content id


def test_known_answer_id() -> None:
    expected = sha256(canonical('{"done":false,"title":"Buy milk"}'))
    assert expected == "762cfa5b2dda5bc141f25dcbc6106e39ad0fa6b2c74369029e6ceb4480b610f0"
    op = create_operation(base_input())
    assert op.id == expected
    assert compute_operation_id(op) == expected
    assert compute_operation_id(base_input()) == expected
    assert compute_operation_id(op.to_wire()) == expected


def test_identical_content_gives_identical_id() -> None:
    a = create_operation(base_input(data={"a": 1, "b": [1, 2]}))
    b = create_operation(base_input(data={"b": [1, 2], "a": 1}))
    assert a.id == b.id
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"node_id": "node-2"},
        {"type": "update", "previous_data": {}},
        {"collection": "notes"},
        {"record_id": "rec-2"},
        {"data": {"title": "Buy milk", "done": True}},
        {"data": {"title": "Buy milk"}},
        {"data": {"title": "Buy milk", "done": 0}},
        {"data": {"title": "Buy milk", "done": False, "blob": b""}},
        {"timestamp": HLCTimestamp(TS.wall_time + 1, 0, "node-1")},
        {"timestamp": HLCTimestamp(TS.wall_time, 1, "node-1")},
        {"timestamp": HLCTimestamp(TS.wall_time, 0, "node-2")},
    ],
)
def test_changing_a_hashed_field_changes_the_id(change: dict[str, Any]) -> None:
    assert create_operation(base_input(**change)).id != create_operation(base_input()).id


@pytest.mark.parametrize(
    "change",
    [
        {"previous_data": {"done": True}},
        {"sequence_number": 99},
        {"causal_deps": ["a" * 64]},
        {"schema_version": 7},
    ],
)
def test_changing_a_non_hashed_field_keeps_the_id(change: dict[str, Any]) -> None:
    original = create_operation(base_input())
    changed = create_operation(base_input(**change))
    assert changed.id == original.id
    assert changed != original


def test_delete_hashes_null_data() -> None:
    op = create_operation(delete_input())
    expected = sha256(canonical("null").replace('"type":"insert"', '"type":"delete"'))
    assert op.id == expected


def test_rfc8785_key_order_is_by_utf16_code_units() -> None:
    data = {"\u20ac": 1, "\r": 2, "\ufb33": 3, "1": 4, "\U0001f600": 5, "\u0080": 6, "\u00f6": 7}
    # RFC 8785 section 3.2.3's example: the emoji (surrogates D83D DE00) sorts before U+FB33.
    expected_data = '{"\\r":2,"1":4,"\u0080":6,"\u00f6":7,"\u20ac":1,"\U0001f600":5,"\ufb33":3}'
    assert create_operation(base_input(data=data)).id == sha256(canonical(expected_data))


def test_rfc8785_number_formatting() -> None:
    data = {
        "n": [1e21, 1.5, -0.0, 1e-7, 100.0, 0.000001, 1e20, -2.5e-8, 333333333.33333329, 9007199254740991]
    }
    expected_data = (
        '{"n":[1e+21,1.5,0,1e-7,100,0.000001,100000000000000000000,'
        "-2.5e-8,333333333.3333333,9007199254740991]}"
    )
    assert create_operation(base_input(data=data)).id == sha256(canonical(expected_data))


def test_negative_zero_and_integral_floats_hash_like_integers() -> None:
    assert create_operation(base_input(data={"x": -0.0})).id == create_operation(base_input(data={"x": 0})).id
    assert create_operation(base_input(data={"x": 2.0})).id == create_operation(base_input(data={"x": 2})).id


def test_rfc8785_string_escaping() -> None:
    data = {"s": 'tab\there "q" back\\slash \u001f \u007f é \U0001f600 \u2028'}
    expected_data = '{"s":"tab\\there \\"q\\" back\\\\slash \\u001f \u007f é \U0001f600 \u2028"}'
    assert create_operation(base_input(data=data)).id == sha256(canonical(expected_data))


def test_bytes_are_hashed_as_base64_marker() -> None:
    op = create_operation(base_input(data={"blob": b"\x00\xff", "list": [b"hi"]}))
    expected_data = '{"blob":{"__offline_bytes__":"AP8="},"list":[{"__offline_bytes__":"aGk="}]}'
    assert op.id == sha256(canonical(expected_data))


def test_verify_operation() -> None:
    op = create_operation(base_input())
    assert verify_operation(op)
    assert verify_operation(op.to_wire())
    forged = Operation(
        id="0" * 64,
        node_id=op.node_id,
        type=op.type,
        collection=op.collection,
        record_id=op.record_id,
        data=op.data,
        previous_data=None,
        timestamp=op.timestamp,
        sequence_number=0,
    )
    assert not verify_operation(forged)
    assert not verify_operation({**op.to_wire(), "recordId": "other"})
    assert not verify_operation({"id": op.id})


def test_direct_construction_freezes_containers() -> None:
    op = Operation(
        id="x",
        node_id="n",
        type="insert",
        collection="c",
        record_id="r",
        data={"a": [1]},  # type: ignore[arg-type]
        previous_data=None,
        timestamp=TS,
        sequence_number=0,
        causal_deps=["d"],  # type: ignore[arg-type]
    )
    assert isinstance(op.data, FrozenDict)
    assert op.data["a"] == (1,)
    assert op.causal_deps == ("d",)


# ------------------------------------------------------------------------------------------------ wire


def test_to_wire_shape() -> None:
    op = create_operation(
        update_input(data={"blob": b"\x01", "tags": ["a"]}, causal_deps=["d"], sequence_number=3)
    )
    wire = op.to_wire()
    assert wire == {
        "id": op.id,
        "nodeId": "node-1",
        "type": "update",
        "collection": "todos",
        "recordId": "rec-1",
        "data": {"blob": {BYTES_MARKER: "AQ=="}, "tags": ["a"]},
        "previousData": {"done": False},
        "timestamp": {"wallTime": TS.wall_time, "logical": 0, "nodeId": "node-1"},
        "sequenceNumber": 3,
        "causalDeps": ["d"],
        "schemaVersion": 1,
    }
    assert type(wire["data"]) is dict
    assert type(wire["data"]["tags"]) is list
    assert type(wire["causalDeps"]) is list
    assert json.loads(json.dumps(wire)) == wire


def test_wire_round_trip_of_each_type() -> None:
    for source in (base_input(), update_input(causal_deps=["a", "b"]), delete_input()):
        op = create_operation(source)
        assert Operation.from_wire(json.loads(json.dumps(op.to_wire()))) == op


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=5).filter(lambda k: k != BYTES_MARKER), children, max_size=4)
    ),
    max_leaves=12,
)
records = st.dictionaries(st.text(max_size=6).filter(lambda k: k != BYTES_MARKER), json_values, max_size=5)


@settings(max_examples=150, deadline=None)
@given(records, st.one_of(st.none(), records), st.lists(st.text(min_size=1, max_size=4), max_size=3))
def test_wire_round_trip_property(
    data: dict[str, Any], previous: dict[str, Any] | None, deps: list[str]
) -> None:
    op = create_operation(
        base_input(
            type="update" if previous is not None else "insert",
            data=data,
            previous_data=previous,
            causal_deps=deps,
        )
    )
    text = json.dumps(op.to_wire(), allow_nan=False)
    back = Operation.from_wire(json.loads(text))
    assert back == op
    assert back.id == op.id
    assert back.to_wire() == op.to_wire()
    assert verify_operation(back)


def test_round_trip_preserves_nested_bytes_types() -> None:
    op = create_operation(base_input(data={"l": [b"a", {"b": b""}], "d": {"x": [b"\xff"]}}))
    back = Operation.from_wire(json.loads(json.dumps(op.to_wire())))
    assert back.data is not None
    assert back.data["l"][0] == b"a"
    assert isinstance(back.data["l"][1]["b"], bytes)
    assert back.data["d"]["x"] == (b"\xff",)


@pytest.mark.parametrize(
    "tamper",
    [
        {"recordId": "rec-2"},
        {"collection": "other"},
        {"type": "update", "previousData": {}},
        {"nodeId": "node-9"},
        {"data": {"title": "Buy beer", "done": False}},
        {"timestamp": {"wallTime": TS.wall_time, "logical": 1, "nodeId": "node-1"}},
        {"id": "f" * 64},
    ],
)
def test_tampered_wire_operation_is_refused(tamper: dict[str, Any]) -> None:
    wire = {**create_operation(base_input()).to_wire(), **tamper}
    with pytest.raises(OfflineError) as info:
        Operation.from_wire(wire)
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None
    assert info.value.context["field"] == "id"
    assert info.value.context["reason"] == "HASH_MISMATCH"
    assert info.value.context["received"] == wire["id"]
    # Without verification the claimed id is kept as is.
    assert Operation.from_wire(wire, verify=False).id == wire["id"]


def test_non_hashed_wire_fields_may_change() -> None:
    wire = {**create_operation(base_input()).to_wire(), "sequenceNumber": 12, "causalDeps": ["z"]}
    op = Operation.from_wire(wire)
    assert op.sequence_number == 12
    assert op.causal_deps == ("z",)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"id": None}, "id"),
        ({"id": 5}, "id"),
        ({"sequenceNumber": -1}, "sequenceNumber"),
        ({"timestamp": {"wallTime": 1}}, "timestamp"),
        ({"timestamp": {"wallTime": True, "logical": 0, "nodeId": "node-1"}}, "timestamp"),
        ({"timestamp": {"wallTime": -1, "logical": 0, "nodeId": "node-1"}}, "timestamp"),
        ({"timestamp": {"wallTime": 10**15, "logical": 0, "nodeId": "node-1"}}, "timestamp"),
        ({"timestamp": {"wallTime": 1, "logical": 100_000, "nodeId": "node-1"}}, "timestamp"),
        ({"timestamp": {"wallTime": 1, "logical": 0.0, "nodeId": "node-1"}}, "timestamp"),
        ({"timestamp": {"wallTime": 1, "logical": 0, "nodeId": ""}}, "timestamp"),
        ({"timestamp": {"wallTime": 1, "logical": 0, "nodeId": 7}}, "timestamp"),
        ({"timestamp": {"wallTime": 1, "logical": 0, "node": "node-1"}}, "timestamp"),
        ({"data": {"b": {BYTES_MARKER: "AB=="}}}, "data"),  # non-canonical base64
        ({"data": {"b": {BYTES_MARKER: "not base64!"}}}, "data"),
        ({"data": {"b": {BYTES_MARKER: 12}}}, "data"),
        ({"data": {"b": {BYTES_MARKER: "AA==", "extra": 1}}}, "data"),
        ({"type": "update", "previousData": {"p": {BYTES_MARKER: "%%"}}}, "previousData"),
    ],
)
def test_from_wire_validates(patch: dict[str, Any], field: str) -> None:
    wire = {**create_operation(base_input()).to_wire(), **patch}
    with pytest.raises(OfflineError) as info:
        Operation.from_wire(wire)
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None
    assert info.value.context["field"] == field


def test_a_decoded_timestamp_is_the_one_its_fields_make() -> None:
    """Decoding builds the timestamp without the dataclass constructor and keeps its serialized form:
    both must be exactly what the constructor and serialize_timestamp give."""
    for stamp in (TS, HLCTimestamp(0, 0, "n"), HLCTimestamp(10**15 - 1, 99_999, "node-\u00e9")):
        op = create_operation(base_input(timestamp=stamp, node_id=stamp.node_id))
        decoded = Operation.from_wire(json.loads(json.dumps(op.to_wire())))
        assert decoded == op and hash(decoded) == hash(op)
        assert decoded.timestamp == stamp and hash(decoded.timestamp) == hash(stamp)
        assert type(decoded.timestamp) is HLCTimestamp
        assert timestamp_text(decoded) == serialize_timestamp(stamp) == timestamp_text(op)


def test_encode_decode_helpers() -> None:
    value: FrozenDict[str, Any] = FrozenDict({"a": (b"\x00", {"b": b"xyz"}), "c": 1})
    encoded = encode_value(value)
    assert encoded == {"a": [{BYTES_MARKER: "AA=="}, {"b": {BYTES_MARKER: "eHl6"}}], "c": 1}
    assert encode_value(encoded) == encoded
    assert decode_value(encoded) == {"a": [b"\x00", {"b": b"xyz"}], "c": 1}
    assert encode_value(None) is None
    assert decode_value("plain") == "plain"


def test_operations_and_timestamps_survive_pickling() -> None:
    import pickle

    op = create_operation(update_input(data={"b": b"\x00", "l": [1, {"x": None}]}, causal_deps=["d"]))
    back = pickle.loads(pickle.dumps(op))
    assert back == op
    assert back.timestamp == op.timestamp
    assert isinstance(back.data, FrozenDict)
    assert verify_operation(back)


@settings(max_examples=200, deadline=None)
@given(
    st.text(st.characters(min_codepoint=0, max_codepoint=127), min_size=1, max_size=8),
    st.integers(min_value=1, max_value=MAX_SAFE_INTEGER),
)
def test_received_one_entry_context_is_hashed_as_rfc8785(node: str, count: int) -> None:
    """A received operation whose causal context is its own node's one entry (an insert's) is read by the
    plain-wire path, which writes the context's text itself: its id is the sha256 of rfc8785's bytes of the
    payload, whatever ASCII the node id holds (quotes, backslashes, control characters)."""
    import rfc8785

    from offline.core import operations as operations_module

    stamp = HLCTimestamp(TS.wall_time, 0, node)
    payload = {
        "type": "insert",
        "collection": "todos",
        "recordId": "rec-1",
        "data": {"title": "x"},
        "timestamp": serialize_timestamp(stamp),
        "nodeId": node,
        "causalContext": {node: count},
    }
    wire = {
        "id": hashlib.sha256(rfc8785.dumps(payload)).hexdigest(),
        "nodeId": node,
        "type": "insert",
        "collection": "todos",
        "recordId": "rec-1",
        "data": {"title": "x"},
        "previousData": None,
        "timestamp": {"wallTime": stamp.wall_time, "logical": 0, "nodeId": node},
        "sequenceNumber": 1,
        "causalDeps": [],
        "schemaVersion": 1,
        "causalContext": {node: count},
    }
    fast = operations_module._from_plain_wire(json.loads(json.dumps(wire)), True)
    assert fast is not None and fast.id == wire["id"]
    assert fast.causal_context == {node: count}
    assert Operation.from_wire(wire) == fast


def test_an_adopted_dict_is_a_frozen_dict_like_any_other() -> None:
    """`adopt` wraps the dict it is handed without copying it: equal, hashable and immutable as
    ``FrozenDict(...)`` is (operations' data and contexts are built with it)."""
    data = {"a": 1, "b": (2, 3)}
    adopted = adopt(data)
    assert type(adopted) is FrozenDict and adopted._data is data
    assert adopted == FrozenDict(data) == data
    assert hash(adopted) == hash(FrozenDict(data))
    with pytest.raises(TypeError):
        adopted.x = 1  # type: ignore[attr-defined]
    assert thaw(adopted) == {"a": 1, "b": [2, 3]}
