"""The event bus of an app: every SPEC 6.1 event type, delivered synchronously.

Handlers run before the write or `apply()` that caused the event returns (DESIGN.md section 2), so a test
or a devtool sees events in the order things happened. A failing handler is logged, never propagated: an
observer must not be able to break a write that is already durable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from offline.core.errors import OfflineError

log = logging.getLogger("offline.events")

#: Event type -> the payload fields SPEC 6.1 promises.
EVENT_TYPES: Final[dict[str, tuple[str, ...]]] = {
    "operation:created": ("operation",),
    "operation:applied": ("operation", "duration"),
    "merge:started": ("operationA", "operationB"),
    "merge:completed": ("trace",),
    "merge:conflict": ("trace",),
    "constraint:violated": ("constraint", "trace"),
    "sync:connected": ("nodeId",),
    "sync:disconnected": ("reason",),
    "sync:sent": ("operations", "batchSize"),
    "sync:received": ("operations", "batchSize"),
    "sync:acknowledged": ("sequenceNumber",),
    "sync:rejected": (
        "operation",
        "operationId",
        "collection",
        "recordId",
        "code",
        "message",
        "data",
        "rejectedAt",
    ),
    # A received operation this replica cannot store: not acknowledged, received again next session.
    "sync:apply-failed": ("operationId", "collection", "recordId", "code", "message"),
    # The server sent record states instead of compacted operations (offline.store.compaction.adopt_states):
    # ``records`` lists {collection, recordId} of each record whose state was replaced.
    "sync:states": ("records",),
    "query:subscribed": ("queryId", "collection"),
    "query:invalidated": ("queryId", "trigger"),
    "query:executed": ("queryId", "duration", "resultCount"),
    "connection:quality": ("quality",),
}

ALL: Final = "*"


@dataclass(frozen=True, slots=True)
class OfflineEvent:
    """One event: `type` plus the payload fields of its type (readable as attributes or items)."""

    type: str
    payload: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        if key == "type":
            return self.type
        return self.payload[key]

    def __getattr__(self, key: str) -> Any:
        try:
            return self.payload[key]
        except KeyError:
            raise AttributeError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        return self.payload.get(key, default)


Handler = Callable[[OfflineEvent], Any]


class EventBus:
    def __init__(self) -> None:
        self._handlers: dict[str, list[Handler]] = {}

    def on(self, event_type: str, handler: Handler) -> Callable[[], None]:
        """Call ``handler(event)`` for every event of ``event_type`` ('*' for all). Returns an unsubscribe."""
        if event_type != ALL and event_type not in EVENT_TYPES:
            raise OfflineError(
                f"unknown event type {event_type!r}; expected one of {', '.join(EVENT_TYPES)} or '*'",
                "INVALID_OPERATION",
                {"field": "event_type", "received": event_type},
            )
        self._handlers.setdefault(event_type, []).append(handler)

        def off() -> None:
            handlers = self._handlers.get(event_type, [])
            if handler in handlers:
                handlers.remove(handler)

        return off

    def off(self, event_type: str, handler: Handler) -> None:
        handlers = self._handlers.get(event_type, [])
        if handler in handlers:
            handlers.remove(handler)

    def has_listeners(self, event_type: str) -> bool:
        return bool(self._handlers.get(event_type) or self._handlers.get(ALL))

    def emit(self, event_type: str, **payload: Any) -> None:
        expected = EVENT_TYPES[event_type]
        missing = [name for name in expected if name not in payload]
        if missing:  # a programming error inside the framework, not a user mistake
            raise AssertionError(f"event {event_type} emitted without {missing}")
        handlers = [*self._handlers.get(event_type, ()), *self._handlers.get(ALL, ())]
        if not handlers:
            return
        event = OfflineEvent(event_type, payload)
        for handler in handlers:
            try:
                handler(event)
            except Exception:
                log.exception("event handler for %s failed", event_type)
