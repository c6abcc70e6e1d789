"""Where this Python runs, and what the schema can use there.

The same `offline` code runs on CPython (desktop, server, tests) and on Pyodide in a browser's Web Worker.
Under Pyodide there is no socket module to speak WebSocket with and no C extension that was not compiled to
WebAssembly, so a few things are picked or refused here instead of failing later, deep in a write.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from offline.core.schema import SchemaDefinition

#: True under Pyodide (CPython compiled to WebAssembly, in a browser or Node.js).
IS_BROWSER: Final = sys.platform == "emscripten"

#: ``async (op, options_json) -> answer``: one WebAuthn ceremony run by the page for Python in its Web Worker
#: (a worker has no ``navigator.credentials``). ``op`` is ``"create"`` or ``"get"``; the answer is
#: ``{"ok": True, "credential": {...}}`` or ``{"ok": False, "error": {"name", "message"}}`` (the DOMException).
PageWebAuthn = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
_page_webauthn: PageWebAuthn | None = None


def set_page_webauthn(relay: PageWebAuthn | None) -> None:
    """Install (or, with None, remove) the page's WebAuthn relay; `offline.worker` does this when its page
    reports WebAuthn support, and `offline.auth.is_passkey_supported()` is then True."""
    global _page_webauthn
    _page_webauthn = relay


def page_webauthn() -> PageWebAuthn | None:
    """The page's WebAuthn relay, when this Python runs in a worker whose page offers WebAuthn."""
    return _page_webauthn


@dataclass(frozen=True, slots=True)
class UnavailableField:
    """A schema field this runtime cannot store, and why (shown to the user, never swallowed)."""

    collection: str
    field: str
    type: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"collection": self.collection, "field": self.field, "type": self.type, "reason": self.reason}


def has_module(name: str) -> bool:
    """Whether ``name`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def unavailable_fields(schema: SchemaDefinition) -> list[UnavailableField]:
    """The fields of ``schema`` that cannot work in this runtime.

    Rich text merges with Yjs: pycrdt natively, the npm package yjs in the browser, which the page's build
    bundles when the project has it installed (pycrdt has no WebAssembly build for Pyodide). Without it a
    runtime cannot apply rich text operations, so such fields are reported up front.
    """
    rich = [
        (name, field_name)
        for name, collection in schema.collections.items()
        for field_name, descriptor in collection.fields.items()
        if descriptor.type == "richtext"
    ]
    if not rich:
        return []
    from offline.merge import yjs  # its Yjs package is imported on first use, not here

    if yjs.missing_package() is None:
        return []
    where, need = (
        (
            "in the browser",
            "the npm package yjs, which this page was built without (npm install yjs, then build)",
        )
        if IS_BROWSER
        else ("here", "the Python package pycrdt (pip install pycrdt)")
    )
    return [
        UnavailableField(
            collection=name,
            field=field_name,
            type="richtext",
            reason=(
                f"rich text fields are unavailable {where}: they need {need}. Writes to {name} fail with an "
                f"error, and {name} records changed elsewhere do not sync to this device."
            ),
        )
        for name, field_name in rich
    ]


__all__ = [
    "IS_BROWSER",
    "PageWebAuthn",
    "UnavailableField",
    "has_module",
    "page_webauthn",
    "set_page_webauthn",
    "unavailable_fields",
]
