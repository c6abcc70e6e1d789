"""Rich text fields as pycrdt (Yjs) documents.

An operation on a rich text field carries a Yjs update (bytes); a record's state is its document with every
update applied. Yjs updates commute and are idempotent, so any delivery order gives the same text.
pycrdt is imported lazily: a schema without rich text never needs it (and a browser without a WebAssembly
build of pycrdt can still run every other field type).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from offline.core.errors import OfflineError

TEXT_KEY = "text"


def _pycrdt() -> Any:
    try:
        import pycrdt
    except ImportError as exc:  # pragma: no cover - depends on the platform
        raise OfflineError(
            "rich text fields need the pycrdt package, which is not available here; install pycrdt "
            "(pip install pycrdt) or remove t.richtext() fields from the schema",
            "STORAGE_ERROR",
            {"package": "pycrdt"},
        ) from exc
    return pycrdt


def _doc(state: bytes | None) -> Any:
    pycrdt = _pycrdt()
    doc = pycrdt.Doc()
    if state:
        doc.apply_update(state)
    return doc


def _text(doc: Any) -> Any:
    return doc.get(TEXT_KEY, type=_pycrdt().Text)


def decode_state(state: str | None) -> bytes | None:
    return base64.b64decode(state) if state else None


def merge_update(state: str | None, update: Any) -> str:
    """Merge a Yjs update (bytes, or a plain string meaning 'initial text') into a base64 state.

    The state is a merged *update*, not a document snapshot: an update that arrives before one it depends
    on stays in it as pending structs instead of being lost, so the text is the same in any delivery order.
    """
    if isinstance(update, str):
        # Every replica must turn the same text into the same update, or concurrent texts would be
        # ordered by a random Yjs client id (different on each replica): derive the client id from the text.
        update = initial_update(update, client_id=_text_client_id(update))
    if not update:
        return state or ""
    try:
        _pycrdt().get_state(bytes(update))
    except ValueError:
        # Not a Yjs update (a buggy or hostile peer): ignored alike everywhere instead of wedging the record.
        return state or ""
    current = decode_state(state)
    merged = _pycrdt().merge_updates(current, bytes(update)) if current else bytes(update)
    return base64.b64encode(merged).decode("ascii")


def text_of(state: str | bytes | None) -> str:
    """The text of a state (base64 text as kept in merge state, or raw bytes as kept in a BLOB column)."""
    if not state:
        return ""
    raw = bytes(state) if isinstance(state, (bytes, bytearray, memoryview)) else decode_state(state)
    return str(_text(_doc(raw)))


def state_bytes(state: str | None) -> bytes:
    return decode_state(state) or b""


def _text_client_id(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big")


def initial_update(text: str, *, client_id: int | None = None) -> bytes:
    """A Yjs update that creates a document holding ``text`` (as Yjs client ``client_id``, else a random one)."""
    doc = _doc(None) if client_id is None else _pycrdt().Doc(client_id=client_id)
    t = _text(doc)
    t += text
    return bytes(doc.get_update())


class CharText:
    """A document's text addressed by Python string indices (code points).

    pycrdt (yrs) counts positions in UTF-8 bytes, so the index of a character after any non-ASCII one is
    different there: an insert would land elsewhere and a delete could panic inside yrs.
    """

    __slots__ = ("_text",)

    def __init__(self, text: Any) -> None:
        self._text = text

    def __str__(self) -> str:
        return str(self._text)

    def __len__(self) -> int:
        return len(str(self._text))

    def _offset(self, index: int) -> int:
        return len(str(self._text)[:index].encode("utf-8"))

    def insert(self, index: int, value: str) -> None:
        size = len(self)
        index = max(0, min(size, index + size if index < 0 else index))
        self._text.insert(self._offset(index), value)

    def __delitem__(self, key: int | slice) -> None:
        size = len(self)
        if isinstance(key, slice):
            start, stop, step = key.indices(size)
            if step != 1:
                raise ValueError("rich text deletes take a contiguous range")
        else:
            start = key + size if key < 0 else key
            if not 0 <= start < size:
                raise IndexError("rich text index out of range")
            stop = start + 1
        if stop > start:
            del self._text[self._offset(start) : self._offset(stop)]

    def __iadd__(self, value: str) -> CharText:
        self._text += value
        return self


def edit_update(state: str | None, edit: Any) -> tuple[bytes, str]:
    """Run ``edit(text)`` on a copy of the document; return the Yjs update it produced and the new text.

    ``text`` is a `CharText`: `insert(index, s)`, `del text[a:b]`, `text += s`, `len`, `str`, with Python
    string indices.
    """
    doc = _doc(decode_state(state))
    before = doc.get_state()
    t = CharText(_text(doc))
    edit(t)
    return bytes(doc.get_update(before)), str(t)
