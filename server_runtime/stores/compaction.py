"""Compaction of a server store's operation log (``ServerStore.compact``): what goes and what stays.

Every stored operation is folded into its record's row (state and value) in the same transaction that
stores it, so the rows are the records and the log is their history. The history serves four things, and
compaction keeps what each needs while deleting the rest (operations with a delivery at or below the
*horizon*, the highest delivery when compaction ran, recorded in meta ``compaction_horizon``):

- Catch-ups. A client whose ``lastDeliverySequence`` is at or above the horizon is streamed the log after
  it, as before. One below it cannot be replayed what was deleted: it is sent the states of the records in
  its scope instead (state-based catch-up, ``server_runtime.sync``), then the log after the horizon. To find
  a session's records through the scope index, each record keeps its latest operation (its scope snapshot
  is where the record is now); the states sent carry each node's highest sequence number folded into them
  (``record_versions``: kept per record for the deleted operations, the rest read from the log), which is
  how the client recognises the operations streamed afterwards that a state already holds.
- The numbering guard (issue 22): a node's highest sequence number must stay known, so each node's
  highest operation stays in the log (the version vector, the SQLite store's optimistic writer and
  ``held_places`` read the log), and ``offline_compacted_nodes`` keeps each node's highest *deleted*
  number: a place at or below it that holds nothing is answered `COMPACTED` by ``held_places``, and the
  sync core takes an operation there for a repeat (a node's operations reach the server in its sequence
  order: an honest client resends only operations the server stored or never saw, and never one below an
  operation the server stored that it has not stored itself).
- A record moving into a session's scope: the session is sent the record's state (as in a state-based
  catch-up) when its history was compacted, else its history as before.
- A record leaving a session's scope: a session that resumes below the horizon learns it left from the
  operation that moved it out (found through the scope index under the values before the move, its state
  then shows the record outside and the client drops it). So each record also keeps, per scope it left (the
  snapshot's values before the move), its latest operation that left it: a session in that scope when it
  went offline finds one after its cursor whatever happened to the record since. This grows with the number
  of distinct scopes a record has left, not with its history.
- Duplicate detection by id (``known_ids``) covers what is kept; repeats of deleted operations are caught
  by their place, as above.

Backups hold what is kept (``export_operations``) and, since the kept operations no longer rebuild the
compacted records, those records' rows and what compaction recorded (``compacted_history``), which import
puts back with ``restore_compaction`` (see ``server_runtime.backup``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .base import COMPACTION_HORIZON_KEY as HORIZON_KEY
from .base import MOVED_FROM, RecordKey, scope_index_entries

__all__ = ["COMPACTED", "HORIZON_KEY", "CompactionPlan", "merge_versions", "plan", "with_compacted"]

#: ``held_places``' answer for a place at or below its node's highest compacted sequence number that holds
#: no operation: the operation there was stored and compacted (see the module docstring).
COMPACTED: Final = ""

#: (delivery, node id, sequence number, collection, record id, scope JSON or None)
LogRow = tuple[int, str, int, str, str, "str | None"]


@dataclass
class CompactionPlan:
    """What one compaction deletes and records (every store applies it in its own SQL)."""

    horizon: int
    #: Deliveries of the operations to delete.
    deliveries: list[int] = field(default_factory=list)
    #: Their ``offline_operation_scopes`` rows: (collection, field, value key, delivery).
    scope_rows: list[tuple[str, str, str, int]] = field(default_factory=list)
    #: Per record, each node's highest deleted sequence number (to merge into what is stored).
    record_versions: dict[RecordKey, dict[str, int]] = field(default_factory=dict)
    #: Each node's highest deleted sequence number (to merge into what is stored).
    node_marks: dict[str, int] = field(default_factory=dict)
    kept: int = 0

    def result(self) -> dict[str, Any]:
        """What ``ServerStore.compact`` returns (and the admin endpoint answers)."""
        return {"horizon": self.horizon, "dropped": len(self.deliveries), "kept": self.kept}


def plan(rows: Iterable[LogRow], horizon: int) -> CompactionPlan:
    """The plan for the log ``rows`` (every operation with a delivery at or below ``horizon``)."""
    rows = list(rows)
    latest: dict[RecordKey, int] = {}
    highest: dict[str, tuple[int, int]] = {}
    # Per record and scope it left (the snapshot's values before the move, as JSON): the latest such move.
    left: dict[tuple[str, str, str], int] = {}
    for delivery, node, seq, collection, record_id, scope in rows:
        key = (collection, record_id)
        if delivery > latest.get(key, 0):
            latest[key] = delivery
        if (seq, delivery) > highest.get(node, (-1, 0)):
            highest[node] = (seq, delivery)
        if scope is not None and MOVED_FROM in scope:
            before = json.loads(scope).get(MOVED_FROM)
            if isinstance(before, dict):
                place = (collection, record_id, json.dumps(before, sort_keys=True, default=str))
                if delivery > left.get(place, 0):
                    left[place] = delivery
    keep = set(latest.values()) | {delivery for _, delivery in highest.values()} | set(left.values())
    out = CompactionPlan(horizon)
    for delivery, node, seq, collection, record_id, scope in rows:
        if delivery in keep:
            out.kept += 1
            continue
        out.deliveries.append(delivery)
        if scope is not None:
            snapshot = json.loads(scope)
            out.scope_rows.extend(
                (collection, name, key, delivery) for name, key in sorted(scope_index_entries(snapshot))
            )
        versions = out.record_versions.setdefault((collection, record_id), {})
        if seq > versions.get(node, -1):
            versions[node] = seq
        if seq > out.node_marks.get(node, -1):
            out.node_marks[node] = seq
    return out


def bounded(horizon: int | None, top: int) -> int:
    """The horizon a compaction goes to: ``horizon`` (None: ``top``, the highest delivery), never above
    ``top``, never below 0."""
    return top if horizon is None else max(0, min(int(horizon), top))


def with_compacted(
    held: dict[tuple[str, int], str], wanted: Iterable[tuple[str, int]], marks: Mapping[str, int]
) -> dict[tuple[str, int], str]:
    """``held_places``' answer: ``held``, and `COMPACTED` for each wanted place that holds nothing and is at
    or below its node's highest compacted number (``marks``)."""
    for place in wanted:
        if place not in held and place[1] <= marks.get(place[0], -1):
            held[place] = COMPACTED
    return held


def merge_versions(*parts: Mapping[str, int] | None) -> dict[str, int]:
    """Each node's highest number across ``parts``."""
    out: dict[str, int] = {}
    for part in parts:
        for node, seq in (part or {}).items():
            if seq > out.get(node, -1):
                out[node] = int(seq)
    return out


def versions_text(versions: Mapping[str, int]) -> str:
    return json.dumps(dict(sorted(versions.items())), separators=(",", ":"))


def parse_versions(text: str | None) -> dict[str, int]:
    return {} if not text else {str(k): int(v) for k, v in json.loads(text).items()}
