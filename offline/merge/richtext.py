"""Rich text fields as Yjs documents.

An operation on a rich text field carries a Yjs update (bytes); a record's state is its document with every
update applied. Yjs updates commute and are idempotent, so any delivery order gives the same text.
Yjs comes from `offline.merge.yjs`: pycrdt natively, the npm package ``yjs`` in the browser (pycrdt has no
WebAssembly build), chosen by platform and imported lazily: a schema without rich text never needs either
(and a browser page built without yjs can still run every other field type).

One document per record and field, one Yjs client per node: a node writes every edit of a document as the
same Yjs client (`client_id_for`, derived from its node id), so its typing is one run of that client's
clock, which Yjs stores as a few structs and a one-entry state vector. (A new random client per edit, as
before, gave every keystroke its own client: 2,000 typed characters kept a 17,876-byte state vector.) A
node's edits all start from its own latest state, which holds all of its earlier edits, so the client's
clocks never repeat. The live document of a state is kept (`_Documents`): an edit changes it in place and
reads take its text, instead of rebuilding the document from the stored update each time.

The stored state is the document's canonical encoding (`offline.merge.yupdate`): the same bytes on every
replica that folded the same updates, in whatever order, with yrs or with yjs (`fold_update`).
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections import OrderedDict
from typing import Any

from offline.core.errors import OfflineError

from . import yjs, yupdate

#: What to do when this platform's Yjs is missing, by the package it lacks.
_INSTALL_HINT = {
    "pycrdt": "install pycrdt (pip install pycrdt)",
    "yjs": "add the npm package yjs to the project (npm install yjs) and build the web client again",
}


def _yjs() -> yjs.YjsBackend:
    try:
        return yjs.backend()
    except ImportError as exc:  # pragma: no cover - depends on the platform
        package = "yjs" if yjs.IS_BROWSER else "pycrdt"
        raise OfflineError(
            f"rich text fields need the {package} package, which is not available here; "
            f"{_INSTALL_HINT[package]}, or remove t.richtext() fields from the schema",
            "STORAGE_ERROR",
            {"package": package},
        ) from exc


def _integrated(update: bytes, client_id: int | None) -> tuple[yjs.YDoc, bytes, bytes]:
    """A document (as ``client_id``) holding everything of ``update`` that can be integrated, its encoding,
    and what of ``update`` waits (structs whose dependencies are not in it yet; with the whole delete set).

    Not ``apply_update(update)`` alone when something waits: Yjs (yrs and yjs alike) integrates an update's
    structs in an order of its own and, when it meets a struct that truly waits, sends to pending the
    integrable structs it had stacked on the way too; so which structs a document held followed how the
    updates were grouped (a state holding pending structs, then an edit or an update), and an edit made on
    one document lost its insert when folded in another, replicas diverged, and a node could even write a
    clock of its own client twice (its earlier edit sent back to pending). The structs an empty document
    can integrate are found first (`yupdate.split_ready`) and only those applied: what a document holds is
    then a function of the set of updates.
    """
    backend = _yjs()
    doc = backend.new_doc(client_id)
    doc.apply_update(update)
    pending = backend.diff_update(update, doc.get_state())
    try:
        # Nothing waits (the usual case: the leftover's first byte, its count of clients with structs, is
        # 0): every struct integrated.
        waits = pending[:1] != b"\x00" and yupdate.struct_count(pending) > 0
        split = yupdate.split_ready(update) if waits else None
    except ValueError:  # pragma: no cover - an encoding this decoder does not read (a newer Yjs?)
        split = None
    if split is None:
        return doc, doc.get_update(), pending
    ready, waiting = split
    doc = backend.new_doc(client_id)
    doc.apply_update(ready)
    return doc, doc.get_update(), waiting


def client_id_for(node_id: str) -> int:
    """The Yjs client id a node writes its rich text edits as: stable, so one node's edits are one client.

    48 bits of the node id's SHA-256 (Yjs client ids are unsigned integers JavaScript holds exactly), far
    from the 32-bit range of `initial_update`'s text-derived ids."""
    return (1 << 48) | int.from_bytes(hashlib.sha256(node_id.encode("utf-8")).digest()[:6], "big")


