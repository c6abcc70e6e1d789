"""The local store: SQLite tables, the operation log, collections, queries, subscriptions, `op` helpers."""

from .app import App, create_app
from .collection import Collection, Query, RichTextHandle
from .events import EVENT_TYPES, EventBus, OfflineEvent
from .live_results import QueryChanges
from .ops import AtomicOp, op

__all__ = [
    "EVENT_TYPES",
    "App",
    "AtomicOp",
    "Collection",
    "EventBus",
    "OfflineEvent",
    "Query",
    "QueryChanges",
    "RichTextHandle",
    "create_app",
    "op",
]
