"""The server's sync core: sessions, the write pipeline and relay (DESIGN.md section 4).

Write pipeline, per client batch, under the store's exclusive writer (one writer per database, across
processes for PostgreSQL): catch up on other processes' commits; then judge each operation in order —
well formed, id equals content hash, collection and field types, schema version, clock drift, size, scope,
state machine, Tier 2 constraints and relations — apply the accepted ones with the same merge engine as the
clients, add the server's own resolution operations, store everything durably, and only then acknowledge.
Relay reads the committed log (delivery order = commit order) and filters it by each session's scope; a
session that sees only part of the log catches up through the stores' index of scope values
(`SyncService.catch_up_selectors`), reading what it may see rather than the whole log.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from offline.core.errors import OfflineError
from offline.core.fields import validate_field_value
from offline.core.hlc import MAX_DRIFT_MS, HybridLogicalClock
from offline.core.operations import Operation, create_operation
from offline.core.schema import SchemaDefinition
from offline.core.scopes import (
    build_scope_map,
    collection_bindings,
    extract_scope_values_from_claims,
    participating_collections,
)
from offline.core.server_nodes import is_server_node_id, new_server_node_id
from offline.core.version_vector import topological_sort
from offline.merge.constraints import Action
from offline.merge.engine import MAX_GAPS, Conflict, MergeEngine, RecordState, numbers_listed
from offline.merge.relations import plan_record_delete
from offline.merge.values import operation_text
from offline.sync import protocol as p

from .judging import follow_up_timestamp, forged_authority, judge_write, refused_insert_tombstone
from .live_sessions import LiveSessions
from .records import RecordCache, StagedView, one_operation_json, one_operation_state
from .stores._codec import decode_optional
from .stores.base import (
    MOVED_FROM,
    ONE_OPERATION,
    RecordKey,
    RecordRow,
    ScopeSelector,
    ServerStore,
    StoredOperation,
    StoredRecordRow,
    WriteConflict,
)
from .stores.compaction import COMPACTED

log = logging.getLogger("offline.server.sync")

#: Store meta key: the plain node ids this database's server wrote under before it took a marked one.
LEGACY_NODE_IDS = "legacy_server_node_ids"
#: Meta key of the server's numbering of deliveries, when it is not the database's first one (see
#: `SyncService.renumber_deliveries`).
DELIVERY_EPOCH = "delivery_epoch"

# Records loaded at start from which the process exempts its objects from garbage collection (see start()).
_FREEZE_AT = 10_000

#: ``sync_options={"rules": {collection: rule}}``: ``rule(claims, operation) -> bool`` decides each client
#: write to that collection (claims: the session's verified token claims, {} without auth).
WriteRule = Callable[[Mapping[str, Any], Operation], bool]

AuthProvider = Callable[[str | None], Awaitable[Mapping[str, Any] | None] | Mapping[str, Any] | None]

#: The principal of every session when the server has no auth provider (and of a token naming no subject).
ANONYMOUS_PRINCIPAL = "anonymous"
#: The principal the server's own node id is registered to (a token subject's principal is "user:<subject>").
SERVER_PRINCIPAL = "server"


def principal_of(claims: Mapping[str, Any] | None) -> str:
    """Who a session speaks for, from its verified claims: node ids are registered to it (`bind_node`). An
    auth provider may name it (claim ``principal``: external issuers' users are ``external:<issuer> <id>``, so
    they never collide with native users), else it is the token's subject."""
    if claims is not None:
        named = claims.get("principal")
        if isinstance(named, str) and named:
            return named
        for key in ("sub", "userId"):
            subject = claims.get(key)
            if isinstance(subject, str) and subject:
                return "user:" + subject
    return ANONYMOUS_PRINCIPAL


@dataclass(slots=True)
class Refusal:
    code: str
    message: str
    retriable: bool = False


@dataclass(slots=True, eq=False)  # identity equality: sessions live in a set
class Session:
    node_id: str
    filters: dict[str, dict[str, Any]]  # collection -> record filter; absent collection = not visible
    claims: Mapping[str, Any] | None
    send: Callable[[str], Awaitable[None]]
    cursor: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    received: int = 0
    rejected: int = 0
    connected_at: float = field(default_factory=time.time)
    # Relay batches the client has not acknowledged yet: message id -> (monotonic send time, base), oldest
    # first; and when it last acknowledged one. See SyncService.relay.
    unacked: dict[str, tuple[float, int]] = field(default_factory=dict)
    last_ack: float = field(default_factory=time.monotonic)
    # The client asked for the state-based first sync (handshake ``initialSync: "states"``).
    wants_states: bool = False
    # Takes each ``record-states`` message's content (states, horizon, through) instead of ``send`` taking
    # it encoded: a session with no socket (a snapshot being built, server_runtime.snapshot) stores the
    # states itself, and would only decode the frame again.
    take_states: Callable[[list[dict[str, Any]], int | None, int | None], Awaitable[None]] | None = None
    principal: str = field(init=False)

    def __post_init__(self) -> None:
        self.principal = principal_of(self.claims)

    def acknowledged(self, message_id: str) -> None:
        """The client applied relay batch ``message_id``, and so every batch sent before it (it applies them
        in order, and drops the connection at a gap)."""
        if message_id not in self.unacked:
            return
        for sent in list(self.unacked):
            del self.unacked[sent]
            if sent == message_id:
                break
        self.last_ack = time.monotonic()

    @property
    def open(self) -> bool:
        """No visible collection has a record filter: visibility depends on the collection alone."""
        return not any(self.filters.values())

    def matches(self, collection: str, values: Mapping[str, Any] | None) -> bool:
        return _in_scope(self.filters, collection, values)


def _in_scope(
    filters: Mapping[str, Mapping[str, Any]], collection: str, values: Mapping[str, Any] | None
) -> bool:
    """Whether a record of ``collection`` with these scope values is visible through ``filters``."""
    filt = filters.get(collection)
    if filt is None:
        return False
    if not filt:  # the whole collection (no generator to build: this runs for every write and relay)
        return True
    values = values or {}
    return all(values.get(k) == v for k, v in filt.items())


@dataclass(slots=True)
class _Request:
    """One client batch waiting for the group commit."""

    session: Session | None
    ops: list[Operation]
    future: asyncio.Future[dict[str, Refusal | int | None]]


def _retrieve(future: asyncio.Future[Any]) -> None:
    # A caller that went away never reads its outcome: mark a failure as seen (no "never retrieved" log).
    if not future.cancelled():
        future.exception()


def _fail(requests: list[_Request], exc: BaseException) -> None:
    for request in requests:
        if not request.future.done():
            request.future.set_exception(exc)


@dataclass(slots=True)
class _Trial:
    """An accepted write applied to a copy of its record's state, with the conflicts it resolved."""

    row: RecordRow
    conflicts: list[Conflict]


class Relayed:
    """One committed operation as the relay needs it: who wrote it, where, its scope snapshot and its wire
    JSON (encoded at most once, then shared by every session it goes to)."""

    __slots__ = (
        "_operation",
        "_wire",
        "collection",
        "delivery",
        "moved_from",
        "node_id",
        "record_id",
        "scope",
    )

    def __init__(
        self,
        delivery: int,
        node_id: str,
        collection: str,
        record_id: str,
        scope: dict[str, Any] | None,
        wire: str | None = None,
        operation: Operation | None = None,
    ) -> None:
        self.delivery = delivery
        self.node_id = node_id
        self.collection = collection
        self.record_id = record_id
        self.scope = scope
        # The scope values before this operation, when it moved its record (else None).
        self.moved_from: dict[str, Any] | None = scope.get(MOVED_FROM) if scope else None
        self._wire = wire
        self._operation = operation

    @classmethod
    def of(cls, stored: StoredOperation) -> Relayed:
        op = stored.operation
        return cls(stored.delivery, op.node_id, op.collection, op.record_id, stored.scope, operation=op)

    def wire_json(self) -> str:
        wire = self._wire
        if wire is None:
            assert self._operation is not None
            wire = self._wire = operation_text(self._operation)
            self._operation = None  # the text is all the relay needs from now on
        return wire


