"""`floatless_json`: `compact_json`'s text on orjson, for the trees `is_floatless` vouches for."""

from __future__ import annotations

import enum
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from offline.core.frozen import FrozenDict
from offline.core.json_text import ORJSON
from offline.merge.values import compact_json, floatless_json, is_floatless

# Integers past 64 bits and lone surrogates included: orjson refuses them, and the fallback writes them.
scalars = st.none() | st.booleans() | st.integers() | st.text()
trees = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=16,
)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_orjson_writes_when_installed() -> None:
    assert (floatless_json is compact_json) == (ORJSON is None)


@given(value=trees)
def test_a_tree_without_floats_is_written_as_compact_json(value: Any) -> None:
    assert is_floatless(value)
    assert floatless_json(value) == _dumps(value)


@given(value=trees, number=st.floats(allow_nan=False, allow_infinity=False), where=st.integers(0, 2))
def test_a_float_anywhere_says_no(value: Any, number: float, where: int) -> None:
    tree = [number, value] if where == 0 else {"a": value, "b": [value, {"c": number}]}
    if where == 2:
        tree = (value, (number,))
    assert not is_floatless(tree)


class _Name(str):
    pass


class _Level(enum.IntEnum):
    LOW = 1


def test_other_types_say_no() -> None:
    for odd in (1e-7, _Name("x"), _Level.LOW, FrozenDict({"a": 1}), b"\x00", {1, 2}, object()):
        assert not is_floatless(odd)
        assert not is_floatless({"a": [odd]})


def test_what_orjson_writes_otherwise_is_never_vouched_for() -> None:
    # Floats orjson writes otherwise than json: exponents ("1e-7", "1e16"), and NaN as null.
    for number in (1e-7, 1e16, 1.5e300, float("nan")):
        assert not is_floatless({"n": number})
        assert compact_json({"n": number}) == _dumps({"n": number})
