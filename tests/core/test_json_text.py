"""The once-built C JSON encoders: the same text as ``json.dumps`` with the same options, or the fallback."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offline.core.json_text import ORJSON, c_compact_encoder, exact_loads

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.parametrize("sort_keys", [False, True])
@pytest.mark.parametrize("allow_nan", [False, True])
@pytest.mark.parametrize("ensure_ascii", [False, True])
@given(value=values)
def test_same_text_as_json_dumps(value: Any, sort_keys: bool, allow_nan: bool, ensure_ascii: bool) -> None:
    options: dict[str, Any] = {
        "separators": (",", ":"),
        "ensure_ascii": ensure_ascii,
        "sort_keys": sort_keys,
        "allow_nan": allow_nan,
    }
    public = json.JSONEncoder(**options).encode
    encode = c_compact_encoder(
        None,
        public,
        {"a": [1, "\u00e9"]},
        sort_keys=sort_keys,
        allow_nan=allow_nan,
        ensure_ascii=ensure_ascii,
    )
    assert encode is not public  # the C encoder was built
    try:
        expected = public(value)
    except ValueError:  # NaN or an infinity with allow_nan=False: both refuse it
        with pytest.raises(ValueError):
            encode(value)
        return
    assert encode(value) == expected


def test_default_is_called_for_other_values() -> None:
    def default(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.hex()
        raise TypeError(f"not JSON: {type(value).__name__}")

    def fallback(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=default)

    encode = c_compact_encoder(default, fallback, {"b": b"\x01"})
    assert encode({"b": b"\x00\xff", "t": (1, 2)}) == '{"b":"00ff","t":[1,2]}'
    with pytest.raises(TypeError):
        encode({1, 2})


def test_an_encoder_escaping_otherwise_than_the_fallback_gives_way_to_it() -> None:
    def fallback(value: Any) -> str:  # escapes what is not ASCII, as the C encoder asked for does not
        return json.dumps(value, separators=(",", ":"))

    assert c_compact_encoder(None, fallback, {"a": [1, 2]}) is fallback
    assert c_compact_encoder(None, fallback, {"a": [1, 2]}, ensure_ascii=True) is not fallback


def test_a_disagreeing_encoder_gives_way_to_the_fallback() -> None:
    def fallback(value: Any) -> str:  # not what the C encoder writes (spaces)
        return json.dumps(value)

    assert c_compact_encoder(None, fallback, {"a": [1, 2]}) is fallback


# Integers past 64 bits, floats in exponent form and lone surrogates included: orjson reads or writes each
# otherwise than json, and `exact_loads` must then say no.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


def _typed(value: Any) -> Any:
    """``value`` with each number tagged by its type, so 1 and 1.0 (equal in Python) compare unequal."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


@given(value=json_values)
def test_exact_loads_reads_what_json_reads_or_says_no(value: Any) -> None:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    read = exact_loads(text)
    if read is None:
        return
    assert _typed(read) == _typed(json.loads(text))
    # What it read, orjson writes back as the text itself (`floatless_json` relies on it).
    assert ORJSON is not None and ORJSON.dumps(read).decode() == text


@pytest.mark.skipif(ORJSON is None, reason="orjson is not installed (or OFFLINE_NO_ORJSON is set)")
def test_exact_loads_reads_the_usual_text_and_refuses_what_orjson_would_read_otherwise() -> None:
    assert exact_loads('{"a":[1,"\u00e9",0.5,true,null],"b":{}}') == {
        "a": [1, "\u00e9", 0.5, True, None],
        "b": {},
    }
    for text in (
        '{"a":123456789012345678901234567890}',  # orjson: a float
        '{"a":-9223372036854775809}',
        '{"a":1e-07}',  # orjson writes 1e-7
        '{"a":1,"a":2}',  # a repeated key
        '{"a":NaN}',
        '{"a":1e400}',
        '{"a":"\\ud800"}',
        '{"a": 1}',  # not compact
        ' {"a":1}',
    ):
        assert exact_loads(text) is None, text
