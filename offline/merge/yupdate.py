"""The canonical encoding of a Yjs update (v1): the same bytes for the same content, whoever encoded it.

A rich text state must be a function of the set of operations folded into it, byte for byte, on every
replica (DESIGN.md section 3). A Yjs document's own encoding is not: it writes its struct store as it is,
and where a run of one client's typing is cut into several structs depends on the order the updates were
integrated in (a run split by a concurrent insertion stays split after that insertion is deleted; an
update applied in one go keeps the boundaries its encoder had). yrs and yjs also order a delete set's
clients differently. What the structs mean does not depend on any of that: a struct of length n is n
one-character items, each after the previous one, all with the struct's right origin, and Yjs integrates
a run the same however it is cut.

So the canonical encoding rewrites an update from that meaning alone:

- clients in decreasing order (as yjs writes them), each client's structs by clock, a gap in its clocks
  as one Skip struct;
- every two structs that can be one are joined: the second continues the first (its clocks follow on, its
  origin is the first's last character, its right origin is the first's) and both hold content of one
  joinable kind (text, deleted content, JSON or Any values), or both are garbage-collected ranges;
- the delete set: clients in decreasing order, each client's ranges sorted and joined where they touch.

Where the input overlaps itself (several updates' structs for the same clocks), the first struct given for
a clock is kept. Content is kept as it was given: a deleted item's text becomes deleted content in a
document (garbage collection), which is why `offline.merge.richtext` canonicalises a document's own encoding,
not the updates it was made from.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import pairwise

_GC = 0
_DELETED = 1
_JSON = 2
_BINARY = 3
_STRING = 4
_EMBED = 5
_FORMAT = 6
_TYPE = 7
_ANY = 8
_DOC = 9
_SKIP = 10
#: Content kinds of which two structs join into one (the second's values after the first's).
_JOINABLE = frozenset({_DELETED, _JSON, _STRING, _ANY})
#: Yjs type refs whose content carries a name (YXmlElement, YXmlHook).
_NAMED_TYPES = frozenset({3, 5})


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def uint(self) -> int:
        data, pos = self.data, self.pos
        value = data[pos]  # IndexError past the end: not an update
        if value < 0x80:  # most numbers here: one byte
            self.pos = pos + 1
            return value
        value, shift = 0, 0
        while True:
            byte = data[pos]  # IndexError past the end: not an update
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return value
            shift += 7

    def byte(self) -> int:
        value = self.data[self.pos]
        self.pos += 1
        return value

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise IndexError("past the end")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def buffer(self) -> bytes:
        return self.take(self.uint())

    def skip_int(self) -> None:  # lib0's signed varint: sign and continuation bits, the same layout
        while self.byte() & 0x80:
            pass

    def skip_any(self) -> None:
        """Step over one lib0 ``any`` value."""
        tag = self.byte()
        if tag in (127, 126, 121, 120):  # undefined, null, false, true
            return
        if tag == 125:
            self.skip_int()
        elif tag == 124:
            self.take(4)
        elif tag in (123, 122):
            self.take(8)
        elif tag in (119, 116):  # string, bytes
            self.buffer()
        elif tag == 118:  # object
            for _ in range(self.uint()):
                self.buffer()
                self.skip_any()
        elif tag == 117:  # array
            for _ in range(self.uint()):
                self.skip_any()
        else:
            raise ValueError(f"unknown value tag {tag}")


def _uint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)


def _utf16_length(raw: bytes) -> int:
    """The length Yjs gives a text (UTF-16 code units) from its UTF-8 bytes."""
    if raw.isascii():
        return len(raw)
    return len(raw.decode("utf-8", "surrogatepass").encode("utf-16-le", "surrogatepass")) // 2


def _utf16_split(raw: bytes, units: int) -> tuple[bytes, bytes]:
    text = raw.decode("utf-8", "surrogatepass").encode("utf-16-le", "surrogatepass")
    head, tail = text[: units * 2], text[units * 2 :]
    # yjs replaces the halves of a surrogate pair it cuts with U+FFFD (so does this).
    if head and 0xD8 <= head[-1] <= 0xDB:
        head, tail = head[:-2] + b"\xfd\xff", b"\xfd\xff" + tail[2:]
    return (
        head.decode("utf-16-le", "surrogatepass").encode("utf-8", "surrogatepass"),
        tail.decode("utf-16-le", "surrogatepass").encode("utf-8", "surrogatepass"),
    )


@dataclass(slots=True)
class _Struct:
    clock: int
    length: int
    kind: int  # content ref: _GC, _DELETED, ... (never _SKIP: gaps are not kept)
    info: int  # the info byte as read (flags and content ref)
    origin: tuple[int, int] | None
    right: tuple[int, int] | None
    parent: bytes  # the encoded parent (and parent sub) of an item with neither origin, else b""
    content: list[bytes]  # text: [UTF-8 bytes]; JSON / Any: one encoded value each; else [its encoding]
    raw: bytes = b""  # the struct as it was read, while it is unchanged (written again as it is)


def _read_struct(reader: _Reader, client: int, clock: int) -> _Struct | int:
    """One struct at ``clock``, or the length of a Skip."""
    begin = reader.pos
    struct = _read_struct_fields(reader, client, clock)
    if not isinstance(struct, int):
        struct.raw = reader.data[begin : reader.pos]
    return struct


def _read_struct_fields(reader: _Reader, client: int, clock: int) -> _Struct | int:
    info = reader.byte()
    kind = info & 0x1F
    if kind == _GC:
        return _Struct(clock, reader.uint(), _GC, info, None, None, b"", [])
    if kind == _SKIP:
        return reader.uint()
    origin = (reader.uint(), reader.uint()) if info & 0x80 else None
    right = (reader.uint(), reader.uint()) if info & 0x40 else None
    parent = b""
    if not info & 0xC0:
        start = reader.pos
        if reader.uint() == 1:
            reader.buffer()  # the root type's name
        else:
            reader.uint(), reader.uint()  # the parent item's id
        if info & 0x20:
            reader.buffer()  # the parent sub (a map key)
        parent = reader.data[start : reader.pos]
    start = reader.pos
    content: list[bytes]
    if kind == _STRING:
        content = [reader.buffer()]
        length = _utf16_length(content[0])
    elif kind == _DELETED:
        length = reader.uint()
        content = []
    elif kind in (_JSON, _ANY):
        length = reader.uint()
        content = []
        for _ in range(length):
            first = reader.pos
            if kind == _JSON:
                reader.buffer()
            else:
                reader.skip_any()
            content.append(reader.data[first : reader.pos])
    else:
        length = 1
        if kind in (_BINARY, _EMBED):
            reader.buffer()
        elif kind == _FORMAT:
            reader.buffer()
            reader.buffer()
        elif kind == _TYPE:
            if reader.uint() in _NAMED_TYPES:
                reader.buffer()
        elif kind == _DOC:
            reader.buffer()
            reader.skip_any()
        else:
            raise ValueError(f"unknown content ref {kind}")
        content = [reader.data[start : reader.pos]]
    return _Struct(clock, length, kind, info, origin, right, parent, content)


def _decode(
    update: bytes,
    structs: dict[int, list[_Struct]],
    deletes: dict[int, list[tuple[int, int]]],
    known: dict[int, bytes] | None = None,
) -> None:
    """Read ``update`` into ``structs`` and ``deletes``; a client's delete ranges encoded exactly as
    ``known`` has them (its encoded part of a delete set) are stepped over, not read."""
    reader = _Reader(update)
    data = update
    for _ in range(reader.uint()):
        count, client = reader.uint(), reader.uint()
        clock = reader.uint()
        into = structs.setdefault(client, [])
        for _ in range(count):
            begin = reader.pos
            info = data[begin]
            kind = info & 0x1F
            if info & 0x80 and kind in (_STRING, _DELETED):
                # Most structs of a text: typed text or deleted content after an origin. Read inline (the
                # numbers are what `_read_struct` reads, in its order): origin, right origin, length.
                pos = begin + 1
                numbers = []
                for _ in range(5 if info & 0x40 else 3):
                    value = data[pos]
                    pos += 1
                    if value >= 0x80:
                        value &= 0x7F
                        shift = 7
                        while True:
                            byte = data[pos]
                            pos += 1
                            value |= (byte & 0x7F) << shift
                            if byte < 0x80:
                                break
                            shift += 7
                    numbers.append(value)
                size = numbers[-1]
                if kind == _STRING:
                    text = data[pos : pos + size]
                    if len(text) != size:
                        raise IndexError("past the end")
                    pos += size
                    content, length = [text], _utf16_length(text)
                else:
                    content, length = [], size
                reader.pos = pos
                right = (numbers[2], numbers[3]) if info & 0x40 else None
                struct = _Struct(
                    clock, length, kind, info, (numbers[0], numbers[1]), right, b"", content, data[begin:pos]
                )
            else:
                read = _read_struct(reader, client, clock)
                if isinstance(read, int):
                    clock += read
                    continue
                struct = read
            into.append(struct)
            clock += struct.length
    for _ in range(reader.uint()):
        begin = reader.pos
        client = reader.uint()
        if known:
            section = known.get(client)
            if section is not None and data.startswith(section, begin):
                reader.pos = begin + len(section)
                continue
        ranges = deletes.setdefault(client, [])
        for _ in range(reader.uint()):
            ranges.append((reader.uint(), reader.uint()))
    if reader.pos != len(update):
        raise ValueError("bytes after the delete set")


def _slice(struct: _Struct, client: int, start: int, stop: int) -> _Struct:
    """The part of ``struct`` from offset ``start`` to ``stop`` (a struct of its own: after ``start`` the
    part's origin is the item before it, as Yjs splits an item)."""
    if start == 0 and stop == struct.length:
        return struct
    kind = struct.kind
    content: list[bytes]
    if kind == _STRING:
        head = _utf16_split(struct.content[0], stop)[0] if stop < struct.length else struct.content[0]
        content = [_utf16_split(head, start)[1] if start else head]
    elif kind in (_JSON, _ANY):
        content = struct.content[start:stop]
    else:
        content = struct.content  # deleted content and garbage: only the length changes
    clock = struct.clock + start
    if kind == _GC:
        return _Struct(clock, stop - start, _GC, struct.info, None, None, b"", [])
    if start == 0:
        return _Struct(clock, stop, kind, struct.info, struct.origin, struct.right, struct.parent, content)
    return _Struct(clock, stop - start, kind, struct.info, (client, clock - 1), struct.right, b"", content)


def _joined(first: _Struct, second: _Struct, client: int) -> bool:
    """Join ``second`` into ``first`` when the two are one run; whether they were."""
    kind = first.kind
    if second.kind != kind or second.clock != first.clock + first.length:
        return False
    if kind != _GC:
        if kind not in _JOINABLE:
            return False
        if second.origin != (client, second.clock - 1) or second.right != first.right:
            return False
        if kind == _STRING:
            first.content = [first.content[0] + second.content[0]]
        else:
            first.content = first.content + second.content
    first.length += second.length
    first.raw = b""
    return True


def _covered(structs: list[_Struct]) -> list[list[int]]:
    """The clock ranges ``structs`` (by clock) hold, as sorted, disjoint [start, stop) ranges."""
    ranges: list[list[int]] = []
    for struct in structs:
        stop = struct.clock + struct.length
        if ranges and struct.clock <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], stop)
        else:
            ranges.append([struct.clock, stop])
    return ranges


