"""Relations' `onDelete` (SPEC 2.3): what deleting a record does to the records that reference it.

The replica that deletes writes the cascade / set-null operations for the children it holds, in the same
transaction; 'restrict' refuses the delete while children exist; 'no-action' leaves them dangling. The
server applies the same plan for children the deleting client could not see.

`plan_record_delete` (a local delete) and `complete_actions` (the extra writes a constraint decision makes,
whose evictions may delete records) follow every delete to a fixpoint: a record deleted by a cascade or an
eviction has its own children and its own referencing records handled the same way (relations' onDelete
and referential constraints, `constraints.check_delete`). The result holds at most one write per record:
a record that ends up deleted gets only its delete (an update written after it would revive it, DESIGN.md
section 3), and the updates of one record are merged into one (set-null on two deleted parents of a
many-to-many field removes both ids). 'restrict' and refusing referential constraints are judged last,
against the final plan, so a child that the same delete removes anyway does not block it.

A parent's delete also wins over concurrent writes to its children, whatever order they arrive in
(`plan_child_write`, for the server; `plan_local_child_write`, for a replica's own writes): a child written
into, or revived under, a parent the judging replica holds as deleted is refused ('restrict', and 'cascade'
when the write creates it), deleted ('cascade') or cleared ('set-null'), as if the delete had come after it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from offline.core.errors import CONSTRAINT_VIOLATION, OfflineError
from offline.core.schema import SchemaDefinition

from .constraints import Action, Decision, RecordLookup, check_delete, records_containing

_Key = tuple[str, str]


class _Pending:
    """The store as it will be once the planned actions apply; the lookup the plan is judged against.

    Planned changes only remove references (set-null, cleared fields), so filtering the stored records
    and dropping those the plan changed away is exact.
    """

    def __init__(self, lookup: RecordLookup) -> None:
        self.lookup = lookup
        self.schema: SchemaDefinition = lookup.schema
        self.deleted: dict[_Key, Action] = {}
        self.changes: dict[_Key, dict[str, Any]] = {}
        self.previous: dict[_Key, dict[str, Any]] = {}

    def find_records(self, collection: str, filters: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self._as_planned(
            collection,
            self.lookup.find_records(collection, filters),
            lambda record: all(record.get(k) == v for k, v in filters.items()),
        )

    def find_containing(self, collection: str, field: str, value: Any) -> list[dict[str, Any]]:
        return self._as_planned(
            collection,
            records_containing(self.lookup, collection, field, value),
            lambda record: value in (record.get(field) or ()),
        )

    def _as_planned(
        self,
        collection: str,
        records: Iterable[dict[str, Any]],
        still_matches: Callable[[dict[str, Any]], bool],
    ) -> list[dict[str, Any]]:
        """The stored records as the plan leaves them: deleted ones gone, changed ones changed, and those
        whose change moves them out of the query dropped."""
        out = []
        for record in records:
            key = (collection, record["id"])
            if key in self.deleted:
                continue
            changed = self.changes.get(key)
            if changed:
                record = {**record, **changed}
                if not still_matches(record):
                    continue
            out.append(record)
        return out

    def add(self, action: Action) -> bool:
        """Record ``action`` in the plan; True when it deletes a record not deleted before."""
        key = (action.collection, action.record_id)
        if key in self.deleted:
            return False
        if action.type == "delete":
            self.deleted[key] = action
            return True
        previous = self.previous.setdefault(key, {})
        for name, value in (action.previous or {}).items():
            previous.setdefault(name, value)  # the value before the whole transaction
        self.changes.setdefault(key, {}).update(action.changes or {})
        return False

    def actions(self, root: _Key | None) -> list[Action]:
        out = [a for key, a in self.deleted.items() if key != root]
        for key, changes in self.changes.items():
            if key in self.deleted:
                continue
            previous = self.previous.get(key, {})
            data = {
                k: v
                for k, v in changes.items()
                if k not in previous or v != previous[k] or type(v) is not type(previous[k])
            }
            if data:
                out.append(Action("update", key[0], key[1], data, {k: previous.get(k) for k in data}))
        return out


def _children(lookup: RecordLookup, source: str, field: str, parent_id: str) -> list[dict[str, Any]]:
    descriptor = lookup.schema.collections[source].fields[field]
    if descriptor.type == "array":  # many-to-many: the field holds a list of ids
        return records_containing(lookup, source, field, parent_id)
    return lookup.find_records(source, {field: parent_id})


def _on_delete(view: _Pending, collection: str, record_id: str) -> Iterator[Action]:
    """The cascade / set-null writes deleting ``collection/record_id`` implies (children read lazily, so
    each action sees the ones before it)."""
    for relation in view.schema.relations.values():
        if relation.to != collection or relation.on_delete not in ("cascade", "set-null"):
            continue
        for child in _children(view, relation.from_, relation.field, record_id):
            if relation.on_delete == "cascade":
                yield Action("delete", relation.from_, child["id"])
                continue
            value = child.get(relation.field)
            new = [v for v in value if v != record_id] if isinstance(value, list) else None
            yield Action(
                "update", relation.from_, child["id"], {relation.field: new}, {relation.field: value}
            )


def _check_restrict(view: _Pending, collection: str, record_id: str) -> None:
    for relation in view.schema.relations.values():
        if relation.to != collection or relation.on_delete != "restrict":
            continue
        for child in _children(view, relation.from_, relation.field, record_id):
            raise OfflineError(
                f"cannot delete {collection} {record_id!r}: {relation.from_} {child['id']!r} still "
                f"references it through relation {relation.name!r} (onDelete 'restrict'); delete or "
                "re-point the children first",
                CONSTRAINT_VIOLATION,
                {
                    "relation": relation.name,
                    "collection": collection,
                    "recordId": record_id,
                    "child": {"collection": relation.from_, "id": child["id"]},
                },
            )


def _settle(
    lookup: RecordLookup, actions: Iterable[Action], root: _Key | None, *, constraints: bool
) -> Decision:
    view = _Pending(lookup)
    decision = Decision()
    queue: deque[_Key] = deque()
    if root is not None:
        view.add(Action("delete", *root))
        queue.append(root)
    for action in actions:
        if view.add(action):
            queue.append((action.collection, action.record_id))
    while queue:
        collection, record_id = queue.popleft()
        for action in _on_delete(view, collection, record_id):
            if view.add(action):
                queue.append((action.collection, action.record_id))
        if constraints:
            found = check_delete(view, collection, {"id": record_id}, refuse=False)
            decision.violations.extend(found.violations)
            for action in found.actions:
                if view.add(action):
                    queue.append((action.collection, action.record_id))
    # Refusals last, against the final plan (order-independent).
    for collection, record_id in view.deleted:
        _check_restrict(view, collection, record_id)
        if constraints:
            check_delete(view, collection, {"id": record_id})
    decision.actions = view.actions(root)
    return decision


def plan_delete(lookup: RecordLookup, collection: str, record_id: str) -> list[Action]:
    """Relations only: the actions that deleting ``collection/record_id`` implies (not the delete itself)."""
    return _settle(lookup, (), (collection, record_id), constraints=False).actions


def plan_record_delete(lookup: RecordLookup, collection: str, record_id: str) -> Decision:
    """Everything deleting ``collection/record_id`` implies: relations' onDelete and referential
    constraints, followed through every record the delete removes. Raises CONSTRAINT_VIOLATION when a
    'restrict' relation or a refusing referential constraint blocks it. The delete itself is not included."""
    return _settle(lookup, (), (collection, record_id), constraints=True)


def complete_actions(lookup: RecordLookup, decision: Decision) -> Decision:
    """``decision`` (from `check_write`) with its deletes followed like `plan_record_delete` does, and its
    writes merged to at most one per record."""
    if not decision.actions:
        return decision
    settled = _settle(lookup, decision.actions, None, constraints=True)
    settled.violations[:0] = decision.violations
    return settled


def plan_child_write(
    lookup: RecordLookup,
    collection: str,
    record: Mapping[str, Any],
    *,
    created: bool,
    parent_deleted: Callable[[str, str], bool],
) -> list[Action]:
    """What a write leaving ``collection/record`` alive implies for the relations it is the child of.

    A parent's delete wins over a concurrent write to its children, whatever order they arrive in: a child
    that references a deleted parent (``parent_deleted(collection, id)``: the replica holds the parent and
    it no longer exists) is treated as if the delete had come after it. 'cascade' deletes the child and
    'set-null' drops the reference, by the returned follow-up actions; 'restrict', and 'cascade' for a child
    the write creates (``created``: an insert or a revival into a deleted parent has nothing to keep), refuse
    the write (CONSTRAINT_VIOLATION). 'no-action' leaves the reference dangling, as documented. A parent the
    replica has never held is not judged (it may arrive later).
    """
    actions: list[Action] = []
    cleared: dict[str, Any] = {}
    previous: dict[str, Any] = {}
    for relation in lookup.schema.relations.values():
        if relation.from_ != collection or relation.on_delete == "no-action":
            continue
        value = record.get(relation.field)
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        gone = [v for v in ids if isinstance(v, str) and parent_deleted(relation.to, v)]
        if not gone:
            continue
        if relation.on_delete == "restrict" or (relation.on_delete == "cascade" and created):
            raise OfflineError(
                f"{collection} {record['id']!r} references {relation.to} {gone[0]!r}, which was deleted "
                f"(relation {relation.name!r}, onDelete {relation.on_delete!r}); the delete wins",
                CONSTRAINT_VIOLATION,
                {
                    "relation": relation.name,
                    "collection": collection,
                    "recordId": record["id"],
                    "field": relation.field,
                    "parent": {"collection": relation.to, "id": gone[0]},
                    "onDelete": relation.on_delete,
                },
            )
        if relation.on_delete == "cascade":
            return [Action("delete", collection, record["id"])]
        kept = [v for v in ids if v not in gone] if isinstance(value, list) else None
        cleared[relation.field] = kept
        previous[relation.field] = value
    if cleared:
        actions.append(Action("update", collection, record["id"], cleared, previous))
    return actions


def plan_local_child_write(
    lookup: RecordLookup,
    collection: str,
    candidate: Mapping[str, Any],
    current: Mapping[str, Any] | None,
    parent_deleted: Callable[[str, str], bool],
) -> list[Action]:
    """`plan_child_write` for a replica's own insert (``current`` None) or update: one that points a child
    at a parent the replica holds as deleted is refused under 'restrict' and 'cascade' (the server would
    refuse it too) and has the reference dropped under 'set-null'. An update that leaves the references
    as they were is not judged."""
    if current is not None and all(
        candidate.get(r.field) == current.get(r.field)
        for r in lookup.schema.relations.values()
        if r.from_ == collection
    ):
        return []
    return plan_child_write(lookup, collection, candidate, created=True, parent_deleted=parent_deleted)


def orphans(
    lookup: RecordLookup, collection: str, record: Mapping[str, Any], gone: Callable[[str, str], bool]
) -> list[tuple[str, str]]:
    """(relation name, parent id) of each reference of ``record`` (alive, in ``collection``) to a parent that
    ``gone`` says was deleted, for relations whose onDelete promises no dangling children."""
    out = []
    for relation in lookup.schema.relations.values():
        if relation.from_ != collection or relation.on_delete == "no-action":
            continue
        value = record.get(relation.field)
        for parent in value if isinstance(value, list) else [value]:
            if isinstance(parent, str) and gone(relation.to, parent):
                out.append((relation.name, parent))
    return out


def as_mapping(action: Action) -> Mapping[str, Any]:
    return {
        "type": action.type,
        "collection": action.collection,
        "recordId": action.record_id,
        "changes": action.changes,
    }
