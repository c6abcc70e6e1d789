"""The server's judgement of cross-record rules: relations, constraints and who may speak as the server.

The sync core (`sync.SyncService`) judges each client operation in commit order against the records as
they stand; this module holds the rules it applies beyond one record:

- Tier 2 constraints (unique, capacity, referential) for every write that leaves a record alive
  (`offline.merge.constraints`);
- relations, for a delete (children the deleting client could not see, 'restrict') *and* for a child's
  insert or update: a parent's delete wins over concurrent child writes whatever order they reach the
  server in (`offline.merge.relations.plan_child_write`), so no replica ends up holding an orphan;
- server authority: only the server writes under a server node id (`offline.core.server_nodes`).

The server writes its resolutions as its own operations, stamped after every operation the record holds
(`follow_up_timestamp`): a resolution stamped before a client's write it overrides would lose to it by
last-writer-wins on every replica, and the rule it enforces would not hold.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from offline.core.errors import OfflineError
from offline.core.hlc import HLCTimestamp, HybridLogicalClock
from offline.core.operations import Operation
from offline.core.server_nodes import is_server_node_id
from offline.merge.constraints import Action, Decision, check_write
from offline.merge.engine import RecordState
from offline.merge.relations import complete_actions, plan_child_write
from offline.sync import protocol as p

from .records import StagedView

#: `operation-rejected` code of an operation of a node the session may not speak for (DESIGN.md section 7).
NODE_ID_MISMATCH = p.NODE_ID_MISMATCH


def forged_authority(op: Operation, server_ids: Collection[str]) -> str | None:
    """Why a client's ``op`` may not be stored because it claims to be the server's, else None."""
    if is_server_node_id(op.node_id) or op.node_id in server_ids:
        return (
            f"node id {op.node_id!r} is a server's: a client may not write under it "
            "(server-authoritative fields would take its writes as the server's)"
        )
    return None


def parent_deleted(view: StagedView) -> Callable[[str, str], bool]:
    """The predicate `plan_child_write` needs: the server holds the record and it no longer exists."""

    def deleted(collection: str, record_id: str) -> bool:
        key = (collection, record_id)
        held = key in view.rows or key in view.cache.rows
        return held and view.record(collection, record_id) is None

    return deleted


def judge_write(
    view: StagedView,
    op: Operation,
    after: dict[str, Any] | None,
    before: dict[str, Any] | None,
    *,
    constrained: bool,
    children: bool = True,
) -> list[Action]:
    """The follow-up actions of an accepted insert/update that leaves ``after`` (None: the record does not
    exist after it) in place of ``before``; raises OfflineError (CONSTRAINT_VIOLATION) to refuse it.

    ``children=False`` skips judging the record against its parents: for a log another server already judged
    (a backup being restored), whose own follow-ups it carries, and which may come from before these rules.
    """
    if after is None:
        return []
    decision = Decision()
    if children and (before is None or _repointed(view, op.collection, after, before)):
        # (A child left pointing where it pointed is not judged again: the parent's delete dealt with it,
        # and a record from before these rules stays editable.)
        decision.actions.extend(
            plan_child_write(
                view, op.collection, after, created=before is None, parent_deleted=parent_deleted(view)
            )
        )
    removed = any(a.type == "delete" and a.record_id == op.record_id for a in decision.actions)
    if constrained and not removed:
        judged = check_write(view, op.collection, after, before)
        decision.actions.extend(judged.actions)
        decision.violations.extend(judged.violations)
    if not decision.actions:
        return []
    return complete_actions(view, decision).actions


def refused_insert_tombstone(view: StagedView, op: Operation) -> list[Action]:
    """The server's delete of a record whose insert it refused by a cross-record rule, when other records
    may point at it (it is the target of a relation or a referential constraint).

    Its author may have written children of it before hearing of the refusal (a task into a deleted
    project, then a comment on that task); without the tombstone the server would hold nothing of the record
    and take those children for children of a record yet to arrive, keeping them as orphans. With it, they
    are judged as children of a deleted record. A later write of the record (`app.sync.retry`) revives it.
    """
    key = (op.collection, op.record_id)
    if op.type != "insert" or key in view.rows or key in view.cache.rows:
        return []
    schema = view.schema
    targeted = any(r.to == op.collection for r in schema.relations.values()) or any(
        c.type == "referential" and c.collection == op.collection
        for coll in schema.collections.values()
        for c in coll.constraints.values()
    )
    return [Action("delete", op.collection, op.record_id)] if targeted else []


def _repointed(view: StagedView, collection: str, after: dict[str, Any], before: dict[str, Any]) -> bool:
    return any(
        after.get(r.field) != before.get(r.field)
        for r in view.schema.relations.values()
        if r.from_ == collection and r.on_delete != "no-action"
    )


def follow_up_timestamp(clock: HybridLogicalClock, state: RecordState) -> HLCTimestamp:
    """A timestamp for the server's own write to a record with ``state``: after every operation it holds."""
    stamp = clock.now()
    latest = state.exist[0] if state.exist else None
    if latest is not None and [stamp.wall_time, stamp.logical, stamp.node_id] <= list(latest[:3]):
        try:
            stamp = clock.receive(HLCTimestamp(int(latest[0]), int(latest[1]), str(latest[2])))
        except OfflineError:
            # Only an operation accepted within the drift limit can be held, so its time is near: should the
            # clock still refuse it, step past it by hand.
            stamp = HLCTimestamp(int(latest[0]), int(latest[1]) + 1, stamp.node_id)
    return stamp


__all__ = [
    "NODE_ID_MISMATCH",
    "follow_up_timestamp",
    "forged_authority",
    "judge_write",
    "parent_deleted",
    "refused_insert_tombstone",
]