def _runs(client: int, given: list[list[_Struct]], added: list[bool]) -> list[_Struct]:
    """A client's structs by clock, joined into maximal runs; ``given`` by source, where sources overlap
    the earlier one's structs are kept (a later one only fills clocks no earlier one holds: ``added[0]``
    is set when one does)."""
    held: list[_Struct] = sorted(given[0], key=lambda s: s.clock)
    for structs in given[1:]:
        if not structs:
            continue
        covered = _covered(held)
        starts = [lo for lo, _ in covered]
        for struct in structs:
            start, stop = struct.clock, struct.clock + struct.length
            # Cut out what is held already: the covered ranges from the last one starting at or before it.
            index = max(0, bisect_right(starts, start) - 1)
            while start < stop and index < len(covered):
                lo, hi = covered[index]
                if lo >= stop:
                    break
                if hi > start:
                    if lo > start:
                        held.append(_slice(struct, client, start - struct.clock, lo - struct.clock))
                        added[0] = True
                    start = max(start, hi)
                index += 1
            if start < stop:
                held.append(_slice(struct, client, start - struct.clock, stop - struct.clock))
                added[0] = True
        held.sort(key=lambda s: s.clock)
    out: list[_Struct] = []
    end = 0
    for struct in held:
        if out and struct.clock < end:  # overlapping within one source (not from a Yjs encoder)
            if struct.clock + struct.length <= end:
                continue
            struct = _slice(struct, client, end - struct.clock, struct.length)
        if not (out and _joined(out[-1], struct, client)):
            out.append(struct)  # (decoded for this encoding alone: joining into it changes no caller's)
        end = struct.clock + struct.length
    return out


