"""Yjs documents for rich text, from whichever Yjs implementation this platform has.

Rich text (`offline.merge.richtext`) needs a handful of Yjs operations: make a document (as a given Yjs
client), apply an update, encode the document (whole or after a state vector), merge updates, read and
edit its one text. Two implementations speak the same update format (Yjs update v1):

- natively (CPython), pycrdt, Python bindings of the Rust port (yrs);
- in the browser, where pycrdt has no WebAssembly build for Pyodide, the npm package ``yjs`` itself, which the
  worker loads beside Pyodide and registers as the JavaScript module ``offline_yjs`` (see the project
  template's worker.js); Python reaches it through Pyodide's foreign function interface.

The backend is chosen once, by platform (`IS_BROWSER`), and imported lazily: a schema without rich text never
loads either. Both see positions as Python string indices (code points): yrs counts UTF-8 bytes and yjs
UTF-16 code units, so each backend converts at its edge.

Updates made by one are read by the other, and folding the same updates gives the same text on both. The
bytes of a document's own encoding may differ (yrs and yjs order a delete set's clients differently and
join adjacent runs of one client's typing in different cases), so a state is never a document's own
encoding: `richtext` stores its canonical encoding (`offline.merge.yupdate`), the same bytes from either.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Protocol

#: The name the browser worker registers the npm ``yjs`` module under (``pyodide.registerJsModule``).
JS_MODULE = "offline_yjs"
#: The name of the document's one text (pycrdt ``doc.get("text", type=Text)``, yjs ``doc.getText("text")``).
TEXT_KEY = "text"


class YDoc(Protocol):
    """One Yjs document holding one text, edited as one Yjs client."""

    client_id: int

    def apply_update(self, update: bytes) -> None: ...

    def get_update(self, state_vector: bytes | None = None) -> bytes:
        """The document as an update (only what ``state_vector`` lacks, when given)."""
        ...

    def get_state(self) -> bytes:
        """The document's state vector."""
        ...

    def text(self) -> str: ...

    def insert(self, index: int, value: str) -> None:
        """Insert ``value`` at character ``index`` (a code point index, within the text)."""
        ...

    def delete(self, start: int, stop: int) -> None:
        """Delete characters ``start`` to ``stop`` (code point indices, ``start < stop``)."""
        ...


class YjsBackend(Protocol):
    name: str

    def new_doc(self, client_id: int | None = None) -> YDoc: ...

    def merge_updates(self, first: bytes, second: bytes) -> bytes: ...

    def diff_update(self, update: bytes, state_vector: bytes) -> bytes:
        """What of ``update`` a document with ``state_vector`` lacks: the structs past it, and the delete set."""
        ...

    def state_vector(self, update: bytes) -> bytes:
        """The state vector of ``update``; ValueError when it is not a Yjs update."""
        ...


def _utf8_offset(text: str, index: int) -> int:
    return index if text.isascii() else len(text[:index].encode("utf-8"))


def _utf16_offset(text: str, index: int) -> int:
    return index if text.isascii() else len(text[:index].encode("utf-16-le")) // 2


class _PycrdtDoc:
    __slots__ = ("_doc", "_text", "client_id")

    def __init__(self, pycrdt: Any, client_id: int | None) -> None:
        self._doc = pycrdt.Doc() if client_id is None else pycrdt.Doc(client_id=client_id)
        self._text = self._doc.get(TEXT_KEY, type=pycrdt.Text)
        self.client_id = int(self._doc.client_id)

    def apply_update(self, update: bytes) -> None:
        self._doc.apply_update(update)

    def get_update(self, state_vector: bytes | None = None) -> bytes:
        return bytes(self._doc.get_update(state_vector) if state_vector else self._doc.get_update())

    def get_state(self) -> bytes:
        return bytes(self._doc.get_state())

    def text(self) -> str:
        return str(self._text)

    def insert(self, index: int, value: str) -> None:
        # yrs counts Text positions in UTF-8 bytes: a character index past a non-ASCII character would
        # land elsewhere (or panic inside yrs, mid-character).
        self._text.insert(_utf8_offset(str(self._text), index), value)

    def delete(self, start: int, stop: int) -> None:
        current = str(self._text)
        del self._text[_utf8_offset(current, start) : _utf8_offset(current, stop)]


class PycrdtBackend:
    """Yjs through pycrdt (yrs): CPython on the desktop, the server and the tests."""

    name = "pycrdt"

    def __init__(self) -> None:
        import pycrdt

        self._pycrdt = pycrdt

    def new_doc(self, client_id: int | None = None) -> YDoc:
        return _PycrdtDoc(self._pycrdt, client_id)

    def merge_updates(self, first: bytes, second: bytes) -> bytes:
        return bytes(self._pycrdt.merge_updates(first, second))

    def diff_update(self, update: bytes, state_vector: bytes) -> bytes:
        return bytes(self._pycrdt.get_update(update, state_vector))

    def state_vector(self, update: bytes) -> bytes:
        return bytes(self._pycrdt.get_state(update))  # raises ValueError on anything else