class _Documents:
    """Live documents (and their texts) of recent states, so neither an edit, a fold nor a read rebuilds a
    document from its stored bytes.

    Keyed by the state's bytes: the document of a state is a function of it. A document also remembers the
    Yjs client it was made as: an edit needs its node's client (`client_id_for`), a fold or a read any.
    Small and least-recently-used.
    """

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self.docs: OrderedDict[bytes, Any] = OrderedDict()
        self.texts: OrderedDict[bytes, str] = OrderedDict()
        # The bytes of recent states by their base64 text (merge state keeps the text; decoding a long
        # document's text costs more than folding a keystroke into it).
        self.raw: OrderedDict[str, bytes] = OrderedDict()
        # Documents an edit left holding its update, by that update (with the state the edit started
        # from), until the fold of the update says whether one is exactly the folded state's document
        # (`adopt`).
        self.edited: OrderedDict[bytes, tuple[bytes, Any]] = OrderedDict()
        # The canonical encodings of complete states (nothing pending), decoded once and kept so that a
        # fold costs the update folded, not the document (`yupdate.Incremental`); None: known complete,
        # not decoded yet.
        self.models: OrderedDict[bytes, yupdate.Incremental | None] = OrderedDict()
        # Apps on several threads share the cache; a document is only used by whoever took it out.
        self.lock = threading.Lock()

    def _put(self, cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        with self.lock:
            cache[key] = value
            cache.move_to_end(key)
            while len(cache) > self.size:
                cache.popitem(last=False)

    def take(self, state: bytes, client_id: int | None = None) -> tuple[Any, bool]:
        """The document of ``state`` (as ``client_id`` when given), out of the cache: the caller changes it;
        and whether it holds exactly ``state`` (nothing pending, which a document cannot be trusted with)."""
        with self.lock:
            doc = self.docs.pop(state, None)
        if doc is not None and (client_id is None or doc.client_id == client_id):
            return doc, True
        known_clean = doc is not None  # only documents holding exactly their state are kept
        if doc is not None:
            self._put(self.docs, state, doc)  # still the state's document, for a fold or a read
        if not state:
            return _yjs().new_doc(client_id), True
        doc = self.fresh(state, client_id)
        if known_clean:
            return doc, True
        # Nothing pending: the document's encoding is the state (canonically).
        try:
            return doc, yupdate.canonical(doc.get_update()) == state
        except ValueError:  # pragma: no cover - see `fold_update`
            return doc, False

    def fresh(self, state: bytes, client_id: int | None = None) -> yjs.YDoc:
        """A new document of ``state`` (as ``client_id`` when given), not from the cache: the state applied
        as it is when known complete, else only what of it can be integrated (`_integrated`)."""
        if not state:
            return _yjs().new_doc(client_id)
        if self.known_complete(state):  # nothing waits: applied as it is
            doc = _yjs().new_doc(client_id)
            doc.apply_update(state)
            return doc
        return _integrated(state, client_id)[0]

    def decoded(self, state: str) -> bytes:
        with self.lock:
            raw = self.raw.get(state)
            if raw is not None:
                self.raw.move_to_end(state)
                return raw
        raw = base64.b64decode(state)
        self._put(self.raw, state, raw)
        return raw

    def encoded(self, state: str, raw: bytes) -> None:
        """``state`` (base64 text) is ``raw``: a decode of it need not run."""
        self._put(self.raw, state, raw)

    def edited_into(self, update: bytes, doc: Any, state: bytes) -> None:
        """An edit made ``update`` in ``doc`` (the document of ``state`` before): ``doc`` may be the
        document of the state the fold of ``update`` makes (`adopt`)."""
        self._put(self.edited, update, (state, doc))

    def complete(self, state: bytes) -> None:
        """``state`` is a canonical encoding with nothing pending: a fold into it may take `fold_into`."""
        with self.lock:
            if state in self.models:
                self.models.move_to_end(state)
                return
        self._put(self.models, state, None)

    def known_complete(self, state: bytes) -> bool:
        with self.lock:
            return state in self.models

    def fold_into(self, state: bytes, update: bytes) -> bytes | None:
        """The state folding ``update`` into the complete ``state`` makes, from its kept decoded model
        (`yupdate.Incremental`); None when ``state`` is not known complete or the update needs the general
        path. The edit's document, when one made ``update`` from ``state``, is the new state's."""
        with self.lock:
            if state not in self.models:
                return None
            model = self.models.pop(state)
        if model is None:
            try:
                model = yupdate.Incremental(state)
            except (IndexError, ValueError, UnicodeError):  # pragma: no cover - marked complete, canonical
                return None
        stored = model.fold(update)
        if stored is None:
            self._put(self.models, state, model)  # unchanged
            return None
        self._put(self.models, stored, model)
        with self.lock:
            edited = self.edited.pop(update, None)
        # The document held exactly ``state`` and made ``update``, which integrates whole: it holds exactly
        # ``stored`` now.
        if edited is not None and edited[0] == state:
            self.keep(stored, edited[1])
        return stored

    def adopt(self, update: bytes, encoded: bytes, state: bytes) -> bool:
        """Keep the document an edit made ``update`` in as ``state``'s document, when it encodes as exactly
        ``encoded``, the encoding of the fresh document ``state`` was made from (so it holds what that
        document holds: the same structs, deletes and client, and nothing pending); the next edit of this
        node then continues in it."""
        with self.lock:
            edited = self.edited.pop(update, None)
        if edited is None or edited[1].get_update() != encoded:
            return False
        self.keep(state, edited[1])
        return True

    def keep(self, state: bytes, doc: Any, *, replace: bool = True) -> None:
        """Keep ``doc`` as the document of ``state``; with ``replace`` False, only if none is kept (a fold's
        fresh document is no better than one kept, which may be an editing node's)."""
        if not replace:
            with self.lock:
                if state in self.docs:
                    self.docs.move_to_end(state)
                    return
        self._put(self.docs, state, doc)

    def text(self, state: bytes) -> str:
        with self.lock:
            text = self.texts.get(state)
            if text is not None:
                self.texts.move_to_end(state)
                return text
            doc = self.docs.get(state)
            if doc is not None:
                text = doc.text()
        if text is None:
            text = self.fresh(state).text()
        self._put(self.texts, state, text)
        return text


_DOCUMENTS = _Documents()


def decode_state(state: str | None) -> bytes | None:
    return _DOCUMENTS.decoded(state) if state else None


def _encode(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _update_bytes(update: Any) -> bytes | None:
    """An operation's rich text value as a Yjs update; None when it is not one (ignored everywhere alike)."""
    if isinstance(update, str):
        # Every replica must turn the same text into the same update, or concurrent texts would be
        # ordered by a random Yjs client id (different on each replica): derive the client id from the text.
        update = initial_update(update, client_id=_text_client_id(update))
    if not update:
        return None
    raw = bytes(update)
    try:
        _yjs().state_vector(raw)
    except ValueError:
        return None  # not a Yjs update (a buggy or hostile peer)
    return raw


def fold_update(state: str | None, update: Any) -> str:
    """Fold a Yjs update (bytes, or a plain string meaning 'initial text') into a rich text state (base64).

    The state is the canonical encoding (`offline.merge.yupdate`) of the document of every update folded so
    far, with whatever of the updates the document could not integrate yet (an update that arrived before
    one it depends on: structs after a gap, deletes of items not seen yet). Those stay in the state as update
    data, where a later update completes them; a document keeps them too, but applying updates out of order
    to one pycrdt document does not always give the text applying them in order gives, so the document is
    always made afresh from the merged updates, in one go.

    Canonical, because every replica must store the same bytes for the same operations: a document's own
    encoding keeps a run of one client's typing cut where integration happened to cut it (which follows
    the order the updates came in), and yrs and yjs write some parts in other orders. A document's
    encoding (not the merged updates) is what is canonicalised: it holds a deleted item's content as
    deleted, as every replica's document does once the delete is in, whichever updates brought the item.
    An update that is not a Yjs update changes nothing (everywhere alike).
    """
    raw = _update_bytes(update)
    if raw is None:
        return state or ""
    current = decode_state(state) or b""
    if current:
        folded = _DOCUMENTS.fold_into(current, raw)
        if folded is not None:
            text = _encode(folded)
            _DOCUMENTS.encoded(text, folded)
            return text
    backend = _yjs()
    merged = backend.merge_updates(current, raw) if current else raw
    # What the document could not integrate (pending): structs past its state vector, deletes of items it
    # lacks (a diff holds the whole delete set; those the document has add nothing).
    doc, encoded, pending = _integrated(merged, None)
    try:
        # The document's structs first (its deleted content as deleted), then what is pending.
        stored, complete = yupdate.canonical_union(encoded, pending)
    except ValueError:  # pragma: no cover - a Yjs encoding this decoder does not read (a newer Yjs?)
        # Kept as Yjs gave it rather than lost: the text still converges, only the bytes may differ.
        stored, complete = backend.merge_updates(encoded, merged), False
    if complete:
        _DOCUMENTS.complete(stored)
        if not _DOCUMENTS.adopt(raw, encoded, stored):
            _DOCUMENTS.keep(stored, doc, replace=False)  # nothing pending: the document is the state's
    text = _encode(stored)
    _DOCUMENTS.encoded(text, stored)
    return text


def merge_update(state: str | None, update: Any) -> str:
    """`fold_update` (the name callers outside the engine know)."""
    return fold_update(state, update)


def text_of(state: str | bytes | None) -> str:
    """The text of a state (base64 text as kept in merge state, or raw bytes as kept in a BLOB column)."""
    if not state:
        return ""
    raw = bytes(state) if isinstance(state, (bytes, bytearray, memoryview)) else decode_state(state)
    return _DOCUMENTS.text(raw) if raw else ""


def state_bytes(state: str | None) -> bytes:
    return decode_state(state) or b""


def _text_client_id(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big")


def initial_update(text: str, *, client_id: int | None = None) -> bytes:
    """A Yjs update that creates a document holding ``text`` (as Yjs client ``client_id``, else a random
    one; the store passes the inserting node's `client_id_for`)."""
    doc = _yjs().new_doc(client_id)
    doc.insert(0, text)
    return doc.get_update()


class CharText:
    """A document's text addressed by Python string indices (code points), whatever the Yjs backend counts
    in (yrs: UTF-8 bytes, yjs: UTF-16 code units; `offline.merge.yjs` converts)."""

    __slots__ = ("_doc",)

    def __init__(self, doc: yjs.YDoc) -> None:
        self._doc = doc

    def __str__(self) -> str:
        return self._doc.text()

    def __len__(self) -> int:
        return len(self._doc.text())

    def insert(self, index: int, value: str) -> None:
        size = len(self)
        index = max(0, min(size, index + size if index < 0 else index))
        self._doc.insert(index, value)

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
            self._doc.delete(start, stop)

    def __iadd__(self, value: str) -> CharText:
        self._doc.insert(len(self), value)
        return self


def edit_update(state: str | None, edit: Any, *, client_id: int | None = None) -> tuple[bytes, str]:
    """Run ``edit(text)`` on the document of ``state``; return the Yjs update it produced and the new text.

    ``text`` is a `CharText`: `insert(index, s)`, `del text[a:b]`, `text += s`, `len`, `str`, with Python
    string indices. ``client_id``: the editing node's Yjs client (`client_id_for`); None, a random one.
    The document comes from the cache the fold of the previous update left it in (`fold_update`).
    """
    current = decode_state(state) or b""
    doc, clean = _DOCUMENTS.take(current, client_id)
    before = doc.get_state()
    t = CharText(doc)
    edit(t)  # if it raises, the document (taken out of the cache) is simply not kept
    update = doc.get_update(before)
    text = str(t)
    if not update or update == b"\x00\x00":
        if clean:
            _DOCUMENTS.keep(current, doc)  # unchanged: still the document of ``current``
    elif clean:
        _DOCUMENTS.edited_into(update, doc, current)  # the fold of ``update`` may adopt it
    return update, text
