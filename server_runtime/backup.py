"""Backups of a server's operations (DESIGN.md sections 5 and 7): NDJSON, keyed with an HMAC.

A backup is one JSON object a line: a manifest first, then one line per stored operation (in delivery order),
then, for a compacted store (server_runtime.stores.compaction), one ``state`` line per record whose history
compaction deleted (its row's state and value, and each node's highest sequence number folded into it) and
one ``compaction`` line (the horizon, each node's highest deleted number), then the ``hmac`` line:
HMAC-SHA256 over every byte before it. Its key is derived from one server secret,
the first one configured of: the backup token (``OFFLINE_BACKUP_TOKEN``), ``AUTH_SECRET``, the admin token
(``OFFLINE_ADMIN_TOKEN``). The backup token comes first because it is the secret of exactly the people who may
move backups around; a server that restores a backup needs the same secret as the one that made it. The
manifest names which secret keyed the file (``"key": "backupToken"``, never the secret itself). A server with
none of them configured leaves its backup endpoints open to anyone, so a key would protect nothing: it writes
``"key": "none"`` with an HMAC under an empty key, which detects damage only.

Import refuses a file whose HMAC does not verify, then judges every operation as a sync write would (its id
is its content hash, it fits the schema) first in a scratch in-memory server, so a refused file leaves the
store exactly as it was. ``?legacy=1`` accepts an unkeyed file (the older format, which ends in a bare sha256
checksum, or ``"key": "none"``) from whoever holds the backup token, judged the same way.

A compacted store's operations alone no longer rebuild its records, so import restores the ``state`` lines
as they are (the HMAC vouches for them; the operations are still judged), after storing the operations: the
restored server holds the same records, answers a resent compacted operation as a repeat, and sends
clients behind its horizon record states. Such a file restores only into an empty server
(``BACKUP_NOT_EMPTY``). A file of a compacted store without them (exported before they existed) is refused
(``BACKUP_INCOMPLETE``) unless ``?legacy=1`` accepts restoring only what its operations rebuild.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from offline.core.errors import OfflineError
from offline.core.operations import Operation
from offline.sync.protocol import ProtocolError, decode_operation

from .stores import MemoryServerStore
from .stores._codec import chunks
from .stores.base import RecordKey, RecordRow
from .sync import Refusal, SyncService

if TYPE_CHECKING:
    from .server import ProductionServer

__all__ = [
    "BackupKey",
    "BackupRefused",
    "export_backup",
    "import_backup",
    "read_backup",
]

log = logging.getLogger("offline.server.backup")

FORMAT = "offline-backup"
#: Version 2 files end in an ``hmac`` line; version 1 files (legacy) in a bare ``checksum`` line.
VERSION = 2
#: Keeps the HMAC key of backups apart from every other use of the same secret (AUTH_SECRET signs tokens).
_KEY_CONTEXT = b"offline backup hmac key v2"
_COMMIT_CHUNK = 500

# Error codes of a refused import (the response's "error").
BACKUP_INVALID = "BACKUP_INVALID"  # not a backup at all, or malformed
BACKUP_TRUNCATED = "BACKUP_TRUNCATED"
BACKUP_HMAC_MISMATCH = "BACKUP_HMAC_MISMATCH"  # altered, or keyed with another secret
BACKUP_UNKEYED = "BACKUP_UNKEYED"  # an unkeyed file without ?legacy=1
BACKUP_KEY_MISSING = "BACKUP_KEY_MISSING"  # a keyed file, and this server has no secret to check it with
BACKUP_CHECKSUM_MISMATCH = "BACKUP_CHECKSUM_MISMATCH"  # an unkeyed file, damaged
BACKUP_OPERATIONS_REFUSED = "BACKUP_OPERATIONS_REFUSED"  # some operation would be refused as a sync write
BACKUP_INCOMPLETE = "BACKUP_INCOMPLETE"  # a compacted store's file without its records' states
BACKUP_NOT_EMPTY = "BACKUP_NOT_EMPTY"  # a compacted store's file, and this server holds data already
#: A restore into an empty database that other running server processes share.
OTHER_SERVERS_RUNNING = "OTHER_SERVERS_RUNNING"
SCHEMA_MISMATCH = "SCHEMA_MISMATCH"

_SECRET_NAMES = {
    "backupToken": "the backup token (OFFLINE_BACKUP_TOKEN)",
    "authSecret": "AUTH_SECRET",
    "adminToken": "the admin token (OFFLINE_ADMIN_TOKEN)",
    "none": "no secret",
}


class BackupRefused(Exception):
    """An import refused whole: nothing was stored. ``refused``: operation (id or line) -> why."""

    def __init__(
        self, code: str, message: str, *, status: int = 400, refused: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.refused = dict(refused or {})

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.refused:
            body["refused"] = self.refused
        return body


@dataclass(frozen=True)
class BackupKey:
    """The HMAC key of this server's backups and the name of the secret it comes from (``source``)."""

    source: str
    key: bytes = field(repr=False)

    @classmethod
    def choose(
        cls, *, backup_token: str | None, auth_secret: str | None, admin_token: str | None
    ) -> BackupKey:
        for source, secret in (
            ("backupToken", backup_token),
            ("authSecret", auth_secret),
            ("adminToken", admin_token),
        ):
            if secret:
                return cls(source, _derive(secret.encode("utf-8")))
        return cls.none()

    @classmethod
    def none(cls) -> BackupKey:
        return cls("none", _derive(b""))

    @property
    def keyed(self) -> bool:
        return self.source != "none"


