"""Relations' `onDelete` (SPEC 2.3): what deleting a record does to the records that reference it.

The replica that deletes writes the cascade / set-null operations for the children it holds, in the same
transaction; 'restrict' refuses the delete while children exist; 'no-action' leaves them dangling. The
server applies the same plan for children the deleting client could not see.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from offline.core.errors import CONSTRAINT_VIOLATION, OfflineError

from .constraints import Action, RecordLookup


def _children(lookup: RecordLookup, source: str, field: str, parent_id: str) -> list[dict[str, Any]]:
    descriptor = lookup.schema.collections[source].fields[field]
    if descriptor.type == "array":  # many-to-many: the field holds a list of ids
        return [r for r in lookup.find_records(source, {}) if parent_id in (r.get(field) or ())]
    return lookup.find_records(source, {field: parent_id})


def plan_delete(lookup: RecordLookup, collection: str, record_id: str) -> list[Action]:
    """Actions that deleting ``collection/record_id`` implies, children before grandchildren."""
    actions: list[Action] = []
    deleted: set[tuple[str, str]] = {(collection, record_id)}
    queue = [(collection, record_id)]
    updated: dict[tuple[str, str], dict[str, Any]] = {}
    while queue:
        parent_collection, parent_id = queue.pop(0)
        for relation in lookup.schema.relations.values():
            if relation.to != parent_collection or relation.on_delete == "no-action":
                continue
            for child in _children(lookup, relation.from_, relation.field, parent_id):
                key = (relation.from_, child["id"])
                if key in deleted:
                    continue
                if relation.on_delete == "restrict":
                    raise OfflineError(
                        f"cannot delete {parent_collection} {parent_id!r}: {relation.from_} {child['id']!r} still "
                        f"references it through relation {relation.name!r} (onDelete 'restrict'); delete or "
                        "re-point the children first",
                        CONSTRAINT_VIOLATION,
                        {
                            "relation": relation.name,
                            "collection": parent_collection,
                            "recordId": parent_id,
                            "child": {"collection": relation.from_, "id": child["id"]},
                        },
                    )
                if relation.on_delete == "cascade":
                    deleted.add(key)
                    updated.pop(key, None)
                    actions.append(Action("delete", relation.from_, child["id"]))
                    queue.append(key)
                else:  # set-null
                    current = updated.get(key, dict(child))
                    value = current.get(relation.field)
                    new = [v for v in value if v != parent_id] if isinstance(value, list) else None
                    current[relation.field] = new
                    updated[key] = current
                    actions.append(
                        Action(
                            "update",
                            relation.from_,
                            child["id"],
                            {relation.field: new},
                            {relation.field: value},
                        )
                    )
    # An update planned for a record that a later cascade deletes is dropped: the delete covers it.
    return [a for a in actions if a.type == "delete" or (a.collection, a.record_id) not in deleted]


def as_mapping(action: Action) -> Mapping[str, Any]:
    return {
        "type": action.type,
        "collection": action.collection,
        "recordId": action.record_id,
        "changes": action.changes,
    }