def _write_struct(out: bytearray, struct: _Struct) -> None:
    if struct.raw:
        # As it was read: Yjs encoders write a struct one way only (minimal numbers, flags from its fields).
        out += struct.raw
        return
    kind = struct.kind
    if kind == _GC:
        out.append(0)
        _uint(out, struct.length)
        return
    info = (struct.info & 0x20) | kind
    if struct.origin is not None:
        info |= 0x80
    if struct.right is not None:
        info |= 0x40
    out.append(info)
    if struct.origin is not None:
        _uint(out, struct.origin[0])
        _uint(out, struct.origin[1])
    if struct.right is not None:
        _uint(out, struct.right[0])
        _uint(out, struct.right[1])
    if not info & 0xC0:
        out += struct.parent
    if kind == _STRING:
        _uint(out, len(struct.content[0]))
        out += struct.content[0]
    elif kind in (_DELETED, _JSON, _ANY):
        _uint(out, struct.length)
        for value in struct.content:
            out += value
    else:
        out += struct.content[0]


def canonical(*updates: bytes) -> bytes:
    """The canonical encoding of what ``updates`` hold together (the first given for a clock kept).

    Raises ValueError when one is not a Yjs update (v1)."""
    return canonical_union(*updates)[0]


def canonical_union(first: bytes, *rest: bytes) -> tuple[bytes, bool]:
    """`canonical` of ``first`` and ``rest`` together, and whether ``rest`` added nothing to ``first`` (no
    struct for clocks ``first`` does not hold, no deleted range ``first`` does not delete)."""
    sources: list[dict[int, list[_Struct]]] = []
    deletes: dict[int, list[tuple[int, int]]] = {}
    first_deletes: dict[int, list[list[int]]] = {}
    for index, update in enumerate((first, *rest)):
        structs: dict[int, list[_Struct]] = {}
        try:
            _decode(update, structs, deletes)
        except (IndexError, ValueError, UnicodeError) as exc:
            raise ValueError(f"not a Yjs update (v1): {exc}") from None
        sources.append(structs)
        if index == 0 and rest:
            first_deletes = _delete_ranges(deletes)
    added = [False]
    out = bytearray()
    clients = sorted({c for structs in sources for c, s in structs.items() if s}, reverse=True)
    _uint(out, len(clients))
    for client in clients:
        runs = _runs(client, [structs.get(client, []) for structs in sources], added)
        count = len(runs) + sum(1 for a, b in pairwise(runs) if b.clock > a.clock + a.length)
        _uint(out, count)
        _uint(out, client)
        _uint(out, runs[0].clock)
        end = runs[0].clock
        for struct in runs:
            if struct.clock > end:  # a gap: clocks this update does not hold
                out.append(_SKIP)
                _uint(out, struct.clock - end)
            _write_struct(out, struct)
            end = struct.clock + struct.length
    merged = _delete_ranges(deletes)
    _write_delete_set(out, merged)
    return bytes(out), not added[0] and (not rest or merged == first_deletes)


