"""The Python side of the browser client: the app running in a Web Worker, driven by messages.

A page cannot call Python directly: it posts JSON text to a worker running Pyodide, which hands each message
to `WorkerBridge.handle_now` (served at once) or, for requests that wait on the network, `WorkerBridge.handle`.
The bridge calls the same `create_app` collections (and the project's own Python functions) a desktop client
would, replies with JSON, and pushes live query results, sync status and warnings to the page unasked. The
worker's JavaScript owns what Python cannot reach: the browser's persistent storage. ``persist()`` (an async
function from JavaScript) saves the database file there; a write's reply is posted only once it is saved,
so a write the page sees acknowledged survives a reload.

Message shapes (all JSON text):

- page -> worker: ``{"id": 7, "method": "insert", "collection": "todos", "data": {...}}`` (``id`` names the
  request; a record's id is ``recordId``); methods are listed in `WorkerBridge.METHODS`.
- worker -> page: ``{"type": "reply", "id": 7, "ok": true, "result": ...}`` or ``"ok": false`` with
  ``"error": {"code", "message", "context"}``; a live query's results, whole on subscribing
  (``{"type": "snapshot", "sub": 3, "records": [...]}``, replacing what the page holds; a large one comes
  in parts, each but the last with ``"more": true``, to be put together in order) and then as changes
  (``{"type": "changes", "sub": 3, "inserted": [records], "updated": [records], "removed": [ids]}``: the
  page keeps the results in the query's order itself);
  ``{"type": "status", "status": "connected", "pending": 0, "error": null, "rejected": 0, "clockOffsetMs": 0,
  "applyError": null, "received": 120, "serverTotal": 120}`` (``received`` of ``serverTotal``: the server's
  log, in delivery sequences, as far as this device has it); ``{"type": "log", ...}``;
  ``{"type": "ready", ...}`` once, after `start`.
- WebAuthn, which a worker lacks (no ``navigator.credentials``), runs on the page: once ready, the page
  reports ``{"method": "pageInfo", "webauthn": true}``; a passkey ceremony then posts
  ``{"type": "webauthn", "id": 2, "op": "create" | "get", "options": {...}}`` (WebAuthn's JSON forms) and the
  page answers ``{"method": "webauthnResult", "ceremony": 2, "ok": true, "credential": {...}}`` or ``"ok":
  false`` with ``"error": {"name", "message"}`` (see `WorkerBridge.webauthn`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import logging
import os
import sqlite3
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from offline.core.errors import INVALID_OPERATION, STORAGE_ERROR, OfflineError
from offline.core.json_text import c_compact_encoder
from offline.core.operations import Operation
from offline.core.schema import SchemaDefinition
from offline.platform import IS_BROWSER, page_webauthn, set_page_webauthn, unavailable_fields
from offline.store import App, create_app, op
from offline.store.collection import Query
from offline.store.database import is_damaged
from offline.store.live_results import LiveResults
from offline.store.ops import AtomicOp
from offline.store.replication import pending_count

Post = Callable[[str], Any]
Persist = Callable[[], Awaitable[Any]]

#: Records per read when a live query's whole results are sent (see `WorkerBridge._send_snapshot`).
SNAPSHOT_PAGE = 2000

#: Bumped when the message shapes change incompatibly (the page checks it in the ready message).
PROTOCOL_VERSION = 3

# `{"$op": "increment", "value": 2}` in update changes stands for op.increment(2): JSON cannot carry the
# Python objects. No field type holds a JSON object, so such a dict is never a plain value.
_ATOMIC: dict[str, Callable[..., AtomicOp]] = {
    "increment": op.increment,
    "decrement": op.decrement,
    "max": op.max,
    "min": op.min,
    "append": op.append,
    "remove": op.remove,
}


def _bad(message: str, **context: Any) -> OfflineError:
    return OfflineError(message, INVALID_OPERATION, context)


def _error_json(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, OfflineError):
        return {"code": exc.code, "message": exc.message, "context": exc.context or {}}
    return {"code": "INTERNAL_ERROR", "message": f"{type(exc).__name__}: {exc}", "context": {}}


def _ceremony_error(name: str, message: str) -> dict[str, Any]:
    """A failed WebAuthn ceremony's answer, as the page gives one (the DOMException's name and message)."""
    return {"ok": False, "error": {"name": name, "message": message}}


def _pages(records: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(records), size):
        yield records[start : start + size]


def _dumps(value: Any) -> str:
    # Records hold JSON values already; `default=str` only guards against an app function's odd result.
    return json.dumps(value, separators=(",", ":"), default=str)


# The text of a record a live query sends (`_dumps`'s, its C encoder built once): ``json.dumps`` with these
# options builds an encoder on each call, ~5 us a record in the browser's worker, where a first sync sends
# every record it stores this way (~1.6 us). Records are rows the codec decoded, trees of JSON values: the
# cycle check it leaves out has nothing to find.
_record_text = c_compact_encoder(
    str, _dumps, {"a": [1, 2.5, None, True, "\u00e9\n\u2028"], "b": {"c": -3}}, ensure_ascii=True
)


class _Refused(Exception):
    """A request refused before it started, with the id to answer it under."""

    def __init__(self, request_id: Any, error: OfflineError) -> None:
        super().__init__(error.message)
        self.request_id = request_id
        self.error = error


class _Forward(logging.Handler):
    """Sends the library's warnings to the page: a skipped remote operation must not go unnoticed."""

    def __init__(self, bridge: WorkerBridge) -> None:
        super().__init__(logging.WARNING)
        self.bridge = bridge

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.bridge.post(
                {"type": "log", "level": record.levelname.lower(), "message": record.getMessage()}
            )


