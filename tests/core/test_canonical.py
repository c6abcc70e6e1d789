"""canonical_json must be byte-for-byte rfc8785.dumps (errors included), just faster."""

from __future__ import annotations

import hashlib
import math
import struct
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from offline.core import canonical as canonical_module
from offline.core import operations
from offline.core.canonical import canonical_json
from offline.core.errors import OfflineError
from offline.core.frozen import FrozenDict, freeze
from offline.core.hlc import HLCTimestamp, serialize_timestamp
from offline.core.operations import BYTES_MARKER, MAX_SAFE_INTEGER, create_operation, encode_value

# ------------------------------------------------------------------------------------------ strategies

# Characters where the escaping or the key order of JSON encoders tend to differ.
_TRICKY_CHARS = st.one_of(
    st.characters(min_codepoint=0, max_codepoint=0x7F),  # controls, quote, backslash, DEL
    st.sampled_from(["\u2028", "\u2029", "\u0080", "\u00e9", "\ufeff", "\ufffd", "\uffff", "\U0010ffff"]),
    st.characters(min_codepoint=0xE000, max_codepoint=0xFFFF),  # BMP above the surrogates
    st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF),  # surrogate pairs in UTF-16
    st.characters(codec="utf-8"),
)
_TEXT = st.text(_TRICKY_CHARS, max_size=6)
# Short keys drawn from a small alphabet collide on prefixes, which is where orderings differ.
_KEYS = st.one_of(
    st.text(st.sampled_from(["a", "b", "\x7f", "\u00e9", "\ue000", "\uffff", "\U00010000", "\U0001f600"])),
    _TEXT,
)

_EDGE_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    2.0,
    0.5,
    1e-4,
    math.nextafter(1e-4, 0),
    9.999e-5,
    1e-5,
    1e-6,
    1.5e-6,
    math.nextafter(1e-6, 0),
    1e-7,
    -1e-7,
    1e16,
    math.nextafter(1e16, 0),
    1.5e16,
    1e20,
    1e21,
    math.nextafter(1e21, 0),
    math.nextafter(1e21, math.inf),
    1e22,
    2.0**53,
    -(2.0**53),
    2.0**53 - 1,
    2.0**53 + 2,
    2.0**52 + 0.5,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    2.225073858507201e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    333333333.33333329,
    0.1 + 0.2,
    123456789012345680.0,
    4.35,
    0.000001,
]

_FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(
        allow_nan=False, allow_infinity=False, allow_subnormal=True, min_value=-1e-300, max_value=1e-300
    ),
    st.sampled_from(_EDGE_FLOATS),
    st.integers(-(2**53), 2**53).map(float),
    # Any bit pattern: every exponent, including subnormals (NaN and infinities filtered out).
    st.integers(0, 2**64 - 1)
    .map(lambda bits: struct.unpack("<d", bits.to_bytes(8, "little"))[0])
    .filter(math.isfinite),
    # Short decimals across all magnitudes: the numbers people actually write.
    st.builds(lambda m, e: float(f"{m}e{e}"), st.integers(-99999, 99999), st.integers(-330, 310)).filter(
        math.isfinite
    ),
)
_INTS = st.one_of(
    st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
    st.sampled_from([0, 1, -1, MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 2**31, -(2**31), 2**32]),
)
_SCALARS = st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, _TEXT)
_JSON = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(_KEYS, children, max_size=6),
    ),
    max_leaves=12,
)


def _outcome(fn: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(value)
    except RecursionError:
        return "error", "RecursionError"
    except Exception as exc:
        return "error", (type(exc), str(exc))


# ---------------------------------------------------------------------------------------- properties


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSON)
@example({"\ue000": 1, "\U0001f600": 2, "\uffff": 3, "\ud7ff": 4})
@example([1e21, 1e-7, 5e-324, -0.0, 2.0, 1e16, 2.0**53, 1e-5, 0.0001])
def test_matches_rfc8785(value: Any) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