def _write_delete_set(out: bytearray, merged: dict[int, list[list[int]]]) -> None:
    """A delete set in canonical order: its clients descending, each client's ranges as ``_delete_ranges``
    sorted and joined them."""
    _uint(out, len(merged))
    for client in sorted(merged, reverse=True):
        _write_client_deletes(out, client, merged[client])


def _write_client_deletes(out: bytearray, client: int, ranges: list[list[int]]) -> None:
    _uint(out, client)
    _uint(out, len(ranges))
    for clock, length in ranges:
        _uint(out, clock)
        _uint(out, length)


def _delete_ranges(deletes: dict[int, list[tuple[int, int]]]) -> dict[int, list[list[int]]]:
    """Each client's deleted [clock, length] ranges, sorted and joined where they touch."""
    merged: dict[int, list[list[int]]] = {}
    for client, given in deletes.items():
        ranges: list[list[int]] = []
        for clock, length in sorted(given):
            if length <= 0:
                continue
            if ranges and clock <= ranges[-1][0] + ranges[-1][1]:
                ranges[-1][1] = max(ranges[-1][1], clock + length - ranges[-1][0])
            else:
                ranges.append([clock, length])
        if ranges:
            merged[client] = ranges
    return merged


#: The root a text's structs name as their parent when they have neither origin: ``text`` (a root type).
_TEXT_ROOT = b"\x01\x04text"


