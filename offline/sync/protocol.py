"""The WebSocket sync protocol: message types, their JSON form and strict decoding (DESIGN.md section 4).

One message is one JSON text frame. ``encode`` turns a message into compact JSON; ``decode`` turns any frame
(text or bytes, from any peer, hostile or not) into a message or raises ``ProtocolError``, and never anything
else: sizes are checked before parsing, nesting is bounded before the (recursive) JSON parser runs, ``NaN``,
``Infinity`` and duplicate keys are refused, and every field is type- and range-checked.

Operations inside ``operation-batch`` and ``operation`` messages are left as raw JSON objects by ``decode``,
so one bad operation can be refused on its own (an ``operation-rejected`` message) while the rest of its batch
proceeds; ``decode_operation`` validates one of them and verifies its content hash.

Pure standard library, so it also runs under Pyodide.
"""

from __future__ import annotations

import json
import math
import uuid
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any, AnyStr, ClassVar, Final, TypeAlias

from offline.core.errors import OfflineError
from offline.core.json_text import ORJSON, c_compact_encoder
from offline.core.operations import Operation, keep_received_text, plain_wire_keys

__all__ = [
    "AUTH_FAILED",
    "BATCH_TOO_LARGE",
    "CLOCK_DRIFT",
    "CONNECTION_ERROR_CODES",
    "CONSTRAINT_VIOLATION",
    "EMAIL_NOT_VERIFIED",
    "HASH_MISMATCH",
    "INTERNAL_ERROR",
    "INVALID_OPERATION",
    "INVALID_TRANSITION",
    "MALFORMED_MESSAGE",
    "MAX_BATCH_OPERATIONS",
    "MAX_DEPTH",
    "MAX_FRAME_DEPTH",
    "MAX_ID_LENGTH",
    "MAX_MESSAGE_BYTES",
    "MAX_OPERATION_BYTES",
    "MAX_SAFE_INTEGER",
    "MESSAGE_TOO_LARGE",
    "MESSAGE_TYPES",
    "NODE_ID_MISMATCH",
    "OPERATION_ERROR_CODES",
    "OPERATION_TOO_LARGE",
    "OVERLOADED",
    "PROTOCOL_VERSION",
    "PROTOCOL_VIOLATION",
    "RESYNC_REQUIRED",
    "RETRIABLE_CODES",
    "SCHEMA_MISMATCH",
    "SCOPE_VIOLATION",
    "SERVER_SHUTDOWN",
    "SESSION_REVOKED",
    "TOKEN_EXPIRED",
    "UNKNOWN_MESSAGE_TYPE",
    "USER_DISABLED",
    "Acknowledgment",
    "ErrorMessage",
    "Handshake",
    "HandshakeResponse",
    "Message",
    "OperationBatch",
    "OperationMessage",
    "OperationRejected",
    "ProtocolError",
    "RecordStates",
    "decode",
    "decode_operation",
    "decode_operation_text",
    "encode",
    "encode_batch_frame",
    "from_dict",
    "new_message_id",
]

# ------------------------------------------------------------------------------------------------ limits

PROTOCOL_VERSION: Final = 1
#: Largest frame ``decode`` accepts, in UTF-8 bytes.
MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
#: Most operations one ``operation-batch`` may carry.
MAX_BATCH_OPERATIONS: Final = 1000
#: Largest operation ``decode_operation`` accepts, as compact UTF-8 JSON.
MAX_OPERATION_BYTES: Final = 256 * 1024
#: Deepest nesting of an operation's data (the same limit ``offline.core.operations`` enforces).
MAX_DEPTH: Final = 64
#: Deepest nesting of a whole frame: the envelope (message object, ``operations`` array, operation object)
#: adds three levels around an operation's data, so every operation that can be created can also be sent.
MAX_FRAME_DEPTH: Final = MAX_DEPTH + 3
#: Longest ``messageId`` / ``nodeId`` (in characters).
MAX_ID_LENGTH: Final = 128
#: Integers beyond this lose precision in JavaScript peers.
MAX_SAFE_INTEGER: Final = 2**53 - 1

# ----------------------------------------------------------------------------------------- error codes

# The connection is at fault: sent as an `error` message.
MALFORMED_MESSAGE: Final = "MALFORMED_MESSAGE"
UNKNOWN_MESSAGE_TYPE: Final = "UNKNOWN_MESSAGE_TYPE"
MESSAGE_TOO_LARGE: Final = "MESSAGE_TOO_LARGE"
BATCH_TOO_LARGE: Final = "BATCH_TOO_LARGE"
PROTOCOL_VIOLATION: Final = "PROTOCOL_VIOLATION"
AUTH_FAILED: Final = "AUTH_FAILED"
SCHEMA_MISMATCH: Final = "SCHEMA_MISMATCH"
OVERLOADED: Final = "OVERLOADED"
SERVER_SHUTDOWN: Final = "SERVER_SHUTDOWN"
RESYNC_REQUIRED: Final = "RESYNC_REQUIRED"
INTERNAL_ERROR: Final = "INTERNAL_ERROR"
#: A live session ended by the server: its auth session was revoked (only new credentials help) ...
SESSION_REVOKED: Final = "SESSION_REVOKED"
#: ... or its access token expired (refresh, then reconnect).
TOKEN_EXPIRED: Final = "TOKEN_EXPIRED"
#: The handshake's account was disabled by an administrator (only the administrator can change that).
USER_DISABLED: Final = "USER_DISABLED"
#: The server requires a verified email address for sync and the account's is not verified yet.
EMAIL_NOT_VERIFIED: Final = "EMAIL_NOT_VERIFIED"