def _derive(secret: bytes) -> bytes:
    return hmac.new(secret, _KEY_CONTEXT, hashlib.sha256).digest()


def _line(value: Mapping[str, Any]) -> bytes:
    return (json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


# -- export ---------------------------------------------------------------------------------------------------------


async def export_backup(server: ProductionServer, key: BackupKey) -> AsyncIterator[bytes]:
    """The backup's lines, streamed from the store (the HMAC line last)."""
    store = server.store
    sync = server.sync
    count = (await store.stats()).get("operations", 0)
    horizon = await store.compaction_horizon()
    manifest = {
        "type": "manifest",
        "format": FORMAT,
        "version": VERSION,
        "schemaVersion": sync.schema.version,
        "serverNodeId": getattr(sync, "node_id", None),
        "operations": count,
        "createdAt": int(time.time() * 1000),
        "store": store.kind,
        "key": key.source,
        # Which principal owns each device's node id (SyncService.bind_node): a restored server keeps them.
        "nodes": await store.node_registrations(),
        # Nonzero: operations up to this delivery were compacted (server_runtime.stores.compaction); the
        # file then carries the compacted records' states and a compaction line.
        "compactionHorizon": horizon,
    }
    mac = hmac.new(key.key, digestmod=hashlib.sha256)
    first = _line(manifest)
    mac.update(first)
    yield first
    written = 0
    async for stored in store.export_operations():
        data = _line(
            {
                "type": "operation",
                "delivery": stored.delivery,
                "operation": stored.operation.to_wire(),
                "scope": stored.scope,
            }
        )
        mac.update(data)
        written += 1
        yield data
    tail: dict[str, Any] = {"type": "hmac", "algorithm": "hmac-sha256", "operations": written}
    # Read again: a compaction that ran while the log was read deleted operations from pages read after it.
    horizon = max(horizon, await store.compaction_horizon())
    if horizon:
        # Read after the operations: a write committed meanwhile is then in a state (folding its operation
        # again on import changes nothing) rather than missing from one; so is a record compacted meanwhile.
        states = 0
        async for data in _compaction_lines(server, horizon):
            mac.update(data)
            states += data.startswith(b'{"type":"state"')
            yield data
        tail["states"] = states
    yield _line({**tail, "hmac": mac.hexdigest()})


async def _compaction_lines(server: ProductionServer, horizon: int) -> AsyncIterator[bytes]:
    """The ``state`` line of each record whose history compaction deleted, then the ``compaction`` line."""
    store = server.store
    versions, marks = await store.compacted_history()
    for part in chunks(sorted(versions), _COMMIT_CHUNK):
        rows = await store.load_rows(part)
        for key in part:
            row = rows.get(key)
            if row is None:  # compaction records versions only of records with a row
                continue
            yield _line(
                {
                    "type": "state",
                    "collection": key[0],
                    "recordId": key[1],
                    "state": row.state_json(),
                    "record": row.record,
                    "versions": versions[key],
                }
            )
    yield _line({"type": "compaction", "horizon": horizon, "nodes": marks})


# -- reading a file -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordStateLine:
    """A ``state`` line: a compacted record's row and each node's highest number folded into it."""

    collection: str
    record_id: str
    state: str  # the stored state text
    record: dict[str, Any] | None
    versions: dict[str, int]


@dataclass
class BackupFile:
    manifest: dict[str, Any]
    operations: list[Operation]
    keyed: bool  # its HMAC verified under this server's secret
    #: Each operation's delivery in the backed-up store (parallel to ``operations``; 0 when absent).
    deliveries: list[int] = field(default_factory=list)
    states: list[RecordStateLine] = field(default_factory=list)
    #: The ``compaction`` line: {"horizon": int, "nodes": {node id: highest deleted number}}; None: absent.
    compaction: dict[str, Any] | None = None


def read_backup(body: bytes, key: BackupKey, *, legacy: bool = False, max_operation_bytes: int) -> BackupFile:
    """Check a backup's framing and HMAC (or, with ``legacy``, an unkeyed file's checksum), then decode
    every operation as the sync endpoint does. Raises ``BackupRefused`` naming the first problem of the file,
    or every operation that would be refused."""
    lines = body.splitlines(keepends=True)
    if not lines:
        raise BackupRefused(BACKUP_INVALID, "the backup is empty: it needs a manifest line first")
    try:
        manifest = json.loads(lines[0])
    except ValueError as exc:
        raise BackupRefused(
            BACKUP_INVALID, f"the backup is not NDJSON: its first line is not JSON ({exc})"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupRefused(BACKUP_INVALID, "the first line is not an offline backup manifest")
    if len(lines) < 2:
        raise BackupRefused(BACKUP_TRUNCATED, "the backup is truncated: it has no HMAC line")
    try:
        tail = json.loads(lines[-1])
    except ValueError:
        tail = None  # a file cut off mid-line (an interrupted download) ends in half a JSON line
    kind = tail.get("type") if isinstance(tail, dict) else None
    if not isinstance(tail, dict) or kind not in ("hmac", "checksum"):
        raise BackupRefused(BACKUP_TRUNCATED, "the last line is not the HMAC line: the backup is truncated")
    signed = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines[:-1])
    keyed = _check_integrity(manifest, tail, signed, key, legacy=legacy)

    body_lines = lines[1:-1]
    operations: list[Operation] = []
    deliveries: list[int] = []
    states: list[RecordStateLine] = []
    compacted: dict[str, Any] | None = None
    refused: dict[str, str] = {}
    items: list[tuple[int, Any]] = []
    for number, line in enumerate(body_lines, start=2):
        try:
            items.append((number, json.loads(line)))
        except ValueError as exc:
            raise BackupRefused(BACKUP_INVALID, f"line {number} is not JSON ({exc})") from None
    kinds = [item.get("type") if isinstance(item, dict) else None for _, item in items]
    counted = sum(1 for kind in kinds if kind not in ("state", "compaction"))
    if tail.get("operations") != counted:
        raise BackupRefused(
            BACKUP_INVALID,
            f"the HMAC line counts {tail.get('operations')} operations, the file has {counted}",
        )
    if tail.get("states", 0) != kinds.count("state"):
        raise BackupRefused(
            BACKUP_INVALID,
            f"the HMAC line counts {tail.get('states', 0)} record states, the file has {kinds.count('state')}",
        )
    for (number, item), kind in zip(items, kinds, strict=True):
        if kind == "state":
            states.append(_state_line(item, number))
            continue
        if kind == "compaction":
            if compacted is not None:
                raise BackupRefused(BACKUP_INVALID, f"line {number} is a second compaction line")
            compacted = _compaction_line(item, number)
            continue
        delivery = item.get("delivery") if isinstance(item, dict) else None
        deliveries.append(delivery if isinstance(delivery, int) and not isinstance(delivery, bool) else 0)
        raw = item.get("operation") if isinstance(item, dict) else None
        claimed = raw.get("id") if isinstance(raw, dict) else None
        name = claimed if isinstance(claimed, str) and claimed else f"line {number}"
        try:
            operations.append(decode_operation(raw, max_bytes=max_operation_bytes))  # type: ignore[arg-type]
        except ProtocolError as exc:
            refused[name] = f"{exc.code}: {exc.message}"
    if refused:
        raise BackupRefused(
            BACKUP_OPERATIONS_REFUSED,
            f"{len(refused)} operation(s) of the backup are not valid operations; nothing was imported",
            status=422,
            refused=refused,
        )
    if states and compacted is None:
        raise BackupRefused(BACKUP_INVALID, "the backup has record states but no compaction line")
    horizon = manifest.get("compactionHorizon", 0)
    if compacted is None and isinstance(horizon, int) and horizon > 0 and not legacy:
        raise BackupRefused(
            BACKUP_INCOMPLETE,
            f"the backup is of a store compacted up to delivery {horizon} and holds only the operations "
            "compaction kept, not the compacted records' states (exported by an older server): restoring it "
            "would rebuild those records from the kept operations alone and lose data. Export the backup "
            "again with this version, or import it with ?legacy=1 to accept that loss",
        )
    return BackupFile(manifest, operations, keyed, deliveries, states, compacted)


def _state_line(item: Mapping[str, Any], number: int) -> RecordStateLine:
    collection, record_id, state = item.get("collection"), item.get("recordId"), item.get("state")
    record, versions = item.get("record"), item.get("versions")
    if not (
        isinstance(collection, str)
        and collection
        and isinstance(record_id, str)
        and record_id
        and isinstance(state, str)
        and state
        and (record is None or isinstance(record, dict))
        and _is_marks(versions)
    ):
        raise BackupRefused(
            BACKUP_INVALID,
            f"line {number} is not a record state (collection, recordId, state text, record object or "
            "null, versions mapping node ids to sequence numbers)",
        )
    return RecordStateLine(collection, record_id, state, record, dict(versions))


def _compaction_line(item: Mapping[str, Any], number: int) -> dict[str, Any]:
    horizon, nodes = item.get("horizon"), item.get("nodes")
    if not (isinstance(horizon, int) and not isinstance(horizon, bool) and horizon >= 0 and _is_marks(nodes)):
        raise BackupRefused(
            BACKUP_INVALID,
            f"line {number} is not a compaction line (horizon: a delivery, nodes: node ids to sequence numbers)",
        )
    return {"horizon": horizon, "nodes": dict(nodes)}


def _is_marks(value: Any) -> TypeGuard[dict[str, int]]:
    return isinstance(value, dict) and all(
        isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in value.items()
    )


def _check_integrity(
    manifest: Mapping[str, Any], tail: Mapping[str, Any], signed: bytes, key: BackupKey, *, legacy: bool
) -> bool:
    """True when the file's HMAC verified under this server's key; False for an unkeyed file that
    ``legacy`` lets through (after its damage check). Raises for everything else."""
    if tail.get("type") == "checksum":  # version 1: a bare sha256, which anyone can recompute
        if not legacy:
            raise BackupRefused(
                BACKUP_UNKEYED,
                "the backup carries no HMAC (the older, unkeyed format): anyone could have altered it. Import "
                "it with ?legacy=1 only if you trust where it came from",
            )
        if not hmac.compare_digest(hashlib.sha256(signed).hexdigest(), str(tail.get("sha256", ""))):
            raise BackupRefused(
                BACKUP_CHECKSUM_MISMATCH, "checksum mismatch: the backup was altered or damaged"
            )
        return False
    source = str(manifest.get("key", ""))
    given = str(tail.get("hmac", ""))
    if source == "none":
        if key.keyed and not legacy:
            raise BackupRefused(
                BACKUP_UNKEYED,
                "the backup was made by a server without a backup secret (unkeyed): import it with ?legacy=1 "
                "only if you trust where it came from",
            )
        if not _mac_matches(BackupKey.none(), signed, given):
            raise BackupRefused(BACKUP_HMAC_MISMATCH, "HMAC mismatch: the backup was altered or damaged")
        return False
    if not key.keyed:
        raise BackupRefused(
            BACKUP_KEY_MISSING,
            f"the backup is keyed with {_SECRET_NAMES.get(source, 'a server secret')} and this server has no "
            "secret to check it with: set the same OFFLINE_BACKUP_TOKEN, AUTH_SECRET or OFFLINE_ADMIN_TOKEN",
        )
    if not _mac_matches(key, signed, given):
        hint = ""
        if source != key.source and source in _SECRET_NAMES:
            hint = (
                f" (the file says it was keyed with {_SECRET_NAMES[source]}; this server keys backups with "
                f"{_SECRET_NAMES[key.source]})"
            )
        raise BackupRefused(
            BACKUP_HMAC_MISMATCH,
            "HMAC mismatch: the backup was altered, damaged or made with another secret" + hint,
        )
    return True


def _mac_matches(key: BackupKey, signed: bytes, given: str) -> bool:
    expected = hmac.new(key.key, signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace"))


# -- import ---------------------------------------------------------------------------------------------------------


async def import_backup(server: ProductionServer, backup: BackupFile) -> dict[str, Any]:
    """Judge every operation in a scratch server first; store them only when none is refused there.

    The scratch server (memory store, the same schema and server identity) judges exactly as this server's
    sync service does; judging into the real store directly would keep what passed when a later operation
    of the file fails. Operations this store already holds count as duplicates.
    """
    sync = server.sync
    manifest = backup.manifest
    version = manifest.get("schemaVersion", 0)
    if not isinstance(version, int) or version > sync.schema.version:
        raise BackupRefused(
            SCHEMA_MISMATCH,
            f"the backup is of schema version {version}, newer than the server's {sync.schema.version}; "
            "upgrade the server first",
            status=409,
        )
    source_node = manifest.get("serverNodeId")
    node_id = str(source_node) if source_node else None
    nodes = manifest.get("nodes", {})  # absent from older files
    if not isinstance(nodes, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in nodes.items()
    ):
        raise BackupRefused(BACKUP_INVALID, "the manifest's nodes must map node ids to principals")
    if backup.compaction is not None and (sync.watermark or sync.cache.rows):
        raise BackupRefused(
            BACKUP_NOT_EMPTY,
            "the backup is of a compacted store: its record states replace rows, so it restores only into a "
            "server that holds no data yet. Import it into a fresh database",
            status=409,
        )
    if sync.watermark == 0 and (backup.operations or backup.states):
        await _refuse_while_shared(server)
    rows = _restored_rows(sync, backup.states)
    refused = await _judge_in_scratch(sync, backup.operations, node_id)
    if refused:
        raise BackupRefused(
            BACKUP_OPERATIONS_REFUSED,
            f"{len(refused)} operation(s) of the backup would be refused as sync writes; nothing was imported",
            status=422,
            refused=refused,
        )
    if sync.watermark == 0 and (backup.operations or backup.states):
        # The operations are numbered from 1 here, whatever their numbers were: devices that synced with
        # the backed-up server must not resume from their watermarks (`SyncService.renumber_deliveries`).
        await sync.renumber_deliveries()
    if node_id and sync.watermark == 0:
        # A fresh server adopts the backed-up server's identity, so its writes stay authoritative.
        await sync.adopt_node_id(node_id)
    await sync.restore_node_owners(nodes)
    imported = duplicates = 0
    late: dict[str, str] = {}
    ops = backup.operations
    compacted = backup.compaction
    # The operations compaction kept up to its horizon are numbered anew here: the restored horizon is the
    # highest new delivery among them, so clients behind it are sent the records' states.
    within = (
        {op.id for op, d in zip(ops, backup.deliveries, strict=True) if d <= compacted["horizon"]}
        if compacted is not None
        else set()
    )
    horizon = 0
    for start in range(0, len(ops), _COMMIT_CHUNK):
        results = await sync.commit(None, ops[start : start + _COMMIT_CHUNK])
        for op_id, value in results.items():
            if value is None:
                duplicates += 1
            elif isinstance(value, int):
                imported += 1
                if op_id in within:
                    horizon = max(horizon, value)
            else:
                # Refused here but not in the scratch server: this store's own records decided it.
                late[op_id] = _describe(value)
    if compacted is not None:
        # After the operations: stored first, the deleted numbers would make the kept operations below a
        # node's highest deleted one look like repeats. The states then replace the rows the kept
        # operations rebuilt.
        versions: dict[RecordKey, dict[str, int]] = {
            (s.collection, s.record_id): s.versions for s in backup.states
        }
        await sync.restore_compaction(rows, versions, compacted["nodes"], horizon or sync.watermark)
    result: dict[str, Any] = {
        "imported": imported,
        "duplicates": duplicates,
        "refused": late,
        "operations": len(ops),
    }
    if compacted is not None:
        result["states"] = len(rows)
    return result


async def _refuse_while_shared(server: ProductionServer) -> None:
    """A restore into an empty database gives this process a new identity and numbering of deliveries (and,
    for a compacted store, rows written past its writers): other processes on the same database would go on
    with the old ones and their cached rows. Refuse while any runs."""
    others = await server.sync.store.other_servers()
    if others:
        raise BackupRefused(
            OTHER_SERVERS_RUNNING,
            f"{others} other server process(es) use this database; a restore gives the server a new identity "
            "and numbering of deliveries that running processes would not pick up. Stop the other server "
            "processes, import the backup through this one, then start them again",
            status=409,
        )


def _restored_rows(sync: SyncService, states: list[RecordStateLine]) -> list[RecordRow]:
    """The rows of the ``state`` lines, each state read once to refuse a file whose states this server
    cannot read (before anything is stored)."""
    rows: list[RecordRow] = []
    for line in states:
        if line.collection not in sync.schema.collections:
            raise BackupRefused(
                SCHEMA_MISMATCH,
                f"the backup holds a record of collection {line.collection!r}, which the schema does not have",
                status=409,
            )
        row = sync.stored_row(line.collection, line.record_id, line.state, line.record)
        try:
            row.state  # noqa: B018  # parsed now: a state this server cannot read is refused up front
        except (OfflineError, ValueError, KeyError, TypeError) as exc:
            raise BackupRefused(
                BACKUP_INVALID,
                f"the state of {line.collection}/{line.record_id} is not a record state ({exc})",
            ) from None
        rows.append(row)
    return rows


async def _judge_in_scratch(sync: SyncService, ops: list[Operation], node_id: str | None) -> dict[str, str]:
    store = MemoryServerStore()
    try:
        await store.set_schema(sync.schema)
        if node_id:
            await store.set_meta("server_node_id", node_id)
        scratch = SyncService(store, limits=sync.limits)
        await scratch.start()
        refused: dict[str, str] = {}
        try:
            for start in range(0, len(ops), _COMMIT_CHUNK):
                results = await scratch.commit(None, ops[start : start + _COMMIT_CHUNK])
                for op_id, value in results.items():
                    if isinstance(value, Refusal):
                        refused[op_id] = _describe(value)
        finally:
            await scratch.stop()
        return refused
    finally:
        await store.close()


def _describe(refusal: Refusal) -> str:
    return f"{refusal.code}: {refusal.message}"