def _encoded(struct: _Struct) -> bytes:
    if not struct.raw:
        out = bytearray()
        _write_struct(out, struct)
        struct.raw = bytes(out)
    return struct.raw


class Incremental:
    """The canonical encoding of a complete document (nothing pending), kept decoded so that folding one
    more update costs that update, not the document: `fold` integrates the update's structs and deletes as
    a Yjs document does and writes the encoding again from per-client parts it keeps encoded.

    `fold` gives the bytes `canonical` gives for the document holding both (the encoding of a fresh
    document made from them, canonicalised), or None, leaving the model unchanged, for any update it does
    not integrate exactly as a document would: one with clocks it already holds or after a gap, origins or
    deletes it does not hold, content other than text, parents other than the text, or garbage-collected
    neighbours. Those take the general path.
    """

    __slots__ = ("_clients", "_delete_sections", "_deletes", "_ends", "_heads", "_sections")

    def __init__(self, state: bytes) -> None:
        structs: dict[int, list[_Struct]] = {}
        deletes: dict[int, list[tuple[int, int]]] = {}
        _decode(state, structs, deletes)
        self._clients: dict[int, list[_Struct]] = {}
        self._ends: dict[int, int] = {}
        for client, given in structs.items():
            if not given:
                continue
            if given[0].clock != 0:
                raise ValueError("a client's structs do not start at clock 0")
            for a, b in pairwise(given):
                if b.clock != a.clock + a.length:
                    raise ValueError("a gap in a client's clocks (something pending)")
            self._clients[client] = given
            self._ends[client] = given[-1].clock + given[-1].length
        self._deletes = _delete_ranges(deletes)
        for client, ranges in self._deletes.items():
            if ranges[-1][0] + ranges[-1][1] > self._ends.get(client, 0):
                raise ValueError("a delete of clocks no struct holds (something pending)")
        # Encoded parts: each client's structs (its count, id and first clock before them), and the encoding
        # of a client's first structs (how many) that a fold has not changed since; each client's deletes.
        self._sections: dict[int, bytes] = {}
        self._heads: dict[int, tuple[int, bytes]] = {}
        self._delete_sections: dict[int, bytes] = {}
        if self.encode() != state:
            raise ValueError("not a canonical encoding")

    def _holds(self, client: int, clock: int, added: dict[int, int]) -> _Struct | None:
        """The struct holding ``(client, clock)`` in the model, or None (added structs: a stand-in)."""
        structs = self._clients.get(client)
        if structs is not None and clock < self._ends[client]:
            index = bisect_right(structs, clock, key=lambda s: s.clock) - 1
            return structs[index]
        if added.get(client, -1) > clock >= self._ends.get(client, 0):
            return _NEW
        return None

    def fold(self, update: bytes) -> bytes | None:
        structs: dict[int, list[_Struct]] = {}
        deletes: dict[int, list[tuple[int, int]]] = {}
        try:
            _decode(update, structs, deletes, self._delete_sections)
        except (IndexError, ValueError, UnicodeError):
            return None
        # Check everything before changing anything.
        added: dict[int, int] = {}
        for client, given in structs.items():
            clock = self._ends.get(client, 0)
            for struct in given:
                if struct.clock != clock or struct.kind not in (_STRING, _DELETED) or struct.info & 0x20:
                    return None
                clock += struct.length
            if given:
                added[client] = clock
        for given in structs.values():
            for struct in given:
                for ref in (struct.origin, struct.right):
                    if ref is not None:
                        target = self._holds(ref[0], ref[1], added)
                        if target is None or target.kind == _GC:
                            return None
                if struct.origin is None and struct.right is None and struct.parent != _TEXT_ROOT:
                    return None
        # An update encoded by a document carries its whole delete set: only what the model does not hold
        # deleted yet changes anything.
        fresh: dict[int, list[tuple[int, int]]] = {}
        for client, deleted in deletes.items():
            ranges = _uncovered(deleted, self._deletes.get(client, []))
            if ranges:
                fresh[client] = ranges
            end = max(self._ends.get(client, 0), added.get(client, 0))
            for clock, length in ranges:
                if clock + length > end:
                    return None  # deletes an item not held: it would be pending
                if clock + length > self._ends.get(client, 0):
                    return None  # deletes an item of this update (rare: the general path)
                mine = self._clients[client]
                index = bisect_right(mine, clock, key=lambda s: s.clock) - 1
                while index < len(mine) and mine[index].clock < clock + length:
                    if mine[index].kind not in (_STRING, _DELETED, _GC):
                        return None  # content a document garbage-collects in other ways
                    index += 1
        # Integrate: the new structs after each client's, then the deletes.
        for client, given in structs.items():
            if not given:
                continue
            held = self._clients.setdefault(client, [])
            head = self._heads.get(client)
            if head is not None and head[0] >= len(held):  # the last struct may take the first new one
                del self._heads[client]
            for struct in given:
                if not (held and _joined(held[-1], struct, client)):
                    held.append(struct)
            self._ends[client] = added[client]
            self._sections.pop(client, None)
        for client, ranges in fresh.items():
            for clock, length in ranges:
                self._delete(client, clock, clock + length)
            known = [(clock, length) for clock, length in self._deletes.get(client, [])]
            self._deletes[client] = _delete_ranges({client: known + ranges})[client]
            self._delete_sections.pop(client, None)
        return self.encode()

    def _delete(self, client: int, start: int, stop: int) -> None:
        """Items ``start`` to ``stop`` of ``client`` deleted: their text becomes deleted content."""
        held = self._clients[client]
        first = bisect_right(held, start, key=lambda s: s.clock) - 1
        last = first
        while last < len(held) and held[last].clock < stop:
            last += 1
        pieces: list[_Struct] = []
        changed = False
        for struct in held[first:last]:
            lo, hi = (
                max(start, struct.clock) - struct.clock,
                min(stop, struct.clock + struct.length) - struct.clock,
            )
            if struct.kind in (_GC, _DELETED) or lo >= hi:
                pieces.append(struct)
                continue
            changed = True
            if lo > 0:
                pieces.append(_slice(struct, client, 0, lo))
            part = _slice(struct, client, lo, hi)
            pieces.append(
                _Struct(
                    part.clock, part.length, _DELETED, part.info, part.origin, part.right, part.parent, []
                )
            )
            if hi < struct.length:
                pieces.append(_slice(struct, client, hi, struct.length))
        if not changed:
            return
        # Join again around what changed: a piece may continue its neighbour (a deleted run's neighbour).
        begin = max(0, first - 1)
        around = held[begin:first] + pieces + held[last : last + 1]
        out: list[_Struct] = []
        for struct in around:
            if out and _joined_copy(out, struct, client):
                continue
            out.append(struct)
        held[begin : min(len(held), last + 1)] = out
        self._sections.pop(client, None)
        head = self._heads.get(client)
        if head is not None and head[0] > begin:
            del self._heads[client]

    def encode(self) -> bytes:
        parts: list[bytes] = []
        out = bytearray()
        clients = sorted(self._clients, reverse=True)
        _uint(out, len(clients))
        parts.append(bytes(out))
        for client in clients:
            section = self._sections.get(client)
            if section is None:
                structs = self._clients[client]
                head = bytearray()
                _uint(head, len(structs))
                _uint(head, client)
                _uint(head, structs[0].clock)
                # The structs before the last are kept encoded: typing changes the last, or adds after it.
                count, done = self._heads.get(client, (0, b""))
                if count < len(structs) - 1:
                    done += b"".join([_encoded(s) for s in structs[count:-1]])
                    count = len(structs) - 1
                    self._heads[client] = (count, done)
                section = bytes(head) + done + b"".join([_encoded(s) for s in structs[count:]])
                self._sections[client] = section
            parts.append(section)
        out = bytearray()
        _uint(out, len(self._deletes))
        parts.append(bytes(out))
        for client in sorted(self._deletes, reverse=True):
            section = self._delete_sections.get(client)
            if section is None:
                head = bytearray()
                _write_client_deletes(head, client, self._deletes[client])
                section = self._delete_sections[client] = bytes(head)
            parts.append(section)
        return b"".join(parts)