# One operation is refused: sent as an `operation-rejected` message.
SCOPE_VIOLATION: Final = "SCOPE_VIOLATION"
INVALID_OPERATION: Final = "INVALID_OPERATION"
INVALID_TRANSITION: Final = "INVALID_TRANSITION"
CONSTRAINT_VIOLATION: Final = "CONSTRAINT_VIOLATION"
CLOCK_DRIFT: Final = "CLOCK_DRIFT"
OPERATION_TOO_LARGE: Final = "OPERATION_TOO_LARGE"
HASH_MISMATCH: Final = "HASH_MISMATCH"
#: An operation of a node the session may not speak for (another principal's device, or the server).
NODE_ID_MISMATCH: Final = "NODE_ID_MISMATCH"

CONNECTION_ERROR_CODES: Final = frozenset(
    {
        MALFORMED_MESSAGE,
        UNKNOWN_MESSAGE_TYPE,
        MESSAGE_TOO_LARGE,
        BATCH_TOO_LARGE,
        PROTOCOL_VIOLATION,
        AUTH_FAILED,
        SCHEMA_MISMATCH,
        OVERLOADED,
        SERVER_SHUTDOWN,
        RESYNC_REQUIRED,
        INTERNAL_ERROR,
        SESSION_REVOKED,
        TOKEN_EXPIRED,
        USER_DISABLED,
        EMAIL_NOT_VERIFIED,
    }
)
OPERATION_ERROR_CODES: Final = frozenset(
    {
        SCOPE_VIOLATION,
        INVALID_OPERATION,
        INVALID_TRANSITION,
        CONSTRAINT_VIOLATION,
        CLOCK_DRIFT,
        OPERATION_TOO_LARGE,
        HASH_MISMATCH,
        NODE_ID_MISMATCH,
    }
)
#: Codes after which the same request may succeed later (reconnect / resend).
RETRIABLE_CODES: Final = frozenset(
    {OVERLOADED, SERVER_SHUTDOWN, INTERNAL_ERROR, RESYNC_REQUIRED, TOKEN_EXPIRED}
)


class ProtocolError(OfflineError):
    """A message or operation broke the protocol. ``code`` is one of this module's codes.

    ``context["field"]`` names the offending field or path (``"frame"`` for the frame as a whole).
    """

    def __init__(
        self,
        code: str,
        message: str,
        retriable: bool | None = None,
        *,
        field: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        ctx: dict[str, Any] = {"field": field}
        if context:
            ctx.update(context)
        if field is not None:
            ctx["field"] = field
        super().__init__(message, code, ctx)
        self.retriable: bool = code in RETRIABLE_CODES if retriable is None else retriable

    @property
    def field(self) -> str | None:
        return (self.context or {}).get("field")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_protocol_error, (type(self), self.code, self.message, self.retriable, self.context))

    def to_error_message(self, message_id: str | None = None) -> ErrorMessage:
        """The ``error`` message reporting this error to the peer."""
        return ErrorMessage(message_id or new_message_id(), self.code, self.message, self.retriable)

    def to_rejection(
        self,
        operation_id: str,
        message_id: str | None = None,
        *,
        collection: str | None = None,
        record_id: str | None = None,
    ) -> OperationRejected:
        """The ``operation-rejected`` message refusing ``operation_id`` (of that record) for this error."""
        return OperationRejected(
            message_id or new_message_id(),
            operation_id,
            self.code,
            self.message,
            self.retriable,
            collection=collection,
            record_id=record_id,
        )


def _rebuild_protocol_error(
    cls: type[ProtocolError], code: str, message: str, retriable: bool, context: dict[str, Any] | None
) -> ProtocolError:
    err = ProtocolError.__new__(cls)
    ProtocolError.__init__(err, code, message, retriable, context=context)
    return err


def new_message_id() -> str:
    """A fresh random message id."""
    return uuid.uuid4().hex


# ---------------------------------------------------------------------------------------------- messages


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        out[key] = value


@dataclass(frozen=True)
class Handshake:
    """C->S: opens a session. ``protocolVersion`` travels too (absent on input means 1).

    ``initialSync`` (optional, beyond DESIGN.md's table): ``"states"`` asks a session starting from delivery
    0 for the state-based first sync (see `RecordStates`): the server may send the records' merge states,
    then the operations after them, instead of every operation of its log. A server that does not know the
    field, or whose log is short, streams the operations as usual. Also sent by a client whose state-based
    sync was cut after some messages (its watermark is their last ``through``): the rest by states.
    """

    TYPE: ClassVar[str] = "handshake"

    message_id: str
    node_id: str
    version_vector: dict[str, int]
    schema_version: int
    last_delivery_sequence: int
    auth_token: str | None = None
    sync_scope: dict[str, Any] | None = None
    protocol_version: int = PROTOCOL_VERSION
    initial_sync: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.TYPE,
            "messageId": self.message_id,
            "nodeId": self.node_id,
            "versionVector": dict(self.version_vector),
            "schemaVersion": self.schema_version,
            "lastDeliverySequence": self.last_delivery_sequence,
            "protocolVersion": self.protocol_version,
        }
        _put(out, "authToken", self.auth_token)
        _put(out, "syncScope", self.sync_scope)
        _put(out, "initialSync", self.initial_sync)
        return out


