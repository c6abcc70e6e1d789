"""Tier 2: constraints across records (unique, capacity, referential) and their `onConflict` policies.

The replica that accepts a write decides: the local store for its own writes, the server for what clients
send (DESIGN.md section 3). A decision is either a refusal (OfflineError CONSTRAINT_VIOLATION, whose context
names the constraint: the incoming write loses) or extra operations written by the deciding replica in the
same transaction (the existing records lose). Losing records are "evicted": their constrained fields are
cleared when all of them are optional, otherwise the record is deleted (and that delete follows the
relations' `onDelete` and the referential constraints like any delete, see `relations.complete_actions`).

A write is judged when it inserts a record, or when an update changes a constrained field or a field of the
constraint's `where`; only records matching `where` take part. Nulls never collide: a unique value with a
null part is never a duplicate, a capacity group with a null part is no group (so evicted records, whose
fields are cleared, never fill a group of their own), a null reference points at nothing.

Policies, for unique and capacity:
- first-write-wins / server-decides: what is already stored wins; the incoming write is refused.
- last-write-wins: the incoming write wins; conflicting stored records are evicted (for capacity, the oldest
  members of the group, by id, make room).
- priority-field: the record with the higher `priorityField` value wins (a tie keeps what is stored; a null
  priority is lower than any value).
- custom: `resolve(incoming, existing)` (existing: the conflicting record for unique, the group's records for
  capacity, None for a missing reference) returns None to refuse the incoming write, or a dict of changes
  applied to the incoming record by a follow-up operation. The changes are validated like a write and the
  changed record is judged again: a resolver whose changes still violate its constraint (or that returns
  anything but None or a dict of valid field values) refuses the write; other constraints touched by the
  changes decide as usual.

Referential constraints (`fields` hold ids of `collection`'s records; an array field holds a list of ids):
- a write pointing at a missing record: last-write-wins drops the dangling reference by a follow-up
  operation (an array loses the missing ids, an optional field is cleared) and refuses when a required
  scalar field would be cleared; custom asks the resolver as above; every other policy refuses.
- deleting a referenced record (`check_delete`): last-write-wins (the delete is the later write) drops the
  references (an array loses the id, an optional field is cleared) and deletes the referencing records
  whose required scalar field pointed at it; every other policy, custom included (there is no incoming
  record to change), refuses the delete while records still reference it.

Operations merged without a server (peer to peer) are not judged: `find_breaches` lists the rules the merged
records break so `App.apply` can report them (offline.store.breaches).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from offline.core.errors import CONSTRAINT_VIOLATION, OfflineError
from offline.core.fields import validate_field_value
from offline.core.schema import CollectionDefinition, Constraint, SchemaDefinition

from .values import normalize


class RecordLookup(Protocol):
    schema: SchemaDefinition

    def find_records(self, collection: str, filters: Mapping[str, Any]) -> list[dict[str, Any]]: ...


def records_containing(lookup: RecordLookup, collection: str, field: str, value: Any) -> list[dict[str, Any]]:
    """Alive records of ``collection`` whose array ``field`` holds ``value``: through the lookup's own
    ``find_containing`` (an index of the array's elements) when it has one, else by reading the collection."""
    find = getattr(lookup, "find_containing", None)
    if find is not None:
        return list(find(collection, field, value))
    return [r for r in lookup.find_records(collection, {}) if value in (r.get(field) or ())]


@dataclass(frozen=True, slots=True)
class Action:
    """An extra write the deciding replica makes: 'update' (changes, previous) or 'delete'."""

    type: str
    collection: str
    record_id: str
    changes: dict[str, Any] | None = None
    previous: dict[str, Any] | None = None


@dataclass(slots=True)
class Violation:
    """A constraint that was violated and resolved in favour of the incoming write."""

    constraint: str
    type: str
    collection: str
    record_id: str
    fields: tuple[str, ...]
    losers: list[str] = field(default_factory=list)
    output: Any = None


@dataclass(slots=True)
class Decision:
    actions: list[Action] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)


