"""Partial-sync rules, scope maps and scope values from claims (SPEC 2.9, 4.4)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offline.core.fields import t
from offline.core.schema import SchemaDefinition, define_schema
from offline.core.scopes import (
    build_scope_map,
    collect_schema_scope_fields,
    extract_scope_values_from_claims,
    has_sync_rules,
    participating_collections,
    record_in_scope,
)


def make_schema(sync: dict[str, Any] | None = None, **scopes: Any) -> SchemaDefinition:
    """Collections todos, projects, notes, tags; `scopes` gives legacy `scope` per collection."""
    collections: dict[str, Any] = {
        "todos": {"fields": {"title": t.string(), "userId": t.string(), "orgId": t.string().optional()}},
        "projects": {"fields": {"name": t.string(), "ownerId": t.string(), "orgId": t.string()}},
        "notes": {"fields": {"body": t.string(), "userId": t.string()}},
        "tags": {"fields": {"label": t.string()}},
    }
    for name, scope in scopes.items():
        collections[name]["scope"] = scope
    schema_input: dict[str, Any] = {"version": 1, "collections": collections}
    if sync is not None:
        schema_input["sync"] = sync
    return define_schema(schema_input)


SYNC = {
    "todos": {"where": {"userId": True}},
    "projects": {"where": {"ownerId": "userId", "orgId": "org"}},
}


# -- build_scope_map -------------------------------------------------------------------------------


def test_true_binding_uses_same_named_scope_value() -> None:
    schema = make_schema(sync={"todos": {"where": {"userId": True}}})
    assert build_scope_map(schema, {"userId": "u1"}) == {"todos": {"userId": "u1"}}


def test_string_binding_uses_other_scope_key() -> None:
    schema = make_schema(sync={"projects": {"where": {"ownerId": "userId", "orgId": "org"}}})
    scope = build_scope_map(schema, {"userId": "u1", "org": "o9", "ownerId": "ignored", "orgId": "ignored"})
    assert scope == {"projects": {"ownerId": "u1", "orgId": "o9"}}


def test_collections_not_listed_are_omitted_when_sync_present() -> None:
    schema = make_schema(sync=SYNC)
    scope = build_scope_map(schema, {"userId": "u1", "org": "o1"})
    assert scope == {"todos": {"userId": "u1"}, "projects": {"ownerId": "u1", "orgId": "o1"}}
    assert "notes" not in scope
    assert "tags" not in scope


def test_legacy_scope_participates_when_sync_present() -> None:
    schema = make_schema(sync={"todos": {"where": {"userId": True}}}, notes=["userId"])
    scope = build_scope_map(schema, {"userId": "u1"})
    assert scope == {"todos": {"userId": "u1"}, "notes": {"userId": "u1"}}
    assert "projects" not in scope
    assert participating_collections(schema) == {"todos", "notes"}


def test_legacy_scope_mapping_form() -> None:
    schema = make_schema(sync={"todos": {"where": {"userId": True}}}, projects={"ownerId": "userId"})
    assert build_scope_map(schema, {"userId": "u7"}) == {
        "todos": {"userId": "u7"},
        "projects": {"ownerId": "u7"},
    }


def test_legacy_scope_without_sync_rules() -> None:
    schema = make_schema(notes=["userId"])
    scope = build_scope_map(schema, {"userId": "u1"})
    assert scope["notes"] == {"userId": "u1"}
    # Without sync rules, every collection syncs; unscoped ones are unfiltered.
    assert scope == {"todos": {}, "projects": {}, "notes": {"userId": "u1"}, "tags": {}}
    assert participating_collections(schema) == {"todos", "projects", "notes", "tags"}


def test_no_sync_and_no_scope_gives_every_collection_unfiltered() -> None:
    schema = make_schema()
    assert build_scope_map(schema, {"userId": "u1"}) == {"todos": {}, "projects": {}, "notes": {}, "tags": {}}
    assert not has_sync_rules(schema)


def test_empty_sync_means_no_partial_sync() -> None:
    schema = make_schema(sync={})
    assert not has_sync_rules(schema)
    assert build_scope_map(schema, {"userId": "u"}) == {"todos": {}, "projects": {}, "notes": {}, "tags": {}}


def test_empty_legacy_scope_does_not_make_a_collection_participate() -> None:
    schema = make_schema(sync={"todos": {"where": {"userId": True}}}, notes=[], tags={})
    assert build_scope_map(schema, {"userId": "u"}) == {"todos": {"userId": "u"}}
    assert participating_collections(schema) == {"todos"}


def test_sync_rule_with_empty_where_falls_back_to_legacy_scope() -> None:
    schema = make_schema(sync={"todos": {"where": {}}, "notes": {"where": {}}}, todos=["userId"])
    assert build_scope_map(schema, {"userId": "u"}) == {"todos": {"userId": "u"}, "notes": {}}


def test_sync_rule_wins_over_legacy_scope() -> None:
    schema = make_schema(sync={"todos": {"where": {"orgId": "org"}}}, todos=["userId"])
    assert build_scope_map(schema, {"userId": "u1", "org": "o1"}) == {"todos": {"orgId": "o1"}}


def test_missing_scope_values_are_left_out_of_the_filter() -> None:
    schema = make_schema(sync=SYNC)
    assert build_scope_map(schema, {}) == {"todos": {}, "projects": {}}
    assert build_scope_map(schema, {"org": "o1"}) == {"todos": {}, "projects": {"orgId": "o1"}}


def test_scope_values_are_passed_through_unchanged() -> None:
    schema = make_schema(sync={"todos": {"where": {"userId": True}}})
    value = {"nested": [1, 2]}
    assert build_scope_map(schema, {"userId": value})["todos"]["userId"] is value
    assert build_scope_map(schema, {"userId": None}) == {"todos": {"userId": None}}


def test_scope_map_follows_schema_collection_order() -> None:
    schema = make_schema(sync={"notes": {"where": {"userId": True}}, "todos": {"where": {"userId": True}}})
    assert list(build_scope_map(schema, {"userId": "u"})) == ["todos", "notes"]


def test_scope_map_is_a_fresh_plain_dict() -> None:
    schema = make_schema(sync=SYNC)
    first = build_scope_map(schema, {"userId": "u1"})
    assert type(first) is dict
    assert all(type(v) is dict for v in first.values())
    first["todos"]["userId"] = "hacked"
    assert build_scope_map(schema, {"userId": "u1"})["todos"] == {"userId": "u1"}


@given(
    user=st.text(max_size=8),
    org=st.one_of(st.none(), st.text(max_size=8), st.integers()),
    extra=st.dictionaries(st.text(max_size=6), st.integers(), max_size=4),
)
def test_scope_map_binds_by_rule(user: str, org: Any, extra: dict[str, int]) -> None:
    schema = make_schema(sync=SYNC)
    values: dict[str, Any] = {**extra, "userId": user, "org": org}
    assert build_scope_map(schema, values) == {
        "todos": {"userId": user},
        "projects": {"ownerId": user, "orgId": org},
    }


# -- collect_schema_scope_fields -------------------------------------------------------------------


def test_collect_scope_fields_from_sync_rules() -> None:
    fields = collect_schema_scope_fields(make_schema(sync=SYNC))
    assert sorted(fields) == ["org", "userId"]
    assert len(fields) == len(set(fields))


def test_collect_scope_fields_includes_legacy_scopes() -> None:
    schema = make_schema(sync={"projects": {"where": {"orgId": "org"}}}, notes=["userId"], todos=["orgId"])
    assert set(collect_schema_scope_fields(schema)) == {"org", "userId", "orgId"}


def test_collect_scope_fields_legacy_only() -> None:
    assert collect_schema_scope_fields(make_schema(notes=["userId"])) == ["userId"]


def test_collect_scope_fields_empty() -> None:
    assert collect_schema_scope_fields(make_schema()) == []


def test_collect_scope_fields_deduplicated() -> None:
    schema = make_schema(
        sync={"todos": {"where": {"userId": True}}, "notes": {"where": {"userId": True}}},
        projects={"ownerId": "userId"},
    )
    assert collect_schema_scope_fields(schema) == ["userId"]


# -- extract_scope_values_from_claims --------------------------------------------------------------


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ({"userId": "top", "scope": {"userId": "nested"}, "sub": "subject"}, {"userId": "top"}),
        ({"scope": {"userId": "nested"}, "sub": "subject"}, {"userId": "nested"}),
        ({"sub": "subject"}, {"userId": "subject"}),
        ({}, {}),
        ({"scope": "read write", "sub": "subject"}, {"userId": "subject"}),
        ({"scope": ["userId"], "sub": "subject"}, {"userId": "subject"}),
        ({"userId": None, "sub": "subject"}, {"userId": None}),
        ({"sub": 42}, {}),
        ({"other": "x"}, {}),
    ],
    ids=repr,
)
def test_extract_user_id_precedence(claims: dict[str, Any], expected: dict[str, Any]) -> None:
    schema = make_schema(sync={"todos": {"where": {"userId": True}}})
    assert extract_scope_values_from_claims(schema, claims) == expected


def test_sub_is_only_used_for_user_id() -> None:
    schema = make_schema(sync={"projects": {"where": {"orgId": "org"}}})
    assert extract_scope_values_from_claims(schema, {"sub": "s"}) == {}
    assert extract_scope_values_from_claims(schema, {"sub": "s", "scope": {"org": "o"}}) == {"org": "o"}


def test_extract_uses_scope_keys_not_record_fields() -> None:
    schema = make_schema(sync={"projects": {"where": {"ownerId": "userId", "orgId": "org"}}})
    claims = {"ownerId": "wrong", "orgId": "wrong", "org": "o1", "sub": "u1"}
    assert extract_scope_values_from_claims(schema, claims) == {"userId": "u1", "org": "o1"}


def test_extract_with_no_scope_fields_is_empty() -> None:
    assert extract_scope_values_from_claims(make_schema(), {"userId": "u", "sub": "s"}) == {}


def test_extract_reads_legacy_scopes() -> None:
    schema = make_schema(notes=["userId"])
    assert extract_scope_values_from_claims(schema, {"sub": "s1"}) == {"userId": "s1"}


def test_extracted_values_feed_build_scope_map() -> None:
    schema = make_schema(sync=SYNC)
    values = extract_scope_values_from_claims(schema, {"sub": "u1", "scope": {"org": "o1"}})
    assert build_scope_map(schema, values) == {
        "todos": {"userId": "u1"},
        "projects": {"ownerId": "u1", "orgId": "o1"},
    }


PRECEDENCE_SCHEMA = make_schema(sync=SYNC, notes=["userId"], tags={"label": "team"})
SCOPE_KEYS = ["userId", "org", "team"]
claim_values = st.one_of(st.none(), st.text(max_size=5), st.integers(), st.booleans())
key_names = st.sampled_from([*SCOPE_KEYS, "sub", "other", "iat"])


@given(
    top=st.dictionaries(key_names, claim_values, max_size=5),
    nested=st.one_of(
        st.dictionaries(key_names, claim_values, max_size=5),
        st.text(max_size=5),
        st.none(),
        st.lists(st.text(max_size=3), max_size=2),
    ),
    include_nested=st.booleans(),
    sub=st.one_of(st.none(), st.text(max_size=5), st.integers()),
    include_sub=st.booleans(),
)
def test_extract_precedence_over_random_claims(
    top: dict[str, Any], nested: Any, include_nested: bool, sub: Any, include_sub: bool
) -> None:
    claims = dict(top)
    claims.pop("scope", None)
    if include_nested:
        claims["scope"] = nested
    if include_sub:
        claims["sub"] = sub
    result = extract_scope_values_from_claims(PRECEDENCE_SCHEMA, claims)

    assert set(collect_schema_scope_fields(PRECEDENCE_SCHEMA)) == set(SCOPE_KEYS)
    assert set(result) <= set(SCOPE_KEYS)
    for key in SCOPE_KEYS:
        if key in claims:
            assert result[key] == claims[key]
        elif include_nested and isinstance(nested, dict) and key in nested:
            assert result[key] == nested[key]
        elif key == "userId" and isinstance(claims.get("sub"), str):
            assert result[key] == claims["sub"]
        else:
            assert key not in result


# -- record_in_scope -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "scope_filter", "expected"),
    [
        ({"userId": "u1", "title": "x"}, {"userId": "u1"}, True),
        ({"userId": "u2"}, {"userId": "u1"}, False),
        ({"title": "x"}, {"userId": "u1"}, False),
        ({"title": "x"}, {}, True),
        ({"userId": "u1", "orgId": "o1"}, {"userId": "u1", "orgId": "o2"}, False),
    ],
)
def test_record_in_scope(record: dict[str, Any], scope_filter: dict[str, Any], expected: bool) -> None:
    assert record_in_scope(record, scope_filter) is expected