def _uncovered(given: list[tuple[int, int]], held: list[list[int]]) -> list[tuple[int, int]]:
    """The parts of the [clock, length] ranges ``given`` that ``held`` (sorted, disjoint) does not cover."""
    out: list[tuple[int, int]] = []
    index, size = 0, len(held)
    for clock, length in sorted(given):
        start, stop = clock, clock + length
        while index < size and held[index][0] + held[index][1] <= start:
            index += 1
        probe = index
        while start < stop and probe < size and held[probe][0] < stop:
            lo, hi = held[probe][0], held[probe][0] + held[probe][1]
            if lo > start:
                out.append((start, lo - start))
            start = max(start, hi)
            probe += 1
        if start < stop:
            out.append((start, stop - start))
    return out


#: Stands in for a struct an update being folded adds (a reference to it is held, and not garbage).
_NEW = _Struct(0, 0, _STRING, 0, None, None, b"", [])


def _joined_copy(out: list[_Struct], struct: _Struct, client: int) -> bool:
    """`_joined` into ``out[-1]`` without changing a struct the model may share: a copy takes the join."""
    last = out[-1]
    copy = _Struct(
        last.clock,
        last.length,
        last.kind,
        last.info,
        last.origin,
        last.right,
        last.parent,
        last.content,
        last.raw,
    )
    if not _joined(copy, struct, client):
        return False
    out[-1] = copy
    return True


