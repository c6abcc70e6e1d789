"""Partial-sync rules and scope maps (SPEC 2.9, 4.4).

A collection's scope filter is `{record_field: scope_value}`; a record is in scope when every listed field
equals its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .schema import SchemaDefinition

ScopeMap = dict[str, dict[str, Any]]


def has_sync_rules(schema: SchemaDefinition) -> bool:
    """True when the schema declares at least one root-level `sync` rule (partial sync)."""
    return bool(schema.sync)


def collection_bindings(schema: SchemaDefinition, name: str) -> Mapping[str, Any] | None:
    """{record field: True or scope key} of one collection, or None when its sync is not filtered.

    A `sync` rule with a non-empty `where` wins over the collection's legacy `scope`.
    """
    if schema.sync is not None:
        rule = schema.sync.get(name)
        if rule is not None and rule.where:
            return rule.where
    scope = schema.collections[name].scope
    return scope if scope else None


def _scope_key(record_field: str, binding: Any) -> str:
    return record_field if binding is True else str(binding)


def participating_collections(schema: SchemaDefinition) -> frozenset[str]:
    """Collections that sync at all: every one without `sync` rules, else those listed or legacy-scoped."""
    if not has_sync_rules(schema):
        return frozenset(schema.collections)
    assert schema.sync is not None
    return frozenset(
        name for name, collection in schema.collections.items() if name in schema.sync or collection.scope
    )


def collect_schema_scope_fields(schema: SchemaDefinition) -> list[str]:
    """Names of the scope values the schema binds (legacy scopes, then sync rules), in first-seen order."""
    seen: dict[str, None] = {}
    wheres: list[Mapping[str, Any]] = [c.scope for c in schema.collections.values() if c.scope]
    if schema.sync is not None:
        wheres.extend(rule.where for rule in schema.sync.values())
    for where in wheres:
        for record_field, binding in where.items():
            seen.setdefault(_scope_key(record_field, binding), None)
    return list(seen)


def build_scope_map(schema: SchemaDefinition, scope_values: Mapping[str, Any]) -> ScopeMap:
    """Each participating collection -> its filter object, from the given scope values (SPEC 2.9).

    Without `sync` rules every collection is present (unfiltered ones map to `{}`); with them, only the
    collections listed in `sync` or carrying a legacy `scope`. A binding whose scope value is absent is left
    out of the filter; the server, which derives values from authenticated claims, decides whether that
    session may see the collection at all.
    """
    participating = participating_collections(schema)
    out: ScopeMap = {}
    for name in schema.collections:
        if name not in participating:
            continue
        filt: dict[str, Any] = {}
        for record_field, binding in (collection_bindings(schema, name) or {}).items():
            key = _scope_key(record_field, binding)
            if key in scope_values:
                filt[record_field] = scope_values[key]
        out[name] = filt
    return out


def extract_scope_values_from_claims(schema: SchemaDefinition, claims: Mapping[str, Any]) -> dict[str, Any]:
    """Scope values from JWT claims, in SPEC 4.4's order: top-level claim, `claims.scope[field]`, `sub`."""
    nested = claims.get("scope")
    out: dict[str, Any] = {}
    for field in collect_schema_scope_fields(schema):
        if field in claims:
            out[field] = claims[field]
        elif isinstance(nested, Mapping) and field in nested:
            out[field] = nested[field]
        elif field == "userId" and isinstance(claims.get("sub"), str):
            out[field] = claims["sub"]
    return out


def record_in_scope(record: Mapping[str, Any], scope_filter: Mapping[str, Any]) -> bool:
    """True when every filtered field of ``record`` equals the filter's value."""
    return all(record.get(field) == value for field, value in scope_filter.items())
