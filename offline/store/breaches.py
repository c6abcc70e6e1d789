"""What holds offline: cross-record rules after merging remote operations without a server.

Per-record merging is deterministic everywhere; rules across records (unique, capacity, referential
constraints, relations' onDelete) are decided by whoever accepts a write: the local store for its own writes,
the server for everything synced through it (DESIGN.md section 3). Operations exchanged peer to peer
(`App.apply`) are merged as they are, so two replicas agree on the same records even when those records break
a rule, and nothing resolves it until a server judges the writes. `App.apply` reports each such breach
instead: its return value's ``violations`` and a ``constraint:violated`` event per breach.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from offline.core.operations import Operation
from offline.merge.constraints import Breach, find_breaches
from offline.merge.trace import MergeTrace

if TYPE_CHECKING:
    from .app import App


class Applied(list[Operation]):
    """`App.apply`'s result: the operations newly applied (a list, as before), and ``violations``: the
    cross-record rules the records they touched now break (`Breach`, empty when none)."""

    violations: list[Breach]

    def __init__(self, operations: list[Operation], violations: list[Breach] | None = None) -> None:
        super().__init__(operations)
        self.violations = violations or []


def _has_rules(app: App) -> bool:
    schema = app.schema
    return bool(schema.relations) or any(c.constraints for c in schema.collections.values())


def report(app: App, applied: list[Operation]) -> Applied:
    """``applied`` with the breaches of the records it touched; one ``constraint:violated`` event each."""
    if not applied or not _has_rules(app):
        return Applied(applied)
    touched: dict[tuple[str, str], Operation] = {}
    for op in applied:
        touched[(op.collection, op.record_id)] = op  # the latest applied of each record stands for it
    app.flush()

    def held(collection: str, record_id: str) -> bool:
        with app.db.lock:
            row = app.db.conn.execute(
                "SELECT 1 FROM _offline_state WHERE collection = ? AND record_id = ?", (collection, record_id)
            ).fetchone()
        return row is not None

    records = [(c, r, app.collection(c).find_by_id(r)) for c, r in touched]
    breaches = find_breaches(app, records, held)
    if breaches and app.events.has_listeners("constraint:violated"):
        for breach in breaches:
            app.events.emit("constraint:violated", constraint=breach.name, trace=_trace(app, breach, touched))
    return Applied(applied, breaches)


def _trace(app: App, breach: Breach, touched: dict[tuple[str, str], Operation]) -> MergeTrace:
    """The breach as a Tier 2 trace: B an applied operation of one record involved, A the latest operation of
    another one (or B again); no output, since nothing resolved it."""
    ids = breach.record_ids
    mine = next((touched[(breach.collection, i)] for i in ids if (breach.collection, i) in touched), None)
    if mine is None:  # a child of a deleted parent: the parent's delete was applied
        mine = next(op for op in touched.values())
    others = [i for i in ids if i != mine.record_id] or [mine.record_id]
    with app.db.lock:
        history = app.db.record_operations(breach.collection, others[0])
    other = max(
        history,
        key=lambda o: (o.timestamp.wall_time, o.timestamp.logical, o.timestamp.node_id, o.id),
        default=mine,
    )

    def values(op: Operation) -> dict[str, Any]:
        return {f: dict(op.data or {}).get(f) for f in breach.fields}

    return MergeTrace(
        operation_a=other,
        operation_b=mine,
        field=",".join(breach.fields),
        strategy=f"{breach.kind}-constraint" if breach.kind != "relation" else "relation",
        input_a=values(other),
        input_b=values(mine),
        base=None,
        output=None,
        tier=2,
        constraint_violated=breach.name,
    )


__all__ = ["Applied", "Breach", "report"]