def _delivery(item: Relayed) -> int:
    return item.delivery


@dataclass(slots=True)
class SyncLimits:
    batch_size: int = 500
    max_message_bytes: int = p.MAX_MESSAGE_BYTES
    max_batch_operations: int = p.MAX_BATCH_OPERATIONS
    max_operation_bytes: int = p.MAX_OPERATION_BYTES
    handshake_timeout: float = 5.0  # a connection sending no handshake holds a slot until then
    max_protocol_errors: int = 20
    recent_operations: int = 20_000
    # Relay batches unacknowledged this long, with no acknowledgement at all meanwhile, are streamed again.
    ack_timeout: float = 5.0
    # Largest relay frame in UTF-8 bytes (a single larger operation goes alone): clients refuse frames over
    # protocol.MAX_MESSAGE_BYTES, whatever this server accepts, and smaller frames keep each apply short.
    relay_frame_bytes: int = p.MAX_MESSAGE_BYTES // 4
    # Catch-up pages read from the store at once, across sessions: a crowd of sessions starting together
    # (a server restart) holds this many pages in memory, not one per session, and queues for the rest.
    catch_up_reads: int = 4
    # A session starting from delivery 0 that asks for it (a fresh device) is sent its records' states, then
    # the log after them, once the log holds more operations than this: each record then costs the device
    # one state instead of every operation of it (verified, folded and logged one by one). A short log is
    # streamed as operations (cheap either way, and the device keeps the operations). A scoped session is
    # judged by the operations its scope holds (see SyncService._sees_more_than).
    state_sync_after: int = 1000
    # Snapshots (``POST <sync path>/snapshot``, server_runtime.snapshot: a fresh device's first sync as one
    # database file the server builds) built at once; a request beyond it syncs by socket instead. 0: off.
    snapshot_builds: int = 1
    # Largest snapshot (the replica's database, built in memory) in bytes: a scope holding more syncs by socket
    # (whose catch-up streams pages), so one fresh device of a huge scope cannot take the server's memory.
    snapshot_max_bytes: int = 96 * 1024 * 1024
    # A server without sign-in builds its open scope's snapshot in the background as it starts, and again once
    # the log has moved and then stayed still, at most once per this many seconds (and at most a tenth of the
    # time: never sooner than ten builds' durations after the last). 0: only on request.
    snapshot_prepare_every: float = 30.0
    # Snapshot requests one client address may have in progress, from its first byte to the file's last sent:
    # each holds a file of up to snapshot_max_bytes on its way out, and a server without sign-in answers
    # anyone. One more is answered 429 and that device syncs by socket.
    snapshot_per_address: int = 2


