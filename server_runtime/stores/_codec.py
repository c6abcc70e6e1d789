"""Text forms shared by the server stores: operations, record states, records, scopes and errors.

Everything is stored as JSON text (byte for byte what ``json.dumps`` produced), so a value read back equals
the value written, whatever the backend. Bytes values travel as the wire's bytes marker (``encode_value``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

from offline.core.errors import STORAGE_ERROR, OfflineError
from offline.core.operations import BYTES_MARKER, Operation, decode_value, operation_from_text
from offline.merge.engine import RecordState
from offline.merge.values import operation_text, value_json

from .base import RecordRow, StoredOperation, StoredRecordRow

T = TypeVar("T")

#: Page size of the streaming reads (``load_all_rows``, ``export_operations``).
PAGE_SIZE: Final = 1000


def dumps(value: Any) -> str:
    # json.dumps(encode_value(value), separators=(",", ":"), ensure_ascii=False), byte for byte, on an
    # encoder built once (json.dumps with options builds one per call: half the time of a small record).
    return value_json(value)


def encode_operation(op: Operation) -> str:
    # The text the operation was received as when the sync endpoint kept it (it reads back as the same
    # operation), else its compact wire JSON: json.dumps(op.to_wire(), separators=(",", ":"),
    # ensure_ascii=False), byte for byte.
    return operation_text(op)


def decode_operation(text: str) -> Operation:
    # The store only ever holds operations that were validated (and their ids verified) on the way in, so
    # reading them back skips the hash check; backups are verified by whoever imports them.
    return operation_from_text(text)


def encode_optional(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else dumps(value)


def decode_optional(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    value = json.loads(text)
    if BYTES_MARKER in text:  # else decode_value would return an equal copy: no bytes value in there
        value = decode_value(value)
    if not isinstance(value, dict):
        raise OfflineError("stored value is not a JSON object", STORAGE_ERROR, {"value": text[:200]})
    return value


def stored_operation(delivery: int, wire: str, scope: str | None) -> StoredOperation:
    return StoredOperation(
        delivery=int(delivery), operation=decode_operation(wire), scope=decode_optional(scope)
    )


def record_row(
    collection: str,
    record_id: str,
    state: str,
    record: str | None,
    refold: Callable[[Operation], RecordState] | None = None,
) -> RecordRow:
    """A stored row; ``refold`` (the store's ``_refold_state``) reads a ``ONE_OPERATION`` state text. Its
    record is decoded when first used (a catch-up's states do not read it)."""
    return StoredRecordRow.unread(collection, record_id, state, record, decode_optional, refold)


def check_appends(ops: Sequence[tuple[Operation, Mapping[str, Any] | None]]) -> None:
    for item in ops:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Operation)):
            raise TypeError("append() takes a list of (Operation, scope dict or None) pairs")
        if item[1] is not None and not isinstance(item[1], Mapping):
            raise TypeError("append(): a scope must be a dict or None")


def check_rows(rows: Iterable[RecordRow]) -> list[RecordRow]:
    out = list(rows)
    for row in out:
        if not isinstance(row, RecordRow):
            raise TypeError("save_rows() takes RecordRow objects")
    return out


def check_meta(key: object, value: object = "") -> None:
    if not isinstance(key, str) or not key:
        raise TypeError("a meta key must be a non-empty string")
    if not isinstance(value, str):
        raise TypeError("a meta value must be a string")


def check_node_claim(node_id: object, principal: object) -> None:
    if not isinstance(node_id, str) or not node_id:
        raise TypeError("a node id must be a non-empty string")
    if not isinstance(principal, str) or not principal:
        raise TypeError("a principal must be a non-empty string")


def chunks(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def storage_error(kind: str, action: str, exc: BaseException) -> OfflineError:
    return OfflineError(
        f"{kind} store: {action} failed: {exc}",
        STORAGE_ERROR,
        {"store": kind, "action": action, "cause": type(exc).__name__},
    )


def stats_from_rows(kind: str, rows: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """The ``stats()`` dict from the rows of the shared statistics query (collection NULL: the operations)."""
    records: dict[str, int] = {}
    deleted: dict[str, int] = {}
    out: dict[str, Any] = {
        "kind": kind,
        "operations": 0,
        "max_delivery": 0,
        "records": records,
        "deleted": deleted,
    }
    for collection, first, second in rows:
        if collection is None:
            out["operations"], out["max_delivery"] = int(first), int(second)
            continue
        if first:
            records[collection] = int(first)
        if second:
            deleted[collection] = int(second)
    return out