def _refuse(
    constraint: Constraint, collection: str, record: Mapping[str, Any], others: list[str], why: str
) -> OfflineError:
    return OfflineError(
        f"{collection}: constraint {constraint.name!r} ({constraint.type} on {', '.join(constraint.fields)}) "
        f"refuses this write: {why}",
        CONSTRAINT_VIOLATION,
        {
            "constraint": constraint.name,
            "type": constraint.type,
            "collection": collection,
            "fields": list(constraint.fields),
            "recordId": record.get("id"),
            "conflictsWith": others,
            "onConflict": constraint.on_conflict,
        },
    )


def _evict(definition: CollectionDefinition, constraint: Constraint, record: Mapping[str, Any]) -> Action:
    fields = constraint.fields
    if all(not definition.fields[f].required for f in fields):
        return Action(
            "update",
            definition.name,
            record["id"],
            {f: None for f in fields},
            {f: record.get(f) for f in fields},
        )
    return Action("delete", definition.name, record["id"])


def _priority(record: Mapping[str, Any], name: str | None) -> Any:
    value = record.get(name) if name else None
    return (value is not None, value if value is not None else 0)


def _matches(record: Mapping[str, Any], where: Mapping[str, Any] | None) -> bool:
    return all(record.get(k) == v for k, v in (where or {}).items())


# The policy of a custom constraint whose resolver already changed the record in this write: refuse.
_RESOLVED = "resolved"
_RESOLVED_WHY = "its resolver's changes do not resolve the conflict"