# Values rfc8785 refuses or that only the fallback can handle: the outcome must be the same.
_ODD_SCALARS = st.one_of(
    st.sampled_from(
        [
            math.nan,
            math.inf,
            -math.inf,
            2**53,
            -(2**53),
            2**63,
            -(10**30),
            "\ud800",
            "a\udfffb",
            b"bytes",
            {1, 2},
            object(),
            True,
        ]
    ),
    st.integers(),
    st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=3),
)
_ODD_KEYS = st.one_of(_KEYS, st.integers(), st.none(), st.booleans(), st.just("\udc00"), st.floats())
_ODD_JSON = st.recursive(
    st.one_of(_SCALARS, _ODD_SCALARS),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(_ODD_KEYS, children, max_size=4),
        st.dictionaries(_KEYS, children, max_size=3).map(FrozenDict),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ODD_JSON)
def test_same_outcome_as_rfc8785_for_any_value(value: Any) -> None:
    assert _outcome(canonical_json, value) == _outcome(rfc8785.dumps, value)


# ---------------------------------------------------------------------------------------- edge cases


def test_every_code_point_is_escaped_like_rfc8785() -> None:
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert canonical_json(everything) == rfc8785.dumps(everything)
    assert canonical_json({everything: everything}) == rfc8785.dumps({everything: everything})


def test_string_escapes() -> None:
    value = '\b\f\n\r\t\x00\x01\x1f"\\/\x7f\u2028\u2029é\U0001f600'
    expected = '"\\b\\f\\n\\r\\t\\u0000\\u0001\\u001f\\"\\\\/\x7f\u2028\u2029é\U0001f600"'
    assert canonical_json(value) == expected.encode("utf-8") == rfc8785.dumps(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (2.0, "2"),
        (-3.0, "-3"),
        (0.5, "0.5"),
        (1e-4, "0.0001"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (9007199254740991.0, "9007199254740991"),
        (2.0**53, "9007199254740992"),
        (1e16, "10000000000000000"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e300, "1.5e+300"),
        (5e-324, "5e-324"),
        (-5e-324, "-5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (333333333.33333329, "333333333.3333333"),
        (0.1 + 0.2, "0.30000000000000004"),
    ],
)
def test_number_forms(value: float, expected: str) -> None:
    assert canonical_json(value) == expected.encode() == rfc8785.dumps(value)


def test_key_order_is_by_utf16_code_units() -> None:
    # RFC 8785 section 3.2.3's example: the emoji (D83D DE00) sorts before U+FB33 although it is larger.
    value = {"\u20ac": 1, "\r": 2, "\ufb33": 3, "1": 4, "\U0001f600": 5, "\u0080": 6, "\u00f6": 7}
    expected = '{"\\r":2,"1":4,"\u0080":6,"\u00f6":7,"\u20ac":1,"\U0001f600":5,"\ufb33":3}'
    assert canonical_json(value) == expected.encode("utf-8") == rfc8785.dumps(value)
    # Without supplementary characters code point order is code unit order: the fast path is taken.
    bmp = {"\uffff": 1, "\ue000": 2, "\ud7ff": 3, "a": 4, "": 5}
    assert canonical_module._prepare(bmp) is bmp
    assert canonical_json(bmp) == rfc8785.dumps(bmp)


@pytest.mark.parametrize(
    "value",
    [
        2**53,
        -(2**53),
        {"a": [1, 2**60]},
        math.nan,
        [math.inf],
        {"a": -math.inf},
        {1: "x"},
        {None: "x"},
        "\ud800",
        {"\udfff": 1},
        FrozenDict({"a": 1}),
        b"raw",
        {"a": {1, 2}},
    ],
)
def test_refused_like_rfc8785(value: Any) -> None:
    with pytest.raises(ValueError) as expected:
        rfc8785.dumps(value)
    with pytest.raises(type(expected.value)) as actual:
        canonical_json(value)
    assert str(actual.value) == str(expected.value)


def test_subclasses_are_serialized_like_rfc8785() -> None:
    import enum

    class Color(enum.IntEnum):
        RED = 1

    class Name(enum.StrEnum):
        ALICE = "alice"

    class MyDict(dict[str, Any]):
        pass

    for value in [Color.RED, [Color.RED, 2.0], {"k": Name.ALICE}, MyDict(b=1, a=2.0), (1, (2.0,))]:
        assert _outcome(canonical_json, value) == _outcome(rfc8785.dumps, value)


def test_cycles_and_deep_nesting_behave_like_rfc8785() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(RecursionError):
        rfc8785.dumps(cyclic)
    with pytest.raises(RecursionError):
        canonical_json(cyclic)
    deep: Any = 1
    for _ in range(300):
        deep = {"a": [deep]}
    assert canonical_json(deep) == rfc8785.dumps(deep)


def test_typical_documents_take_the_fast_path() -> None:
    value = {"s": "x", "i": 1, "b": True, "n": None, "f": 1.5, "l": [1, "é", {"k": False}], "t": ("a",)}
    assert canonical_module._prepare(value) is value
    converted = canonical_module._prepare({"x": [2.0, -0.0]})
    assert converted == {"x": [2, 0]}
    assert all(type(v) is int for v in converted["x"])
    for slow in [1e-5, 1e16, 1e21, 2**53, {"\U0001f600": 1}, {1: 1}, math.nan, Ellipsis]:
        with pytest.raises(canonical_module._NeedsFallback):
            canonical_module._prepare(slow)


# ------------------------------------------------------------------------------- operation ids unchanged

TS = HLCTimestamp(1_700_000_000_000, 7, "node-1")


def _old_id(type_: str, collection: str, record_id: str, data: Any, ts: HLCTimestamp, node_id: str) -> str:
    """How ids were computed before canonical_json: pure rfc8785 over encode_value of the frozen data."""
    payload = {
        "type": type_,
        "collection": collection,
        "recordId": record_id,
        "data": encode_value(freeze(data)) if data is not None else None,
        "timestamp": serialize_timestamp(ts),
        "nodeId": node_id,
    }
    return hashlib.sha256(rfc8785.dumps(payload)).hexdigest()


_DATA_KEYS = _KEYS.filter(lambda k: k != BYTES_MARKER)
_DATA = st.recursive(
    st.one_of(_SCALARS, st.binary(max_size=6), st.binary(max_size=3).map(bytearray)),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(_DATA_KEYS, children, max_size=4),
        st.dictionaries(_DATA_KEYS, children, max_size=3).map(freeze),
    ),
    max_leaves=15,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(_DATA_KEYS, _DATA, max_size=6)
    | st.dictionaries(_DATA_KEYS, _DATA, max_size=4).map(freeze),
    st.sampled_from(["insert", "update"]),
    _TEXT.filter(bool),
)
def test_operation_ids_are_unchanged(data: Any, type_: str, record_id: str) -> None:
    fields: dict[str, Any] = {
        "node_id": "node-1",
        "type": type_,
        "collection": "todos",
        "record_id": record_id,
        "data": data,
        "previous_data": {} if type_ == "update" else None,
        "timestamp": TS,
        "sequence_number": 3,
        "schema_version": 1,
    }
    op = create_operation(fields)
    expected = _old_id(type_, "todos", record_id, data, TS, "node-1")
    assert op.id == expected
    assert op.data == freeze(data)
    assert operations.compute_operation_id(op) == expected
    assert operations.compute_operation_id(op.to_wire()) == expected
    assert operations.Operation.from_wire(op.to_wire()) == op


