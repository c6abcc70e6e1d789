"""`define_schema`: validate a schema input and freeze it (SPEC 2.1-2.3, 2.9, 7.2; DESIGN.md section 2).

Structural mistakes (names, missing collections or fields) are `OfflineError` code INVALID_SCHEMA; misuse of
state machines is `SchemaValidationError`. Every error's context names what was wrong.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from .errors import INVALID_SCHEMA, OfflineError, SchemaValidationError
from .fields import FieldDescriptor
from .frozen import FrozenDict, freeze
from .state_machine import StateMachineDefinition, validate_state_machine_definition

NAME_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

RelationType = Literal["many-to-one", "one-to-many", "many-to-many"]
RELATION_TYPES: Final = ("many-to-one", "one-to-many", "many-to-many")
OnDelete = Literal["set-null", "cascade", "restrict", "no-action"]
ON_DELETE: Final = ("set-null", "cascade", "restrict", "no-action")
CONSTRAINT_TYPES: Final = ("unique", "capacity", "referential")
ON_CONFLICT: Final = ("first-write-wins", "last-write-wins", "priority-field", "server-decides", "custom")

#: Resolver of Tier 3: called with the two concurrent values (earlier HLC first) and the base value.
ResolverFn = Callable[[Any, Any, Any], Any]

_COLLECTION_KEYS: Final = {
    "fields": "fields",
    "indexes": "indexes",
    "constraints": "constraints",
    "resolve": "resolve",
    "stateMachine": "state_machine",
    "state_machine": "state_machine",
    "scope": "scope",
}
_SCHEMA_KEYS: Final = ("version", "collections", "relations", "sync", "migrations")


def _fail(message: str, **context: Any) -> OfflineError:
    return OfflineError(message, INVALID_SCHEMA, context)


def _get(mapping: Mapping[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    # DESIGN.md section 2: camelCase keys are documented, snake_case spellings are accepted too.
    if camel in mapping:
        return mapping[camel]
    return mapping.get(snake, default)


@dataclass(frozen=True, slots=True)
class Constraint:
    """A Tier 2 constraint (DESIGN.md section 3), keyed by name in its collection."""

    name: str
    type: Literal["unique", "capacity", "referential"]
    fields: tuple[str, ...]
    on_conflict: str
    where: FrozenDict[str, Any] | None = None
    limit: int | None = None
    collection: str | None = None
    priority_field: str | None = None
    resolve: Callable[..., Any] | None = None

    def __getitem__(self, key: str) -> Any:
        return getattr(self, {"onConflict": "on_conflict", "priorityField": "priority_field"}.get(key, key))


@dataclass(frozen=True, slots=True)
class RelationDefinition:
    name: str
    from_: str
    to: str
    type: RelationType
    field: str
    on_delete: OnDelete = "no-action"

    def __getitem__(self, key: str) -> Any:
        return getattr(self, {"from": "from_", "onDelete": "on_delete"}.get(key, key))


@dataclass(frozen=True, slots=True)
class CollectionDefinition:
    name: str
    fields: FrozenDict[str, FieldDescriptor]
    indexes: tuple[str, ...] = ()
    constraints: FrozenDict[str, Constraint] = dataclasses.field(default_factory=FrozenDict)
    resolve: FrozenDict[str, ResolverFn] = dataclasses.field(default_factory=FrozenDict)
    state_machine: StateMachineDefinition | None = None
    scope: FrozenDict[str, Any] | None = None

    def __getitem__(self, key: str) -> Any:
        # Lets code written against SPEC's object shape read `collection["stateMachine"]`.
        return getattr(self, _COLLECTION_KEYS.get(key, key))


@dataclass(frozen=True, slots=True)
class SyncRule:
    """`sync[collection]`: record field -> `True` (same-named scope value) or the scope key to bind."""

    where: FrozenDict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


@dataclass(frozen=True, slots=True)
class SchemaDefinition:
    """A validated, deeply immutable schema (SPEC 2.1)."""

    version: int
    collections: FrozenDict[str, CollectionDefinition]
    relations: FrozenDict[str, RelationDefinition] = dataclasses.field(default_factory=FrozenDict)
    sync: FrozenDict[str, SyncRule] | None = None
    migrations: FrozenDict[int, Any] = dataclasses.field(default_factory=FrozenDict)

    def collection(self, name: str) -> CollectionDefinition:
        try:
            return self.collections[name]
        except KeyError:
            raise _fail(f"unknown collection {name!r}", collection=name) from None

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


def _require_mapping(value: Any, what: str, **context: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(f"{what} must be a mapping, got {type(value).__name__}", **context)
    return value


def _check_name(name: Any, what: str, **context: Any) -> str:
    if not isinstance(name, str) or not name or not NAME_RE.match(name):
        raise _fail(
            f"{what} name {name!r} is invalid: it must start with a letter and contain only letters, "
            "digits and underscores",
            **context,
        )
    return name


def _string_list(value: Any, what: str, **context: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _fail(f"{what} must be a list of field names", **context)
    for item in value:
        if not isinstance(item, str):
            raise _fail(f"{what} must contain field names (strings), got {item!r}", **context)
    return tuple(value)


def _validate_fields(name: str, raw: Any) -> FrozenDict[str, FieldDescriptor]:
    fields = _require_mapping(raw, f"collection {name!r} fields", collection=name)
    if not fields:
        raise _fail(f"collection {name!r} has no fields", collection=name)
    out: dict[str, FieldDescriptor] = {}
    for field_name, descriptor in fields.items():
        _check_name(field_name, "field", collection=name, field=field_name)
        if field_name == "id":
            raise _fail(
                f"collection {name!r} declares a field named 'id'; every record already has an id",
                collection=name,
                field="id",
            )
        if not isinstance(descriptor, FieldDescriptor):
            raise _fail(
                f"{name}.{field_name} must be built with t (for example t.string()), got {descriptor!r}",
                collection=name,
                field=field_name,
            )
        out[field_name] = descriptor
    return FrozenDict(out)


def _validate_where(
    where: Any, collection: str, fields: Mapping[str, FieldDescriptor], what: str
) -> FrozenDict[str, Any]:
    mapping = _require_mapping(where, what, collection=collection)
    for field_name, binding in mapping.items():
        if field_name != "id" and field_name not in fields:
            raise _fail(
                f"{what} names field {field_name!r}, which collection {collection!r} does not have",
                collection=collection,
                field=field_name,
            )
        if binding is not True and not (isinstance(binding, str) and binding):
            raise _fail(
                f"{what}[{field_name!r}] must be true or a scope key name, got {binding!r}",
                collection=collection,
                field=field_name,
            )
    return FrozenDict(mapping)


def _validate_constraint(
    collection: str,
    cname: str,
    raw: Any,
    fields: Mapping[str, FieldDescriptor],
    collection_names: Sequence[str],
) -> Constraint:
    spec = _require_mapping(raw, f"constraint {collection}.{cname}", collection=collection, constraint=cname)
    ctype = spec.get("type")
    if ctype not in CONSTRAINT_TYPES:
        raise _fail(
            f"constraint {collection}.{cname} has type {ctype!r}; expected one of {', '.join(CONSTRAINT_TYPES)}",
            collection=collection,
            constraint=cname,
        )
    cfields = _string_list(
        spec.get("fields", ()),
        f"constraint {collection}.{cname} fields",
        collection=collection,
        constraint=cname,
    )
    if not cfields:
        raise _fail(
            f"constraint {collection}.{cname} needs at least one field",
            collection=collection,
            constraint=cname,
        )
    for f in cfields:
        if f not in fields:
            raise _fail(
                f"constraint {collection}.{cname} names field {f!r}, which the collection does not have",
                collection=collection,
                constraint=cname,
                field=f,
            )
    where = spec.get("where")
    frozen_where = None
    if where is not None:
        where_map = _require_mapping(
            where, f"constraint {collection}.{cname} where", collection=collection, constraint=cname
        )
        for f in where_map:
            if f not in fields:
                raise _fail(
                    f"constraint {collection}.{cname} where names field {f!r}, which the collection does not have",
                    collection=collection,
                    constraint=cname,
                    field=f,
                )
        frozen_where = freeze(where_map)
    limit = spec.get("limit")
    if ctype == "capacity" and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise _fail(
            f"capacity constraint {collection}.{cname} needs a positive integer limit, got {limit!r}",
            collection=collection,
            constraint=cname,
            field="limit",
        )
    target = spec.get("collection")
    if ctype == "referential" and target not in collection_names:
        raise _fail(
            f"referential constraint {collection}.{cname} points at collection {target!r}, "
            "which the schema does not have",
            collection=collection,
            constraint=cname,
            target=target,
        )
    on_conflict = _get(spec, "onConflict", "on_conflict", "server-decides")
    if on_conflict not in ON_CONFLICT:
        raise _fail(
            f"constraint {collection}.{cname} onConflict {on_conflict!r} is not one of {', '.join(ON_CONFLICT)}",
            collection=collection,
            constraint=cname,
        )
    priority_field = _get(spec, "priorityField", "priority_field")
    if on_conflict == "priority-field" and (
        not isinstance(priority_field, str) or priority_field not in fields
    ):
        raise _fail(
            f"constraint {collection}.{cname} uses onConflict 'priority-field' but priorityField "
            f"{priority_field!r} is not a field of {collection!r}",
            collection=collection,
            constraint=cname,
            field=priority_field,
        )
    resolve = spec.get("resolve")
    if on_conflict == "custom" and not callable(resolve):
        raise _fail(
            f"constraint {collection}.{cname} uses onConflict 'custom' and needs a callable resolve",
            collection=collection,
            constraint=cname,
        )
    return Constraint(
        name=cname,
        type=ctype,
        fields=cfields,
        on_conflict=on_conflict,
        where=frozen_where,
        limit=limit if ctype == "capacity" else None,
        collection=target if ctype == "referential" else None,
        priority_field=priority_field,
        resolve=resolve,
    )


def _validate_collection(name: str, raw: Any, collection_names: Sequence[str]) -> CollectionDefinition:
    spec = _require_mapping(raw, f"collection {name!r}", collection=name)
    for key in spec:
        if key not in _COLLECTION_KEYS:
            raise _fail(
                f"collection {name!r} has unknown key {key!r}; expected {', '.join(sorted(set(_COLLECTION_KEYS)))}",
                collection=name,
                key=key,
            )
    fields = _validate_fields(name, spec.get("fields"))

    indexes = _string_list(spec.get("indexes", ()), f"{name}.indexes", collection=name)
    for index in indexes:
        if index not in fields:
            raise _fail(
                f"index on {name}.{index}: collection {name!r} has no field {index!r}",
                collection=name,
                field=index,
            )

    constraints: dict[str, Constraint] = {}
    for cname, craw in _require_mapping(
        spec.get("constraints", {}), f"{name}.constraints", collection=name
    ).items():
        _check_name(cname, "constraint", collection=name, constraint=cname)
        constraints[cname] = _validate_constraint(name, cname, craw, fields, collection_names)

    resolvers: dict[str, ResolverFn] = {}
    for field_name, fn in _require_mapping(
        spec.get("resolve", {}), f"{name}.resolve", collection=name
    ).items():
        if field_name not in fields:
            raise _fail(
                f"resolver for {name}.{field_name}: collection {name!r} has no field {field_name!r}",
                collection=name,
                field=field_name,
            )
        if not callable(fn):
            raise _fail(
                f"resolver for {name}.{field_name} must be a function (a, b, base) -> value",
                collection=name,
                field=field_name,
            )
        resolvers[field_name] = fn

    state_machine = None
    raw_sm = _get(spec, "stateMachine", "state_machine")
    if raw_sm is not None:
        state_machine = validate_state_machine_definition(name, raw_sm, fields)
        if fields[state_machine.field].transition_map is not None:
            raise SchemaValidationError(
                f"{name}.{state_machine.field} declares transitions twice (with .transitions() and in "
                "stateMachine); keep one",
                {"collection": name, "field": state_machine.field},
            )

    scope = spec.get("scope")
    frozen_scope = None
    if scope is not None:
        if isinstance(scope, Sequence) and not isinstance(scope, (str, bytes)):
            # The legacy form is a list of record fields, each bound to the scope value of the same name.
            scope = dict.fromkeys(_string_list(scope, f"{name}.scope", collection=name), True)
        frozen_scope = _validate_where(scope, name, fields, f"{name}.scope")

    return CollectionDefinition(
        name=name,
        fields=fields,
        indexes=indexes,
        constraints=FrozenDict(constraints),
        resolve=FrozenDict(resolvers),
        state_machine=state_machine,
        scope=frozen_scope,
    )


def _validate_relation(
    rname: str, raw: Any, collections: Mapping[str, CollectionDefinition]
) -> RelationDefinition:
    spec = _require_mapping(raw, f"relation {rname!r}", relation=rname)
    source = _get(spec, "from", "from_")
    target = spec.get("to")
    for role, cname in (("from", source), ("to", target)):
        if not isinstance(cname, str) or cname not in collections:
            raise _fail(
                f"relation {rname!r} references collection {cname!r} ({role}), which the schema does not have",
                relation=rname,
                collection=cname,
                role=role,
            )
    rtype = spec.get("type")
    if rtype not in RELATION_TYPES:
        raise _fail(
            f"relation {rname!r} has type {rtype!r}; expected one of {', '.join(RELATION_TYPES)}",
            relation=rname,
        )
    field = spec.get("field")
    if not isinstance(field, str) or field not in collections[source].fields:
        raise _fail(
            f"relation {rname!r} uses field {field!r}, which collection {source!r} does not have",
            relation=rname,
            collection=source,
            field=field,
        )
    on_delete = _get(spec, "onDelete", "on_delete", "no-action")
    if on_delete not in ON_DELETE:
        raise _fail(
            f"relation {rname!r} onDelete {on_delete!r} is not one of {', '.join(ON_DELETE)}",
            relation=rname,
        )
    if on_delete == "set-null" and collections[source].fields[field].required:
        raise _fail(
            f"relation {rname!r} uses onDelete 'set-null' but {source}.{field} is required; make it .optional()",
            relation=rname,
            collection=source,
            field=field,
        )
    return RelationDefinition(rname, source, str(target), rtype, field, on_delete)


def define_schema(schema_input: Mapping[str, Any]) -> SchemaDefinition:
    """Validate ``schema_input`` (SPEC 2.1) and return a frozen SchemaDefinition."""
    spec = _require_mapping(schema_input, "the schema")
    for key in spec:
        if key not in _SCHEMA_KEYS:
            raise _fail(f"unknown schema key {key!r}; expected {', '.join(_SCHEMA_KEYS)}", key=key)

    version = spec.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _fail(f"schema version must be a positive integer, got {version!r}", field="version")

    raw_collections = _require_mapping(spec.get("collections"), "collections", field="collections")
    if not raw_collections:
        raise _fail("the schema needs at least one collection", field="collections")
    names = list(raw_collections)
    for name in names:
        _check_name(name, "collection", collection=name)
    collections = {name: _validate_collection(name, raw_collections[name], names) for name in names}

    relations = {}
    for rname, raw in _require_mapping(spec.get("relations", {}), "relations", field="relations").items():
        _check_name(rname, "relation", relation=rname)
        relations[rname] = _validate_relation(rname, raw, collections)

    sync: FrozenDict[str, SyncRule] | None = None
    if spec.get("sync") is not None:
        sync_rules = {}
        for cname, rule in _require_mapping(spec["sync"], "sync", field="sync").items():
            if cname not in collections:
                raise _fail(
                    f"sync rule names collection {cname!r}, which the schema does not have", collection=cname
                )
            rule_map = _require_mapping(rule, f"sync[{cname!r}]", collection=cname)
            if "where" not in rule_map:
                raise _fail(f"sync[{cname!r}] needs a where mapping", collection=cname)
            extra = set(rule_map) - {"where"}
            if extra:
                raise _fail(f"sync[{cname!r}] has unknown keys {sorted(extra)}", collection=cname)
            sync_rules[cname] = SyncRule(
                _validate_where(rule_map["where"], cname, collections[cname].fields, f"sync[{cname!r}].where")
            )
        sync = FrozenDict(sync_rules)

    migrations: dict[int, Any] = {}
    # Keyed by the version a migration reaches: migrations[2] holds the steps from version 1 to 2.
    for to_version, migration in _require_mapping(
        spec.get("migrations", {}), "migrations", field="migrations"
    ).items():
        if isinstance(to_version, bool) or not isinstance(to_version, int) or not 2 <= to_version <= version:
            raise _fail(
                f"migrations key {to_version!r} must be the schema version the steps reach (2 to {version})",
                field="migrations",
            )
        if not hasattr(migration, "steps"):
            raise _fail(
                f"migrations[{to_version}] must be built with migrate()...build()", field="migrations"
            )
        migrations[to_version] = migration

    return SchemaDefinition(
        version=version,
        collections=FrozenDict(collections),
        relations=FrozenDict(relations),
        sync=sync,
        migrations=FrozenDict(dict(sorted(migrations.items()))),
    )
