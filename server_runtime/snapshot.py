"""``POST <sync path>/snapshot``: a fresh device's first sync as one server-built database file.

See `offline.sync.snapshot` for why. The request is judged like a sync handshake (the same token, the same
scope resolution, the same schema and ``Origin`` checks); the server then runs the session's state-based
first sync into a local database of its own (the replica the device would have built from the socket's
``record-states`` messages, built by the same library) and sends that file, gzip-encoded when the client
accepts it. The device opens it as its database and connects from its watermark.

Cost, and what bounds it: the build is the state catch-up the socket would have streamed (the same store
reads, bounded by what the scope sees) plus writing the replica, off the event loop. At most
``SyncLimits.snapshot_builds`` run at once (0: snapshots off); a request beyond that is answered 503, and the
device syncs over the socket instead (as it does on any answer but 200). The last file built is kept for
the same scope while the log has not moved, so a crowd of fresh devices on a quiet server costs one build.
A short log (no state-based first sync for this scope, see `SyncService._sees_more_than`) is answered 204.

Per address: a request holds a file on its way out until its last byte is sent (a client that reads slowly,
or sends its request's body slowly, holds it that long), so one client address may have
``SyncLimits.snapshot_per_address`` requests in progress; one more is answered 429 ``RATE_LIMITED``. A client
that does not accept gzip is sent the file decompressed as it goes, never a decompressed copy held whole.

Prepared ahead: a server without sign-in has one scope every fresh device asks for (the open one), so it
builds that scope's file as it starts and again once the log has moved and then stayed still for a moment
(``SyncLimits.snapshot_prepare_every`` bounds how often: a tenth of the time at most). The first device then
gets a file at once instead of waiting for a build that competes with its own start for the CPU. A file is
only ever served for the exact log position it holds (never a stale one: a device would briefly hold what
was since deleted), so on a server whose log never stays still, devices wait for their build as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

import offline
from offline.auth.errors import RATE_LIMITED
from offline.core.errors import STORAGE_ERROR, OfflineError
from offline.store.app import create_app
from offline.sync import protocol as p
from offline.sync import snapshot

from .client_address import client_address
from .limits import OriginPolicy
from .sync import Session

if TYPE_CHECKING:
    from .sync import SyncService

log = logging.getLogger("offline.server.snapshot")

#: Largest request body read (the request is a few fields; a scope is small).
MAX_REQUEST_BYTES = 64 * 1024
MEDIA_TYPE = "application/vnd.sqlite3"
#: Error code of a request that is not what the endpoint reads (the field named in ``field``).
INVALID_REQUEST = "INVALID_REQUEST"


@dataclass(frozen=True, slots=True)
class Built:
    """A finished snapshot: the gzip-encoded file, and what it was built from."""

    key: str  # the scope and log position it holds (see `Snapshots._key`)
    body: bytes  # gzip of the database file
    horizon: int
    records: int


def _decompressed(body: bytes) -> Iterator[bytes]:
    """The file of a gzip ``body``, a piece at a time (run on a worker thread by the response)."""
    with gzip.GzipFile(fileobj=io.BytesIO(body)) as file:
        while piece := file.read(_PIECE_BYTES):
            yield piece


_PIECE_BYTES = 256 * 1024


class _Releasing(Response):
    """``response``, sent as it is, then ``release`` called: once the last byte is sent, or the client is gone
    (it holds its address's place until then)."""

    def __init__(self, response: Response, release: Callable[[], None]) -> None:
        # (Not Response.__init__: nothing is rendered here; what the middleware reads is the inner one's.)
        self.status_code = response.status_code
        self.raw_headers = response.raw_headers
        self.background = None
        self._response = response
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self._response(scope, receive, send)
        finally:
            self._release()


# What a build too large for ``snapshot_max_bytes`` gives: the request (and any waiting on it) get 204.
_TOO_LARGE = Built(key="", body=b"", horizon=0, records=0)


def _no_snapshot() -> Response:
    """204: no snapshot for this request; the device syncs over the socket."""
    return Response(status_code=204, headers={"Cache-Control": "no-store"})


def _refuse(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    headers = {"Cache-Control": "no-store"}
    if status in (429, 503):
        headers["Retry-After"] = "5"
    return JSONResponse({"error": code, "message": message, **extra}, status_code=status, headers=headers)


class Snapshots:
    """The snapshot endpoint of one server process."""

    def __init__(self, service: SyncService, origins: OriginPolicy, *, quiet: float = 2.0) -> None:
        self.service = service
        self.origins = origins
        self._last: Built | None = None
        # The open scope's file built ahead of any request (kept apart from ``_last``, which requests for
        # other scopes replace), and the task building it.
        self._prepared: Built | None = None
        self._preparing: asyncio.Task[None] | None = None
        # How long the log must stay still before the open scope is prepared again.
        self._quiet = quiet
        # The builds in progress, by key: a second request for a key waits for its build, and their number
        # is what ``snapshot_builds`` bounds.
        self._same: dict[str, asyncio.Future[Built | None]] = {}
        # Requests in progress by client address (see the module docstring).
        self._by_address: dict[str, int] = {}

    @property
    def preparing(self) -> bool:
        """Whether the open scope's file is being kept ready in the background."""
        return self._preparing is not None

    def start(self) -> None:
        """Keep the open scope's file ready (see the module docstring): only on a server without sign-in,
        with snapshots and preparing on. Call once the sync service has started."""
        limits = self.service.limits
        if self.service.auth is not None or limits.snapshot_builds <= 0 or limits.snapshot_prepare_every <= 0:
            return
        if self._preparing is None:
            self._preparing = asyncio.create_task(self._prepare(), name="offline-snapshot-prepare")

    async def stop(self) -> None:
        task, self._preparing = self._preparing, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _prepare(self) -> None:
        service = self.service
        every = service.limits.snapshot_prepare_every
        filters = service.resolve_scope(None, None)
        done: int | None = None  # the log position last looked at (prepared, or too short to need a file)
        seen, still_since = service.watermark, time.monotonic()
        not_before = 0.0
        while True:
            now = time.monotonic()
            if service.watermark != seen:
                seen, still_since = service.watermark, now
            # As it starts (nothing looked at yet): at once; afterwards once the log stayed still a moment.
            due = done is None or (seen != done and now - still_since >= self._quiet)
            if due and now >= not_before and service.started:
                session = _session(filters, None)
                selectors = service.catch_up_selectors(session)
                try:
                    wanted = await service._sees_more_than(selectors, 0)
                except Exception as exc:  # (a store that failed a read: look again later, keep serving)
                    log.warning("could not read the log to prepare a snapshot (%s); trying again later", exc)
                    not_before = time.monotonic() + every
                else:
                    # From here to the build's registration in ``_same`` (`_build_once`, before its first
                    # await) nothing awaits: a request arriving meanwhile finds this build and waits for it.
                    key = self._key(filters)
                    if not wanted or self._cached(key) is not None or key in self._same:
                        done = seen  # a short log, or a request built it (or is building it) already
                    elif len(self._same) < service.limits.snapshot_builds:
                        done = seen
                        began = time.monotonic()
                        built = await self._build_once(key, session, selectors, filters, prepared=True)
                        took = time.monotonic() - began
                        not_before = time.monotonic() + max(every, 10 * took)
                        if built is not None and built is not _TOO_LARGE:
                            service.counters["snapshots_prepared"] += 1
            await asyncio.sleep(min(0.5, self._quiet / 2))

    def _cached(self, key: str) -> Built | None:
        for built in (self._prepared, self._last):
            if built is not None and built.key == key:
                return built
        return None

    async def endpoint(self, request: Request) -> Response:
        if not self.origins.permits(request.headers.get("origin")):
            return _refuse(403, "ORIGIN_NOT_ALLOWED", "this origin may not sync with this server")
        address = client_address(request)
        held = self._by_address.get(address, 0)
        if held >= self.service.limits.snapshot_per_address:
            return _refuse(
                429,
                RATE_LIMITED,
                f"{held} snapshot requests from this address are in progress; sync by socket",
            )
        self._by_address[address] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                left = self._by_address.pop(address) - 1
                if left:
                    self._by_address[address] = left

        try:
            response = await self._answer(request)
        except BaseException:
            release()
            raise
        return _Releasing(response, release)

    async def _answer(self, request: Request) -> Response:
        service = self.service
        limit = service.limits.snapshot_builds
        if limit <= 0:
            return _no_snapshot()
        try:
            asked = await _read_request(request)
        except _BadRequest as exc:
            return _refuse(400, INVALID_REQUEST, exc.message, field=exc.field)
        except ClientDisconnect:
            return Response(status_code=400)
        if not service.started:
            return _refuse(503, p.SERVER_SHUTDOWN, "the server is starting or shutting down; sync by socket")
        if asked["format"] != snapshot.FORMAT or asked["offline"] != offline.__version__:
            # Another build of the library writes and reads another layout: the socket serves it.
            return _no_snapshot()
        schema = service.schema
        if asked["schemaVersion"] != schema.version:
            lo, hi = service.supported_schema
            if lo <= asked["schemaVersion"] <= hi:
                return _no_snapshot()
            return _refuse(
                409,
                "SCHEMA_MISMATCH",
                f"client schema version {asked['schemaVersion']}, server supports {lo} to {hi}",
            )
        token = _bearer(request.headers.get("authorization"))
        try:
            claims = await service.authenticate(token)
        except OfflineError as exc:
            if exc.code == p.OVERLOADED:
                return _refuse(503, p.OVERLOADED, "the sign-in could not be checked now; sync by socket")
            if exc.code == STORAGE_ERROR:
                return _refuse(503, STORAGE_ERROR, "the server could not check the sign-in now")
            return _refuse(401, p.AUTH_FAILED, "authentication failed")
        filters = service.resolve_scope(claims, asked["syncScope"])
        session = _session(filters, claims)
        selectors = service.catch_up_selectors(session)
        if not await service._sees_more_than(selectors, 0):
            return _no_snapshot()
        key = self._key(filters)
        built = self._cached(key)
        if built is None:
            waiting = self._same.get(key)
            if waiting is not None:
                built = await asyncio.shield(waiting)
            elif len(self._same) >= limit:
                return _refuse(503, p.OVERLOADED, "the server is building other snapshots; sync by socket")
            else:
                built = await self._build_once(key, session, selectors, filters)
            if built is None:
                return _refuse(503, STORAGE_ERROR, "the snapshot could not be built; sync by socket")
            if built is _TOO_LARGE:
                return _no_snapshot()
        service.counters["snapshots_served"] += 1
        headers = {
            "Cache-Control": "no-store",
            "X-Offline-Snapshot-Format": str(snapshot.FORMAT),
            "X-Offline-Snapshot-Horizon": str(built.horizon),
            "X-Offline-Snapshot-Records": str(built.records),
        }
        if "gzip" in request.headers.get("accept-encoding", "").lower():
            headers["Content-Encoding"] = "gzip"
            return Response(built.body, media_type=MEDIA_TYPE, headers=headers)
        # gzip's trailer holds the file's length (modulo 4 GiB; a snapshot is at most snapshot_max_bytes).
        headers["Content-Length"] = str(int.from_bytes(built.body[-4:], "little"))
        return StreamingResponse(_decompressed(built.body), media_type=MEDIA_TYPE, headers=headers)

    def _key(self, filters: Mapping[str, Any]) -> str:
        service = self.service
        scope = json.dumps(filters, sort_keys=True, separators=(",", ":"), default=str)
        return f"{service.watermark} {service.delivery_epoch} {scope}"

    async def _build_once(
        self,
        key: str,
        session: Session,
        selectors: Any,
        filters: Mapping[str, Any],
        *,
        prepared: bool = False,
    ) -> Built | None:
        future: asyncio.Future[Built | None] = asyncio.get_running_loop().create_future()
        self._same[key] = future
        built: Built | None = None
        try:
            built = await self._build(key, session, selectors, filters)
        except _TooLarge as exc:
            log.info("no snapshot for a fresh device: %s (snapshot_max_bytes); it syncs by socket", exc)
            built = _TOO_LARGE
        except Exception:
            log.exception("building a snapshot failed; the device syncs by socket instead")
        finally:
            del self._same[key]
            future.set_result(built)
        if built is not None and built is not _TOO_LARGE:
            if prepared:
                self._prepared = built
            else:
                self._last = built
        return built

    async def _build(self, key: str, session: Session, selectors: Any, filters: Mapping[str, Any]) -> Built:
        service = self.service
        limit = service.limits.snapshot_max_bytes
        # In memory: a replica nobody keeps needs no journal, no fsync and no checkpoints.
        app = await asyncio.to_thread(create_app, service.schema, None, ":memory:", compact_after=None)
        try:
            kept = snapshot.scope_filters(filters)
            await asyncio.to_thread(
                snapshot.begin,
                app,
                server_node_id=service.node_id,
                delivery_epoch=service.delivery_epoch,
                accepted_scope=filters,
            )
            horizon: list[int] = []
            # The states of one message are stored (in a thread) while the next are read: the store's reads
            # and the replica's writes overlap, one message of each at a time.
            storing: asyncio.Future[None] | None = None

            async def store(states: list[dict[str, Any]], end: int | None, through: int | None) -> None:
                nonlocal storing
                if storing is not None:
                    await storing
                storing = asyncio.ensure_future(
                    asyncio.to_thread(_adopt_within, app, states, kept, through, limit)
                )
                if end is not None:
                    await storing
                    storing = None
                    horizon.append(end)
                    await asyncio.to_thread(snapshot.finish, app, end)

            session.take_states = store
            try:
                await service._catch_up_states(session, selectors, service.watermark)
            finally:
                if storing is not None:
                    await storing
            if not horizon:
                raise RuntimeError("the state catch-up ended without its final message")
            records = await asyncio.to_thread(_count_records, app)
            data = await asyncio.to_thread(snapshot.seal, app)
        finally:
            await asyncio.to_thread(app.close)
        # Level 1: most of the saving (SQLite pages of JSON text compress well) at a fraction of the time.
        body = await asyncio.to_thread(gzip.compress, data, 1)
        service.counters["snapshots_built"] += 1
        log.info(
            "built a snapshot of %d record(s) up to delivery %d (%d bytes, %d gzip-encoded)",
            records,
            horizon[0],
            len(data),
            len(body),
        )
        return Built(key=key, body=body, horizon=horizon[0], records=records)


class _TooLarge(Exception):
    """The replica outgrew ``snapshot_max_bytes``: the device syncs by socket instead."""


def _adopt_within(
    app: Any, states: list[dict[str, Any]], filters: Mapping[str, Any], through: int | None, limit: int
) -> None:
    snapshot.adopt(app, states, filters, through=through)
    (pages,) = app.db.conn.execute("PRAGMA page_count").fetchone()
    (size,) = app.db.conn.execute("PRAGMA page_size").fetchone()
    if pages * size > limit:
        raise _TooLarge(f"the replica passed {limit} bytes")


def _count_records(app: Any) -> int:
    """The records the replica holds (deleted ones aside)."""
    return sum(app.collection(name).count() for name in app.codecs)


def _session(filters: dict[str, dict[str, Any]], claims: Mapping[str, Any] | None) -> Session:
    """The socketless session a build runs the state catch-up of (its states go to `Session.take_states`)."""
    return Session(node_id="", filters=filters, claims=claims, send=_unsent, wants_states=True)


async def _unsent(text: str) -> None:
    # A snapshot's session has no socket: its states go to `Session.take_states` (see Snapshots._build).
    raise RuntimeError("a snapshot session sends no frame")


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class _BadRequest(Exception):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


async def _read_request(request: Request) -> dict[str, Any]:
    """The request's JSON body, checked: ``format``, ``offline``, ``schemaVersion``, ``syncScope``."""
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_REQUEST_BYTES:
            raise _BadRequest(f"the request body is larger than {MAX_REQUEST_BYTES} bytes", "body")
    try:
        data = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError):
        raise _BadRequest("the request body must be a JSON object", "body") from None
    if not isinstance(data, dict):
        raise _BadRequest("the request body must be a JSON object", "body")
    for name in ("format", "schemaVersion"):
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _BadRequest(f"{name} must be an integer", name)
    if not isinstance(data.get("offline"), str):
        raise _BadRequest("offline must be the client's library version (a string)", "offline")
    scope = data.get("syncScope")
    if scope is not None and not isinstance(scope, dict):
        raise _BadRequest("syncScope must be an object or null", "syncScope")
    return {
        "format": data["format"],
        "offline": data["offline"],
        "schemaVersion": data["schemaVersion"],
        "syncScope": scope,
    }
