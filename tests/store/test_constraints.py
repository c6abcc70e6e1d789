"""Tier 2 constraints on local writes (DESIGN.md section 3; offline/merge/constraints.py).

Every constraint type (unique, capacity, referential) under every onConflict policy: refused writes raise
CONSTRAINT_VIOLATION naming the constraint and write nothing; winning writes evict the losers in the same
transaction; custom resolvers refuse (None) or change the incoming record (a dict, judged again). The
tier-2 MergeTrace is checked through `constraint:violated` / `merge:conflict`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import App, OfflineError, create_app, define_schema, t
from offline.core.errors import CONSTRAINT_VIOLATION

Factory = Callable[..., App]

POLICIES = ["first-write-wins", "last-write-wins", "priority-field", "server-decides", "custom"]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Factory]:
    opened: list[App] = []

    def factory(schema_input: dict[str, Any], name: str = "a") -> App:
        app = create_app(define_schema(schema_input), path=str(tmp_path / f"{name}.db"))
        opened.append(app)
        return app

    yield factory
    for app in opened:
        app.close()


def refused(exc: pytest.ExceptionInfo[OfflineError], constraint: str) -> None:
    assert exc.value.code == CONSTRAINT_VIOLATION
    assert exc.value.context is not None
    assert exc.value.context["constraint"] == constraint
    assert constraint in exc.value.message


def op_count(app: App) -> int:
    return len(app.operations())


# -- unique ----------------------------------------------------------------------------------------------


def unique_schema(
    policy: str,
    *,
    email_optional: bool = True,
    resolve: Callable[..., Any] | None = None,
    where: dict[str, Any] | None = None,
) -> dict[str, Any]:
    email = t.string().optional() if email_optional else t.string()
    constraint: dict[str, Any] = {"type": "unique", "fields": ["email"], "onConflict": policy}
    if policy == "priority-field":
        constraint["priorityField"] = "rank"
    if policy == "custom":
        constraint["resolve"] = resolve or (lambda incoming, existing: None)
    if where is not None:
        constraint["where"] = where
    return {
        "version": 1,
        "collections": {
            "users": {
                "fields": {
                    "email": email,
                    "name": t.string().optional(),
                    "rank": t.number().optional(),
                    "active": t.boolean().default(True),
                },
                "constraints": {"uniqueEmail": constraint},
            }
        },
    }


@pytest.mark.parametrize("policy", ["first-write-wins", "server-decides"])
def test_unique_stored_record_wins_and_the_incoming_insert_is_refused(make: Factory, policy: str) -> None:
    app = make(unique_schema(policy))
    first = app.users.insert({"email": "a@x.io", "name": "first"})
    before = op_count(app)

    with pytest.raises(OfflineError) as exc:
        app.users.insert({"email": "a@x.io", "name": "second"})

    refused(exc, "uniqueEmail")
    assert exc.value.context is not None
    assert exc.value.context["conflictsWith"] == [first["id"]]
    assert app.users.fetch() == [first]
    assert op_count(app) == before


@pytest.mark.parametrize("policy", ["first-write-wins", "server-decides"])
def test_unique_update_onto_a_taken_value_is_refused_and_leaves_the_record(
    make: Factory, policy: str
) -> None:
    app = make(unique_schema(policy))
    app.users.insert({"email": "a@x.io"})
    other = app.users.insert({"email": "b@x.io"})
    before = op_count(app)

    with pytest.raises(OfflineError) as exc:
        app.users.update(other["id"], {"email": "a@x.io", "name": "renamed"})

    refused(exc, "uniqueEmail")
    assert app.users.find_by_id(other["id"]) == other
    assert op_count(app) == before


def test_unique_last_write_wins_clears_the_losers_optional_field_in_the_same_transaction(
    make: Factory,
) -> None:
    app = make(unique_schema("last-write-wins"))
    loser = app.users.insert({"email": "a@x.io", "name": "old"})
    before = op_count(app)

    winner = app.users.insert({"email": "a@x.io", "name": "new"})

    assert winner["email"] == "a@x.io"
    assert app.users.find_by_id(loser["id"]) == {**loser, "email": None}
    ops = app.operations()[before:]
    assert [(o.type, o.record_id) for o in ops] == [("insert", winner["id"]), ("update", loser["id"])]
    assert dict(ops[1].data or {}) == {"email": None}
    assert dict(ops[1].previous_data or {}) == {"email": "a@x.io"}


def test_unique_last_write_wins_deletes_the_loser_when_the_field_is_required(make: Factory) -> None:
    app = make(unique_schema("last-write-wins", email_optional=False))
    loser = app.users.insert({"email": "a@x.io", "name": "old"})
    before = op_count(app)

    winner = app.users.update(app.users.insert({"email": "b@x.io"})["id"], {"email": "a@x.io"})

    assert app.users.find_by_id(loser["id"]) is None
    assert app.users.fetch() == [winner]
    ops = app.operations()[before:]
    assert [(o.type, o.record_id) for o in ops] == [
        ("insert", winner["id"]),
        ("update", winner["id"]),
        ("delete", loser["id"]),
    ]


def test_unique_priority_field_higher_priority_evicts_the_stored_record(make: Factory) -> None:
    app = make(unique_schema("priority-field"))
    low = app.users.insert({"email": "a@x.io", "rank": 1})

    high = app.users.insert({"email": "a@x.io", "rank": 5})

    assert high["email"] == "a@x.io"
    assert app.users.find_by_id(low["id"])["email"] is None  # type: ignore[index]


@pytest.mark.parametrize("rank", [5, 3, None], ids=["tie", "lower", "null"])
def test_unique_priority_field_tie_or_lower_priority_is_refused(make: Factory, rank: Any) -> None:
    app = make(unique_schema("priority-field"))
    stored = app.users.insert({"email": "a@x.io", "rank": 5})

    with pytest.raises(OfflineError) as exc:
        app.users.insert({"email": "a@x.io", "rank": rank})

    refused(exc, "uniqueEmail")
    assert app.users.fetch() == [stored]


def test_unique_priority_field_a_ranked_write_beats_an_unranked_record(make: Factory) -> None:
    app = make(unique_schema("priority-field"))
    unranked = app.users.insert({"email": "a@x.io"})

    app.users.insert({"email": "a@x.io", "rank": 0})

    assert app.users.find_by_id(unranked["id"])["email"] is None  # type: ignore[index]


def test_unique_custom_resolver_returning_none_refuses(make: Factory) -> None:
    calls: list[tuple[dict[str, Any], Any]] = []

    def resolve(incoming: dict[str, Any], existing: Any) -> None:
        calls.append((incoming, existing))
        return None

    app = make(unique_schema("custom", resolve=resolve))
    stored = app.users.insert({"email": "a@x.io", "name": "stored"})

    with pytest.raises(OfflineError) as exc:
        app.users.insert({"email": "a@x.io", "name": "incoming"})

    refused(exc, "uniqueEmail")
    assert app.users.fetch() == [stored]
    [(incoming, existing)] = calls
    assert incoming["name"] == "incoming" and incoming["email"] == "a@x.io"
    assert existing == stored


def test_unique_custom_resolver_dict_applies_a_follow_up_change(make: Factory) -> None:
    def resolve(incoming: dict[str, Any], existing: dict[str, Any]) -> dict[str, Any]:
        local, domain = incoming["email"].split("@")
        return {"email": f"{local}+1@{domain}"}

    app = make(unique_schema("custom", resolve=resolve))
    stored = app.users.insert({"email": "a@x.io"})
    before = op_count(app)

    record = app.users.insert({"email": "a@x.io", "name": "n"})

    assert record["email"] == "a+1@x.io"
    assert app.users.find_by_id(stored["id"]) == stored  # the stored record is untouched
    ops = app.operations()[before:]
    assert [(o.type, o.record_id) for o in ops] == [("insert", record["id"]), ("update", record["id"])]
    assert dict(ops[0].data or {})["email"] == "a@x.io"
    assert dict(ops[1].data or {}) == {"email": "a+1@x.io"}
    assert dict(ops[1].previous_data or {}) == {"email": "a@x.io"}


@pytest.mark.parametrize(
    "result",
    [{"email": "a@x.io"}, {}, {"name": "unrelated"}, {"email": 5}, {"bogus": 1}, {"rank": "high"}, "nope"],
    ids=["same-value", "empty", "other-field", "wrong-type", "unknown-field", "invalid-other", "not-a-dict"],
)
def test_unique_custom_resolver_whose_changes_do_not_resolve_the_conflict_refuses(
    make: Factory, result: Any
) -> None:
    app = make(unique_schema("custom", resolve=lambda incoming, existing: result))
    stored = app.users.insert({"email": "a@x.io"})
    before = op_count(app)

    with pytest.raises(OfflineError) as exc:
        app.users.insert({"email": "a@x.io"})

    refused(exc, "uniqueEmail")
    assert app.users.fetch() == [stored]
    assert op_count(app) == before


def test_unique_custom_resolver_onto_another_taken_value_is_refused(make: Factory) -> None:
    app = make(unique_schema("custom", resolve=lambda incoming, existing: {"email": "b@x.io"}))
    app.users.insert({"email": "a@x.io"})
    app.users.insert({"email": "b@x.io"})

    with pytest.raises(OfflineError) as exc:
        app.users.insert({"email": "a@x.io"})

    refused(exc, "uniqueEmail")
    assert app.users.count() == 2


@pytest.mark.parametrize("policy", POLICIES)
def test_unique_nulls_never_collide(make: Factory, policy: str) -> None:
    app = make(unique_schema(policy))
    first = app.users.insert({"name": "one"})
    second = app.users.insert({"name": "two"})

    assert first["email"] is None and second["email"] is None
    assert app.users.count() == 2


@pytest.mark.parametrize("policy", POLICIES)
def test_unique_different_values_never_conflict(make: Factory, policy: str) -> None:
    app = make(unique_schema(policy))
    app.users.insert({"email": "a@x.io", "rank": 9})
    app.users.insert({"email": "b@x.io", "rank": 1})

    assert sorted(r["email"] for r in app.users.fetch()) == ["a@x.io", "b@x.io"]


def test_unique_where_scopes_the_constraint(make: Factory) -> None:
    app = make(unique_schema("first-write-wins", where={"active": True}))
    app.users.insert({"email": "a@x.io", "active": False})
    app.users.insert({"email": "a@x.io", "active": False})
    active = app.users.insert({"email": "a@x.io", "active": True})

    with pytest.raises(OfflineError) as exc:
        app.users.insert({"email": "a@x.io", "active": True})
    refused(exc, "uniqueEmail")

    # An update moving a record into the scope is judged (the where field changed).
    inactive = app.users.where({"active": False}).first()
    assert inactive is not None
    with pytest.raises(OfflineError):
        app.users.update(inactive["id"], {"active": True})
    # Out of the scope again, the once-active value is free.
    app.users.update(active["id"], {"active": False})
    app.users.update(inactive["id"], {"active": True})
    assert app.users.where({"active": True}).count() == 1


def test_updates_not_touching_constrained_fields_are_not_judged_again(
    make: Factory,
) -> None:
    schema = unique_schema("first-write-wins")
    app = make(schema)
    remote = make(schema, "remote")
    mine = app.users.insert({"email": "a@x.io", "name": "mine"})
    theirs = remote.users.insert({"email": "a@x.io", "name": "theirs"})
    app.apply(remote.operations())  # merging does not enforce tier 2 locally: the server decides
    assert app.users.where({"email": "a@x.io"}).count() == 2

    updated = app.users.update(mine["id"], {"name": "renamed", "rank": 3})
    assert updated == {**mine, "name": "renamed", "rank": 3}

    assert app.users.update(theirs["id"], {"name": "also renamed"})["name"] == "also renamed"

    # Touching the constrained field is judged: moving away is fine, moving back onto a taken value is not.
    app.users.update(theirs["id"], {"email": "c@x.io"})
    with pytest.raises(OfflineError) as exc:
        app.users.update(theirs["id"], {"email": "a@x.io"})
    refused(exc, "uniqueEmail")


# -- capacity --------------------------------------------------------------------------------------------


def capacity_schema(
    policy: str,
    *,
    team_optional: bool = False,
    resolve: Callable[..., Any] | None = None,
    where: dict[str, Any] | None = None,
    limit: int = 2,
) -> dict[str, Any]:
    team = t.string().optional() if team_optional else t.string()
    constraint: dict[str, Any] = {
        "type": "capacity",
        "fields": ["team"],
        "limit": limit,
        "onConflict": policy,
    }
    if policy == "priority-field":
        constraint["priorityField"] = "rank"
    if policy == "custom":
        constraint["resolve"] = resolve or (lambda incoming, existing: None)
    if where is not None:
        constraint["where"] = where
    return {
        "version": 1,
        "collections": {
            "members": {
                "fields": {
                    "team": team,
                    "name": t.string(),
                    "rank": t.number().optional(),
                    "active": t.boolean().default(True),
                },
                "constraints": {"teamSize": constraint},
            }
        },
    }


@pytest.mark.parametrize("policy", ["first-write-wins", "server-decides"])
def test_capacity_full_group_refuses_the_incoming_member(make: Factory, policy: str) -> None:
    app = make(capacity_schema(policy))
    a = app.members.insert({"team": "red", "name": "a"})
    b = app.members.insert({"team": "red", "name": "b"})
    before = op_count(app)

    with pytest.raises(OfflineError) as exc:
        app.members.insert({"team": "red", "name": "c"})

    refused(exc, "teamSize")
    assert exc.value.context is not None
    assert sorted(exc.value.context["conflictsWith"]) == sorted([a["id"], b["id"]])
    assert op_count(app) == before
    # Another group has room, and moving into the full group is refused too.
    blue = app.members.insert({"team": "blue", "name": "c"})
    with pytest.raises(OfflineError):
        app.members.update(blue["id"], {"team": "red"})
    assert app.members.where({"team": "red"}).count() == 2


@pytest.mark.parametrize("policy", POLICIES)
def test_capacity_below_the_limit_accepts_every_write(make: Factory, policy: str) -> None:
    app = make(capacity_schema(policy, limit=3))
    for name in "abc":
        app.members.insert({"team": "red", "name": name})
    assert app.members.where({"team": "red"}).count() == 3


def test_capacity_last_write_wins_deletes_the_oldest_member(make: Factory) -> None:
    app = make(capacity_schema("last-write-wins"))
    oldest = app.members.insert({"team": "red", "name": "a"})
    kept = app.members.insert({"team": "red", "name": "b"})
    before = op_count(app)

    newest = app.members.insert({"team": "red", "name": "c"})

    assert app.members.where({"team": "red"}).fetch() == [kept, newest]
    assert app.members.find_by_id(oldest["id"]) is None
    ops = app.operations()[before:]
    assert [(o.type, o.record_id) for o in ops] == [("insert", newest["id"]), ("delete", oldest["id"])]


def test_capacity_last_write_wins_clears_an_optional_group_field(make: Factory) -> None:
    app = make(capacity_schema("last-write-wins", team_optional=True))
    oldest = app.members.insert({"team": "red", "name": "a"})
    app.members.insert({"team": "red", "name": "b"})
    app.members.insert({"team": "red", "name": "c"})

    assert app.members.find_by_id(oldest["id"]) == {**oldest, "team": None}
    assert app.members.where({"team": "red"}).count() == 2


def test_capacity_null_group_is_no_group(make: Factory) -> None:
    app = make(capacity_schema("first-write-wins", team_optional=True))
    for name in "abcd":
        app.members.insert({"name": name})
    assert app.members.where({"team": None}).count() == 4


def test_capacity_evicted_members_never_fill_a_group_of_their_own(make: Factory) -> None:
    app = make(capacity_schema("last-write-wins", team_optional=True))
    for name in "abcdef":
        app.members.insert({"team": "red", "name": name})
    assert app.members.where({"team": "red"}).count() == 2
    assert app.members.where({"team": None}).count() == 4


def test_capacity_priority_field_evicts_the_lowest_ranked_member(make: Factory) -> None:
    app = make(capacity_schema("priority-field"))
    low = app.members.insert({"team": "red", "name": "low", "rank": 1})
    high = app.members.insert({"team": "red", "name": "high", "rank": 9})

    mid = app.members.insert({"team": "red", "name": "mid", "rank": 5})

    assert app.members.find_by_id(low["id"]) is None
    assert {r["id"] for r in app.members.where({"team": "red"}).fetch()} == {high["id"], mid["id"]}


@pytest.mark.parametrize("rank", [1, 0, None], ids=["tie", "lower", "null"])
def test_capacity_priority_field_tie_or_lower_is_refused(make: Factory, rank: Any) -> None:
    app = make(capacity_schema("priority-field"))
    app.members.insert({"team": "red", "name": "a", "rank": 1})
    app.members.insert({"team": "red", "name": "b", "rank": 9})

    with pytest.raises(OfflineError) as exc:
        app.members.insert({"team": "red", "name": "c", "rank": rank})

    refused(exc, "teamSize")
    assert app.members.where({"team": "red"}).count() == 2


def test_capacity_custom_resolver_gets_the_group_and_can_move_the_member(make: Factory) -> None:
    seen: list[Any] = []

    def resolve(incoming: dict[str, Any], group: list[dict[str, Any]]) -> dict[str, Any]:
        seen.append(group)
        return {"team": "overflow"}

    app = make(capacity_schema("custom", resolve=resolve))
    a = app.members.insert({"team": "red", "name": "a"})
    b = app.members.insert({"team": "red", "name": "b"})

    c = app.members.insert({"team": "red", "name": "c"})

    assert c["team"] == "overflow"
    assert seen == [[a, b]]
    assert app.members.where({"team": "red"}).fetch() == [a, b]


def test_capacity_custom_resolver_returning_none_refuses(make: Factory) -> None:
    app = make(capacity_schema("custom"))
    app.members.insert({"team": "red", "name": "a"})
    app.members.insert({"team": "red", "name": "b"})

    with pytest.raises(OfflineError) as exc:
        app.members.insert({"team": "red", "name": "c"})

    refused(exc, "teamSize")
    assert app.members.count() == 2


def test_capacity_custom_resolver_into_another_full_group_refuses(make: Factory) -> None:
    app = make(capacity_schema("custom", resolve=lambda incoming, group: {"team": "blue"}))
    for team in ("red", "red", "blue", "blue"):
        app.members.insert({"team": team, "name": "x"})

    with pytest.raises(OfflineError) as exc:
        app.members.insert({"team": "red", "name": "c"})

    refused(exc, "teamSize")
    assert app.members.count() == 4


def test_capacity_where_counts_only_matching_records(make: Factory) -> None:
    app = make(capacity_schema("first-write-wins", where={"active": True}))
    app.members.insert({"team": "red", "name": "gone", "active": False})
    app.members.insert({"team": "red", "name": "a"})
    app.members.insert({"team": "red", "name": "b"})
    app.members.insert({"team": "red", "name": "also gone", "active": False})  # out of scope: not judged

    with pytest.raises(OfflineError):
        app.members.insert({"team": "red", "name": "c"})
    inactive = app.members.where({"active": False}).first()
    assert inactive is not None
    with pytest.raises(OfflineError):  # entering the scope is judged
        app.members.update(inactive["id"], {"active": True})
    assert app.members.where({"team": "red", "active": True}).count() == 2


def test_capacity_update_not_touching_the_group_is_not_judged(make: Factory) -> None:
    schema = capacity_schema("first-write-wins")
    app = make(schema)
    remote = make(schema, "remote")
    for name in "ab":
        app.members.insert({"team": "red", "name": name})
    theirs = remote.members.insert({"team": "red", "name": "c"})
    app.apply(remote.operations())
    assert app.members.where({"team": "red"}).count() == 3  # over capacity through a merge

    assert app.members.update(theirs["id"], {"name": "renamed"})["name"] == "renamed"


# -- referential -----------------------------------------------------------------------------------------


def referential_schema(
    policy: str,
    *,
    optional: bool = True,
    resolve: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    post_id = t.string().optional() if optional else t.string()
    constraint: dict[str, Any] = {
        "type": "referential",
        "fields": ["postId"],
        "collection": "posts",
        "onConflict": policy,
    }
    tags: dict[str, Any] = {
        "type": "referential",
        "fields": ["tagIds"],
        "collection": "tags",
        "onConflict": "last-write-wins",
    }
    if policy == "priority-field":
        constraint["priorityField"] = "rank"
    if policy == "custom":
        constraint["resolve"] = resolve or (lambda incoming, existing: None)
    return {
        "version": 1,
        "collections": {
            "posts": {"fields": {"title": t.string()}},
            "tags": {"fields": {"label": t.string()}},
            "comments": {
                "fields": {
                    "postId": post_id,
                    "body": t.string(),
                    "rank": t.number().optional(),
                    "tagIds": t.array(t.string()).default([]),
                },
                "constraints": {"commentPost": constraint, "commentTags": tags},
            },
        },
    }


@pytest.mark.parametrize("policy", POLICIES)
def test_referential_reference_to_an_existing_record_is_accepted(make: Factory, policy: str) -> None:
    app = make(referential_schema(policy))
    post = app.posts.insert({"title": "p"})
    comment = app.comments.insert({"postId": post["id"], "body": "hi"})
    assert app.comments.find_by_id(comment["id"]) == comment
    assert comment["postId"] == post["id"]


@pytest.mark.parametrize("policy", ["first-write-wins", "server-decides", "priority-field"])
def test_referential_dangling_reference_is_refused(make: Factory, policy: str) -> None:
    app = make(referential_schema(policy))
    before = op_count(app)

    with pytest.raises(OfflineError) as exc:
        app.comments.insert({"postId": "missing", "body": "hi"})

    refused(exc, "commentPost")
    assert app.comments.count() == 0
    assert op_count(app) == before
    post = app.posts.insert({"title": "p"})
    comment = app.comments.insert({"postId": post["id"], "body": "hi"})
    with pytest.raises(OfflineError):
        app.comments.update(comment["id"], {"postId": "missing"})
    assert app.comments.find_by_id(comment["id"]) == comment


def test_referential_last_write_wins_clears_a_dangling_optional_reference(make: Factory) -> None:
    app = make(referential_schema("last-write-wins"))
    before = op_count(app)

    comment = app.comments.insert({"postId": "missing", "body": "hi"})

    assert comment["postId"] is None
    ops = app.operations()[before:]
    assert [(o.type, dict(o.data or {}).get("postId")) for o in ops] == [
        ("insert", "missing"),
        ("update", None),
    ]


def test_referential_last_write_wins_refuses_a_dangling_required_reference(make: Factory) -> None:
    app = make(referential_schema("last-write-wins", optional=False))
    with pytest.raises(OfflineError) as exc:
        app.comments.insert({"postId": "missing", "body": "hi"})
    refused(exc, "commentPost")
    assert app.comments.count() == 0


def test_referential_last_write_wins_array_keeps_only_existing_ids(make: Factory) -> None:
    app = make(referential_schema("last-write-wins"))
    tag = app.tags.insert({"label": "t"})

    comment = app.comments.insert({"body": "hi", "tagIds": [tag["id"], "gone"]})

    assert comment["tagIds"] == [tag["id"]]


def test_referential_custom_resolver_repoints_or_refuses(make: Factory) -> None:
    fallback: dict[str, Any] = {}
    calls: list[tuple[dict[str, Any], Any]] = []

    def resolve(incoming: dict[str, Any], existing: Any) -> dict[str, Any] | None:
        calls.append((incoming, existing))
        return {"postId": fallback["id"]} if fallback else None

    app = make(referential_schema("custom", resolve=resolve))
    with pytest.raises(OfflineError) as exc:
        app.comments.insert({"postId": "missing", "body": "hi"})
    refused(exc, "commentPost")
    assert app.comments.count() == 0
    assert calls[0][1] is None  # no existing record for a missing reference

    fallback.update(app.posts.insert({"title": "inbox"}))
    comment = app.comments.insert({"postId": "missing", "body": "hi"})
    assert comment["postId"] == fallback["id"]


def test_referential_custom_resolver_pointing_at_another_missing_record_refuses(make: Factory) -> None:
    app = make(referential_schema("custom", resolve=lambda incoming, existing: {"postId": "also-missing"}))
    with pytest.raises(OfflineError) as exc:
        app.comments.insert({"postId": "missing", "body": "hi"})
    refused(exc, "commentPost")
    assert app.comments.count() == 0


@pytest.mark.parametrize("policy", ["first-write-wins", "server-decides", "priority-field", "custom"])
def test_referential_delete_of_a_referenced_record_is_refused(make: Factory, policy: str) -> None:
    app = make(referential_schema(policy))
    post = app.posts.insert({"title": "p"})
    comment = app.comments.insert({"postId": post["id"], "body": "hi"})
    before = op_count(app)

    with pytest.raises(OfflineError) as exc:
        app.posts.delete(post["id"])

    refused(exc, "commentPost")
    assert exc.value.context is not None
    assert exc.value.context["conflictsWith"] == [comment["id"]]
    assert app.posts.find_by_id(post["id"]) == post
    assert app.comments.find_by_id(comment["id"]) == comment
    assert op_count(app) == before
    # Once nothing references it, the delete goes through.
    app.comments.delete(comment["id"])
    assert app.posts.delete(post["id"]) is True
    assert app.posts.count() == 0


def test_referential_delete_last_write_wins_clears_optional_references(make: Factory) -> None:
    app = make(referential_schema("last-write-wins"))
    post = app.posts.insert({"title": "p"})
    other = app.posts.insert({"title": "q"})
    c1 = app.comments.insert({"postId": post["id"], "body": "1"})
    c2 = app.comments.insert({"postId": other["id"], "body": "2"})
    before = op_count(app)

    app.posts.delete(post["id"])

    assert app.comments.find_by_id(c1["id"]) == {**c1, "postId": None}
    assert app.comments.find_by_id(c2["id"]) == c2
    ops = app.operations()[before:]
    assert [(o.type, o.collection, o.record_id) for o in ops] == [
        ("delete", "posts", post["id"]),
        ("update", "comments", c1["id"]),
    ]


def test_referential_delete_last_write_wins_deletes_records_with_a_required_reference(
    make: Factory,
) -> None:
    app = make(referential_schema("last-write-wins", optional=False))
    post = app.posts.insert({"title": "p"})
    comment = app.comments.insert({"postId": post["id"], "body": "1"})
    before = op_count(app)

    app.posts.delete(post["id"])

    assert app.comments.count() == 0
    ops = app.operations()[before:]
    assert [(o.type, o.record_id) for o in ops] == [("delete", post["id"]), ("delete", comment["id"])]


def test_referential_delete_last_write_wins_removes_the_id_from_arrays(make: Factory) -> None:
    app = make(referential_schema("first-write-wins"))
    t1 = app.tags.insert({"label": "1"})
    t2 = app.tags.insert({"label": "2"})
    comment = app.comments.insert({"body": "hi", "tagIds": [t1["id"], t2["id"]]})

    app.tags.delete(t1["id"])

    assert app.comments.find_by_id(comment["id"])["tagIds"] == [t2["id"]]  # type: ignore[index]


# -- tier-2 MergeTrace -----------------------------------------------------------------------------------


def listen(app: App) -> tuple[list[Any], list[Any]]:
    violated: list[Any] = []
    conflicts: list[Any] = []
    app.events.on("constraint:violated", violated.append)
    app.events.on("merge:conflict", conflicts.append)
    return violated, conflicts


def test_unique_trace_names_the_constraint_and_the_winning_write(make: Factory) -> None:
    app = make(unique_schema("last-write-wins"))
    loser = app.users.insert({"email": "a@x.io"})
    violated, conflicts = listen(app)
    before = op_count(app)

    winner = app.users.insert({"email": "a@x.io"})

    [event] = violated
    trace = event.trace
    assert event.constraint == "uniqueEmail"
    assert trace.tier == 2
    assert trace.strategy == "unique-constraint"
    assert trace.constraint_violated == "uniqueEmail"
    assert trace.field == "email"
    insert_op = app.operations()[before]
    assert insert_op.record_id == winner["id"] and insert_op.type == "insert"
    assert trace.operation_b == insert_op
    assert trace.operation_a.record_id == loser["id"]
    assert trace.input_b == {"email": "a@x.io"}
    assert trace.output == {"email": "a@x.io"}
    assert [c.trace for c in conflicts] == [trace]
    assert trace.to_dict()["constraintViolated"] == "uniqueEmail"
    assert trace.to_dict()["tier"] == 2


def test_unique_trace_operation_a_is_the_losers_write(make: Factory) -> None:
    app = make(unique_schema("last-write-wins"))
    loser = app.users.insert({"email": "a@x.io"})
    loser_op = app.operations()[-1]
    violated, _ = listen(app)

    app.users.insert({"email": "a@x.io"})

    [event] = violated
    assert event.trace.operation_a == loser_op
    assert event.trace.operation_a.record_id == loser["id"]
    assert event.trace.input_a == {"email": "a@x.io"}


def test_capacity_trace_is_tier_two_and_names_the_constraint(make: Factory) -> None:
    app = make(capacity_schema("last-write-wins"))
    app.members.insert({"team": "red", "name": "a"})
    app.members.insert({"team": "red", "name": "b"})
    violated, conflicts = listen(app)
    before = op_count(app)

    app.members.insert({"team": "red", "name": "c"})

    [event] = violated
    assert event.constraint == "teamSize"
    assert event.trace.tier == 2
    assert event.trace.constraint_violated == "teamSize"
    assert event.trace.operation_b == app.operations()[before]
    assert event.trace.output == {"team": "red"}
    assert len(conflicts) == 1


def test_custom_resolution_trace_output_is_the_resolvers_change(make: Factory) -> None:
    app = make(unique_schema("custom", resolve=lambda incoming, existing: {"email": "z@x.io"}))
    app.users.insert({"email": "a@x.io"})
    violated, _ = listen(app)
    before = op_count(app)

    app.users.insert({"email": "a@x.io"})

    [event] = violated
    assert event.trace.tier == 2
    assert event.trace.constraint_violated == "uniqueEmail"
    assert event.trace.operation_b == app.operations()[before]
    assert event.trace.output == {"email": "z@x.io"}


def test_referential_delete_trace_names_the_constraint(make: Factory) -> None:
    app = make(referential_schema("last-write-wins"))
    post = app.posts.insert({"title": "p"})
    comment = app.comments.insert({"postId": post["id"], "body": "1"})
    violated, _ = listen(app)
    before = op_count(app)

    app.posts.delete(post["id"])

    [event] = violated
    assert event.constraint == "commentPost"
    assert event.trace.tier == 2
    assert event.trace.constraint_violated == "commentPost"
    assert event.trace.operation_b == app.operations()[before]
    assert event.trace.operation_b.type == "delete"
    assert event.trace.operation_a.record_id == comment["id"]


def test_refused_writes_emit_no_trace(make: Factory) -> None:
    app = make(unique_schema("first-write-wins"))
    app.users.insert({"email": "a@x.io"})
    violated, conflicts = listen(app)
    with pytest.raises(OfflineError):
        app.users.insert({"email": "a@x.io"})
    assert violated == [] and conflicts == []


# -- replication of a decision ---------------------------------------------------------------------------


def test_a_replica_applying_the_deciding_replicas_operations_gets_the_same_records(make: Factory) -> None:
    schema = unique_schema("last-write-wins", email_optional=False)
    app = make(schema)
    other = make(schema, "other")
    app.users.insert({"email": "a@x.io", "name": "old"})
    app.users.insert({"email": "a@x.io", "name": "new"})
    app.users.insert({"email": "b@x.io"})

    other.apply(app.operations())

    assert other.users.fetch() == app.users.fetch()
    assert [r["name"] for r in app.users.where({"email": "a@x.io"}).fetch()] == ["new"]
