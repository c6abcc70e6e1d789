"""Deep immutability for values the framework hands out (schemas, operation data).

`FrozenDict` is a read-only, hashable mapping; `freeze` turns nested dicts/lists/sets into
FrozenDict/tuple/frozenset and `thaw` turns them back into plain, JSON-friendly containers.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class FrozenDict(Mapping[K, V]):
    """An immutable mapping. Equal to a plain dict with the same items."""

    __slots__ = ("_data", "_hash")
    _data: dict[K, V]
    _hash: int | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_data", dict(*args, **kwargs))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    # The Mapping mixins would go through __iter__ and __getitem__ per key; operations carry FrozenDicts
    # (data, previous data, causal context) read on every write and every fold, so these ask the dict. Its
    # views are read-only, so nothing here hands out a way to change the mapping.
    def __contains__(self, key: object) -> bool:
        return key in self._data

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, /, default: V | T) -> V | T: ...
    def get(self, key: K, /, default: Any = None) -> Any:
        return self._data.get(key, default)

    def keys(self) -> KeysView[K]:
        return self._data.keys()

    def items(self) -> ItemsView[K, V]:
        return self._data.items()

    def values(self) -> ValuesView[V]:
        return self._data.values()

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError("FrozenDict is immutable")

    def __delattr__(self, name: str) -> None:
        raise TypeError("FrozenDict is immutable")

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._data.items())))
        assert self._hash is not None
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return bool(self._data == other._data)
        if isinstance(other, Mapping):
            return bool(self._data == dict(other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (self._data,))


_new = object.__new__
_set_data = FrozenDict.__dict__["_data"].__set__  # the slots' descriptors: past the __setattr__ refusal
_set_hash = FrozenDict.__dict__["_hash"].__set__


def adopt(data: dict[K, V]) -> FrozenDict[K, V]:
    """A FrozenDict of ``data`` itself, not a copy: for a dict no one else holds (the caller made it and
    hands it over). Through the slots directly: ``FrozenDict(data)`` (the copy, ``__init__``'s arguments
    and two ``object.__setattr__`` calls) took ~3 times as long, once per operation's data and context."""
    frozen: FrozenDict[K, V] = _new(FrozenDict)
    _set_data(frozen, data)
    _set_hash(frozen, None)
    return frozen


def freeze(value: Any) -> Any:
    """Return a deeply immutable copy of ``value`` (dict -> FrozenDict, list -> tuple, set -> frozenset)."""
    if isinstance(value, FrozenDict):
        return value
    if isinstance(value, Mapping):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(freeze(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def thaw(value: Any) -> Any:
    """Return a plain mutable copy of ``value`` (FrozenDict/Mapping -> dict, tuple -> list)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return [thaw(v) for v in sorted(value, key=repr)]
    return value