@dataclass(frozen=True)
class HandshakeResponse:
    """S->C: the answer to a handshake (``accepted: false`` with ``rejectReason`` on a schema mismatch).

    ``deliveryEpoch`` (optional) names the server's numbering of deliveries when it is not the database's
    first one: a server restored from a backup numbers the operations anew, so a ``lastDeliverySequence``
    counted by the backed-up server means nothing there. A client keeps its watermark together with the
    server's ``nodeId`` and ``deliveryEpoch`` and, when either differs from what it synced with, starts over
    from delivery 0 (everything in its scope is sent again; it ignores what it holds already). Absent: the
    database's original numbering (a server never restored).
    """

    TYPE: ClassVar[str] = "handshake-response"

    message_id: str
    accepted: bool
    node_id: str
    version_vector: dict[str, int]
    schema_version: int
    server_time: int
    server_max_delivery_sequence: int
    accepted_scope: dict[str, Any] | None = None
    reject_reason: str | None = None
    supported_schema_min: int | None = None
    supported_schema_max: int | None = None
    delivery_epoch: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.TYPE,
            "messageId": self.message_id,
            "accepted": self.accepted,
            "nodeId": self.node_id,
            "versionVector": dict(self.version_vector),
            "schemaVersion": self.schema_version,
            "serverTime": self.server_time,
            "serverMaxDeliverySequence": self.server_max_delivery_sequence,
        }
        _put(out, "acceptedScope", self.accepted_scope)
        _put(out, "rejectReason", self.reject_reason)
        _put(out, "supportedSchemaMin", self.supported_schema_min)
        _put(out, "supportedSchemaMax", self.supported_schema_max)
        _put(out, "deliveryEpoch", self.delivery_epoch)
        return out


@dataclass(frozen=True)
class OperationBatch:
    """Both ways: a batch of raw wire operations (validate each with ``decode_operation``)."""

    TYPE: ClassVar[str] = "operation-batch"

    message_id: str
    operations: tuple[dict[str, Any], ...]
    is_final: bool
    batch_index: int
    base_delivery_sequence: int | None = None
    max_delivery_sequence: int | None = None
    #: Set by ``decode`` for a frame that is the compact encoding of its operations: each operation's compact
    #: JSON, exactly as it appeared in the frame (pass it to ``decode_operation_text``). Not part of the wire
    #: form and not compared.
    operation_texts: tuple[str, ...] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.operations, tuple):
            object.__setattr__(self, "operations", tuple(self.operations))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.TYPE,
            "messageId": self.message_id,
            "isFinal": self.is_final,
            "batchIndex": self.batch_index,
        }
        _put(out, "baseDeliverySequence", self.base_delivery_sequence)
        _put(out, "maxDeliverySequence", self.max_delivery_sequence)
        # Last, as encode_batch_frame writes it: a receiver's decode then takes the compact-batch path.
        out["operations"] = list(self.operations)
        return out


@dataclass(frozen=True)
class OperationMessage:
    """Both ways: one raw wire operation, streamed for low latency."""

    TYPE: ClassVar[str] = "operation"

    message_id: str
    operation: dict[str, Any]
    delivery_sequence: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE, "messageId": self.message_id, "operation": self.operation}
        _put(out, "deliverySequence", self.delivery_sequence)
        return out


@dataclass(frozen=True)
class Acknowledgment:
    """Both ways: the operations of ``acknowledged_message_id`` are durably stored."""

    TYPE: ClassVar[str] = "acknowledgment"

    message_id: str
    acknowledged_message_id: str
    last_sequence_number: int
    delivery_sequence: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.TYPE,
            "messageId": self.message_id,
            "acknowledgedMessageId": self.acknowledged_message_id,
            "lastSequenceNumber": self.last_sequence_number,
        }
        _put(out, "deliverySequence", self.delivery_sequence)
        return out


@dataclass(frozen=True)
class OperationRejected:
    """S->C: one operation is refused for good (the rest of its batch is unaffected)."""

    TYPE: ClassVar[str] = "operation-rejected"

    message_id: str
    operation_id: str
    code: str
    message: str
    retriable: bool
    # The refused operation's record (DESIGN.md section 7: some clients find the operation by these alone).
    # None only from an older server; this server sends both, "" when the operation named none.
    collection: str | None = None
    record_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "type": self.TYPE,
            "messageId": self.message_id,
            "operationId": self.operation_id,
            "code": self.code,
            "message": self.message,
            "retriable": self.retriable,
        }
        if self.collection is not None:
            out["collection"] = self.collection
        if self.record_id is not None:
            out["recordId"] = self.record_id
        return out


@dataclass(frozen=True)
class RecordStates:
    """S->C ``record-states`` (DESIGN-level name: *record states*, the state-based catch-up): the server's
    merge states of records, sent instead of the operations a compaction deleted.

    A session resuming below the server's compaction horizon (``lastDeliverySequence`` under it, 0
    included) first gets the states of the records in its scope in one or more of these messages, the last
    with ``isFinal`` and ``horizon`` (the delivery the states account for: the client's watermark from
    then on), then the operation stream after the horizon as usual. A record moving into a session's scope
    whose history was compacted is sent the same way (``isFinal`` false, no horizon) before the operation
    that moved it. Each entry of ``states`` is ``{"collection", "recordId", "state", "versions"}``:
    ``state`` the record's merge state as JSON text (``RecordState.to_json``), ``versions`` each node's
    highest sequence number folded into it. The client replaces its state of each record with the server's
    and folds on top only its own operations that state does not hold; an operation streamed later at or
    below its node's number in ``versions`` is one the state holds. A record sent because it left the
    session's scope (the client holds it and drops it once the state shows it outside) comes with its scope
    fields only. Acknowledged like a batch.

    The same messages make a fresh session's state-based first sync (``initialSync: "states"`` in its
    handshake): the horizon is then the end of the log when the session began. ``through`` (optional, on a
    message that is not final): the delivery sequence up to which the server's scan of its log found the
    records sent so far. The client then holds the state of every record its scope's log touched up to
    ``through`` (each state read after those operations were committed), so it moves its watermark there
    and a session cut before the final message resumes from it: the client asks with ``initialSync:
    "states"`` again, and the server sends the states of the records touched after it (or, when few
    operations remain, those operations; one the state holds is a repeat by its ``versions``).
    """

    TYPE: ClassVar[str] = "record-states"

    message_id: str
    states: tuple[dict[str, Any], ...]
    is_final: bool
    horizon: int | None = None
    through: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.states, tuple):
            object.__setattr__(self, "states", tuple(self.states))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE, "messageId": self.message_id, "isFinal": self.is_final}
        _put(out, "horizon", self.horizon)
        _put(out, "through", self.through)
        out["states"] = list(self.states)
        return out