def test_known_operation_ids() -> None:
    cases: list[tuple[str, Any]] = [
        ("insert", {"title": "Buy milk", "done": False, "priority": 3, "owner": "alice", "pinned": True}),
        ("insert", {"f": [1.0, -0.0, 1e-7, 1e21, 0.1, 5e-324], "\U0001f600": "x", "\ufb33": b"\x00\xff"}),
        ("insert", {"nested": {"list": [{"a": None}, [bytearray(b"hi")]], "esc": '\x00\n"\\\u2028'}}),
        ("delete", None),
    ]
    for type_, data in cases:
        op = create_operation(
            {
                "node_id": "node-1",
                "type": type_,
                "collection": "todos",
                "record_id": "rec-1",
                "data": data,
                "timestamp": TS,
                "sequence_number": 0,
                "schema_version": 1,
            }
        )
        assert op.id == _old_id(type_, "todos", "rec-1", data, TS, "node-1")


# ---------------------------------------------------------------------- fast validation path of records


_ANY_DATA = st.recursive(
    st.one_of(
        _DATA,
        _ODD_SCALARS,
        st.just(BYTES_MARKER),
        st.just(memoryview(b"x")),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.one_of(_ODD_KEYS, st.just(BYTES_MARKER)), children, max_size=3),
        st.dictionaries(_KEYS, children, max_size=3).map(FrozenDict),
    ),
    max_leaves=10,
)