def _touches(constraint: Constraint, candidate: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    if current is None:
        return True
    names = set(constraint.fields) | set(constraint.where or {})
    return any(candidate.get(n) != current.get(n) for n in names)


def check_write(
    lookup: RecordLookup,
    collection: str,
    candidate: Mapping[str, Any],
    current: Mapping[str, Any] | None,
    *,
    _resolved: frozenset[str] = frozenset(),
    _force: frozenset[str] = frozenset(),
) -> Decision:
    """Judge an insert (``current`` None) or update of ``candidate`` against the collection's constraints."""
    definition = lookup.schema.collections[collection]
    decision = Decision()
    changes: dict[str, Any] = {}  # follow-up changes of the candidate (custom resolvers, cleared references)
    for constraint in definition.constraints.values():
        touched = constraint.name in _force or _touches(constraint, candidate, current)
        if not touched or not _matches(candidate, constraint.where):
            continue
        policy = constraint.on_conflict
        if policy == "custom" and constraint.name in _resolved:
            # The resolver already changed this record once in this write; its result must satisfy the
            # constraint, so a remaining conflict refuses the write (and cannot loop).
            policy = _RESOLVED
        if constraint.type == "unique":
            _check_unique(lookup, definition, constraint, policy, candidate, decision, changes)
        elif constraint.type == "capacity":
            _check_capacity(lookup, definition, constraint, policy, candidate, decision, changes)
        else:
            _check_referential(lookup, definition, constraint, policy, candidate, decision, changes)
    used = {
        v.constraint
        for v in decision.violations
        if definition.constraints[v.constraint].on_conflict == "custom"
    }
    if changes or used:
        if changes:
            decision.actions.insert(0, _follow_up(collection, candidate, changes))
        # The changed record is judged again, as an update of the candidate: by the constraints the changes
        # touch, and always by the custom constraints whose resolvers made them.
        again = check_write(
            lookup,
            collection,
            {**candidate, **changes},
            candidate,
            _resolved=_resolved | used,
            _force=frozenset(used),
        )
        decision.actions.extend(again.actions)
        decision.violations.extend(again.violations)
    return decision


def _custom(
    definition: CollectionDefinition,
    constraint: Constraint,
    candidate: Mapping[str, Any],
    existing: Any,
    others: list[str],
) -> dict[str, Any]:
    assert constraint.resolve is not None
    collection = definition.name
    result = constraint.resolve(dict(candidate), existing)
    if result is None:
        raise _refuse(constraint, collection, candidate, others, "its resolver refused it")
    if not isinstance(result, Mapping):
        raise _refuse(
            constraint, collection, candidate, others, "its resolver returned neither None nor a dict"
        )
    changes: dict[str, Any] = {}
    for name, value in result.items():
        descriptor = definition.fields.get(name) if isinstance(name, str) else None
        if descriptor is None or descriptor.is_auto or descriptor.type == "richtext":
            raise _refuse(
                constraint,
                collection,
                candidate,
                others,
                f"its resolver returned a change of {name!r}, which is not a writable field",
            )
        try:
            validate_field_value(collection, name, descriptor, value)
        except OfflineError as exc:
            raise _refuse(
                constraint, collection, candidate, others, f"its resolver returned an invalid value: {exc}"
            ) from None
        value = normalize(descriptor, value)
        if value != candidate.get(name) or type(value) is not type(candidate.get(name)):
            changes[name] = value
    return changes


def _follow_up(collection: str, candidate: Mapping[str, Any], changes: dict[str, Any]) -> Action:
    return Action("update", collection, candidate["id"], changes, {k: candidate.get(k) for k in changes})


def _check_unique(
    lookup: RecordLookup,
    definition: CollectionDefinition,
    constraint: Constraint,
    policy: str,
    candidate: Mapping[str, Any],
    decision: Decision,
    changes: dict[str, Any],
) -> None:
    values = {f: candidate.get(f) for f in constraint.fields}
    if any(v is None for v in values.values()):
        return  # like SQL, nulls never collide
    filters = {**dict(constraint.where or {}), **values}
    others = [r for r in lookup.find_records(definition.name, filters) if r["id"] != candidate["id"]]
    if not others:
        return
    ids = [r["id"] for r in others]
    violation = Violation(constraint.name, "unique", definition.name, candidate["id"], constraint.fields)
    if policy == _RESOLVED:
        raise _refuse(constraint, definition.name, candidate, ids, f"{values} is taken; {_RESOLVED_WHY}")
    if policy in ("first-write-wins", "server-decides"):
        raise _refuse(constraint, definition.name, candidate, ids, f"{values} is already taken")
    if policy == "priority-field":
        mine = _priority(candidate, constraint.priority_field)
        if not all(mine > _priority(r, constraint.priority_field) for r in others):
            raise _refuse(
                constraint, definition.name, candidate, ids, f"{values} is held by a higher priority record"
            )
    if policy == "custom":
        resolved = _custom(definition, constraint, candidate, dict(others[0]), ids)
        changes.update(resolved)
        violation.output = resolved
        decision.violations.append(violation)
        return
    for record in others:
        decision.actions.append(_evict(definition, constraint, record))
    violation.losers = ids
    violation.output = values
    decision.violations.append(violation)


def _check_capacity(
    lookup: RecordLookup,
    definition: CollectionDefinition,
    constraint: Constraint,
    policy: str,
    candidate: Mapping[str, Any],
    decision: Decision,
    changes: dict[str, Any],
) -> None:
    assert constraint.limit is not None
    group = {f: candidate.get(f) for f in constraint.fields}
    if any(v is None for v in group.values()):
        return  # a null group value is no group (evicted records are cleared to null)
    filters = {**dict(constraint.where or {}), **group}
    members = [r for r in lookup.find_records(definition.name, filters) if r["id"] != candidate["id"]]
    overflow = len(members) + 1 - constraint.limit
    if overflow <= 0:
        return
    ids = [r["id"] for r in members]
    violation = Violation(constraint.name, "capacity", definition.name, candidate["id"], constraint.fields)
    if policy == _RESOLVED:
        raise _refuse(
            constraint, definition.name, candidate, ids, f"the group {group} is full; {_RESOLVED_WHY}"
        )
    if policy in ("first-write-wins", "server-decides"):
        raise _refuse(
            constraint,
            definition.name,
            candidate,
            ids,
            f"the group {group} is full (limit {constraint.limit})",
        )
    if policy == "custom":
        resolved = _custom(definition, constraint, candidate, [dict(r) for r in members], ids)
        changes.update(resolved)
        violation.output = resolved
        decision.violations.append(violation)
        return
    if policy == "priority-field":
        ranked = sorted(
            [*members, candidate],
            key=lambda r: (_priority(r, constraint.priority_field), r["id"] != candidate["id"]),
        )
        losers: list[Mapping[str, Any]] = ranked[:overflow]
        if any(r["id"] == candidate["id"] for r in losers):
            raise _refuse(
                constraint,
                definition.name,
                candidate,
                ids,
                f"the group {group} is full of higher priority records",
            )
    else:  # last-write-wins: the oldest members (UUID v7 ids sort by creation) make room
        losers = list(sorted(members, key=lambda r: r["id"])[:overflow])
    for record in losers:
        decision.actions.append(_evict(definition, constraint, record))
    violation.losers = [r["id"] for r in losers]
    violation.output = group
    decision.violations.append(violation)


def _check_referential(
    lookup: RecordLookup,
    definition: CollectionDefinition,
    constraint: Constraint,
    policy: str,
    candidate: Mapping[str, Any],
    decision: Decision,
    changes: dict[str, Any],
) -> None:
    assert constraint.collection is not None
    for name in constraint.fields:
        value = candidate.get(name)
        if value is None:
            continue
        targets = value if isinstance(value, list) else [value]
        missing = [v for v in targets if not lookup.find_records(constraint.collection, {"id": v})]
        if not missing:
            continue
        violation = Violation(constraint.name, "referential", definition.name, candidate["id"], (name,))
        if policy == "custom":
            resolved = _custom(definition, constraint, candidate, None, [])
            changes.update(resolved)
            violation.output = resolved
        elif policy == "last-write-wins" and (
            isinstance(value, list) or not definition.fields[name].required
        ):
            kept = [v for v in targets if v not in missing] if isinstance(value, list) else None
            changes[name] = kept
            violation.output = kept
        else:
            raise _refuse(
                constraint,
                definition.name,
                candidate,
                [],
                f"{name} points at {missing} which do not exist in {constraint.collection}"
                + (f"; {_RESOLVED_WHY}" if policy == _RESOLVED else ""),
            )
        decision.violations.append(violation)


def check_delete(
    lookup: RecordLookup, collection: str, record: Mapping[str, Any], *, refuse: bool = True
) -> Decision:
    """Referential constraints pointing at ``collection``: may ``record`` be deleted, and what follows?

    ``refuse=False`` only collects what last-write-wins constraints do (a planner judges refusals last).
    """
    decision = Decision()
    for source in lookup.schema.collections.values():
        for constraint in source.constraints.values():
            if constraint.type != "referential" or constraint.collection != collection:
                continue
            if not refuse and constraint.on_conflict != "last-write-wins":
                continue
            for name in constraint.fields:
                is_array = source.fields[name].type == "array"
                if is_array:
                    referencing = records_containing(lookup, source.name, name, record["id"])
                else:
                    referencing = lookup.find_records(source.name, {name: record["id"]})
                if not referencing:
                    continue
                ids = [r["id"] for r in referencing]
                if constraint.on_conflict != "last-write-wins":
                    raise _refuse(
                        constraint, source.name, record, ids, f"records of {source.name} still reference it"
                    )
                for ref in referencing:
                    if is_array or not source.fields[name].required:
                        # An array loses the id (an empty list is still a value); a scalar is cleared.
                        new = [v for v in ref[name] if v != record["id"]] if is_array else None
                        decision.actions.append(
                            Action("update", source.name, ref["id"], {name: new}, {name: ref.get(name)})
                        )
                    else:
                        decision.actions.append(Action("delete", source.name, ref["id"]))
                decision.violations.append(
                    Violation(constraint.name, "referential", source.name, record["id"], (name,), ids)
                )
    return decision


@dataclass(frozen=True, slots=True)
class Breach:
    """A cross-record rule that the records a replica holds break, found after it merged remote operations
    without a server (peer to peer, `App.apply`): nothing decides it there, so it is reported, not resolved.

    ``kind``: 'unique', 'capacity', 'referential' (constraints) or 'relation' (a child of a deleted parent,
    under 'cascade', 'set-null' or 'restrict'); ``name``: the constraint's or the relation's; ``record_ids``:
    the records involved (sorted).
    """

    kind: str
    name: str
    collection: str
    record_ids: tuple[str, ...]
    fields: tuple[str, ...]
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "collection": self.collection,
            "recordIds": list(self.record_ids),
            "fields": list(self.fields),
            "message": self.message,
        }


