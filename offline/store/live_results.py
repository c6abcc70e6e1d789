"""A live query's results kept current from what each commit changed, and the change sets handed out.

After a commit the records it touched are read again by id (`Query.among`, the query's filters applied in
SQL) and put in place in the held results, ordered in Python the way SQLite's ORDER BY orders them: a refresh
costs the touched records, not the collection. Two cases run the query again instead (then only the
difference is handed out): a limited window that lost records only the rest of the table can refill, and an
ordering on a rich text field (its stored form is a CRDT document, not the text the records show).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .rows import to_column

if TYPE_CHECKING:
    from .collection import Query

Record = dict[str, Any]
SortKey = Callable[[Record], Any]

# Changes touching more records than this are merged in one pass instead of one insertion each.
_SPLICE_ONE_BY_ONE = 32


@dataclass(frozen=True, slots=True)
class QueryChanges:
    """How a live query's results changed (what `Query.subscribe_changes` callbacks receive).

    The same change set the browser client's LiveResults hands its callbacks: ``inserted`` records entered
    the results, ``updated`` ones stayed and changed (``previous`` holds their values before, in the same
    order), ``removed`` ones left (as they were last seen). The first call has ``reset`` True and the whole
    results in ``inserted``. ``apply(records)`` turns the results before into the results after, in the
    query's order.
    """

    reset: bool
    inserted: list[Record]
    updated: list[Record]
    previous: list[Record]
    removed: list[Record]
    _key: SortKey | None = field(default=None, repr=False, compare=False)
    # Without a sort key (an ordering on rich text): the ids of the results after, in order.
    _order: list[str] | None = field(default=None, repr=False, compare=False)

    def apply(self, records: Sequence[Record]) -> list[Record]:
        """The results after these changes, from ``records``: the results before, as the previous call
        returned them (any list for the first call, whose change set replaces it)."""
        if self._order is not None:
            by_id = {} if self.reset else {record["id"]: record for record in records}
            for record in self.removed:
                by_id.pop(record["id"], None)
            for record in self.inserted + self.updated:
                by_id[record["id"]] = record
            return [by_id[record_id] for record_id in self._order]
        key = self._key
        assert key is not None
        if self.reset:
            return sorted(self.inserted, key=key)
        return _spliced(list(records), self.removed + self.previous, self.inserted + self.updated, key)


class _Descending:
    """A sort key part that orders the other way (text cannot be negated)."""

    __slots__ = ("part",)

    def __init__(self, part: Any) -> None:
        self.part = part

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.part == other.part

    def __lt__(self, other: _Descending) -> bool:
        return bool(other.part < self.part)

    def __le__(self, other: _Descending) -> bool:
        return bool(other.part <= self.part)

    def __gt__(self, other: _Descending) -> bool:
        return bool(other.part > self.part)

    def __ge__(self, other: _Descending) -> bool:
        return bool(other.part >= self.part)

    __hash__ = None  # type: ignore[assignment]


def _ranked(value: Any) -> tuple[int, Any]:
    """A stored value as SQLite orders it: NULL first, then numbers, then text, then blobs."""
    if value is None:
        return (0, 0)
    if isinstance(value, int | float):
        return (1, value)
    if isinstance(value, str):
        # SQLite's BINARY collation compares UTF-8 bytes, which order like the code points Python compares.
        return (2, value)
    return (3, bytes(value))


def sort_key(query: Query) -> SortKey | None:
    """The key that sorts records as ``query``'s ORDER BY sorts their rows; None when Python cannot
    reproduce it (an ordering on a rich text field)."""
    fields = query.collection.fields
    getters: list[tuple[str, Any, bool]] = []
    for name, desc in [*query.order, ("id", False)]:
        descriptor = None if name == "id" else fields[name]
        if descriptor is not None and descriptor.type == "richtext":
            return None
        getters.append((name, descriptor, desc))

    def key(record: Record) -> tuple[Any, ...]:
        parts: list[Any] = []
        for name, descriptor, desc in getters:
            value = record.get(name)
            part = _ranked(value if descriptor is None else to_column(descriptor, value))
            parts.append(_Descending(part) if desc else part)
        return tuple(parts)

    return key


def _position(rows: list[Record], record: Record, key: SortKey) -> int:
    """Where ``record`` (by id) sits in ``rows``; -1 when it is not there."""
    index = bisect_left(rows, key(record), key=key)
    if index < len(rows) and rows[index]["id"] == record["id"]:
        return index
    for index, held in enumerate(rows):  # a list not in this key's order: look everywhere
        if held["id"] == record["id"]:
            return index
    return -1


def _spliced(rows: list[Record], old: list[Record], new: list[Record], key: SortKey) -> list[Record]:
    """``rows`` (sorted by ``key``) without the records of ``old`` and with those of ``new``, in order; may
    change ``rows`` itself."""
    if len(old) + len(new) <= _SPLICE_ONE_BY_ONE:
        for record in old:
            index = _position(rows, record, key)
            if index >= 0:
                del rows[index]
        for record in new:
            insort(rows, record, key=key)
        return rows
    gone = {record["id"] for record in old}
    kept = [record for record in rows if record["id"] not in gone] if gone else rows
    added = sorted(new, key=key)
    out: list[Record] = []
    start = 0
    for record in added:
        index = bisect_left(kept, key(record), lo=start, key=key)
        out.extend(kept[start:index])
        out.append(record)
        start = index
    out.extend(kept[start:])
    return out


class LiveResults:
    """The current results of one live query, and how each refresh changed them."""

    def __init__(self, query: Query) -> None:
        self.query = query
        self.key = sort_key(query)
        self.limit: int | None = query._limit
        self.rows: list[Record] = []  # in the query's order
        self.by_id: dict[str, Record] = {}

    def _changes(
        self,
        reset: bool,
        inserted: list[Record],
        updated: list[Record],
        previous: list[Record],
        removed: list[Record],
    ) -> QueryChanges:
        order = None if self.key is not None else [record["id"] for record in self.rows]
        return QueryChanges(reset, inserted, updated, previous, removed, self.key, order)

    def reset(self) -> QueryChanges:
        """Run the query: the results as a whole."""
        self.rows = self.query.fetch()
        self.by_id = {record["id"]: record for record in self.rows}
        return self._changes(True, list(self.rows), [], [], [])

    def refresh(self, touched: Collection[str] | None) -> QueryChanges | None:
        """Bring the results up to date after the records ``touched`` (ids; None: unknown) changed; None when
        the results stayed the same."""
        if self.limit == 0:
            return None
        if touched is None or self.key is None:
            return self._run_again()
        touched = set(touched)
        if not touched:
            return None
        key = self.key
        found = {record["id"]: record for record in self.query.among(touched)}
        limit = self.limit
        if limit is not None and len(self.rows) >= limit:
            # A full window: the records outside it all sort after its last one. It stays exact without
            # them while enough records (untouched ones in it, touched ones now sorting before its end)
            # still fill it.
            last = key(self.rows[-1])
            staying = len(self.rows) - sum(1 for record_id in touched if record_id in self.by_id)
            entering = sum(1 for record in found.values() if key(record) <= last)
            if staying + entering < limit:
                return self._run_again()
        inserted: list[Record] = []
        updated: list[Record] = []
        previous: list[Record] = []
        removed: list[Record] = []
        for record_id in touched:
            old = self.by_id.get(record_id)
            new = found.get(record_id)
            if new is None:
                if old is not None:
                    removed.append(old)
            elif old is None:
                inserted.append(new)
            elif new != old:
                updated.append(new)
                previous.append(old)
        if not (inserted or updated or removed):
            return None
        rows = _spliced(self.rows, removed + previous, inserted + updated, key)
        for record in removed:
            del self.by_id[record["id"]]
        for record in inserted + updated:
            self.by_id[record["id"]] = record
        if limit is not None and len(rows) > limit:
            # Pushed past the window's end: gone from the results, as last shown (never shown when it
            # has just come in).
            pushed = rows[limit:]
            del rows[limit:]
            was = {record["id"]: old for record, old in zip(updated, previous, strict=True)}
            fresh = {record["id"] for record in inserted}
            for record in pushed:
                del self.by_id[record["id"]]
                if record["id"] not in fresh:
                    removed.append(was.get(record["id"], record))
            out = {record["id"] for record in pushed}
            inserted = [record for record in inserted if record["id"] not in out]
            kept = [i for i, record in enumerate(updated) if record["id"] not in out]
            updated = [updated[i] for i in kept]
            previous = [previous[i] for i in kept]
        self.rows = rows
        if not (inserted or updated or removed):
            return None
        inserted.sort(key=key)
        return self._changes(False, inserted, updated, previous, removed)

    def _run_again(self) -> QueryChanges | None:
        """Run the query and hand out how its results differ from the held ones."""
        results = self.query.fetch()
        before = self.by_id
        now = {record["id"]: record for record in results}
        inserted = [record for record in results if record["id"] not in before]
        updated = [r for r in results if r["id"] in before and before[r["id"]] != r]
        previous = [before[record["id"]] for record in updated]
        removed = [record for record_id, record in before.items() if record_id not in now]
        self.rows = results
        self.by_id = now
        if not (inserted or updated or removed):
            return None
        return self._changes(False, inserted, updated, previous, removed)