@dataclass(slots=True)
class _LiveQuery:
    """A page's live query and what the page holds of its results.

    A commit is answered from the records it touched alone (`Query.among`): the query is not run again, and
    its cost does not grow with the collection. Only a record whose text changed is sent as updated (a
    received operation that lost to a newer write touches its record and leaves it as it was). Without a
    limit the results may be large, so only each record's id and the hash of its text are kept. With a
    limit, `LiveResults` keeps the (bounded) window and puts touched records in place: a record can push
    another in or out, and the query runs again only when the window lost records the rest must refill.
    """

    query: Query
    collection: str
    # Without a limit: the ids of the records the page holds, each to the hash of its text.
    ids: dict[str, int] = field(default_factory=dict)
    window: LiveResults | None = None  # with a limit


class WorkerBridge:
    """Serves one page's requests against one `App` (see the module docstring for the messages)."""

    METHODS = frozenset(
        {
            "insert",
            "insertMany",
            "update",
            "delete",
            "richtext",
            "findById",
            "fetch",
            "count",
            "subscribe",
            "unsubscribe",
            "call",
            "status",
            "rejected",
            "retry",
            "discard",
            "connect",
            "disconnect",
            "network",
            "persist",
            "pageInfo",
            "webauthnResult",
        }
    )
    # Methods that may write: the bridge persists the database before replying to them.
    WRITES = frozenset(
        {"insert", "insertMany", "update", "delete", "richtext", "call", "persist", "retry", "discard"}
    )
    # Methods that wait for something (the network, storage): served by `handle` on the event loop.
    ASYNC_METHODS = frozenset({"connect", "disconnect", "network", "persist"})

    def __init__(
        self,
        app: App,
        *,
        post: Post,
        persist: Persist | None = None,
        actions: ModuleType | None = None,
        status_interval: float = 0.25,
        relay_webauthn: bool = IS_BROWSER,
    ) -> None:
        self.app = app
        self._post = post
        self._persist = persist
        self.actions = actions
        self.status_interval = status_interval
        # Passkeys from Python: WebAuthn ceremonies relayed to the page (``relay_webauthn``: when the page
        # reports WebAuthn support, `offline.auth.is_passkey_supported()` becomes True and the ceremonies go
        # through `webauthn`; only in the browser's worker by default, natively Python has no WebAuthn).
        self.relay_webauthn = relay_webauthn
        self._ceremonies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_ceremony = 0
        # Live queries are re-run once per event-loop turn after the commits that touched their collection,
        # not once per write as `Query.subscribe` does: a burst of writes (1,000 inserts sent at once, a
        # batch received from the server) then costs one query and one message per subscription.
        self._live: dict[int, _LiveQuery] = {}
        # Per collection, the ids of the records changed since the last refresh.
        self._stale: dict[str, set[str]] = {}
        self._refresh_scheduled = False
        app.commit_listeners.append(self._on_commit)
        app.subscriptions.change_listeners.append(self._on_records_changed)
        # Unsubscribe handles of the app events this bridge listens to (see `detach`).
        self._event_offs = [
            app.events.on("sync:received", lambda event: self._mark(event["operations"])),
            # A refused operation is taken out of its record, which may change or disappear.
            app.events.on("sync:rejected", lambda event: self._mark([event["operation"]])),
        ]
        self._persisted_changes = -1
        self._last_status: dict[str, Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._log_handler = _Forward(self)
        self._sync_wanted = False  # started, and not paused by the page (see network_changed)

    # -- outgoing -------------------------------------------------------------------------------------------

    def post(self, message: Mapping[str, Any]) -> None:
        self._post(_dumps(message))

    def ready_message(self) -> dict[str, Any]:
        schema = self.app.schema
        return {
            "type": "ready",
            "protocol": PROTOCOL_VERSION,
            "nodeId": self.app.node_id,
            "schemaVersion": schema.version,
            "collections": {
                name: {"fields": {field: d.type for field, d in coll.fields.items()}}
                for name, coll in schema.collections.items()
            },
            "unavailable": [f.to_json() for f in unavailable_fields(schema)],
            "actions": self.action_names(),
            "sync": getattr(self.app.sync, "url", None),
            "runtime": {
                "python": sys.version.split()[0],
                "sqlite": sqlite3.sqlite_version,
                "platform": sys.platform,
            },
        }

    def status_message(self) -> dict[str, Any]:
        sync = self.app.sync
        error = getattr(sync, "last_error", None)
        message: dict[str, Any] = {
            "type": "status",
            "status": sync.status,
            "pending": pending_count(self.app),
            "error": _error_json(error) if error is not None else None,
        }
        describe = getattr(sync, "describe", None)
        if describe is not None:  # refusals kept, the clock's offset, a received operation not applied,
            described = describe()  # how much of the server's log arrived (a first sync's progress)
            for key in ("rejected", "clockOffsetMs", "applyError", "received", "serverTotal"):
                message[key] = described[key]
        return message

    def publish_status(self, *, force: bool = False) -> None:
        if self.app._closed:
            return
        message = self.status_message()
        if force or message != self._last_status:
            self._last_status = message
            self.post(message)

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self, *, connect: bool = True) -> None:
        """Announce readiness, persist the freshly opened database, start syncing and watching status."""
        logging.getLogger("offline").addHandler(self._log_handler)
        await self.persist_now(force=True)
        self.post(self.ready_message())
        events = self.app.events
        for event in (
            "sync:connected",
            "sync:disconnected",
            "sync:received",
            "sync:states",  # (a state-based first sync: its progress, and its records to store)
            "sync:acknowledged",
            "sync:rejected",
            "sync:apply-failed",
        ):
            self._event_offs.append(events.on(event, lambda _event: self._changed()))
        self._sync_wanted = connect
        if connect and hasattr(self.app.sync, "url"):
            await self.app.sync.connect(wait=False)
        self.publish_status(force=True)
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    def detach(self) -> None:
        """Stop serving this page and leave the app open (the desktop shell's page reloaded or navigated).

        The app outlives its pages there: a new page gets a new bridge over the same app, and the old one
        must stop hearing commits and events, or it would keep posting to a page that is gone.
        """
        logging.getLogger("offline").removeHandler(self._log_handler)
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
        for off in self._event_offs:
            off()
        self._event_offs.clear()
        if self._on_commit in self.app.commit_listeners:
            self.app.commit_listeners.remove(self._on_commit)
        if self._on_records_changed in self.app.subscriptions.change_listeners:
            self.app.subscriptions.change_listeners.remove(self._on_records_changed)
        self._live.clear()
        self._end_webauthn()

    async def stop(self) -> None:
        watcher = self._watcher
        self.detach()
        if watcher is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        with contextlib.suppress(Exception):
            await self.app.sync.disconnect()
        await self.persist_now()
        self.app.close()

    async def network_changed(self, online: bool) -> None:
        """The browser's ``online``/``offline`` events: start a fresh session at once.

        Going offline does not close an open WebSocket (frames just stop moving, and a page has no ping to
        notice), and coming back online would otherwise wait out the engine's backoff. A restart fixes
        both: offline, the new attempt fails and the status says so; online, it reconnects now. The event
        is only a hint (a server on localhost still answers when the browser thinks it is offline), so
        nothing is refused because of it.
        """
        sync = self.app.sync
        if not self._sync_wanted or not hasattr(sync, "url") or self.app._closed:
            return
        if sync.status == "error":  # refused for good (authentication, schema): a retry cannot help
            return
        await sync.disconnect()
        await sync.connect(wait=False)
        self.publish_status()

    def _changed(self) -> None:
        # Called from sync events (inside the engine's task): report and persist soon, not in the handler.
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.publish_status()
        if self._needs_persist():
            asyncio.get_running_loop().create_task(self._persist_in_background())

    async def _persist_in_background(self) -> None:
        try:
            await self.persist_now()
        except OfflineError as exc:  # nobody awaits this: tell the page
            self.post({"type": "log", "level": "error", "message": exc.message, "code": exc.code})

    async def _watch(self) -> None:
        # Status changes that raise no event (connecting, offline, retry backoff) and background writes
        # (acknowledgements, received operations) are picked up here.
        while not self.app._closed:
            await asyncio.sleep(self.status_interval)
            self._tick()

    # -- persistence ----------------------------------------------------------------------------------------

    def _needs_persist(self) -> bool:
        return self._persist is not None and self.app.db.conn.total_changes != self._persisted_changes

    async def persist_now(self, *, force: bool = False) -> None:
        """Copy the database to persistent browser storage when it changed (``force``: always)."""
        if self._persist is None or self.app._closed:
            return
        changes = self.app.db.conn.total_changes
        if not force and changes == self._persisted_changes:
            return
        self._persisted_changes = changes
        try:
            await self._persist()
        except Exception as exc:
            self._persisted_changes = -1  # try again on the next change or tick
            raise self._storage_error(str(exc)) from exc

    # -- requests -------------------------------------------------------------------------------------------

    def _parse(self, text: str) -> tuple[Any, str, dict[str, Any]]:
        try:
            request = json.loads(text)
        except ValueError as exc:
            raise _bad(f"a request must be JSON text: {exc}") from None
        if not isinstance(request, dict):
            raise _bad("a request must be a JSON object")
        method = request.get("method")
        if method not in self.METHODS:
            raise _Refused(
                request.get("id"),
                _bad(
                    f"unknown method {method!r}; use one of {', '.join(sorted(self.METHODS))}",
                    method=str(method),
                ),
            )
        return request.get("id"), str(method), request

    def _needs_loop(self, method: str, request: Mapping[str, Any]) -> bool:
        if method in self.ASYNC_METHODS:
            return True
        if method == "call" and self.actions is not None:
            function = getattr(self.actions, str(request.get("name")), None)
            return inspect.iscoroutinefunction(function)
        return False

    @staticmethod
    def _reply(request_id: Any, result: Any) -> str:
        return _dumps({"type": "reply", "id": request_id, "ok": True, "result": result})

    @staticmethod
    def _error_reply(request_id: Any, exc: BaseException) -> str:
        return _dumps({"type": "reply", "id": request_id, "ok": False, "error": _error_json(exc)})

    def handle_now(self, text: str) -> tuple[bool, str] | None:
        """Serve a request at once, without the event loop: ``(persist first, reply text)``, or None when
        the request has to wait for something (it then goes through `handle`).

        The worker's JavaScript calls this first: a write then costs the write, the live queries' update
        and one save to storage, with no timer hops in between. When ``persist first`` is true, the reply
        may be posted only once the database is stored (else `storage_failure` gives the reply to post).
        """
        request_id: Any = None
        try:
            request_id, method, request = self._parse(text)
            if self._needs_loop(method, request):
                return None
            result = getattr(self, f"_do_{method}")(request)
        except _Refused as refused:
            return False, self._error_reply(refused.request_id, refused.error)
        except Exception as exc:
            return False, self._error_reply(request_id, exc)
        return method in self.WRITES and self.take_persist(), self._reply(request_id, result)

    def serve_now(self, text: str) -> str | None:
        """`handle_now` for a caller that wraps the request in its own transaction (another tab's write,
        `offline.worker_tabs`): the reply text, or None when the request waits on the loop; a request the
        bridge refuses or that fails raises (so the caller's transaction rolls back), and nothing counts as
        saved (the caller asks `take_persist` once its transaction committed)."""
        request_id, method, request = self._parse(text)
        if self._needs_loop(method, request):
            return None
        return self._reply(request_id, getattr(self, f"_do_{method}")(request))

    def refusal_reply(self, text: str, exc: BaseException) -> str:
        """The error reply to the request ``text`` for ``exc`` raised by `serve_now`."""
        if isinstance(exc, _Refused):
            return self._error_reply(exc.request_id, exc.error)
        try:
            request = json.loads(text)
        except ValueError:
            request = None
        return self._error_reply(request.get("id") if isinstance(request, dict) else None, exc)

    async def handle(self, text: str) -> None:
        """Serve one request (JSON text) and post its reply, persisting the database first after writes."""
        self._post(await self.serve(text))

    async def serve(self, text: str, *, before_save: Callable[[str], None] | None = None) -> str:
        """`handle` without the posting: the reply text. ``before_save`` (another tab's request, see
        `offline.worker_tabs`) is given the reply of a request that waited on the loop once it ran, before
        the save that stores its writes, so that it goes into the same save."""
        served = self.handle_now(text)
        if served is not None:
            return await self.settle(served)
        request_id: Any = None
        try:
            request_id, method, request = self._parse(text)
            try:
                result = await getattr(self, "_do_call_async" if method == "call" else f"_do_{method}")(
                    request
                )
                reply = self._reply(request_id, result)
            except Exception as exc:
                if before_save is None:
                    raise
                reply = self._error_reply(request_id, exc)  # (its writes before the failure stay)
            if before_save is not None:
                before_save(reply)
            if method in self.WRITES:
                await self.persist_now()
        except Exception as exc:
            return self._error_reply(request_id, exc)
        return reply

    async def settle(self, served: tuple[bool, str]) -> str:
        """The reply to post for what `handle_now` served: saved first when it asks for it (else the
        storage error instead)."""
        persist, reply = served
        if persist and self._persist is not None:
            try:
                await self._persist()
            except Exception as exc:
                reply = self.storage_failure(reply, str(exc))
        return reply

    def take_persist(self) -> bool:
        """Whether the database changed since the last save; if so it counts as saved from now on."""
        if self._persist is None or self.app._closed:
            return False
        changes = self.app.db.conn.total_changes
        if changes == self._persisted_changes:
            return False
        self._persisted_changes = changes
        return True

    def storage_failure(self, reply: str, reason: str) -> str:
        """The reply to post instead of ``reply`` when saving its write failed (the write is not durable)."""
        self._persisted_changes = -1  # save again on the next change or tick
        return self._error_reply(json.loads(reply).get("id"), self._storage_error(reason))

    def _storage_error(self, reason: str) -> OfflineError:
        return OfflineError(
            f"the browser refused to store the local database: {reason}; free some storage space for "
            "this site (or allow it to store data) and try again",
            "STORAGE_ERROR",
            {"path": self.app.path},
        )

    def _collection(self, request: Mapping[str, Any]) -> Any:
        name = request.get("collection")
        if not isinstance(name, str):
            raise _bad("the request needs a 'collection' name")
        return self.app.collection(name)

    def _query(self, request: Mapping[str, Any]) -> Query:
        collection = self._collection(request)
        spec = request.get("query") or {}
        if not isinstance(spec, dict):
            raise _bad('\'query\' must be an object like {"where": {...}, "orderBy": [["field", false]]}')
        where = spec.get("where") or {}
        if not isinstance(where, dict):
            raise _bad("'where' must be an object of field values")
        query: Query = collection.where(where)
        for item in spec.get("orderBy") or []:
            field, desc = (item, False) if isinstance(item, str) else (item[0], bool(item[1]))
            query = query.order_by(field, desc=desc)
        if spec.get("limit") is not None:
            query = query.limit(spec["limit"])
        return query

    @staticmethod
    def _changes(changes: Any) -> dict[str, Any]:
        if not isinstance(changes, dict):
            raise _bad("'changes' must be an object of field values")
        decoded: dict[str, Any] = {}
        for name, value in changes.items():
            if isinstance(value, dict) and "$op" in value:
                make = _ATOMIC.get(value["$op"])
                if make is None:
                    raise _bad(
                        f"unknown atomic operation {value['$op']!r}; use one of {', '.join(_ATOMIC)}",
                        field=name,
                    )
                decoded[name] = make(*([value["value"]] if "value" in value else []))
            else:
                decoded[name] = value
        return decoded

    def _do_insert(self, request: Mapping[str, Any]) -> Any:
        return self._collection(request).insert(request.get("data") or {})

    def _do_insertMany(self, request: Mapping[str, Any]) -> Any:
        collection = self._collection(request)
        items = request.get("items")
        if not isinstance(items, list):
            raise _bad("'items' must be a list of records")
        with self.app.batch():  # one transaction, one copy to storage, one subscription update
            return [collection.insert(item) for item in items]

    def _do_update(self, request: Mapping[str, Any]) -> Any:
        return self._collection(request).update(
            request.get("recordId"), self._changes(request.get("changes"))
        )

    def _do_delete(self, request: Mapping[str, Any]) -> Any:
        return self._collection(request).delete(request.get("recordId"))

    def _do_richtext(self, request: Mapping[str, Any]) -> Any:
        """An edit of a rich text field through `Collection.richtext`: ``"edit": "insert"`` with ``index`` and
        ``text``, or ``"delete"`` with ``index`` and ``length`` (character indices, as in Python); answers
        the record as it is after the edit."""
        handle = self._collection(request).richtext(request.get("recordId"), request.get("field"))
        edit = request.get("edit")
        numbers = ("index",) if edit == "insert" else ("index", "length")
        for name in numbers:
            value = request.get(name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise _bad(f"a rich text {edit} needs an integer {name!r}", field=name)
        if edit == "insert":
            return handle.insert(request["index"], request.get("text"))
        if edit == "delete":
            return handle.delete(request["index"], request["length"])
        raise _bad(f"unknown rich text edit {edit!r}; use 'insert' or 'delete'", field="edit")

    def _do_findById(self, request: Mapping[str, Any]) -> Any:
        return self._collection(request).find_by_id(request.get("recordId"))

    def _do_fetch(self, request: Mapping[str, Any]) -> Any:
        return self._query(request).fetch()

    def _do_count(self, request: Mapping[str, Any]) -> Any:
        return self._query(request).count()

    def _do_subscribe(self, request: Mapping[str, Any]) -> Any:
        sub = request.get("sub")
        if not isinstance(sub, int) or isinstance(sub, bool) or sub in self._live:
            raise _bad("'sub' must be a new integer subscription id")
        query = self._query(request)
        live = self._live[sub] = _LiveQuery(query, query.collection.name)
        self._send_snapshot(sub, live)  # the current results, before the reply
        return sub

    def _do_unsubscribe(self, request: Mapping[str, Any]) -> Any:
        return self._live.pop(request.get("sub"), None) is not None  # type: ignore[arg-type]

    def _on_commit(self, ops: list[Operation]) -> None:
        self._mark(ops)

    def _on_records_changed(self, collection: str, record_ids: list[str]) -> None:
        self._mark_records((collection, record_id) for record_id in record_ids)

    def _mark(self, ops: Iterable[Operation]) -> None:
        """Note the records ``ops`` changed; the live queries of their collections are refreshed soon."""
        self._mark_records((operation.collection, operation.record_id) for operation in ops)

    def _mark_records(self, records: Iterable[tuple[str, str]]) -> None:
        watched = {live.collection for live in self._live.values()}
        if not watched:
            return
        touched = False
        for collection, record_id in records:
            if collection in watched:
                self._stale.setdefault(collection, set()).add(record_id)
                touched = True
        if touched:
            self._schedule_refresh()

    def _schedule_refresh(self) -> None:
        if self._refresh_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a write outside any event loop: nothing to coalesce with
            self._refresh()
            return
        self._refresh_scheduled = True
        loop.call_soon(self._refresh)

    def _refresh(self) -> None:
        self._refresh_scheduled = False
        stale, self._stale = self._stale, {}
        if self.app._closed:
            return
        for sub, live in list(self._live.items()):
            if live.collection not in stale:
                continue
            try:
                if live.window is not None:
                    self._send_difference(sub, live, stale[live.collection])
                else:
                    self._send_changes(sub, live, stale[live.collection])
            except Exception as exc:  # a query that stopped working must be visible, not silent
                self.post({"type": "log", "level": "error", "message": f"subscription {sub} failed: {exc}"})

    def _send_snapshot(self, sub: int, live: _LiveQuery) -> None:
        """The whole results, which replace what the page holds (on subscribing).

        Read and sent a page of records at a time (every part but the last says ``"more": true``): 50,000
        records never exist at once as Python objects or as one JSON text, whose peak would stay as the size
        of the worker's memory (WebAssembly memory never shrinks). Kept: the ids, to tell later changes
        apart (and with a limit, each record's text).
        """
        if live.query._limit is not None:  # a bounded window, held whole (`LiveResults`)
            live.window = LiveResults(live.query)
            pages: Iterable[list[dict[str, Any]]] = _pages(live.window.reset().inserted, SNAPSHOT_PAGE)
        else:
            pages = live.query.fetch_pages(SNAPSHOT_PAGE)
        ids: dict[str, int] = {}
        ready: str | None = None  # a part, posted once it is known not to be the last
        for page in pages:
            if ready is not None:
                self._post(f'{{"type":"snapshot","sub":{sub},"records":[{ready}],"more":true}}')
            texts = [_record_text(record) for record in page]
            if live.window is None:
                ids.update(zip((record["id"] for record in page), map(hash, texts), strict=True))
            ready = ",".join(texts)
        live.ids = ids
        self._post(f'{{"type":"snapshot","sub":{sub},"records":[{ready or ""}]}}')

    def _send_changes(self, sub: int, live: _LiveQuery, touched: set[str]) -> None:
        """What the touched records change in the results of a query without a limit.

        Each record is encoded once: its text is both what tells a change apart (its hash) and what the
        message carries (a first sync by states sends thousands of records this way)."""
        inserted: list[str] = []
        updated: list[str] = []
        held = live.ids
        matching = set()
        for record in live.query.among(touched):
            record_id = record["id"]
            matching.add(record_id)
            text = _record_text(record)
            text_hash = hash(text)
            before = held.get(record_id)
            if before is None:
                inserted.append(text)
            elif before != text_hash:
                updated.append(text)
            held[record_id] = text_hash
        removed = [record_id for record_id in touched if record_id in held and record_id not in matching]
        for record_id in removed:
            del held[record_id]
        if inserted or updated or removed:
            # (The text `post` would write for the message with these records.)
            self._post(
                f'{{"type":"changes","sub":{sub},"inserted":[{",".join(inserted)}],'
                f'"updated":[{",".join(updated)}],"removed":{_dumps(removed)}}}'
            )

    def _send_difference(self, sub: int, live: _LiveQuery, touched: set[str]) -> None:
        """What the touched records change in a limited query's window (`LiveResults.refresh`)."""
        assert live.window is not None
        changes = live.window.refresh(touched)
        if changes is not None:
            removed = [record["id"] for record in changes.removed]
            self._post_changes(sub, changes.inserted, changes.updated, removed)

    def _post_changes(
        self, sub: int, inserted: list[dict[str, Any]], updated: list[dict[str, Any]], removed: list[str]
    ) -> None:
        if inserted or updated or removed:
            self.post(
                {"type": "changes", "sub": sub, "inserted": inserted, "updated": updated, "removed": removed}
            )

    def action_names(self) -> list[str]:
        """The project's functions the page may call: public functions defined in the actions module."""
        module = self.actions
        if module is None:
            return []
        exported = getattr(module, "__all__", None)
        names = (
            list(exported)
            if exported is not None
            else [
                name
                for name, value in vars(module).items()
                if not name.startswith("_")
                and inspect.isfunction(value)
                and value.__module__ == module.__name__
            ]
        )
        return sorted(names)

    def _action(self, request: Mapping[str, Any]) -> tuple[Callable[..., Any], list[Any]]:
        name = request.get("name")
        if self.actions is None:
            raise _bad("this project has no actions module for the page to call")
        if not isinstance(name, str) or name not in self.action_names():
            raise _bad(
                f"{name!r} is not a function of {self.actions.__name__}; it has {', '.join(self.action_names())}",
                name=str(name),
            )
        args = request.get("args") or []
        if not isinstance(args, list):
            raise _bad("'args' must be a list")
        return getattr(self.actions, name), args

    def _do_call(self, request: Mapping[str, Any]) -> Any:
        function, args = self._action(request)
        result = function(self.app, *args)
        if inspect.isawaitable(result):  # an ordinary function that returned one: never awaited here
            close = getattr(result, "close", None)
            if close is not None:
                close()
            raise _bad(f"{function.__name__} returned an awaitable; make it an `async def` function")
        return result

    async def _do_call_async(self, request: Mapping[str, Any]) -> Any:
        function, args = self._action(request)
        return await function(self.app, *args)

    def _do_status(self, request: Mapping[str, Any]) -> Any:
        message = self.status_message()
        del message["type"]
        return message

    def _do_rejected(self, request: Mapping[str, Any]) -> Any:
        return self._sync_with("rejected").rejected()

    def _do_retry(self, request: Mapping[str, Any]) -> Any:
        return self._sync_with("retry").retry(str(request.get("operationId")))

    def _do_discard(self, request: Mapping[str, Any]) -> Any:
        return self._sync_with("discard").discard(str(request.get("operationId")))

    def _sync_with(self, method: str) -> Any:
        if not hasattr(self.app.sync, method):
            raise _bad("this app was built without a sync URL (BUILD_SYNC_URL)")
        return self.app.sync

    async def _do_connect(self, request: Mapping[str, Any]) -> Any:
        if not hasattr(self.app.sync, "url"):
            raise _bad("this app was built without a sync URL (BUILD_SYNC_URL)")
        self._sync_wanted = True
        await self.app.sync.connect(wait=False)
        self.publish_status()
        return True

    async def _do_disconnect(self, request: Mapping[str, Any]) -> Any:
        self._sync_wanted = False
        await self.app.sync.disconnect()
        self.publish_status()
        return True

    async def _do_network(self, request: Mapping[str, Any]) -> Any:
        await self.network_changed(bool(request.get("online")))
        return True

    async def _do_persist(self, request: Mapping[str, Any]) -> Any:
        await self.persist_now(force=True)
        return True

    # -- WebAuthn on the page -------------------------------------------------------------------------------

    def _do_pageInfo(self, request: Mapping[str, Any]) -> Any:
        """What the page offers that a worker lacks; for now whether it has WebAuthn (``"webauthn": true``)."""
        relays = self.relay_webauthn and request.get("webauthn") is True
        if relays:
            set_page_webauthn(self.webauthn)
        elif page_webauthn() == self.webauthn:
            set_page_webauthn(None)
        return {"webauthn": relays}

    async def webauthn(self, op: str, options: dict[str, Any]) -> dict[str, Any]:
        """Have the page run one WebAuthn ceremony (``op``: ``"create"`` or ``"get"``, ``options`` in WebAuthn's
        JSON form) and return its answer: ``{"ok": True, "credential": {...}}`` or ``{"ok": False, "error":
        {"name", "message"}}``. Installed as `offline.platform.page_webauthn` (see `_do_pageInfo`)."""
        if op not in ("create", "get"):
            raise _bad(f"a WebAuthn ceremony is 'create' or 'get', not {op!r}")
        self._next_ceremony += 1
        ceremony = self._next_ceremony
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._ceremonies[ceremony] = waiter
        # The browser ends the ceremony after the options' timeout (ms); a page that never answers (closed
        # in the meantime, say) is given a little longer than that.
        timeout = options.get("timeout")
        wait = (timeout / 1000 if isinstance(timeout, (int, float)) and timeout > 0 else 300.0) + 30.0
        try:
            self.post({"type": "webauthn", "id": ceremony, "op": op, "options": options})
            return await asyncio.wait_for(waiter, wait)
        except TimeoutError:
            return _ceremony_error("TimeoutError", "the page did not answer the WebAuthn request")
        finally:
            self._ceremonies.pop(ceremony, None)

    def _do_webauthnResult(self, request: Mapping[str, Any]) -> Any:
        """The page's answer to a `webauthn` request; False when nobody waits for it (any more)."""
        ceremony = request.get("ceremony")
        waiter = self._ceremonies.get(ceremony) if isinstance(ceremony, int) else None
        if waiter is None or waiter.done():
            return False
        ok = request.get("ok") is True
        answer: dict[str, Any] = {"ok": ok}
        if ok:
            answer["credential"] = request.get("credential")
        else:
            error = request.get("error")
            answer["error"] = error if isinstance(error, dict) else {"name": "Error", "message": str(error)}
        waiter.set_result(answer)
        return True

    def _end_webauthn(self) -> None:
        """This page is gone: no more ceremonies through it, and the ones under way end (aborted)."""
        if page_webauthn() == self.webauthn:
            set_page_webauthn(None)
        for waiter in self._ceremonies.values():
            if not waiter.done():
                waiter.set_result(
                    _ceremony_error("AbortError", "the page closed during the WebAuthn ceremony")
                )


def _import(name: str, role: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise OfflineError(
            f'cannot import the project\'s {role} module {name!r}: {exc}; list it under "offline"."modules" '
            "in package.json and build again",
            "INVALID_SCHEMA",
            {"module": name},
        ) from exc


def _remove_database(path: str) -> None:
    """Delete the database file at ``path`` and its rollback journal (in the browser, storage.js empties
    the files it keeps in the browser's storage when they are deleted)."""
    for name in (path, f"{path}-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


def open_app(
    config: Mapping[str, Any], progress: Callable[[str], Any] | None = None
) -> tuple[App, ModuleType | None]:
    """Open the app a worker config describes: its schema module, database path, sync URL.

    ``snapshot`` true in the config: the database file is a replica the server built (web/snapshot.js). If
    it does not open here (damaged on the way, or built by a library whose layout this one does not read),
    it is deleted and a new database opened, which the sync engine fills over the socket; ``progress`` then
    hears ``"snapshot-discarded"``.
    """
    schema_module = _import(str(config.get("schemaModule") or "schema"), "schema")
    schema = getattr(schema_module, "schema", None)
    if not isinstance(schema, SchemaDefinition):
        raise OfflineError(
            f"{schema_module.__name__} must define `schema = define_schema({{...}})`",
            "INVALID_SCHEMA",
            {"module": schema_module.__name__},
        )
    actions_name = config.get("actionsModule")
    actions = _import(str(actions_name), "actions") if actions_name else None
    sync_url = config.get("syncUrl")
    sync = {"url": sync_url, **(config.get("syncOptions") or {})} if sync_url else None
    path = str(config.get("dbPath") or "app.db")
    try:
        app = create_app(schema, sync=sync, path=path)
    except Exception:
        if not config.get("snapshot"):
            raise
        # Nothing of this device is in the file yet (it was written at this start, before anything else):
        # a new database loses nothing, and the server sends the same records over the socket.
        traceback.print_exc()
        print(
            "the server's snapshot of the database did not open: a new database syncs instead",
            file=sys.stderr,
        )
        _remove_database(path)
        if progress is not None:
            progress("snapshot-discarded")
        app = create_app(schema, sync=sync, path=path)
    if IS_BROWSER:
        # A rollback journal, no WAL. Where the file is kept in OPFS (web/storage.js), the journal is there
        # too, and storage.js keeps the two files' changes in SQLite's order; where it is kept in IndexedDB,
        # a copy of the file taken between two transactions is then always a consistent database (a WAL copy
        # could pair an old main file with a newer log), and durability comes from persist() alone.
        app.db.conn.execute("PRAGMA journal_mode=DELETE")
        # This worker's connection is the only one to the file (one tab owns the database): holding its lock
        # spares every transaction re-reading the file's header to learn whether its page cache is still
        # good, and the journal is emptied at a commit instead of deleted. Where the file is in the browser's
        # storage (OPFS), each of those is a call into the browser.
        app.db.conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        # Sync sends only what the browser stored (see offline.worker_tabs.DurableSync): so far, everything.
        if hasattr(app.sync, "durable_sequence"):
            app.sync.durable_sequence = app._seq
    return app, actions


def _startup_error(exc: BaseException) -> OfflineError:
    """What the page is told when the app cannot open: a code, and what to do next (never a traceback)."""
    if is_damaged(exc) or (isinstance(exc, OfflineError) and (exc.context or {}).get("reason") == "corrupt"):
        cause = exc.__cause__ if isinstance(exc, OfflineError) and exc.__cause__ is not None else exc
        return OfflineError(
            "the data this app keeps in this browser is damaged and cannot be opened; it was left as it is. "
            "What was synced is safe on the server: clear this site's data (in the browser's settings for "
            "this site) and reload the page to download it again (changes made here and not synced yet "
            "would be lost with it)",
            STORAGE_ERROR,
            {"reason": "corrupt", "cause": f"{type(cause).__name__}: {cause}"},
        )
    if isinstance(exc, OfflineError):
        return exc
    return OfflineError(
        f"the app could not start: {type(exc).__name__}: {exc} (the browser console has the details)",
        STORAGE_ERROR,
        {"reason": "startup", "cause": f"{type(exc).__name__}: {exc}"},
    )


def _report_first(app: App, event: str, stage: str, progress: Callable[[str], Any]) -> None:
    """Report ``stage`` the first time ``event`` fires (the first handshake accepted, the first states of a
    first sync stored): where a first visit's time goes after the app is ready."""
    off: Callable[[], None] | None = None

    def once(_event: Any) -> None:
        if off is not None:
            off()
        progress(stage)

    off = app.events.on(event, once)


async def start(
    config: Any, post: Post, persist: Persist | None = None, progress: Callable[[str], Any] | None = None
) -> WorkerBridge | None:
    """Open the app and start serving a page; the worker's JavaScript calls this once.

    ``config`` is a mapping (or a JS object converted by Pyodide) with ``schemaModule``, ``actionsModule``,
    ``dbPath``, ``snapshot`` (see `open_app`), ``syncUrl`` and ``syncOptions``. When the app cannot open (a
    damaged database, a project module that does not import), the page gets ``{"type": "fatal", "code",
    "message", "context"}`` and this returns None. ``progress(stage)`` reports the startup stage reached (``"app-opened"``: the schema
    imported and the database opened), for the page's timings.
    """
    if hasattr(config, "to_py"):  # a JsProxy
        config = config.to_py()
    try:
        app, actions = open_app(config, progress)
    except Exception as exc:
        traceback.print_exc()  # the details, for the developer: the worker's console
        error = _startup_error(exc)
        post(
            json.dumps(
                {"type": "fatal", "code": error.code, "message": error.message, "context": error.context},
                default=str,
            )
        )
        return None
    if progress is not None:
        progress("app-opened")
        _report_first(app, "sync:connected", "sync-connected", progress)
        _report_first(app, "sync:states", "first-states", progress)
    bridge = WorkerBridge(app, post=post, persist=persist, actions=actions)
    await bridge.start()
    return bridge


__all__ = ["PROTOCOL_VERSION", "WorkerBridge", "open_app", "start"]
