"""Live queries: after each commit that touches its collection a subscription's results are brought up to
date from the records the commit changed (see `live_results`), and its callback is called when (and only
when) they changed: with the whole list (`Query.subscribe`) or with what changed (`Query.subscribe_changes`)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .live_results import LiveResults, QueryChanges

if TYPE_CHECKING:
    from offline.core.operations import Operation

    from .app import App
    from .collection import Query

log = logging.getLogger("offline.store")
_ids = itertools.count(1)


@dataclass(slots=True)
class Subscription:
    id: str
    results: LiveResults
    callback: Callable[[Any], Any]
    wants_changes: bool  # called with a QueryChanges, else with the list of records
    active: bool = True
    # Records changed since this subscription's last refresh (None: unknown, run the query again). A
    # callback that writes starts a refresh of every subscription before the rest heard of the change before
    # it: each refresh takes all that is pending, so no subscription reads a mix of old and new.
    pending: set[str] | None = field(default_factory=set)


class SubscriptionRegistry:
    def __init__(self, app: App) -> None:
        self.app = app
        self._by_collection: dict[str, list[Subscription]] = {}
        # Called with (collection, record ids) when records change with no operation saying so (records
        # forgotten as they leave the sync scope): views that follow records one by one, like the browser
        # worker's live queries, hear of those here (commits and received operations name their records).
        self.change_listeners: list[Callable[[str, list[str]], None]] = []

    def add(
        self, query: Query, callback: Callable[[Any], Any], *, changes: bool = False
    ) -> Callable[[], None]:
        """Subscribe ``callback`` to ``query``: called now, then after every commit that changes the
        results; with a `QueryChanges` when ``changes``, else with the list of records."""
        sub = Subscription(f"q{next(_ids)}", LiveResults(query), callback, changes)
        collection = query.collection.name
        self._by_collection.setdefault(collection, []).append(sub)
        events = self.app.events
        if events.has_listeners("query:subscribed"):
            events.emit("query:subscribed", queryId=sub.id, collection=collection)
        started = time.perf_counter()
        first = sub.results.reset()
        self._executed(sub, started)
        self._call(sub, first)

        def unsubscribe() -> None:
            sub.active = False
            subs = self._by_collection.get(collection, [])
            if sub in subs:
                subs.remove(sub)

        return unsubscribe

    def _executed(self, sub: Subscription, started: float) -> None:
        events = self.app.events
        if events.has_listeners("query:executed"):
            events.emit(
                "query:executed",
                queryId=sub.id,
                duration=(time.perf_counter() - started) * 1000,
                resultCount=len(sub.results.rows),
            )

    def _call(self, sub: Subscription, changes: QueryChanges) -> None:
        try:
            sub.callback(changes if sub.wants_changes else list(sub.results.rows))
        except Exception:
            # A broken subscriber must not undo or block a write that is already committed.
            log.exception("subscription callback %s failed", sub.id)

    def watching(self, collections: Iterable[str]) -> bool:
        return any(self._by_collection.get(c) for c in collections)

    def notify(
        self,
        collections: Iterable[str],
        trigger: Operation | None,
        *,
        record_ids: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        """Refresh the subscriptions to ``collections`` after a commit. ``record_ids``: per collection, the
        ids of every record whose row may have changed; a collection it does not name runs its queries
        again."""
        events = self.app.events
        due: list[Subscription] = []
        for collection in collections:
            touched = None if record_ids is None else record_ids.get(collection)
            for sub in self._by_collection.get(collection, ()):
                if touched is None:
                    sub.pending = None
                elif sub.pending is not None:
                    sub.pending.update(touched)
                due.append(sub)
        for sub in due:
            if not sub.active:
                continue
            if trigger is not None and events.has_listeners("query:invalidated"):
                events.emit("query:invalidated", queryId=sub.id, trigger=trigger)
            pending, sub.pending = sub.pending, set()
            if pending is not None and not pending:
                continue  # a write made by a callback refreshed it already
            started = time.perf_counter()
            changes = sub.results.refresh(pending)
            self._executed(sub, started)
            if changes is not None:
                self._call(sub, changes)

    def clear(self) -> None:
        for subs in self._by_collection.values():
            for sub in subs:
                sub.active = False
        self._by_collection.clear()


def records_of(ops: Iterable[Operation]) -> dict[str, set[str]]:
    """Per collection, the ids of the records ``ops`` wrote."""
    return records_of_keys((op.collection, op.record_id) for op in ops)


def records_of_keys(keys: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    """Per collection, the ids of the records ``keys`` (collection, record id) name."""
    out: dict[str, set[str]] = {}
    for collection, record_id in keys:
        out.setdefault(collection, set()).add(record_id)
    return out