class SyncService:
    """Owns the record cache, the write pipeline and every connected session of one server process."""

    def __init__(
        self,
        store: ServerStore,
        *,
        auth: Any = None,
        limits: SyncLimits | None = None,
        now: Callable[[], int] | None = None,
        rules: Mapping[str, WriteRule] | None = None,
    ) -> None:
        self.store = store
        self.auth = auth
        self.rules = _checked_rules(rules)
        self.limits = limits or SyncLimits()
        self._now = now or (lambda: time.time_ns() // 1_000_000)
        self.sessions: set[Session] = set()
        # Auth session id -> its live sync sessions, ended when it is revoked or its token expires.
        self.live = LiveSessions(auth)
        self.started = False
        self._lock = asyncio.Lock()
        self._queue: list[_Request] = []  # batches waiting for the next group commit
        self._committer: asyncio.Task[None] | None = None
        # The latest committed operations as the relay sends them, in delivery order (a list, trimmed in
        # halves, so a session's position is found by bisection).
        self._recent: list[Relayed] = []
        self.watermark = 0
        self.counters: dict[str, int] = {
            "received": 0,
            "accepted": 0,
            "duplicates": 0,
            "sent": 0,
            "server_ops": 0,
            "history_sent": 0,  # records sent whole to a session because they moved into its scope
            "states_sent": 0,  # record states sent (state-based catch-up after a compaction)
            "snapshots_built": 0,  # replica files built for fresh devices (server_runtime.snapshot)
            "snapshots_served": 0,  # and sent (a file is sent again while the log has not moved)
            "snapshots_prepared": 0,  # of those built, the ones built in the background (no device waiting)
        }
        self.rejections: dict[str, int] = {}
        self.conflicts: dict[str, int] = {}
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self._catch_up_reads = asyncio.Semaphore(max(1, self.limits.catch_up_reads))
        # Node id -> the principal it is registered to (registrations never change: a read one is kept).
        self._node_owners: dict[str, str] = {}
        # Node id -> the highest sequence number stored of it: a new operation above it takes a free place.
        self._tails: dict[str, int] = {}
        # Whether the listeners want an "operation" event (a wire dict) for every stored operation now; the
        # operational surface, which only forwards them to live event streams, says no while none is open.
        self.wants_operation_events: Callable[[], bool] = lambda: True
        # The store's compaction horizon as a relay last read it (see `relay`).
        self._horizon = 0

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def schema(self) -> SchemaDefinition:
        schema = getattr(self.store, "schema", None)
        if schema is None:
            raise OfflineError(
                "the server store has no schema; call `await store.set_schema(schema)` before starting",
                "SYNC_ERROR",
                {"field": "schema"},
            )
        return schema  # type: ignore[no-any-return]

    async def start(self) -> None:
        if self.started:
            return
        schema = self.schema
        node_id = await self.store.get_meta("server_node_id")
        if not is_server_node_id(node_id):
            node_id = await self._create_node_id()
        self.node_id: str = node_id
        await self._register_server_node(node_id)
        self.delivery_epoch: str | None = await self.store.get_meta(DELIVERY_EPOCH)
        self.clock = HybridLogicalClock(node_id, now=self._now)
        self.legacy_node_ids: tuple[str, ...] = tuple(
            json.loads(await self.store.get_meta(LEGACY_NODE_IDS) or "[]")
        )
        self.engine = MergeEngine(schema, authoritative_nodes=(node_id, *self.legacy_node_ids))
        self.cache = RecordCache(schema, self._refold)
        async for row in self.store.load_all_rows():
            self.cache.put(row)
        if len(self.cache.rows) >= _FREEZE_AT:
            # What startup loaded (the cache's records, the schema, modules) lives as long as the process:
            # exempt it from the full garbage collections a write load triggers.
            gc.collect()
            gc.freeze()
        self.watermark = await self.store.max_delivery()
        self._tails = await self.store.version_vector()
        self._seq = self._tails.get(node_id, 0)
        self.participating = participating_collections(schema)
        unknown = sorted(set(self.rules) - set(schema.collections))
        if unknown:  # a misspelt name would leave the collection without its rule
            raise OfflineError(
                f"sync_options['rules'] names collections the schema does not have: {', '.join(unknown)}",
                "SYNC_ERROR",
                {"field": "sync_options.rules"},
            )
        self.scope_fields: dict[str, tuple[str, ...]] = {}
        for name, where in _bindings(schema).items():
            self.scope_fields[name] = tuple(where)
        min_version = min(schema.migrations) - 1 if schema.migrations else schema.version
        self.supported_schema = (max(1, min_version), schema.version)
        await self.store.listen(self._on_remote_commit)
        self.live.start()
        self.started = True

    async def _create_node_id(self) -> str:
        """Give a database its (marked) server node id, once: processes starting together must agree on it.

        A database of a server from before the marker (offline.core.server_nodes) moves to a marked id; its
        old id stays authoritative here (meta LEGACY_NODE_IDS) for the operations written under it.
        Clients see a new server id and resync their delivery watermark from 0 once.
        """
        candidate = new_server_node_id()
        if self.store.kind != "postgresql":  # one process owns a memory or SQLite store
            await self._retire_node_id(self.store, await self.store.get_meta("server_node_id"))
            await self.store.set_meta("server_node_id", candidate)
            return candidate
        # Decide under the cross-process write lock; a process that got there first has committed its id.
        async with self.store.writer() as writer:
            existing = await self.store.get_meta("server_node_id")
            if is_server_node_id(existing):
                return str(existing)
            await self._retire_node_id(writer, existing)
            await writer.set_meta("server_node_id", candidate)
        return candidate

    async def _register_server_node(self, node_id: str) -> None:
        """Register the server's node id to the server, so that no handshake can claim it."""
        owner = await self.store.claim_node(node_id, SERVER_PRINCIPAL)
        if owner != SERVER_PRINCIPAL:
            # Registered by a client before this store knew it as the server's (a restored backup): the
            # server's id is refused to clients whatever the registry says (bind_node, _judge).
            log.error("the server's node id %s is registered to a client (%s)", node_id, owner)
        self._node_owners[node_id] = SERVER_PRINCIPAL

    async def bind_node(self, node_id: str, claims: Mapping[str, Any] | None) -> bool:
        """May a session with these claims speak as ``node_id``? Registers the node id to the claims'
        principal when it is new: the first principal to use a node id keeps it, except that a signed-in
        user takes over a node of the anonymous principal (a server that had no sign-in before, whose devices
        then sign in). Never the server's own node id, nor any server's (a marked id, offline.core.server_nodes)."""
        if node_id == self.node_id or is_server_node_id(node_id) or node_id in self.legacy_node_ids:
            return False
        principal = principal_of(claims)
        owner = self._node_owners.get(node_id)
        if owner is None or self._may_change(owner):
            owner = (await self.store.node_principals([node_id])).get(node_id)
            if owner is None or (owner == ANONYMOUS_PRINCIPAL and principal != ANONYMOUS_PRINCIPAL):
                if principal != ANONYMOUS_PRINCIPAL and not await self._wrote_within(node_id, claims):
                    return False
                owner = await self.store.claim_node(node_id, principal, replacing=ANONYMOUS_PRINCIPAL)
            self._node_owners[node_id] = owner
        return owner == principal

    async def _wrote_within(self, node_id: str, claims: Mapping[str, Any] | None) -> bool:
        """Whether everything a node no user has registered yet has written (in a database from before the
        registry, or under the anonymous principal) lies within the scope of these claims: its own user may
        take it, another may not."""
        filters = self.resolve_scope(claims, None)
        return all(_in_scope(filters, c, scope) for c, scope in await self.store.node_scopes(node_id))

    async def restore_node_owners(self, owners: Mapping[str, str]) -> None:
        """Register node ids to the principals a backup names, where this store has not registered them
        already (a restored server goes on refusing each device's id to every other principal)."""
        for node_id, principal in owners.items():
            self._node_owners[node_id] = await self.store.claim_node(node_id, principal)

    def _may_change(self, owner: str) -> bool:
        """Whether a registration read earlier may have changed since (in another process): only an
        anonymous one, and only on a server with sign-in."""
        return owner == ANONYMOUS_PRINCIPAL and self.auth is not None

    async def _learn_owners(self, group: list[_Request]) -> None:
        """Read the registrations of the nodes whose operations sessions send besides their own."""
        owners = self._node_owners
        unknown = {
            op.node_id
            for request in group
            if request.session is not None
            for op in request.ops
            if op.node_id != request.session.node_id
            and (op.node_id not in owners or self._may_change(owners[op.node_id]))
        }
        if unknown:
            self._node_owners.update(await self.store.node_principals(unknown))

    def _may_speak_for(self, session: Session, node_id: str) -> bool:
        """A session sends its own node's operations, and those of other nodes of its principal (a user's
        devices relaying each other's writes); never the server's."""
        if node_id == session.node_id:
            return True
        return node_id != self.node_id and self._node_owners.get(node_id) == session.principal

    async def _retire_node_id(self, target: Any, old: str | None) -> None:
        if old is None:
            return
        legacy = json.loads(await self.store.get_meta(LEGACY_NODE_IDS) or "[]")
        if old not in legacy:
            await target.set_meta(LEGACY_NODE_IDS, json.dumps([*legacy, old]))

    async def stop(self) -> None:
        self.started = False
        await self.live.stop()
        for session in list(self.sessions):
            session.wake.set()

    def emit(self, kind: str, payload: dict[str, Any]) -> None:
        for listener in list(self.listeners):
            try:
                listener(kind, payload)
            except Exception:
                log.exception("sync listener failed")

    # -- other processes ----------------------------------------------------------------------------------------

    async def _on_remote_commit(self, max_delivery: int) -> None:
        if max_delivery <= self.watermark:
            return
        async with self._lock:
            await self._catch_up(self.store)
        self._wake_sessions()

    async def _catch_up(self, reader: Any) -> None:
        """Fold in operations other processes committed since our watermark (their rows are stored)."""
        missed: list[StoredOperation] = await reader.operations_since(self.watermark)
        if not missed:
            return
        keys = list(dict.fromkeys((s.operation.collection, s.operation.record_id) for s in missed))
        rows = await reader.load_rows(keys)
        # Read after the operations: a compaction through another process that deleted some of them before
        # we read them committed its horizon with the deletions, so it is seen here. Taken in together with
        # the operations (no await between), so a relay never serves them from memory under the old horizon:
        # sessions below it get record states instead (see `relay`).
        horizon = await reader.compaction_horizon()
        if horizon is None:
            horizon = await self.store.compaction_horizon()
        self._horizon = max(self._horizon, horizon)
        for row in rows.values():
            self.cache.put(row)
        self._remember(missed)
        self.watermark = max(self.watermark, missed[-1].delivery)
        self._note_places(missed)
        self._seq = max(self._seq, self._tails.get(self.node_id, 0))

    def _note_places(self, stored: list[StoredOperation]) -> None:
        tails = self._tails
        for item in stored:
            op = item.operation
            if op.sequence_number > tails.get(op.node_id, 0):
                tails[op.node_id] = op.sequence_number

    async def _held_places(
        self, writer: Any, group: list[_Request], known: set[str]
    ) -> dict[tuple[str, int], str]:
        """The stored operations at the places (node id, sequence number) of the group's new operations that
        are not above their node's highest stored one (a resent batch, a peer's forgery): rarely any."""
        tails = self._tails
        wanted = [
            (op.node_id, op.sequence_number)
            for request in group
            for op in request.ops
            if op.sequence_number <= tails.get(op.node_id, 0) and op.id not in known
        ]
        if not wanted:
            return {}
        held: dict[tuple[str, int], str] = await writer.held_places(wanted)
        return held

    # -- scope ------------------------------------------------------------------------------------------------------

    async def authenticate(self, token: str | None) -> Mapping[str, Any] | None:
        """Claims of a valid token; None when the server has no auth provider. Raises on a bad token."""
        if self.auth is None:
            return None
        verify = getattr(self.auth, "authenticate", self.auth)
        claims = verify(token)
        if asyncio.iscoroutine(claims):
            claims = await claims
        if claims is None:
            raise OfflineError("authentication failed", p.AUTH_FAILED, {})
        return dict(claims)

    def resolve_scope(
        self, claims: Mapping[str, Any] | None, requested: Mapping[str, Any] | None
    ) -> dict[str, dict[str, Any]]:
        """Per collection, the filter a session gets: claims win; a client may narrow, never widen."""
        schema = self.schema
        bindings = _bindings(schema)
        requested = requested or {}
        out: dict[str, dict[str, Any]] = {}
        values = extract_scope_values_from_claims(schema, claims) if claims is not None else None
        granted = build_scope_map(schema, values) if values is not None else {}
        for name in self.participating:
            where = bindings.get(name)
            asked = requested.get(name) if isinstance(requested.get(name), Mapping) else {}
            if claims is not None and where:
                filt = dict(granted.get(name, {}))
                if len(filt) < len(where):
                    continue  # the claims lack a scope value this collection needs: nothing is visible
            else:
                filt = {}
            for key, value in (asked or {}).items():
                if key not in filt:  # narrowing on a field the grant leaves open
                    filt[key] = value
            out[name] = filt
        return out

    def _scope_snapshot(
        self,
        collection: str,
        record: Mapping[str, Any] | None,
        before: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """The record's scope values as the relay judges an operation by; when the operation changed them,
        the values before it too, under ``"$from"`` (see `relay`)."""
        fields = self.scope_fields.get(collection)
        if not fields:
            return None
        record = record or {}
        snapshot = {f: record.get(f) for f in fields}
        if before is not None:
            previous = {f: before.get(f) for f in fields}
            if previous != snapshot:
                snapshot[MOVED_FROM] = previous
        return snapshot

    # -- the write pipeline ------------------------------------------------------------------------------------

    async def commit(
        self, session: Session | None, raw_ops: list[Operation]
    ) -> dict[str, Refusal | int | None]:
        """Judge, apply and store ``raw_ops``; returns op id -> delivery (new), None (duplicate) or Refusal.

        Batches that arrive while a commit is under way are committed together after it, in one store
        transaction (group commit): one durable commit (an fsync) serves many clients, each batch judged in
        arrival order as if alone, each caller answered only once everything is stored.
        """
        if not raw_ops:
            return {}
        self.counters["received"] += len(raw_ops)
        request = _Request(session, list(raw_ops), asyncio.get_running_loop().create_future())
        request.future.add_done_callback(_retrieve)
        self._queue.append(request)
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_queued(), name="offline-commit")
        # Shielded: a caller that goes away (its connection dropped) does not cancel the others' commit.
        return await asyncio.shield(request.future)

    async def _commit_queued(self) -> None:
        while self._queue:
            group, self._queue = self._queue, []
            try:
                await self._commit_judged(group)
            except asyncio.CancelledError:
                _fail(group, OfflineError("the server stopped before storing the batch", p.SERVER_SHUTDOWN))
                _fail(
                    self._queue,
                    OfflineError("the server stopped before storing the batch", p.SERVER_SHUTDOWN),
                )
                self._queue = []
                raise
            except Exception as exc:
                if len(group) == 1:
                    _fail(group, exc)
                    continue
                # Nothing of the group was stored: commit each batch alone, so only a failing one fails.
                for request in group:
                    try:
                        await self._commit_judged([request])
                    except Exception as alone:
                        _fail([request], alone)

    async def _commit_judged(self, group: list[_Request]) -> None:
        try:
            await self._commit_group(group)
        except WriteConflict:
            # Another process wrote to the store since its last commit here (nothing of this group was
            # written): judge the group again, after what it wrote (the store's next writer reads it first).
            log.warning("the store was written to by another process; judging the batch again")
            await self._commit_group(group)

    async def _commit_group(self, group: list[_Request]) -> None:
        started = time.perf_counter()
        received = sum(len(r.ops) for r in group)
        # (Here, not in `commit`: a batch reaches the queue without waiting, so batches keep their order.)
        await self._learn_owners(group)
        seq_before = self._seq
        # (request index or -1 for the server's own operations, operation, scope snapshot), in commit order.
        accepted: list[tuple[int, Operation, dict[str, Any] | None]] = []
        outcomes: list[dict[str, Refusal | int | None]] = [{} for _ in group]
        try:
            # Optimistic: with SQLite, the usual group (new operations from clients) is stored in one trip
            # to the database's thread, BEGIN to COMMIT, where holding the lock from the start takes three
            # (the difference in latency is large at a few hundred writes a second: batches queue behind it).
            async with self._lock, self.store.writer(optimistic=True) as writer:
                await self._catch_up(writer)
                known = await writer.known_operations([op for r in group for op in r.ops])
                places = await self._held_places(writer, group, known)
                view = StagedView(self.cache)
                taken: set[str] = set()  # accepted earlier in this group
                for index, request in enumerate(group):
                    self._judge_batch(request, outcomes[index], index, view, known, taken, accepted, places)
                # Each state is encoded once, for the store and the cache alike.
                rows = [
                    row
                    if row.state_text is not None
                    else RecordRow(row.collection, row.record_id, row.state, row.record, row.state.to_json())
                    for row in view.rows.values()
                ]
                if accepted:
                    sequences = await writer.append([(op, snapshot) for _, op, snapshot in accepted])
                    await writer.save_rows(rows)
                else:
                    sequences = []
        except BaseException:
            self._seq = seq_before  # the server operations written for this group were not stored
            raise
        # Committed: publish to the cache, the relay and the callers.
        for row in rows:
            self.cache.put(row)
        stored: list[StoredOperation] = []
        for (index, op, snapshot), delivery in zip(accepted, sequences, strict=True):
            results = outcomes[index] if index >= 0 else None
            if delivery is None:
                if results is not None:
                    results[op.id] = None
                continue
            if results is not None and op.id in results:
                results[op.id] = delivery
            stored.append(StoredOperation(delivery, op, snapshot))
        if stored:
            self._remember(stored)
            self.watermark = max(self.watermark, stored[-1].delivery)
            self._note_places(stored)
        for results in outcomes:
            self.counters["accepted"] += sum(1 for v in results.values() if isinstance(v, int) and v)
            self.counters["duplicates"] += sum(1 for v in results.values() if v is None)
            for value in results.values():
                if isinstance(value, Refusal):
                    self.rejections[value.code] = self.rejections.get(value.code, 0) + 1
        if self.listeners:
            if self.wants_operation_events():
                for item in stored:
                    self.emit("operation", {"operation": item.operation.to_wire(), "delivery": item.delivery})
            for request, results in zip(group, outcomes, strict=True):
                records: dict[str, Operation] | None = None  # built only for a batch with a refusal
                for op_id, value in results.items():
                    if isinstance(value, Refusal):
                        if records is None:
                            records = {op.id: op for op in request.ops}
                        refused = records[op_id]
                        self.emit(
                            "rejected",
                            {
                                "operationId": op_id,
                                "collection": refused.collection,
                                "recordId": refused.record_id,
                                "code": value.code,
                                "message": value.message,
                            },
                        )
        self._wake_sessions()
        self.emit("commit", {"seconds": time.perf_counter() - started, "operations": received})
        for request, results in zip(group, outcomes, strict=True):
            if not request.future.done():
                request.future.set_result(results)

    def _judge_batch(
        self,
        request: _Request,
        results: dict[str, Refusal | int | None],
        index: int,
        view: StagedView,
        known: set[str],
        taken: set[str],
        accepted: list[tuple[int, Operation, dict[str, Any] | None]],
        places: dict[tuple[str, int], str],
    ) -> None:
        """Judge one client batch into ``view`` (after the batches before it in the group). ``places``: the
        operation ids at (node id, sequence number) places taken in the store or by this group so far."""
        session = request.session
        deleted: list[tuple[str, str, dict[str, Any]]] = []
        for op in topological_sort(request.ops):
            if op.id in known or op.id in results or op.id in taken:
                results.setdefault(op.id, None)
                continue
            if session is not None:
                refusal = self._identity_problem(session, op)
                if refusal is not None:
                    results[op.id] = refusal
                    continue
            place = (op.node_id, op.sequence_number)
            holder = places.get(place)
            if holder == COMPACTED:
                # Stored once and deleted by compaction since (see server_runtime.stores.compaction).
                results[op.id] = None
                continue
            if holder is not None and holder != op.id:
                # Every replica refuses a batch holding two operations of one node under one number: stored,
                # this one would stop every client it is relayed to from syncing.
                results[op.id] = Refusal(
                    p.INVALID_OPERATION,
                    f"sequenceNumber {op.sequence_number} of node {op.node_id} is taken by another operation",
                )
                continue
            refusal, actions, trial = self._judge(session, op, view)
            if refusal is not None or trial is None:
                results[op.id] = refusal or Refusal(p.INTERNAL_ERROR, "the operation was not judged")
                for action in actions:  # a refused insert's tombstone (judging.refused_insert_tombstone)
                    accepted.append((-1, *self._server_write(view, action)))
                continue
            before = view.record(op.collection, op.record_id)
            self._count_conflicts(op, trial.conflicts)
            view.put(trial.row)
            after = view.record(op.collection, op.record_id)
            accepted.append(
                (
                    index,
                    op,
                    self._scope_snapshot(op.collection, after if after is not None else before, before),
                )
            )
            taken.add(op.id)
            places[place] = op.id
            results[op.id] = 0
            for action in actions:  # Tier 2: the server writes the losers' side as its own operations
                accepted.append((-1, *self._server_write(view, action)))
            if op.type == "delete" and before is not None:
                deleted.append((op.collection, op.record_id, before))
        # Side effects the deleting client could not see: children it did not hold, references to clear.
        for collection, record_id, _ in deleted:
            if view.record(collection, record_id) is not None:
                continue  # revived by a newer write in the same batch
            try:
                actions = plan_record_delete(view, collection, record_id).actions
            except OfflineError as exc:
                # Blocked only by writes later in this same batch; the delete itself was judged valid.
                log.warning("delete side effects of %s/%s skipped: %s", collection, record_id, exc.message)
                actions = []
            for action in actions:
                accepted.append((-1, *self._server_write(view, action)))

    async def compact(self) -> dict[str, Any]:
        """Compact the store's history (`ServerStore.compact`): ``{"horizon", "dropped", "kept"}``. Sessions
        that resume below the horizon get record states (see `relay`)."""
        started = time.perf_counter()
        # The horizon is announced before anything is deleted: a relay reading the log meanwhile then
        # drops what it read and sends states instead (see `relay`); states sent early are only a superset.
        horizon = await self.store.max_delivery()
        self._horizon = max(self._horizon, horizon)
        result = await self.store.compact(horizon)
        log.info(
            "compacted the operation log up to delivery %d: %d operations deleted, %d kept (%.2f s)",
            result["horizon"],
            result["dropped"],
            result["kept"],
            time.perf_counter() - started,
        )
        return result

    def stored_row(
        self, collection: str, record_id: str, state_text: str, record: dict[str, Any] | None
    ) -> RecordRow:
        """A row from a stored state text (as a store reads it back; a `ONE_OPERATION` text is folded with
        this server's engine when first used)."""
        return StoredRecordRow(collection, record_id, state_text, record, self._refold)

    async def restore_compaction(
        self,
        rows: list[RecordRow],
        record_versions: Mapping[RecordKey, Mapping[str, int]],
        node_marks: Mapping[str, int],
        horizon: int,
    ) -> None:
        """Restore what a compaction left (`ServerStore.restore_compaction`: the compacted records' rows,
        the deleted operations' numbers, the horizon) and serve those rows from now on."""
        async with self._lock:
            await self.store.restore_compaction(rows, record_versions, node_marks, horizon)
            for row in rows:
                self.cache.put(row)
            self._horizon = max(self._horizon, horizon)

    async def renumber_deliveries(self) -> str:
        """Announce a new numbering of deliveries (``HandshakeResponse.delivery_epoch``): called before a
        backup is restored into an empty server, which numbers the backed-up operations from 1 and its new
        writes after them. Devices that synced with the backed-up server (the same node id, adopted) then
        start over from delivery 0 instead of resuming from a watermark counted in the other numbering,
        which would skip every operation numbered at or below it here."""
        epoch = str(uuid.uuid4())
        async with self._lock:
            await self.store.set_meta(DELIVERY_EPOCH, epoch)
            self.delivery_epoch = epoch
        return epoch

    async def adopt_node_id(self, node_id: str) -> None:
        """Take over another server's identity (restoring its backup into an empty store). A server's id from
        before the marker (offline.core.server_nodes) is kept authoritative instead, as a database of that
        server would (`_create_node_id`): this server goes on writing under its own marked id."""
        async with self._lock:
            if not is_server_node_id(node_id):
                await self._retire_node_id(self.store, node_id)
                self.legacy_node_ids = tuple(json.loads(await self.store.get_meta(LEGACY_NODE_IDS) or "[]"))
                node_id = self.node_id
            await self.store.set_meta("server_node_id", node_id)
            self.node_id = node_id
            self.clock = HybridLogicalClock(node_id, now=self._now)
            self.engine = MergeEngine(self.schema, authoritative_nodes=(node_id, *self.legacy_node_ids))
            self._tails = await self.store.version_vector()
            self._seq = self._tails.get(node_id, 0)
        await self._register_server_node(node_id)

    def _deleted_values(self, view: StagedView, collection: str, record_id: str) -> dict[str, Any] | None:
        """What a record the server holds but that is not alive was before its delete (None: no such)."""
        key = (collection, record_id)
        if key not in view.rows and key not in view.cache.rows:
            return None
        return self.engine.last_values(collection, record_id, view.state(collection, record_id))

    def _refold(self, op: Operation) -> RecordState:
        """What ``op`` makes of an empty state (how the cache reads a `stores.base.ONE_OPERATION` text)."""
        return self.engine.state_of((op,))

    def _apply(self, view: StagedView, op: Operation) -> None:
        state = view.state(op.collection, op.record_id)
        self._count_conflicts(op, self.engine.apply(state, op))
        record = self.engine.materialize(op.collection, op.record_id, state)
        view.put(RecordRow(op.collection, op.record_id, state, record))

    def _count_conflicts(self, op: Operation, conflicts: list[Conflict]) -> None:
        for conflict in conflicts:
            self.conflicts[conflict.strategy] = self.conflicts.get(conflict.strategy, 0) + 1
            self.emit(
                "conflict",
                {
                    "collection": op.collection,
                    "recordId": op.record_id,
                    "field": conflict.field,
                    "strategy": conflict.strategy,
                    "tier": conflict.tier,
                    "output": conflict.output,
                },
            )

    def _server_write(self, view: StagedView, action: Action) -> tuple[Operation, dict[str, Any] | None]:
        state = view.state(action.collection, action.record_id)
        before = view.record(action.collection, action.record_id)
        self._seq += 1
        op = create_operation(
            {
                "node_id": self.node_id,
                "type": action.type,
                "collection": action.collection,
                "record_id": action.record_id,
                "data": action.changes if action.type != "delete" else None,
                "previous_data": action.previous if action.type == "update" else None,
                "timestamp": follow_up_timestamp(self.clock, state),
                "sequence_number": self._seq,
                "causal_deps": state.heads(),
                "schema_version": self.schema.version,
                "causal_context": state.next_context(self.node_id),
            }
        )
        self._apply(view, op)
        after = view.record(action.collection, action.record_id)
        self.counters["server_ops"] += 1
        return op, self._scope_snapshot(action.collection, after if after is not None else before, before)

    def _identity_problem(self, session: Session, op: Operation) -> Refusal | None:
        """Whether the session may send this operation as its node's, numbered so (judged first)."""
        forged = forged_authority(op, (self.node_id, *self.legacy_node_ids))
        if forged is not None:
            return Refusal(p.NODE_ID_MISMATCH, forged)
        if not self._may_speak_for(session, op.node_id):
            return Refusal(p.NODE_ID_MISMATCH, "this session may not send operations of node " + op.node_id)
        if op.sequence_number < 1:
            # (The decoder bounds it above by 2**53-1.) The server numbers its own operations from its own
            # alone: no client may write as the server's node.
            return Refusal(p.INVALID_OPERATION, "sequenceNumber must be at least 1")
        return None

    def _judge(
        self, session: Session | None, op: Operation, view: StagedView
    ) -> tuple[Refusal | None, list[Action], _Trial | None]:
        """Decide one operation. On acceptance also return the Tier 2 actions it implies and the trial
        result (new state, record, conflicts), which `commit` keeps instead of applying the op again."""
        schema = self.schema
        collection = schema.collections.get(op.collection)
        if collection is None:
            return Refusal(p.INVALID_OPERATION, f"unknown collection {op.collection!r}"), [], None
        lo, hi = self.supported_schema
        if not lo <= op.schema_version <= hi:
            return (
                Refusal(
                    p.INVALID_OPERATION,
                    f"schemaVersion {op.schema_version} is not supported (server accepts {lo} to {hi})",
                ),
                [],
                None,
            )
        fields = self.engine.op_fields(op) if op.type != "delete" else {}
        if op.type != "delete":
            raw_names = set(op.data or {})
            upgraded = set(fields)
            for name in raw_names - upgraded:
                if op.schema_version == hi:
                    return Refusal(p.INVALID_OPERATION, f"{op.collection} has no field {name!r}"), [], None
            raw: Mapping[str, Any] = op.data or {}
            for name in upgraded:
                descriptor = collection.fields[name]
                value = raw.get(name, fields[name])
                if descriptor.type == "richtext":
                    if value is not None and not isinstance(value, (bytes, str)):
                        return (
                            Refusal(
                                p.INVALID_OPERATION, f"{op.collection}.{name} must carry a rich text update"
                            ),
                            [],
                            None,
                        )
                    continue
                if descriptor.is_auto and op.type == "update":
                    return (
                        Refusal(p.INVALID_OPERATION, f"{op.collection}.{name} is set automatically"),
                        [],
                        None,
                    )
                try:
                    validate_field_value(op.collection, name, descriptor, value)
                except OfflineError as exc:
                    return Refusal(p.INVALID_OPERATION, exc.message), [], None
        if op.timestamp.wall_time > self._now() + MAX_DRIFT_MS:
            return (
                Refusal(p.CLOCK_DRIFT, "the operation is stamped more than 5 minutes in the future"),
                [],
                None,
            )
        before = view.record(op.collection, op.record_id)
        if session is not None:
            if op.collection not in session.filters:
                return (
                    Refusal(p.SCOPE_VIOLATION, f"this session may not write to {op.collection!r}"),
                    [],
                    None,
                )
            if before is not None and not session.matches(op.collection, before):
                return Refusal(p.SCOPE_VIOLATION, "the record is outside this session's scope"), [], None
            if before is None and session.filters[op.collection]:
                # A deleted record is judged by the scope it had before its delete: nobody moves someone
                # else's deleted record (and its content) into their own scope by writing to it.
                last = self._deleted_values(view, op.collection, op.record_id)
                if last is not None and not session.matches(op.collection, last):
                    return (
                        Refusal(p.SCOPE_VIOLATION, "the deleted record is outside this session's scope"),
                        [],
                        None,
                    )
            rule = self.rules.get(op.collection)
            if rule is not None and not _rule_allows(rule, session.claims, op):
                return (
                    Refusal(p.SCOPE_VIOLATION, f"the write rule of {op.collection!r} refuses this {op.type}"),
                    [],
                    None,
                )
        problem = self.engine.transition_problem(op)
        if problem is not None and problem[3] == "reject":
            name, source, allowed, _ = problem
            return (
                Refusal(
                    p.INVALID_TRANSITION,
                    f"{op.collection}.{name} cannot move from {source!r} (allowed: {allowed})",
                ),
                [],
                None,
            )
        # Apply the write to a copy to see the record it would make; accepted, the copy becomes the state.
        key = (op.collection, op.record_id)
        # (Not for this server's own operations: its engine, whose node is authoritative, may fold those
        # otherwise than the stores' engine reading the text back.)
        fresh = key not in view.rows and key not in view.cache.rows and op.node_id != self.node_id
        fold = self.engine.insert_fold(op, op.record_id) if fresh and op.type == "insert" else None
        trial: _Trial
        if fold is not None:
            # A new record's insert (the usual write): the record as the engine folds it straight from the
            # operation, the same as applying it to an empty state and materializing, without building that
            # state; the row parses it from the operation only if another write of the group needs it.
            after = fold.record
            row = StoredRecordRow(op.collection, op.record_id, one_operation_state(op), after, self._refold)
            trial = _Trial(row, [])
        else:
            state = view.state(op.collection, op.record_id)
            context = op.causal_context
            if context is not None and state.holds_dot(op.node_id, context[op.node_id]):
                # Another operation holds this number (the log already refused a repeat by id): folded,
                # replicas would disagree on which of the two counts (merge engine, "Bounded state").
                return (
                    Refusal(
                        p.INVALID_OPERATION,
                        f"causalContext numbers this operation {context[op.node_id]} among the writes of "
                        f"node {op.node_id} to the record, a number another operation holds",
                    ),
                    [],
                    None,
                )
            if context is not None and state.opens_a_gap_too_many(op.node_id, context[op.node_id]):
                # Each gap keeps a run of numbers in the record's state: a writer skipping numbers at will
                # would grow it by one a write.
                return (
                    Refusal(
                        p.INVALID_OPERATION,
                        f"causalContext numbers this operation {context[op.node_id]} among the writes of "
                        f"node {op.node_id} to the record, leaving a gap below it, and the record holds "
                        f"{MAX_GAPS} gaps in that node's numbers already; number writes one after another",
                    ),
                    [],
                    None,
                )
            if key in view.rows:  # staged states are the batch's own objects
                state = type(state).from_json(state.to_json())
            conflicts = self.engine.apply(state, op)
            after = self.engine.materialize(op.collection, op.record_id, state)
            # A record's first operation: its state is stored as its text (stores.base.ONE_OPERATION).
            text = one_operation_state(op) if fresh else None
            trial = _Trial(RecordRow(op.collection, op.record_id, state, after, text), conflicts)
        if session is not None:
            if after is not None and not session.matches(op.collection, after):
                return (
                    Refusal(p.SCOPE_VIOLATION, "the write would put the record outside this session's scope"),
                    [],
                    None,
                )
            if (
                before is None
                and after is None
                and op.type != "delete"
                and not session.matches(op.collection, fields)
            ):
                # A write to a record the server does not hold must carry in-scope values itself.
                return (
                    Refusal(p.SCOPE_VIOLATION, "the written values are outside this session's scope"),
                    [],
                    None,
                )
        try:
            if op.type == "delete":
                if before is not None:
                    plan_record_delete(view, op.collection, op.record_id)  # raises for 'restrict'/refusals
                return None, [], trial
            actions = judge_write(
                view,
                op,
                after,
                before,
                constrained=bool(collection.constraints),
                children=session is not None,  # (None: a restored backup, judged by its own server)
            )
            return None, actions, trial
        except OfflineError as exc:
            return Refusal(p.CONSTRAINT_VIOLATION, exc.message), refused_insert_tombstone(view, op), None
        return None, [], trial

    # -- relay ----------------------------------------------------------------------------------------------------

    def _wake_sessions(self) -> None:
        for session in self.sessions:
            session.wake.set()

    def _remember(self, stored: list[StoredOperation]) -> None:
        """Keep newly committed operations for the relay (their wire JSON is encoded once, on first use)."""
        recent = self._recent
        recent.extend(Relayed.of(item) for item in stored)
        keep = self.limits.recent_operations
        if len(recent) > 2 * keep:
            del recent[: len(recent) - keep]

    async def read_since(self, cursor: int, limit: int) -> list[Relayed]:
        """Committed operations after delivery ``cursor``, at most ``limit``, as the relay sends them."""
        recent = self._recent
        if recent and recent[0].delivery <= cursor + 1:
            start = bisect.bisect_right(recent, cursor, key=_delivery)
            return recent[start : start + limit]
        texts = getattr(self.store, "operation_texts_since", None)
        if texts is not None:  # the stored wire text as it is: nothing to decode or encode again
            rows = await texts(cursor, limit)
            return [
                Relayed(d, node, coll, record, decode_optional(scope), wire)
                for d, node, coll, record, scope, wire in rows
            ]
        return [Relayed.of(item) for item in await self.store.operations_since(cursor, limit)]

    def catch_up_selectors(self, session: Session) -> list[ScopeSelector] | None:
        """What a catch-up of ``session`` reads (`ServerStore.operations_in_scope`): per visible collection,
        its operations of one of the filter's values, or all of them; None when the session sees every
        collection whole, i.e. the whole log.

        Every operation the session is shown holds each of its filter's values after it, or before it when
        it moved its record out of the scope, so one value's operations are a superset, which `_visible`
        judges as it judges the whole log. A value of None matches records without the field, which the
        scope index does not list: such a filter reads the collection."""
        filters = session.filters
        if session.open and self.participating <= filters.keys():
            return None
        selectors: list[ScopeSelector] = []
        for collection, filt in filters.items():
            fields = [f for f, v in filt.items() if v is not None]
            # The schema's scope fields first: every operation's snapshot holds them.
            fields.sort(key=lambda f: f not in self.scope_fields.get(collection, ()))
            if fields:
                selectors.append(ScopeSelector(collection, fields[0], filt[fields[0]]))
            else:
                selectors.append(ScopeSelector(collection))
        return selectors

    async def _page(
        self, session: Session, selectors: list[ScopeSelector] | None, limit: int
    ) -> tuple[list[Relayed], int, bool]:
        """The next operations to judge for ``session`` from its cursor: ``(operations, through, final)``.

        Everything up to delivery ``through`` that the session may be shown is in ``operations``; ``final``:
        that reached the end of the log. A session that sees only part of the log and is more than a page
        behind reads through the stores' scope index (its catch-up costs what it may see, whatever the
        length of the log); otherwise the log is read from the cursor (live updates come from memory).
        """
        cursor = session.cursor
        recent = self._recent
        live = bool(recent) and recent[0].delivery <= cursor + 1 and self.watermark - cursor <= limit
        if live:
            batch = await self.read_since(cursor, limit)
        elif selectors is None:
            async with self._catch_up_reads:
                batch = await self.read_since(cursor, limit)
                await self._read_horizon()
        else:
            async with self._catch_up_reads:
                page = await self.store.operations_in_scope(cursor, limit, selectors)
                await self._read_horizon()
            batch = [
                Relayed(d, node, coll, record, decode_optional(scope), wire)
                for d, node, coll, record, scope, wire in page.operations
            ]
            return batch, max(page.through, cursor), page.complete
        return batch, batch[-1].delivery if batch else cursor, len(batch) < limit

    async def _read_horizon(self) -> int:
        """The compaction horizon as the store has it now (`relay` drops a page read from the store when it
        moved: the page may lack what the compaction deleted).

        Read after the page: a compaction commits its horizon with its deletions, so one that deleted part of
        the page is seen here. This process knows of its own compactions; one done through another process
        sharing the database (PostgreSQL) is known only from the store, and no notification tells of it.
        """
        self._horizon = max(self._horizon, await self.store.compaction_horizon())
        return self._horizon

    # -- state-based catch-up (after a compaction; see server_runtime.stores.compaction) -----------------------

    async def _states(self, keys: list[RecordKey], session: Session | None = None) -> list[dict[str, Any]]:
        """The ``record-states`` entries of these records (those with a row), as ``session`` may see them.

        The versions are read first, then the rows: a commit stores operations and rows at once, so the
        rows hold at least what the versions name. Under the commit lock, so no commit of this process
        lands between the two reads (the rows then hold exactly that).

        A record outside the session's scope is sent only because it left the scope (its client holds it
        and must drop it): its state then carries the scope fields alone (`_left_scope`), which is all the
        client reads of it before dropping it, and not what was written to it in its new scope.
        """
        async with self._lock:
            versions = await self.store.record_versions(keys)
            rows = await self.store.load_rows(keys)
        out: list[dict[str, Any]] = []
        for key in keys:
            row = rows.get(key)
            if row is None:
                continue
            text = row.state_text
            if session is not None and not session.open:
                # A deleted record is judged by what it was before its delete (its state still holds that).
                values = row.record
                if values is None:
                    values = self.engine.last_values(key[0], key[1], row.state)
                if values is not None and not session.matches(key[0], self._scope_snapshot(key[0], values)):
                    text = self._left_scope(key[0], row.state)
            if text is None:
                text = row.state.to_json()
            elif text[:1] == ONE_OPERATION:
                # A state kept as its one operation: the client wants the state (built from the operation).
                text = one_operation_json(self.engine, text)
            out.append(
                {
                    "collection": key[0],
                    "recordId": key[1],
                    "state": numbers_listed(text),  # (a client from before runs may be reading)
                    "versions": versions.get(key, {}),
                }
            )
        return out

    def _left_scope(self, collection: str, state: RecordState) -> str:
        """``state`` with the collection's scope fields only (a record that left a session's scope)."""
        fields = self.scope_fields.get(collection, ())
        kept = state.copy()
        kept.fields = {name: register for name, register in kept.fields.items() if name in fields}
        return kept.to_json()

    async def _send_states(
        self, session: Session, keys: list[RecordKey], horizon: int | None, *, through: int | None = None
    ) -> None:
        """Send ``keys``' states to ``session`` in messages of at most a batch's size; the last is final and
        carries ``horizon`` when given (the end of a state-based catch-up), else none is final and each
        carries ``through`` (how far a catch-up's scan of the log went)."""
        limit = self.limits.batch_size
        chunks = [keys[i : i + limit] for i in range(0, len(keys), limit)] or [[]]
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1 and horizon is not None
            states = await self._states(chunk, session) if chunk else []
            if not states and not last:
                continue
            if session.take_states is not None:  # (not sent: counted as the snapshot's, when it is)
                await session.take_states(states, horizon if last else None, None if last else through)
                continue
            message = p.RecordStates(
                message_id=p.new_message_id(),
                states=tuple(states),
                is_final=last,
                horizon=horizon if last else None,
                through=None if last else through,
            )
            await session.send(p.encode(message))
            self.counters["states_sent"] += len(states)

    async def _sees_more_than(self, selectors: list[ScopeSelector] | None, after: int = 0) -> bool:
        """Whether a session reading through ``selectors`` after delivery ``after`` (0 for a fresh one, else
        where its cut first sync by states got to) may be shown more than ``state_sync_after`` operations,
        which decides its first sync, or the rest of it, by states.

        The threshold is about what the device would receive: a scoped session whose scope holds a few
        operations of a long log gets them as operations (and keeps them, as a device on a short log does).
        One bounded read through the scope indexes (at most threshold + 1 per selector) tells, over a
        superset of what the session is shown (`ScopedPage`), so a scope near the threshold may get states
        where operations would do, never the reverse; either way converges. A session seeing the whole log
        is judged by its length."""
        threshold = self.limits.state_sync_after
        if self.watermark - after <= threshold:
            return False
        if selectors is None:
            return True
        async with self._catch_up_reads:
            page = await self.store.operations_in_scope(after, threshold + 1, selectors)
        return not page.complete or len(page.operations) > threshold

    async def _catch_up_states(
        self, session: Session, selectors: list[ScopeSelector] | None, horizon: int
    ) -> None:
        """A session resuming below the compaction horizon: the states of its records that changed after its
        cursor up to the horizon (found through what compaction kept: each record's latest operation, read
        through the scope index for a scoped session), then a final message with the horizon."""
        cursor = session.cursor
        limit = self.limits.batch_size
        keys: dict[RecordKey, None] = {}
        # Sent as the scan finds them, a batch's worth at a time (each state is read after the horizon's
        # commits, so it holds every operation up to the horizon however late in the scan its record shows
        # up again); ``through`` tells the client how far the scan went (a first sync's progress).
        unsent: list[RecordKey] = []
        while cursor < horizon:
            if selectors is None:
                async with self._catch_up_reads:
                    batch = await self.read_since(cursor, limit)
                through = batch[-1].delivery if len(batch) >= limit else horizon
            else:
                async with self._catch_up_reads:
                    page = await self.store.operations_in_scope(cursor, limit, selectors)
                batch = [
                    Relayed(d, node, coll, record, decode_optional(scope), wire)
                    for d, node, coll, record, scope, wire in page.operations
                ]
                through = page.through if not page.complete else horizon
            for r in batch:
                if r.delivery > horizon:
                    break
                if session.open:
                    seen = r.collection in session.filters
                else:
                    # Also a record this operation moved out of the session's scope: the client drops it
                    # once the state shows it outside (as it would on receiving the operation).
                    seen = session.matches(r.collection, r.scope) or (
                        r.moved_from is not None and session.matches(r.collection, r.moved_from)
                    )
                if seen and (r.collection, r.record_id) not in keys:
                    keys[(r.collection, r.record_id)] = None
                    unsent.append((r.collection, r.record_id))
                    if len(unsent) >= limit:
                        await self._send_states(session, unsent, None, through=r.delivery)
                        unsent = []
            if through <= cursor:
                break
            cursor = through
        await self._send_states(session, unsent, horizon)

    async def _visible(
        self, session: Session, batch: list[Relayed], moved_in: list[RecordKey] | None = None
    ) -> list[str]:
        """The wire texts of ``batch`` that a session with record filters receives.

        An operation goes to the sessions whose scope its record is in after it. The sessions an operation
        moved the record out of get the record's state with its scope fields only instead (they learn where
        it went, and hear no more of it; not the operation, which may write what only the new scope may read),
        and none of the record's operations before it in ``batch``: the state goes before the batch's frames
        (an operation applied after it would bring the record back). The sessions it entered first get the
        record's state (without it they would hold only the fields written since the move; its earlier
        operations would hand them what it held in other scopes). Both kinds of record are added to
        ``moved_in``, whose states the caller sends before the frames.
        """
        node_id = session.node_id
        visible: list[tuple[str, str, str]] = []  # (collection, record id, wire text)
        if moved_in is None:
            moved_in = []
        for r in batch:
            if r.node_id == node_id:
                continue
            if session.matches(r.collection, r.scope):
                if r.moved_from is not None and not session.matches(r.collection, r.moved_from):
                    # Its state, sent before the frames (the operation then counts as held): not its earlier
                    # operations, which hold what it was given in other scopes, overwritten values included.
                    moved_in.append((r.collection, r.record_id))
                    self.counters["history_sent"] += 1
                visible.append((r.collection, r.record_id, r.wire_json()))
            elif r.moved_from is not None and session.matches(r.collection, r.moved_from):
                # Not the operation: it may write more than the move (fields of the record's new scope),
                # and its id is its content hash, so it cannot be cut down. The record's state goes instead
                # (`_states` keeps its scope fields only), before the frames, so this batch's earlier
                # operations of the record are left out: the client drops the record on the state.
                moved_in.append((r.collection, r.record_id))
                visible = [v for v in visible if v[1] != r.record_id or v[0] != r.collection]
        return [text for _, _, text in visible]

    async def relay(self, session: Session) -> None:
        """Stream the committed log to one session from its cursor: catch-up batches, then live updates."""
        limit = self.limits.batch_size
        initial = True
        index = 0
        # The client detects lost batches by checking each batch starts where the last one it got ended;
        # batches with nothing this session may see are skipped, so the base is what was last *sent*.
        last_sent = session.cursor
        resend_after, rewound_at = self.limits.ack_timeout, 0.0  # see the end of the loop
        selectors = self.catch_up_selectors(session)
        self._horizon = max(self._horizon, await self.store.compaction_horizon())
        if session.wants_states and await self._sees_more_than(selectors, session.cursor):
            # A fresh device's state-based first sync: its records' states up to the end of the log as it is
            # now, then the operations after it (the same path as a catch-up across a compaction). A device
            # whose first sync was cut asks again from the watermark its last message gave it: the records
            # touched after it, by states again.
            end = self.watermark
            await self._catch_up_states(session, selectors, end)
            session.cursor = last_sent = end
        while self.started:
            session.wake.clear()
            horizon = self._horizon
            if horizon > session.cursor:
                # What the session lacks up to the horizon was compacted (before it connected, or while it
                # caught up): record states instead of those operations, then the log after the horizon.
                await self._catch_up_states(session, selectors, horizon)
                session.cursor = last_sent = horizon
            before = session.cursor
            batch, top, final = await self._page(session, selectors, limit)
            if self._horizon > before:
                continue  # a compaction began meanwhile: the page may lack what it deleted (states instead)
            if top > session.cursor:
                node_id = session.node_id
                if session.open:
                    visible = [
                        r.wire_json()
                        for r in batch
                        if r.node_id != node_id and r.collection in session.filters
                    ]
                else:
                    moved_in: list[RecordKey] = []
                    visible = await self._visible(session, batch, moved_in)
                    if moved_in:  # (once each: a record may move in and out within one page)
                        await self._send_states(session, list(dict.fromkeys(moved_in)), None)
                # (No more than clients accept, whatever the limits given: they refuse larger frames.)
                chunks = _frames(visible, limit, min(self.limits.relay_frame_bytes, p.MAX_MESSAGE_BYTES))
                visible = chunks.pop() if chunks else []
                for chunk in chunks:
                    # More than one frame's worth (by count or bytes; the earlier operations of records that
                    # entered this session's scope add to the count): all but the last frame leave the
                    # delivery cursor where it is (no max), so a client acknowledges and moves it only once
                    # it holds everything up to ``top``.
                    message_id = p.new_message_id()
                    session.unacked[message_id] = (time.monotonic(), last_sent)
                    await session.send(
                        p.encode_batch_frame(
                            message_id,
                            chunk,
                            is_final=False,
                            batch_index=index,
                            base_delivery_sequence=last_sent,
                        )
                    )
                    self.counters["sent"] += len(chunk)
                    index += 1
                if visible or (initial and final):
                    message_id = p.new_message_id()
                    session.unacked[message_id] = (time.monotonic(), last_sent)
                    frame = p.encode_batch_frame(
                        message_id,
                        visible,
                        is_final=final,
                        batch_index=index,
                        base_delivery_sequence=last_sent,
                        max_delivery_sequence=top,
                    )
                    await session.send(frame)
                    self.counters["sent"] += len(visible)
                    last_sent = top
                    index += 1
                session.cursor = top
                if final:
                    initial = False
                continue
            if initial:
                message = p.OperationBatch(
                    message_id=p.new_message_id(),
                    operations=(),
                    is_final=True,
                    batch_index=index,
                    base_delivery_sequence=last_sent,
                    max_delivery_sequence=session.cursor,
                )
                session.unacked[message.message_id] = (time.monotonic(), last_sent)
                await session.send(p.encode(message))
                initial = False
            if not session.unacked:
                await session.wake.wait()
                continue
            # A batch lost on the way is noticed by the client only when a later one arrives; when none
            # does, only the missing acknowledgement tells. When nothing has been acknowledged for
            # `resend_after` since the newest batch went out, send that batch again (from the same base):
            # the client applies it, or skips it as already applied, and acknowledges it; if earlier ones
            # were lost too, it sees the gap and reconnects. Resending one batch, with the wait doubling
            # each time, costs little when the client was merely slow to acknowledge (busy applying).
            sent_at, base = next(reversed(session.unacked.values()))
            if session.last_ack > rewound_at:
                resend_after = self.limits.ack_timeout
            wait = max(sent_at, session.last_ack) + resend_after - time.monotonic()
            if wait > 0:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that arrives
                # together with the wake-up, and the relay would outlive its session.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await session.wake.wait()
                continue
            rewound_at = time.monotonic()
            resend_after = min(resend_after * 2, 60.0)
            session.cursor = last_sent = base
            initial = True


def _frames(texts: list[str], count: int, budget: int) -> list[list[str]]:
    """``texts`` in consecutive frames of at most ``count`` texts and about ``budget`` UTF-8 bytes each (a
    text larger than the budget goes alone). No texts, no frames."""
    # Every code point takes at most 4 UTF-8 bytes: the usual batch fits without measuring each text.
    if len(texts) <= count and 4 * sum(map(len, texts)) + len(texts) <= budget:
        return [texts] if texts else []
    frames: list[list[str]] = []
    current: list[str] = []
    size = 0
    for text in texts:
        length = (len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))) + 1
        if current and (len(current) >= count or size + length > budget):
            frames.append(current)
            current, size = [], 0
        current.append(text)
        size += length
    if current:
        frames.append(current)
    return frames


def _bindings(schema: SchemaDefinition) -> dict[str, dict[str, Any]]:
    """Collection -> its scope bindings (record field -> True or scope key), the same rule clients use."""
    out: dict[str, dict[str, Any]] = {}
    for name in schema.collections:
        where = collection_bindings(schema, name)
        if where:
            out[name] = dict(where)
    return out


def _checked_rules(rules: Mapping[str, WriteRule] | None) -> dict[str, WriteRule]:
    if rules is None:
        return {}
    if not isinstance(rules, Mapping) or not all(
        isinstance(k, str) and callable(v) for k, v in rules.items()
    ):
        raise OfflineError(
            "sync_options['rules'] must map collection names to functions rule(claims, operation) -> bool",
            "SYNC_ERROR",
            {"field": "sync_options.rules"},
        )
    return dict(rules)


def _rule_allows(rule: WriteRule, claims: Mapping[str, Any] | None, op: Operation) -> bool:
    """The rule's verdict; a rule that raises refuses the write (and the failure is logged)."""
    try:
        return bool(rule(claims or {}, op))
    except Exception:
        log.exception("the write rule of %r failed; the write is refused", op.collection)
        return False
