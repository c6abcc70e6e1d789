"""Live queries: a subscription is re-run after each commit that touches its collection and its callback
is called when (and only when) the results changed."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from offline.core.operations import Operation

    from .app import App
    from .collection import Query

log = logging.getLogger("offline.store")
_ids = itertools.count(1)


@dataclass(slots=True)
class Subscription:
    id: str
    query: Query
    callback: Callable[[list[dict[str, Any]]], Any]
    last: list[dict[str, Any]] = field(default_factory=list)
    active: bool = True


class SubscriptionRegistry:
    def __init__(self, app: App) -> None:
        self.app = app
        self._by_collection: dict[str, list[Subscription]] = {}
        # Called with (collection, record ids) when records change with no operation saying so (records
        # forgotten as they leave the sync scope): views that follow records one by one, like the browser
        # worker's live queries, hear of those here (commits and received operations name their records).
        self.change_listeners: list[Callable[[str, list[str]], None]] = []

    def add(self, query: Query, callback: Callable[[list[dict[str, Any]]], Any]) -> Callable[[], None]:
        sub = Subscription(f"q{next(_ids)}", query, callback)
        collection = query.collection.name
        self._by_collection.setdefault(collection, []).append(sub)
        events = self.app.events
        if events.has_listeners("query:subscribed"):
            events.emit("query:subscribed", queryId=sub.id, collection=collection)
        sub.last = self._run(sub)
        self._call(sub)

        def unsubscribe() -> None:
            sub.active = False
            subs = self._by_collection.get(collection, [])
            if sub in subs:
                subs.remove(sub)

        return unsubscribe

    def _run(self, sub: Subscription) -> list[dict[str, Any]]:
        started = time.perf_counter()
        results = sub.query.fetch()
        events = self.app.events
        if events.has_listeners("query:executed"):
            events.emit(
                "query:executed",
                queryId=sub.id,
                duration=(time.perf_counter() - started) * 1000,
                resultCount=len(results),
            )
        return results

    def _call(self, sub: Subscription) -> None:
        try:
            sub.callback(list(sub.last))
        except Exception:
            # A broken subscriber must not undo or block a write that is already committed.
            log.exception("subscription callback %s failed", sub.id)

    def watching(self, collections: Iterable[str]) -> bool:
        return any(self._by_collection.get(c) for c in collections)

    def notify(self, collections: Iterable[str], trigger: Operation | None) -> None:
        events = self.app.events
        for collection in collections:
            for sub in list(self._by_collection.get(collection, ())):
                if not sub.active:
                    continue
                if trigger is not None and events.has_listeners("query:invalidated"):
                    events.emit("query:invalidated", queryId=sub.id, trigger=trigger)
                results = self._run(sub)
                if results != sub.last:
                    sub.last = results
                    self._call(sub)

    def clear(self) -> None:
        for subs in self._by_collection.values():
            for sub in subs:
                sub.active = False
        self._by_collection.clear()
