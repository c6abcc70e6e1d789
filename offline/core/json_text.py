"""Compact JSON encoders built once on the standard library's C iterencoder.

``json.dumps`` with any non-default option constructs a ``JSONEncoder``, which builds its C iterencoder, on
every call: for the small documents this project encodes by the hundred thousand (operations, merge states,
hash payloads, frames) that costs as much as the encoding. `c_compact_encoder` builds the iterencoder once.
Pure standard library (it also runs under Pyodide); `ORJSON` is the optional faster library, for the few
places that can check its output.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any


def c_compact_encoder(
    default: Callable[[Any], Any] | None,
    fallback: Callable[[Any], str],
    sample: Any,
    *,
    sort_keys: bool = False,
    allow_nan: bool = True,
    ensure_ascii: bool = False,
) -> Callable[[Any], str]:
    """A compact (``separators=(",", ":")``) encoder on json's C iterencoder, non-ASCII-escaping unless
    ``ensure_ascii``, calling ``default`` for values JSON has no form for; ``fallback`` when the interpreter
    lacks the C encoder, or when the built one disagrees with ``fallback`` on ``sample`` (or on a plain
    string).

    No cycle check (``markers=None``): callers encode trees, or values their own walk has bounded. Its output
    is otherwise the same.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    basestring = getattr(
        json.encoder, "c_encode_basestring_ascii" if ensure_ascii else "c_encode_basestring", None
    )
    if make is None or basestring is None:  # pragma: no cover - interpreters without the _json module
        return fallback
    try:
        # (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys, allow_nan)
        iterencode = make(None, default, basestring, None, ":", ",", sort_keys, False, allow_nan)

        def encode(value: Any) -> str:
            return "".join(iterencode(value, 0))

        if encode(sample) != fallback(sample) or encode("x\u00e9") != fallback("x\u00e9"):  # pragma: no cover
            return fallback
    except Exception:  # pragma: no cover - a changed private interface
        return fallback
    return encode


def _load_orjson() -> Any:
    """The ``orjson`` module when it is installed and not turned off, else None.

    orjson (C and Rust) parses and encodes JSON several times faster than the standard library, but it is not
    an exact substitute: it writes some floats differently ("1e-7" where json writes "1e-07"), reads integers
    past 64 bits as floats and refuses what json accepts beyond RFC 8259 (NaN, lone surrogates, "1e400"). So
    it is used only where its result is checked against the text itself (a sync frame that re-encodes to
    exactly what was received) or cannot differ (the canonical payload, after ``canonical._prepare`` turned
    away every value it would write differently); everything else takes the standard library's path. It is
    optional: Pyodide has no build of it, and ``OFFLINE_NO_ORJSON=1`` runs the pure path (tests compare the
    two).
    """
    if os.environ.get("OFFLINE_NO_ORJSON"):
        return None
    try:
        import orjson
    except ImportError:  # pragma: no cover - Pyodide, or not installed
        return None
    return orjson


ORJSON: Any = _load_orjson()


def exact_loads(text: str) -> Any:
    """``json.loads(text)`` by orjson, for a compact text (no whitespace between tokens) read by the hundred
    thousand (merge states, stored operations): None when orjson is off or the result could differ, and the
    caller takes the standard library's path (also None for the text ``null``).

    The check is the one sync frames get (``protocol._compact_batch``): orjson must write what it read back
    as exactly ``text``. Then no key was repeated (the object would encode shorter), no integer past 64 bits
    was read as a float (it would encode as one), and every float in it is written by orjson as it stands in
    ``text``; and the value equals json's: a float's text is its shortest form, which both read back alike.
    Callers that write the value out again with orjson (`floatless_json`) rely on that last point.
    """
    fast = ORJSON
    if fast is None:
        return None
    try:
        value = fast.loads(text)
    except ValueError:  # orjson.JSONDecodeError: NaN, a lone surrogate, "1e400", ...
        return None
    if fast.dumps(value) != text.encode():
        return None
    return value