def _dependencies(struct: _Struct) -> list[tuple[int, int]]:
    """The ids a struct's item needs integrated before it: its origin, right origin and parent item."""
    needs = [d for d in (struct.origin, struct.right) if d is not None]
    if struct.parent:
        reader = _Reader(struct.parent)
        if reader.uint() != 1:  # not a root type: the parent item's id
            needs.append((reader.uint(), reader.uint()))
    return needs


def split_ready(update: bytes) -> tuple[bytes, bytes] | None:
    """``update`` as what an empty document can integrate (each client's structs from clock 0 on, every
    one's origin, right origin and parent among them) and what must wait for updates not received yet;
    each with the whole delete set. None when every struct can be integrated.

    Yjs integrates an update's structs in an order of its own and sends to pending every struct on its
    stack when the chain meets one that truly waits, integrable ones included (and yrs was seen to
    integrate an item whose right origin was pending): which structs a document integrates then follows
    how the updates were grouped. Given only the ready part, a document integrates all of it.

    Raises ValueError when ``update`` is not a Yjs update (v1)."""
    structs: dict[int, list[_Struct]] = {}
    deletes: dict[int, list[tuple[int, int]]] = {}
    try:
        _decode(update, structs, deletes)
    except (IndexError, ValueError, UnicodeError) as exc:
        raise ValueError(f"not a Yjs update (v1): {exc}") from None
    ends = dict.fromkeys(structs, 0)  # each client's clock up to which its structs are ready
    taken = dict.fromkeys(structs, 0)  # how many of each client's structs are ready
    progress = True
    while progress:
        progress = False
        for client, given in structs.items():
            while taken[client] < len(given):
                struct = given[taken[client]]
                if struct.clock != ends[client] or any(
                    clock >= ends.get(owner, 0) for owner, clock in _dependencies(struct)
                ):
                    break
                ends[client] = struct.clock + struct.length
                taken[client] += 1
                progress = True
    if all(taken[client] == len(given) for client, given in structs.items()):
        return None
    ready = {client: given[: taken[client]] for client, given in structs.items()}
    waiting = {client: given[taken[client] :] for client, given in structs.items()}
    return _written(ready, deletes), _written(waiting, deletes)


def _written(structs: dict[int, list[_Struct]], deletes: dict[int, list[tuple[int, int]]]) -> bytes:
    """An update (v1) of ``structs`` (each client's in clock order, gaps written as Skips) and ``deletes``."""
    out = bytearray()
    clients = sorted((c for c, s in structs.items() if s), reverse=True)
    _uint(out, len(clients))
    for client in clients:
        runs = structs[client]
        _uint(out, len(runs) + sum(1 for a, b in pairwise(runs) if b.clock > a.clock + a.length))
        _uint(out, client)
        _uint(out, runs[0].clock)
        end = runs[0].clock
        for struct in runs:
            if struct.clock > end:
                out.append(_SKIP)
                _uint(out, struct.clock - end)
            out += _encoded(struct)
            end = struct.clock + struct.length
    merged = _delete_ranges(deletes)
    _write_delete_set(out, merged)
    return bytes(out)


def struct_count(update: bytes) -> int:
    """How many structs (garbage-collected ranges included, Skips not) ``update`` encodes."""
    structs: dict[int, list[_Struct]] = {}
    _decode(update, structs, {})
    return sum(len(s) for s in structs.values())


__all__ = ["Incremental", "canonical", "canonical_union", "split_ready", "struct_count"]