def find_breaches(
    lookup: RecordLookup,
    touched: Sequence[tuple[str, str, Mapping[str, Any] | None]],
    held: Callable[[str, str], bool],
) -> list[Breach]:
    """The breaches involving the ``touched`` records (collection, id, record or None when it does not exist
    now). ``held(collection, id)``: the replica holds operations of that record (a parent it holds deleted is
    gone; one it never held may still arrive)."""
    schema = lookup.schema
    found: dict[tuple[str, str, tuple[str, ...]], Breach] = {}

    def add(kind: str, name: str, collection: str, ids: list[str], fields: tuple[str, ...], why: str) -> None:
        key = (kind, name, tuple(sorted(set(ids))))
        if key not in found:
            found[key] = Breach(kind, name, collection, key[2], fields, why)

    known: dict[tuple[str, str], bool] = {}  # many children share a parent: judge each parent once

    def gone(collection: str, record_id: str) -> bool:
        key = (collection, record_id)
        verdict = known.get(key)
        if verdict is None:
            verdict = known[key] = not lookup.find_records(collection, {"id": record_id}) and held(
                collection, record_id
            )
        return verdict

    for collection, record_id, record in touched:
        definition = schema.collections[collection]
        if record is not None:
            for c in definition.constraints.values():
                if not _matches(record, c.where):
                    continue
                values = {f: record.get(f) for f in c.fields}
                if c.type in ("unique", "capacity"):
                    if any(v is None for v in values.values()):
                        continue
                    same = lookup.find_records(collection, {**dict(c.where or {}), **values})
                    ids = sorted({r["id"] for r in same} | {record_id})
                    if c.type == "unique" and len(ids) > 1:
                        add(
                            "unique",
                            c.name,
                            collection,
                            ids,
                            c.fields,
                            f"{values} is held by {len(ids)} records",
                        )
                    elif c.type == "capacity" and c.limit is not None and len(ids) > c.limit:
                        add(
                            "capacity",
                            c.name,
                            collection,
                            ids,
                            c.fields,
                            f"the group {values} holds {len(ids)} records (limit {c.limit})",
                        )
                else:
                    assert c.collection is not None
                    for name, value in values.items():
                        targets = value if isinstance(value, list) else [value]
                        missing = [v for v in targets if isinstance(v, str) and gone(c.collection, v)]
                        if missing:
                            add(
                                "referential",
                                c.name,
                                collection,
                                [record_id],
                                (name,),
                                f"{name} points at deleted {c.collection} {missing}",
                            )
            for relation in schema.relations.values():
                if relation.from_ != collection or relation.on_delete == "no-action":
                    continue
                value = record.get(relation.field)
                parents = value if isinstance(value, list) else [value]
                missing = [v for v in parents if isinstance(v, str) and gone(relation.to, v)]
                if missing:
                    add(
                        "relation",
                        relation.name,
                        collection,
                        [record_id],
                        (relation.field,),
                        f"{relation.field} points at deleted {relation.to} {missing} "
                        f"(onDelete {relation.on_delete!r})",
                    )
            continue
        if not held(collection, record_id):
            continue
        # A deleted record: what still points at it.
        for relation in schema.relations.values():
            if relation.to != collection or relation.on_delete == "no-action":
                continue
            if schema.collections[relation.from_].fields[relation.field].type == "array":
                children = [
                    r
                    for r in lookup.find_records(relation.from_, {})
                    if record_id in (r.get(relation.field) or ())
                ]
            else:
                children = lookup.find_records(relation.from_, {relation.field: record_id})
            for child in children:
                add(
                    "relation",
                    relation.name,
                    relation.from_,
                    [child["id"]],
                    (relation.field,),
                    f"{relation.field} points at deleted {collection} [{record_id!r}] "
                    f"(onDelete {relation.on_delete!r})",
                )
        for source in schema.collections.values():
            for c in source.constraints.values():
                if c.type != "referential" or c.collection != collection:
                    continue
                for name in c.fields:
                    referencing = [
                        r for r in lookup.find_records(source.name, {}) if _points_at(r.get(name), record_id)
                    ]
                    for ref in referencing:
                        add(
                            "referential",
                            c.name,
                            source.name,
                            [ref["id"]],
                            (name,),
                            f"{name} points at deleted {collection} [{record_id!r}]",
                        )
    return list(found.values())


def _points_at(value: Any, record_id: str) -> bool:
    return record_id in value if isinstance(value, list) else value == record_id