def _slow_record(field: str, value: Any) -> tuple[Any, Any]:
    """The complete validation walk alone (what _check_record did before it had a fast path)."""
    operations._check_mapping(field, value, field, 1)
    frozen = freeze(value)
    return frozen, encode_value(frozen)


def _record_outcome(fn: Any, value: Any) -> tuple[str, Any]:
    try:
        frozen, plain = fn("data", value)
    except OfflineError as exc:
        return "error", (exc.message, exc.context)
    return "ok", (frozen, type(frozen), plain, rfc8785.dumps(plain))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.one_of(_ODD_KEYS, st.just(BYTES_MARKER)), _ANY_DATA, max_size=4))
def test_fast_record_validation_agrees_with_the_complete_walk(value: dict[Any, Any]) -> None:
    assert _record_outcome(operations._check_record, value) == _record_outcome(_slow_record, value)


@pytest.mark.parametrize("depth", [60, 62, 63, 64, 65, 66])
def test_nesting_limit_is_unchanged(depth: int) -> None:
    leaves: list[Any] = [1, [], {}]
    for leaf in leaves:
        value: Any = leaf
        for _ in range(depth):
            value = {"a": value}
        assert _record_outcome(operations._check_record, value) == _record_outcome(_slow_record, value)


def test_hash_form_does_not_share_the_callers_containers() -> None:
    inner = [1, {"b": 2}]
    data = {"a": inner}
    frozen, plain = operations._check_record("data", data)
    assert plain == {"a": [1, {"b": 2}]}
    assert plain is not data
    assert plain["a"] is not inner
    assert plain["a"][1] is not inner[1]
    assert frozen == freeze(data)
    assert isinstance(frozen["a"], tuple)
    assert isinstance(frozen["a"][1], FrozenDict)


# ------------------------------------------------------------------------ the two encoders behind the fast path

_PLAIN_FLOATS = st.floats(min_value=1e-4, max_value=1e16, exclude_max=True) | st.floats(
    min_value=-1e16, max_value=-1e-4, exclude_min=True
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.one_of(_SCALARS, _PLAIN_FLOATS),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=5),
        max_leaves=15,
    )
)
@example([0.0001, 0.1 + 0.2, 1e15 + 0.5, 9999999999999998.0, 123456.789e-3, -5e-4])
def test_orjson_and_the_standard_library_write_prepared_values_alike(value: Any) -> None:
    """The fast path encodes what ``_prepare`` returns with orjson when it is installed: the same text as the
    standard library's encoder (and so as rfc8785), or the fallback."""
    try:
        prepared = canonical_module._prepare(value)
    except canonical_module._NeedsFallback:
        return
    assert canonical_module._encode(prepared) == canonical_module._stdlib_encode(prepared)


_CONTEXT_KEYS = st.one_of(_TEXT, st.sampled_from(["node-1", "\U0001f600", "\ufb33", "a\U00010000", '"\\']))
_CONTEXT_NUMBERS = st.one_of(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from([MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1, 2.0, True]),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_CONTEXT_KEYS, _CONTEXT_NUMBERS, max_size=5), _TEXT.filter(bool))
@example({"node-1": 1}, "r")
@example({"\U0001f600": 1, "\ufb33": 2}, "r")  # UTF-16 order differs from code point order here
def test_payload_with_a_causal_context_is_rfc8785(context: dict[str, Any], record_id: str) -> None:
    """The payload of an operation with a causal context, written directly by canonical_operation_payload,
    is rfc8785's bytes of the whole object (or fails as rfc8785 does)."""
    payload = {
        "type": "update",
        "collection": "todos",
        "recordId": record_id,
        "data": {"title": "x"},
        "timestamp": serialize_timestamp(TS),
        "nodeId": "node-1",
        "causalContext": context,
    }
    try:
        expected: bytes | None = rfc8785.dumps(payload)
    except Exception:
        expected = None
    try:
        got: bytes | None = canonical_module.canonical_operation_payload(
            "update", "todos", record_id, {"title": "x"}, serialize_timestamp(TS), "node-1", context
        )
    except Exception:
        got = None
    assert got == expected