#: The Yjs client a browser document is while it applies an update: outside the 32-bit clients of yjs's
#: random ids and `richtext.initial_update`'s text-derived ones, and the 49-bit ones of `client_id_for`.
_APPLYING_AS = (1 << 52) - 1


class _BrowserDoc:
    __slots__ = ("_backend", "_doc", "_text", "client_id")

    def __init__(self, backend: BrowserBackend, client_id: int | None) -> None:
        self._backend = backend
        self._doc = backend.yjs.Doc.new()
        if client_id is not None:
            self._doc.clientID = client_id  # yjs keeps it as a plain number (exact up to 2**53)
        self._text = self._doc.getText(TEXT_KEY)
        self.client_id = int(self._doc.clientID)

    def apply_update(self, update: bytes) -> None:
        # yjs gives a document a new random client (and logs it) when an update brings edits of the
        # document's own client: it guards against two sessions sharing one. Here that is the rule, not a
        # clash: a node edits as its one client (`richtext.client_id_for`) on top of its own latest state,
        # which holds all its earlier edits, so its clocks never repeat (pycrdt keeps the client as it is).
        # So the update is applied as a client no edit is ever written as, and the document's comes back.
        self._doc.clientID = _APPLYING_AS
        try:
            self._backend.yjs.applyUpdate(self._doc, self._backend.to_js(update))
        finally:
            self._doc.clientID = self.client_id

    def get_update(self, state_vector: bytes | None = None) -> bytes:
        yjs = self._backend.yjs
        if state_vector:
            encoded = yjs.encodeStateAsUpdate(self._doc, self._backend.to_js(state_vector))
        else:
            encoded = yjs.encodeStateAsUpdate(self._doc)
        return bytes(encoded.to_bytes())

    def get_state(self) -> bytes:
        return bytes(self._backend.yjs.encodeStateVector(self._doc).to_bytes())

    def text(self) -> str:
        return str(self._text.toString())

    def insert(self, index: int, value: str) -> None:
        self._text.insert(_utf16_offset(self.text(), index), value)

    def delete(self, start: int, stop: int) -> None:
        current = self.text()
        first = _utf16_offset(current, start)
        self._text.delete(first, _utf16_offset(current, stop) - first)


class BrowserBackend:
    """Yjs through the npm package ``yjs``, in Pyodide (the worker registers it as `JS_MODULE`)."""

    name = "yjs"

    def __init__(self) -> None:
        from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]

        self.yjs = importlib.import_module(JS_MODULE)
        self._js_error = JsException
        self._to_js = to_js

    def to_js(self, data: bytes) -> Any:
        """``data`` as a JavaScript Uint8Array (a copy: yjs may keep what it is given)."""
        return self._to_js(memoryview(data))

    def new_doc(self, client_id: int | None = None) -> YDoc:
        return _BrowserDoc(self, client_id)

    def merge_updates(self, first: bytes, second: bytes) -> bytes:
        merged = self.yjs.mergeUpdates(self._to_js([self.to_js(first), self.to_js(second)]))
        return bytes(merged.to_bytes())

    def diff_update(self, update: bytes, state_vector: bytes) -> bytes:
        return bytes(self.yjs.diffUpdate(self.to_js(update), self.to_js(state_vector)).to_bytes())

    def state_vector(self, update: bytes) -> bytes:
        try:
            return bytes(self.yjs.encodeStateVectorFromUpdate(self.to_js(update)).to_bytes())
        except self._js_error as exc:  # not a Yjs update: yjs's decoder ran off its end
            raise ValueError(str(exc)) from None


IS_BROWSER = sys.platform == "emscripten"
#: The implementation for this platform, decided here; made (and its package imported) on first use.
_BACKEND_CLASS: type[PycrdtBackend] | type[BrowserBackend] = BrowserBackend if IS_BROWSER else PycrdtBackend
_backend: YjsBackend | None = None


def backend() -> YjsBackend:
    """This platform's Yjs; ImportError when it is missing (pycrdt not installed, yjs not loaded)."""
    global _backend
    if _backend is None:
        _backend = _BACKEND_CLASS()
    return _backend


def missing_package() -> str | None:
    """What rich text lacks here (``"pycrdt"`` or ``"yjs"``), or None when this platform has its Yjs."""
    try:
        backend()
    except ImportError:
        return "yjs" if IS_BROWSER else "pycrdt"
    return None


__all__ = [
    "JS_MODULE",
    "TEXT_KEY",
    "BrowserBackend",
    "PycrdtBackend",
    "YDoc",
    "YjsBackend",
    "backend",
    "missing_package",
]