@dataclass(frozen=True)
class ErrorMessage:
    """S->C: the connection is at fault."""

    TYPE: ClassVar[str] = "error"

    message_id: str
    code: str
    message: str
    retriable: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "messageId": self.message_id,
            "code": self.code,
            "message": self.message,
            "retriable": self.retriable,
        }


Message: TypeAlias = (
    Handshake
    | HandshakeResponse
    | OperationBatch
    | OperationMessage
    | Acknowledgment
    | OperationRejected
    | RecordStates
    | ErrorMessage
)

_MESSAGE_CLASSES: Final[tuple[type[Message], ...]] = (
    Handshake,
    HandshakeResponse,
    OperationBatch,
    OperationMessage,
    Acknowledgment,
    OperationRejected,
    RecordStates,
    ErrorMessage,
)
#: Wire ``type`` -> message class.
MESSAGE_TYPES: Final[Mapping[str, type[Message]]] = {cls.TYPE: cls for cls in _MESSAGE_CLASSES}


# ---------------------------------------------------------------------------------------------- encoding


def encode(message: Message) -> str:
    """Compact JSON text of ``message`` (one text frame)."""
    if not isinstance(message, _MESSAGE_CLASSES):
        raise ProtocolError(
            MALFORMED_MESSAGE,
            f"cannot encode a {type(message).__name__}: not a protocol message",
            field="type",
        )
    try:
        return json.dumps(message.to_dict(), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ProtocolError(
            MALFORMED_MESSAGE, f"cannot encode {message.TYPE} message: {exc}", field=message.TYPE
        ) from None


def encode_batch_frame(
    message_id: str,
    operations_json: Sequence[str],
    *,
    is_final: bool,
    batch_index: int,
    base_delivery_sequence: int | None = None,
    max_delivery_sequence: int | None = None,
) -> str:
    """An ``operation-batch`` frame around operations already encoded as compact JSON objects.

    The same text as ``encode(OperationBatch(...))`` of those operations: senders that hold operations
    as stored JSON text (the server's log, a client's pending writes) join them instead of decoding and
    encoding every operation again. Each text must be one JSON object (``decode`` checks the rest).
    """
    head: dict[str, Any] = {
        "type": OperationBatch.TYPE,
        "messageId": message_id,
        "isFinal": is_final,
        "batchIndex": batch_index,
    }
    _put(head, "baseDeliverySequence", base_delivery_sequence)
    _put(head, "maxDeliverySequence", max_delivery_sequence)
    text = json.dumps(head, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text[:-1] + ',"operations":[' + ",".join(operations_json) + "]}"


# ---------------------------------------------------------------------------------------------- decoding


def _malformed(field: str, message: str, **context: Any) -> ProtocolError:
    return ProtocolError(MALFORMED_MESSAGE, message, field=field, context=context)


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def _is_utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Depth scan tables: "[" and "{" become +1, "]" and "}" -1 (as signed bytes), quotes stay, the rest goes.
_DEPTH_TABLE: Final = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_DEPTH_DELETE: Final = bytes(b for b in range(256) if b not in b'[]{}"')


def _check_depth(data: bytes, limit: int) -> None:
    """Refuse UTF-8 JSON ``data`` whose brackets nest deeper than ``limit``.

    Runs before ``json.loads``, whose parser recurses once per level: deep input would otherwise raise
    RecursionError in CPython and can overflow the far smaller stack of Pyodide. Everything runs at C speed
    (no per-character Python loop): escapes are dropped, strings are cut out, and the deepest prefix of the
    remaining brackets is measured. Unbalanced brackets are left for the JSON parser to report: it stops at
    the first one, and up to there its nesting is exactly the prefix depth measured here.
    """
    if len(data) <= 4096 and data.count(b"[") + data.count(b"{") <= limit:
        return  # cannot nest deeper than the number of opening brackets (counting is a byte loop: small only)
    if b"\\" in data:
        # Backslashes pair up from the left exactly as the JSON lexer reads them; once escaped backslashes
        # are gone, a backslash before a quote escapes it. (Outside strings a backslash is a parse error,
        # and the parser never gets past it.) Each pair becomes two spaces, which the translation below drops
        # as it drops every other byte: a replacement of the same length copies the bytes once, where one
        # that deletes counts every match first (a record-states frame holds ~56 escaped quotes a record,
        # its state text's own: the deleting replace was a third of decoding one).
        data = data.replace(b"\\\\", b"  ").replace(b'\\"', b"  ")
    skeleton = data.translate(_DEPTH_TABLE, _DEPTH_DELETE)
    if b'"' in skeleton:
        # Dropping two adjacent quotes keeps every other character's inside/outside parity, and leaves
        # quotes only around strings that hold brackets; the even-numbered pieces are outside strings.
        skeleton = skeleton.replace(b'""', b"")
        if b'"' in skeleton:
            skeleton = b"".join(skeleton.split(b'"')[::2])
    # Peel the innermost pairs off, a level a pass (one replace scans once, so a pair it uncovers waits for
    # the next pass): balanced brackets are gone after exactly as many passes as they nest deep. A handful of
    # passes for any message, where summing the steps below costs an object per bracket.
    peeled = skeleton
    for _ in range(limit):
        shorter = peeled.replace(b"\x01\xff", b"")
        if len(shorter) == len(peeled):
            break  # unbalanced (or nothing left): measured below
        peeled = shorter
    if not peeled:
        return
    steps = array("b")
    steps.frombytes(skeleton)
    if max(accumulate(steps), default=0) > limit:
        raise _malformed(
            "frame", f"message is nested deeper than {limit} levels", reason="TOO_DEEP", limit=limit
        )


def _refuse_constant(name: str) -> Any:
    raise _malformed("frame", f"message is not valid JSON: {name} is not a JSON number", reason="NOT_FINITE")


# Longest integer literal read. Safe integers have at most 16 digits; longer literals up to this length are
# read so that the field (or the one operation) holding them is refused, and longer ones refuse the whole
# frame (decimal-to-int conversion is quadratic, so a frame full of huge literals would cost real time).
_MAX_INT_DIGITS: Final = 100


def _parse_int(literal: str) -> int:
    # Out-of-range integers inside an operation are left for decode_operation to refuse (one operation, not
    # the whole batch); only literals too long to convert cheaply are refused here.
    if len(literal) <= _MAX_INT_DIGITS:
        try:
            return int(literal)
        except ValueError:
            pass
    raise _malformed("frame", "message holds an integer literal that is too long", reason="NUMBER_TOO_LONG")


def _parse_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _malformed("frame", f"number {literal[:40]} is out of range", reason="NOT_FINITE")
    return value


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key[:64]
                raise _malformed(shown, f"duplicate key {shown!r} in a JSON object", reason="DUPLICATE_KEY")
            seen.add(key)
    return result


def _frame_text(frame: object, max_bytes: int) -> tuple[str, bytes]:
    """The frame as text and as UTF-8 bytes, after its size and encoding are checked."""
    if isinstance(frame, str):
        if len(frame) > max_bytes:  # its UTF-8 form is at least as long
            raise _too_large(len(frame), max_bytes)
        try:
            data = frame.encode("utf-8")
        except UnicodeEncodeError:
            raise _malformed("frame", "message text is not valid Unicode", reason="INVALID_UTF8") from None
        if len(data) > max_bytes:
            raise _too_large(len(data), max_bytes)
        return frame, data
    if isinstance(frame, (bytes, bytearray, memoryview)):
        data = bytes(frame)
        if len(data) > max_bytes:
            raise _too_large(len(data), max_bytes)
        try:
            return data.decode("utf-8"), data
        except UnicodeDecodeError:
            raise _malformed("frame", "message bytes are not valid UTF-8", reason="INVALID_UTF8") from None
    raise _malformed(
        "frame", f"a frame must be text or bytes, got {_type_name(frame)}", reason="INVALID_FRAME"
    )


def _too_large(size: int, limit: int) -> ProtocolError:
    return ProtocolError(
        MESSAGE_TOO_LARGE,
        f"message of {size} bytes exceeds the limit of {limit} bytes",
        field="frame",
        context={"limit": limit, "received": size},
    )


def decode(
    frame: str | bytes | bytearray | memoryview,
    *,
    max_bytes: int = MAX_MESSAGE_BYTES,
    max_batch: int = MAX_BATCH_OPERATIONS,
    max_depth: int = MAX_FRAME_DEPTH,
) -> Message:
    """Parse and validate one frame; raise ``ProtocolError`` (and nothing else) when it is not a message."""
    text, data = _frame_text(frame, max_bytes)
    _check_depth(data, max_depth)
    compact = _compact_batch(text, data, max_batch)
    if compact is not None:
        message = from_dict(compact[0], max_batch=max_batch)
        if isinstance(message, OperationBatch):
            return replace(message, operation_texts=compact[1])
        return message  # pragma: no cover - _compact_batch only accepts operation arrays
    try:
        obj = json.loads(
            text,
            object_pairs_hook=_object_pairs,
            parse_constant=_refuse_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
        )
    except ProtocolError:
        raise
    except json.JSONDecodeError as exc:
        raise _malformed(
            "frame", f"message is not valid JSON: {exc.msg} at position {exc.pos}", reason="INVALID_JSON"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise _malformed("frame", f"message is not valid JSON: {exc}", reason="INVALID_JSON") from None
    return from_dict(obj, max_batch=max_batch)


# Bytes of a frame with every digit made "0" and everything else a space: a run of zeros this long is an
# integer literal (or a string of digits) long enough to need the strict parser's refusal.
_DIGITS_ONLY: Final = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_DIGIT_RUN: Final = b"0" * (_MAX_INT_DIGITS + 1)
_OPERATIONS_TAIL: Final = ',"operations":['
# orjson, or None (the standard library alone); tests turn it off to compare the two paths.
_orjson: Any = ORJSON


def _compact_batch(text: str, data: bytes, max_batch: int) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    """The parsed frame and its operations' texts when ``text`` is exactly the compact encoding of a message
    whose last field is an ``operations`` array of objects (as ``encode_batch_frame`` writes it, which is how
    servers and clients send batches); otherwise None, and the strict parser decides.

    Equality with the re-encoding proves what the strict parser's hooks check one value at a time: no key
    is repeated (the parsed object would encode shorter), no number is non-finite; long digit runs are left
    to the strict parser. So a plain parser can be used, and the operations' texts come for free: the
    receiver stores them instead of encoding each operation again. orjson (when installed) parses and
    re-encodes first; a frame it does not give back exactly (a float it writes another way, an integer past
    64 bits it reads as a float) is tried again with the standard library, so the outcome is the same.
    """
    if _OPERATIONS_TAIL not in text:
        return None
    fast = _orjson
    if fast is not None:
        # No digit-run check first: orjson reads an integer literal past 64 bits as a float, which encodes
        # another way, so a frame it gives back exactly holds none longer than 20 digits.
        try:
            parsed = fast.loads(data)
        except ValueError:  # orjson.JSONDecodeError: the standard library may still read it
            parsed = None
        if parsed is not None:
            texts = _split_batch(parsed, max_batch, fast.dumps, data, _BYTES_PARTS)
            if texts is not None:
                return parsed, tuple([item.decode() for item in texts])
    if _LONG_DIGIT_RUN in data.translate(_DIGITS_ONLY):
        return None
    try:
        obj = json.loads(text, parse_constant=_refuse_constant)
    except (ProtocolError, ValueError, RecursionError):
        return None
    found = _split_batch(obj, max_batch, _encode_operation, text, _TEXT_PARTS)
    return None if found is None else (obj, tuple(found))


# How a batch frame ends with its operations: ',"operations":[', the separator between two operations, and
# the closing ']}'; as text and as UTF-8.
_TEXT_PARTS: Final = (_OPERATIONS_TAIL, ",", "]}")
_BYTES_PARTS: Final = (_OPERATIONS_TAIL.encode(), b",", b"]}")


def _split_batch(
    obj: Any,
    max_batch: int,
    encode: Callable[[Any], AnyStr],
    frame: AnyStr,
    parts: tuple[AnyStr, AnyStr, AnyStr],
) -> list[AnyStr] | None:
    """The encoded operations of parsed frame ``obj`` when ``frame`` is exactly its compact encoding with the
    operations last, else None."""
    if type(obj) is not dict or next(reversed(obj), None) != "operations":
        return None
    operations = obj["operations"]
    if type(operations) is not list or len(operations) > max_batch:
        return None
    head = dict(obj)
    del head["operations"]
    if not head:
        return None
    try:
        texts = [encode(item) for item in operations if type(item) is dict]
        if len(texts) != len(operations):
            return None
        expected = encode(head)
    except (TypeError, ValueError, RecursionError):  # orjson.JSONEncodeError is a TypeError
        return None
    tail, comma, close = parts
    if expected[:-1] + tail + comma.join(texts) + close != frame:
        return None
    return texts


def from_dict(obj: object, *, max_batch: int = MAX_BATCH_OPERATIONS) -> Message:
    """Validate an already-parsed JSON value as a message (``decode`` without the parsing)."""
    if not isinstance(obj, dict):
        raise _malformed(
            "frame", f"a message must be a JSON object, got {_type_name(obj)}", reason="NOT_OBJECT"
        )
    type_ = obj.get("type")
    if type_ is None:
        raise _malformed("type", "message field type is required", reason="MISSING")
    if not isinstance(type_, str):
        raise _malformed(
            "type", f"message field type must be a string, got {_type_name(type_)}", expected="string"
        )
    message_id = _id(obj, "messageId")
    parser = _PARSERS.get(type_)
    if parser is None:
        raise ProtocolError(
            UNKNOWN_MESSAGE_TYPE,
            f"unknown message type {type_[:64]!r}",
            field="type",
            context={"received": type_[:64], "messageId": message_id},
        )
    try:
        return parser(_Fields(obj, message_id, max_batch))
    except ProtocolError as exc:
        if exc.context is not None:
            exc.context.setdefault("messageId", message_id)
        raise


class _Fields:
    """Typed, validated access to one message object's fields."""

    __slots__ = ("max_batch", "message_id", "obj")

    def __init__(self, obj: dict[str, Any], message_id: str, max_batch: int) -> None:
        self.obj = obj
        self.message_id = message_id
        self.max_batch = max_batch

    def _get(self, name: str, required: bool) -> Any:
        value = self.obj.get(name)
        if value is None and required:
            raise _malformed(name, f"message field {name} is required", reason="MISSING")
        return value

    def get_int(self, name: str, *, minimum: int = 0, required: bool = True) -> Any:
        value = self._get(name, required)
        if value is None:
            return None
        if type(value) is not int:
            raise _wrong(name, value, "integer")
        if not minimum <= value <= MAX_SAFE_INTEGER:
            raise _malformed(
                name,
                f"message field {name} must be an integer from {minimum} to 2**53-1",
                expected=f"integer >= {minimum}",
                received=value if abs(value) < 10**20 else "out of range",
            )
        return value

    def get_bool(self, name: str) -> bool:
        value = self._get(name, True)
        if type(value) is not bool:
            raise _wrong(name, value, "boolean")
        return value

    def get_str(self, name: str, *, required: bool = True, non_empty: bool = False) -> Any:
        value = self._get(name, required)
        if value is None:
            return None
        if type(value) is not str:
            raise _wrong(name, value, "string")
        if non_empty and not value:
            raise _malformed(name, f"message field {name} must not be empty", expected="non-empty string")
        if not _is_utf8(value):
            raise _malformed(name, f"message field {name} is not valid Unicode", reason="INVALID_UTF8")
        return value

    def get_id(self, name: str) -> str:
        return _id(self.obj, name)

    def get_object(self, name: str, *, required: bool = True) -> Any:
        value = self._get(name, required)
        if value is None:
            return None
        if type(value) is not dict:
            raise _wrong(name, value, "object")
        return value

    def version_vector(self, name: str) -> dict[str, int]:
        value = self.get_object(name)
        for key, counter in value.items():
            path = f"{name}.{str(key)[:64]}"
            if type(key) is not str or not key or not _is_utf8(key):
                raise _malformed(
                    path, f"message field {name} has an invalid node id key", expected="non-empty string"
                )
            if type(counter) is not int:
                raise _wrong(path, counter, "integer")
            if not 0 <= counter <= MAX_SAFE_INTEGER:
                raise _malformed(
                    path,
                    f"message field {name} counters must be integers from 0 to 2**53-1",
                    expected="integer >= 0",
                )
        result: dict[str, int] = value
        return result

    def operations(self, name: str) -> tuple[dict[str, Any], ...]:
        value = self._get(name, True)
        if type(value) is not list:
            raise _wrong(name, value, "array")
        if len(value) > self.max_batch:
            raise ProtocolError(
                BATCH_TOO_LARGE,
                f"batch of {len(value)} operations exceeds the limit of {self.max_batch}",
                field=name,
                context={"limit": self.max_batch, "received": len(value)},
            )
        for index, item in enumerate(value):
            if type(item) is not dict:
                raise _wrong(f"{name}[{index}]", item, "object")
        return tuple(value)


def _wrong(name: str, value: object, expected: str) -> ProtocolError:
    received = _type_name(value)
    return _malformed(
        name,
        f"message field {name} must be a{'n' if expected[0] in 'aeiou' else ''} {expected}, got {received}",
        expected=expected,
        received=received,
    )


def _id(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if value is None:
        raise _malformed(name, f"message field {name} is required", reason="MISSING")
    if type(value) is not str:
        raise _wrong(name, value, "string")
    if not value or len(value) > MAX_ID_LENGTH or not _is_utf8(value):
        raise _malformed(
            name,
            f"message field {name} must be a non-empty string of at most {MAX_ID_LENGTH} characters",
            expected=f"non-empty string of at most {MAX_ID_LENGTH} characters",
            received=f"string of {len(value)} characters",
        )
    return value


def _handshake(f: _Fields) -> Handshake:
    return Handshake(
        message_id=f.message_id,
        node_id=f.get_id("nodeId"),
        version_vector=f.version_vector("versionVector"),
        schema_version=f.get_int("schemaVersion", minimum=1),
        last_delivery_sequence=f.get_int("lastDeliverySequence"),
        auth_token=f.get_str("authToken", required=False),
        sync_scope=f.get_object("syncScope", required=False),
        protocol_version=f.get_int("protocolVersion", minimum=1, required=False) or PROTOCOL_VERSION,
        initial_sync=f.get_str("initialSync", required=False),
    )


def _handshake_response(f: _Fields) -> HandshakeResponse:
    return HandshakeResponse(
        message_id=f.message_id,
        accepted=f.get_bool("accepted"),
        node_id=f.get_id("nodeId"),
        version_vector=f.version_vector("versionVector"),
        schema_version=f.get_int("schemaVersion", minimum=1),
        server_time=f.get_int("serverTime"),
        server_max_delivery_sequence=f.get_int("serverMaxDeliverySequence"),
        accepted_scope=f.get_object("acceptedScope", required=False),
        reject_reason=f.get_str("rejectReason", required=False),
        supported_schema_min=f.get_int("supportedSchemaMin", minimum=1, required=False),
        supported_schema_max=f.get_int("supportedSchemaMax", minimum=1, required=False),
        delivery_epoch=f.get_str("deliveryEpoch", required=False, non_empty=True),
    )


def _operation_batch(f: _Fields) -> OperationBatch:
    return OperationBatch(
        message_id=f.message_id,
        operations=f.operations("operations"),
        is_final=f.get_bool("isFinal"),
        batch_index=f.get_int("batchIndex"),
        base_delivery_sequence=f.get_int("baseDeliverySequence", required=False),
        max_delivery_sequence=f.get_int("maxDeliverySequence", required=False),
    )


def _operation(f: _Fields) -> OperationMessage:
    return OperationMessage(
        message_id=f.message_id,
        operation=f.get_object("operation"),
        delivery_sequence=f.get_int("deliverySequence", required=False),
    )


def _acknowledgment(f: _Fields) -> Acknowledgment:
    return Acknowledgment(
        message_id=f.message_id,
        acknowledged_message_id=f.get_id("acknowledgedMessageId"),
        last_sequence_number=f.get_int("lastSequenceNumber"),
        delivery_sequence=f.get_int("deliverySequence", required=False),
    )


def _operation_rejected(f: _Fields) -> OperationRejected:
    return OperationRejected(
        message_id=f.message_id,
        operation_id=f.get_str("operationId", non_empty=True),
        code=f.get_str("code", non_empty=True),
        message=f.get_str("message"),
        retriable=f.get_bool("retriable"),
        collection=f.get_str("collection", required=False),
        record_id=f.get_str("recordId", required=False),
    )


def _plain_state_entry(item: Any) -> bool:
    """A ``record-states`` entry that is well formed: non-empty string names and state, ``versions`` an object
    of non-empty ASCII node ids to integers from 0 to 2**53-1 (anything else goes through the checks that
    name what is wrong). Thousands of entries make a first sync: kept to plain loops."""
    if type(item) is not dict:
        return False
    collection, record_id, state, versions = (
        item.get("collection"),
        item.get("recordId"),
        item.get("state"),
        item.get("versions"),
    )
    if type(collection) is not str or type(record_id) is not str or type(state) is not str:
        return False
    if not collection or not record_id or not state or type(versions) is not dict:
        return False
    for key, counter in versions.items():
        if type(key) is not str or not key or not key.isascii() or type(counter) is not int:
            return False
        if not 0 <= counter <= MAX_SAFE_INTEGER:
            return False
    return True


def _record_states(f: _Fields) -> RecordStates:
    value = f._get("states", True)
    if type(value) is not list:
        raise _wrong("states", value, "array")
    if len(value) > f.max_batch:
        raise ProtocolError(
            BATCH_TOO_LARGE,
            f"{len(value)} record states exceed the batch limit of {f.max_batch}",
            field="states",
            context={"limit": f.max_batch, "received": len(value)},
        )
    for index, item in enumerate(value):
        if _plain_state_entry(item):
            continue  # (the usual entry, checked without building an error path for each field)
        path = f"states[{index}]"
        if type(item) is not dict:
            raise _wrong(path, item, "object")
        for name in ("collection", "recordId", "state"):
            if type(item.get(name)) is not str or not item[name]:
                raise _malformed(
                    f"{path}.{name}", f"{path}.{name} must be a non-empty string", expected="string"
                )
        versions = _Fields({"versions": item.get("versions")}, f.message_id, f.max_batch)
        versions.version_vector("versions")
    return RecordStates(
        message_id=f.message_id,
        states=tuple(value),
        is_final=f.get_bool("isFinal"),
        horizon=f.get_int("horizon", required=False),
        through=f.get_int("through", required=False),
    )


def _error(f: _Fields) -> ErrorMessage:
    return ErrorMessage(
        message_id=f.message_id,
        code=f.get_str("code", non_empty=True),
        message=f.get_str("message"),
        retriable=f.get_bool("retriable"),
    )


_PARSERS: Final[Mapping[str, Callable[[_Fields], Message]]] = {
    Handshake.TYPE: _handshake,
    HandshakeResponse.TYPE: _handshake_response,
    OperationBatch.TYPE: _operation_batch,
    OperationMessage.TYPE: _operation,
    Acknowledgment.TYPE: _acknowledgment,
    OperationRejected.TYPE: _operation_rejected,
    RecordStates.TYPE: _record_states,
    ErrorMessage.TYPE: _error,
}


# -------------------------------------------------------------------------------------------- operations


def _make_operation_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)``, built once.

    The circular check is left out: ``_walk_operation`` has bounded the value first (a cycle exceeds it).
    """
    public = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
    sample = {"b": [1, 2.5, None, True, False, "\u00e9\n\x01\u2028"], "a": {"z": -3, 1: "k"}}
    return c_compact_encoder(json.JSONEncoder().default, public, sample, allow_nan=False)


_encode_operation: Final = _make_operation_encoder()


def _walk_operation(raw: Mapping[str, Any], max_depth: int, budget: int) -> None:
    """Iteratively bound ``raw``'s nesting and size (so ``json.dumps`` cannot recurse too deep)."""
    stack: list[tuple[Any, int]] = [(raw, 1)]
    visited = 0
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            raise ProtocolError(
                INVALID_OPERATION,
                f"operation is nested deeper than {max_depth} levels",
                field="data",
                context={"reason": "TOO_DEEP", "limit": max_depth},
            )
        children = value.values() if type(value) is dict or isinstance(value, Mapping) else value
        visited += len(children)  # every value takes at least one byte of JSON
        for child in children:
            # Exact JSON types first: the abstract-class checks cost more than the whole walk otherwise.
            kind = type(child)
            if (
                kind is dict
                or kind is list
                or (kind not in _JSON_SCALARS and isinstance(child, (Mapping, list, tuple)))
            ):
                stack.append((child, depth + 1))
        if visited > budget:
            raise _operation_too_large(visited, budget)


_JSON_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def _operation_too_large(size: int, limit: int, **context: Any) -> ProtocolError:
    return ProtocolError(
        OPERATION_TOO_LARGE,
        f"operation of {size}+ bytes exceeds the limit of {limit} bytes",
        field="operation",
        context={"limit": limit, "received": size, **context},
    )


def decode_operation(raw: Mapping[str, Any], *, max_bytes: int = MAX_OPERATION_BYTES) -> Operation:
    """Validate one raw wire operation (from a batch or operation message) and verify its id.

    Raises ``ProtocolError`` only: ``OPERATION_TOO_LARGE`` when its compact JSON exceeds ``max_bytes``,
    ``HASH_MISMATCH`` when its id is not its content hash, else ``INVALID_OPERATION`` naming the field.
    ``context["operationId"]`` holds the operation's claimed id when it has one (for ``operation-rejected``).
    """
    return decode_operation_text(raw, max_bytes=max_bytes)[0]


def decode_operation_text(
    raw: Mapping[str, Any], *, max_bytes: int = MAX_OPERATION_BYTES, text: str | None = None
) -> tuple[Operation, str]:
    """``decode_operation``, plus the operation's compact JSON text (the size check computes it anyway).

    The text reads back (``Operation.from_wire(json.loads(text))``) as the same operation, so a receiver
    can store it instead of encoding the operation again. Pass ``text`` only as ``decode`` gave it
    (``OperationBatch.operation_texts``): ``raw``'s compact encoding, whose frame was depth-checked whole.
    """
    # A decoded frame's operation is a dict: checked without the Mapping ABC's instance check (a Python call).
    if type(raw) is not dict and not isinstance(raw, Mapping):
        raise ProtocolError(
            INVALID_OPERATION,
            f"an operation must be a JSON object, got {_type_name(raw)}",
            field="operation",
            context={"expected": "object", "received": _type_name(raw)},
        )
    claimed = raw.get("id")
    ids: dict[str, Any] = {"operationId": claimed} if isinstance(claimed, str) and claimed else {}
    try:
        if text is None:
            # Data may nest MAX_DEPTH levels below the operation object; from_wire enforces the exact limit.
            # (A frame's depth check bounds its operations to that too: a known text skips this walk.)
            _walk_operation(raw, MAX_DEPTH + 1, max_bytes)
            try:
                text = _encode_operation(raw)
            except (TypeError, ValueError) as exc:
                raise ProtocolError(
                    INVALID_OPERATION,
                    f"operation is not JSON-serializable: {exc}",
                    field="operation",
                    context={"reason": "NOT_JSON"},
                ) from None
        try:
            size = len(text) if text.isascii() else len(text.encode("utf-8"))
        except UnicodeEncodeError:
            size = len(text.encode("utf-8", "surrogatepass"))  # from_wire names the bad string below
        if size > max_bytes:
            raise _operation_too_large(size, max_bytes)
        try:
            op = Operation.from_wire(raw, verify=True)
            if plain_wire_keys(raw):
                keep_received_text(op, text)  # nothing but the operation's own fields: store and relay it
            return op, text
        except OfflineError as exc:
            context = dict(exc.context or {})
            context.setdefault("field", "operation")
            code = HASH_MISMATCH if context.get("reason") == HASH_MISMATCH else INVALID_OPERATION
            raise ProtocolError(code, exc.message, False, context=context) from None
    except ProtocolError as exc:
        if exc.context is not None:
            exc.context.update(ids)
        raise
    except Exception as exc:  # defensive: the contract is "ProtocolError or a valid operation"
        raise ProtocolError(
            INVALID_OPERATION,
            f"operation is invalid: {type(exc).__name__}: {exc}",
            field="operation",
            context={"reason": "UNEXPECTED", **ids},
        ) from None
