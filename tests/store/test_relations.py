"""Relations' onDelete on local deletes (SPEC 2.3; DESIGN.md section 3; offline/merge/relations.py).

The deleting replica writes the cascade / set-null operations in the same transaction as the delete;
'restrict' refuses while children exist; 'no-action' leaves them. Another replica applying those
operations ends with the same records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import App, OfflineError, create_app, define_schema, t
from offline.core.errors import CONSTRAINT_VIOLATION

Factory = Callable[..., App]


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


def blog(
    on_delete: str, *, tags_on_delete: str | None = None, post_author_optional: bool = True
) -> dict[str, Any]:
    """users <- posts.authorId <- comments.postId (both `on_delete`); posts.tagIds -> tags (many-to-many)."""
    author = t.string().optional() if post_author_optional else t.string()
    post_ref = t.string().optional() if on_delete == "set-null" else t.string()
    return {
        "version": 1,
        "collections": {
            "users": {"fields": {"name": t.string()}},
            "tags": {"fields": {"label": t.string()}},
            "posts": {
                "fields": {"title": t.string(), "authorId": author, "tagIds": t.array(t.string()).optional()}
            },
            "comments": {"fields": {"body": t.string(), "postId": post_ref}},
        },
        "relations": {
            "postAuthor": {
                "from": "posts",
                "to": "users",
                "type": "many-to-one",
                "field": "authorId",
                "onDelete": on_delete,
            },
            "commentPost": {
                "from": "comments",
                "to": "posts",
                "type": "many-to-one",
                "field": "postId",
                "onDelete": on_delete,
            },
            "postTags": {
                "from": "posts",
                "to": "tags",
                "type": "many-to-many",
                "field": "tagIds",
                "onDelete": tags_on_delete or on_delete,
            },
        },
    }


def snapshot(app: App) -> dict[str, list[dict[str, Any]]]:
    return {name: app.collection(name).fetch() for name in app.schema.collections}


def assert_replica_agrees(make: Factory, app: App, schema_input: dict[str, Any]) -> None:
    replica = make(schema_input, "replica")
    replica.apply(app.operations())
    assert snapshot(replica) == snapshot(app)


def seed(app: App) -> dict[str, Any]:
    ann = app.users.insert({"name": "ann"})
    bob = app.users.insert({"name": "bob"})
    red = app.tags.insert({"label": "red"})
    blue = app.tags.insert({"label": "blue"})
    p1 = app.posts.insert({"title": "p1", "authorId": ann["id"], "tagIds": [red["id"], blue["id"]]})
    p2 = app.posts.insert({"title": "p2", "authorId": ann["id"], "tagIds": [blue["id"]]})
    p3 = app.posts.insert({"title": "p3", "authorId": bob["id"], "tagIds": []})
    c1 = app.comments.insert({"body": "c1", "postId": p1["id"]})
    c2 = app.comments.insert({"body": "c2", "postId": p2["id"]})
    c3 = app.comments.insert({"body": "c3", "postId": p3["id"]})
    return {
        "ann": ann,
        "bob": bob,
        "red": red,
        "blue": blue,
        "p1": p1,
        "p2": p2,
        "p3": p3,
        "c1": c1,
        "c2": c2,
        "c3": c3,
    }


def new_ops(app: App, before: int) -> list[tuple[str, str, str]]:
    return [(o.type, o.collection, o.record_id) for o in app.operations()[before:]]


# -- cascade ---------------------------------------------------------------------------------------------


def test_cascade_deletes_children_and_grandchildren_in_one_transaction(make: Factory) -> None:
    schema = blog("cascade")
    app = make(schema)
    r = seed(app)
    before = len(app.operations())

    assert app.users.delete(r["ann"]["id"]) is True

    assert app.users.fetch() == [r["bob"]]
    assert app.posts.fetch() == [r["p3"]]
    assert app.comments.fetch() == [r["c3"]]
    ops = new_ops(app, before)
    assert ops[0] == ("delete", "users", r["ann"]["id"])
    assert sorted(ops[1:]) == sorted(
        [
            ("delete", "posts", r["p1"]["id"]),
            ("delete", "posts", r["p2"]["id"]),
            ("delete", "comments", r["c1"]["id"]),
            ("delete", "comments", r["c2"]["id"]),
        ]
    )
    assert_replica_agrees(make, app, schema)


def test_cascade_through_a_many_to_many_array_field(make: Factory) -> None:
    schema = blog("cascade")
    app = make(schema)
    r = seed(app)
    before = len(app.operations())

    app.tags.delete(r["red"]["id"])

    assert app.posts.fetch() == [r["p2"], r["p3"]]  # p1 held red
    assert app.comments.fetch() == [r["c2"], r["c3"]]  # and c1 went with p1
    assert sorted(new_ops(app, before)) == sorted(
        [
            ("delete", "tags", r["red"]["id"]),
            ("delete", "posts", r["p1"]["id"]),
            ("delete", "comments", r["c1"]["id"]),
        ]
    )
    assert_replica_agrees(make, app, schema)


def test_cascade_of_a_record_without_children_is_a_plain_delete(make: Factory) -> None:
    app = make(blog("cascade"))
    r = seed(app)
    before = len(app.operations())
    app.comments.delete(r["c3"]["id"])
    assert new_ops(app, before) == [("delete", "comments", r["c3"]["id"])]
    assert app.comments.delete("no-such-id") is False
    assert new_ops(app, before) == [("delete", "comments", r["c3"]["id"])]


# -- set-null --------------------------------------------------------------------------------------------


def test_set_null_clears_the_child_field(make: Factory) -> None:
    schema = blog("set-null")
    app = make(schema)
    r = seed(app)
    before = len(app.operations())

    app.posts.delete(r["p1"]["id"])

    assert app.comments.find_by_id(r["c1"]["id"]) == {**r["c1"], "postId": None}
    assert app.comments.find_by_id(r["c2"]["id"]) == r["c2"]
    ops = app.operations()[before:]
    assert [(o.type, o.record_id) for o in ops] == [("delete", r["p1"]["id"]), ("update", r["c1"]["id"])]
    assert dict(ops[1].data or {}) == {"postId": None}
    assert dict(ops[1].previous_data or {}) == {"postId": r["p1"]["id"]}
    assert_replica_agrees(make, app, schema)


def test_set_null_on_a_many_to_many_array_removes_only_that_id(make: Factory) -> None:
    schema = blog("set-null")
    app = make(schema)
    r = seed(app)
    before = len(app.operations())

    app.tags.delete(r["blue"]["id"])

    assert app.posts.find_by_id(r["p1"]["id"])["tagIds"] == [r["red"]["id"]]  # type: ignore[index]
    assert app.posts.find_by_id(r["p2"]["id"])["tagIds"] == []  # type: ignore[index]
    assert app.posts.find_by_id(r["p3"]["id"]) == r["p3"]
    assert sorted(new_ops(app, before)) == sorted(
        [
            ("delete", "tags", r["blue"]["id"]),
            ("update", "posts", r["p1"]["id"]),
            ("update", "posts", r["p2"]["id"]),
        ]
    )
    assert_replica_agrees(make, app, schema)


def test_set_null_is_one_level_deep(make: Factory) -> None:
    app = make(blog("set-null"))
    r = seed(app)
    app.users.delete(r["ann"]["id"])
    assert app.posts.find_by_id(r["p1"]["id"])["authorId"] is None  # type: ignore[index]
    assert app.comments.find_by_id(r["c1"]["id"]) == r["c1"]  # the post survives, so its comment is untouched


def test_set_null_after_a_cascade_removes_every_deleted_id_in_one_update(make: Factory) -> None:
    """Deleting a category cascades to two tags; a post holding both loses both ids in one operation."""
    schema: dict[str, Any] = {
        "version": 1,
        "collections": {
            "categories": {"fields": {"name": t.string()}},
            "tags": {"fields": {"label": t.string(), "categoryId": t.string()}},
            "posts": {"fields": {"title": t.string(), "tagIds": t.array(t.string()).optional()}},
        },
        "relations": {
            "tagCategory": {
                "from": "tags",
                "to": "categories",
                "type": "many-to-one",
                "field": "categoryId",
                "onDelete": "cascade",
            },
            "postTags": {
                "from": "posts",
                "to": "tags",
                "type": "many-to-many",
                "field": "tagIds",
                "onDelete": "set-null",
            },
        },
    }
    app = make(schema)
    category = app.categories.insert({"name": "c"})
    t1 = app.tags.insert({"label": "1", "categoryId": category["id"]})
    t2 = app.tags.insert({"label": "2", "categoryId": category["id"]})
    keep = app.tags.insert({"label": "3", "categoryId": app.categories.insert({"name": "d"})["id"]})
    post = app.posts.insert({"title": "p", "tagIds": [t1["id"], keep["id"], t2["id"]]})
    before = len(app.operations())

    app.categories.delete(category["id"])

    assert app.posts.find_by_id(post["id"])["tagIds"] == [keep["id"]]  # type: ignore[index]
    updates = [o for o in app.operations()[before:] if o.type == "update"]
    assert len(updates) == 1
    assert list(dict(updates[0].previous_data or {})["tagIds"]) == [t1["id"], keep["id"], t2["id"]]
    assert list(dict(updates[0].data or {})["tagIds"]) == [keep["id"]]
    assert_replica_agrees(make, app, schema)


# -- restrict --------------------------------------------------------------------------------------------


def test_restrict_refuses_while_children_exist(make: Factory) -> None:
    app = make(blog("restrict"))
    r = seed(app)
    before = len(app.operations())

    with pytest.raises(OfflineError) as exc:
        app.posts.delete(r["p1"]["id"])

    assert exc.value.code == CONSTRAINT_VIOLATION
    assert exc.value.context is not None
    assert exc.value.context["relation"] == "commentPost"
    assert exc.value.context["child"] == {"collection": "comments", "id": r["c1"]["id"]}
    assert "commentPost" in exc.value.message
    assert app.posts.find_by_id(r["p1"]["id"]) == r["p1"]
    assert len(app.operations()) == before


def test_restrict_many_to_many_refuses_while_an_array_holds_the_id(make: Factory) -> None:
    app = make(blog("restrict"))
    r = seed(app)
    with pytest.raises(OfflineError) as exc:
        app.tags.delete(r["blue"]["id"])
    assert exc.value.context is not None
    assert exc.value.context["relation"] == "postTags"
    assert app.tags.count() == 2


def test_restrict_allows_the_delete_once_no_children_remain(make: Factory) -> None:
    schema = blog("restrict")
    app = make(schema)
    r = seed(app)
    app.comments.delete(r["c1"]["id"])

    assert app.posts.delete(r["p1"]["id"]) is True

    assert app.posts.find_by_id(r["p1"]["id"]) is None
    unused = app.tags.insert({"label": "unused"})
    assert app.tags.delete(unused["id"]) is True
    assert_replica_agrees(make, app, schema)


def test_restrict_below_a_cascade_blocks_the_whole_delete(make: Factory) -> None:
    schema = blog("cascade")
    schema["relations"]["commentPost"]["onDelete"] = "restrict"
    app = make(schema)
    r = seed(app)
    before = len(app.operations())

    with pytest.raises(OfflineError) as exc:
        app.users.delete(r["ann"]["id"])  # would cascade to p1, which c1 restricts

    assert exc.value.context is not None
    assert exc.value.context["relation"] == "commentPost"
    assert snapshot(app)["users"] == [r["ann"], r["bob"]]
    assert app.posts.count() == 3
    assert len(app.operations()) == before


def test_a_child_removed_by_the_same_delete_does_not_restrict_it(make: Factory) -> None:
    schema: dict[str, Any] = {
        "version": 1,
        "collections": {
            "posts": {"fields": {"title": t.string()}},
            "comments": {"fields": {"postId": t.string(), "pinnedTo": t.string().optional()}},
        },
        "relations": {
            "pins": {
                "from": "comments",
                "to": "posts",
                "type": "many-to-one",
                "field": "pinnedTo",
                "onDelete": "restrict",
            },
            "comments": {
                "from": "comments",
                "to": "posts",
                "type": "many-to-one",
                "field": "postId",
                "onDelete": "cascade",
            },
        },
    }
    app = make(schema)
    post = app.posts.insert({"title": "p"})
    app.comments.insert({"postId": post["id"], "pinnedTo": post["id"]})
    other = app.posts.insert({"title": "q"})
    pinned_elsewhere = app.comments.insert({"postId": other["id"], "pinnedTo": post["id"]})

    with pytest.raises(OfflineError):  # a comment of another post still pins it
        app.posts.delete(post["id"])
    app.comments.update(pinned_elsewhere["id"], {"pinnedTo": None})

    assert app.posts.delete(post["id"]) is True  # its own comment goes with it
    assert app.comments.fetch() == [{**pinned_elsewhere, "pinnedTo": None}]


# -- no-action -------------------------------------------------------------------------------------------


def test_no_action_leaves_the_children_dangling(make: Factory) -> None:
    schema = blog("no-action")
    app = make(schema)
    r = seed(app)
    before = len(app.operations())

    app.users.delete(r["ann"]["id"])
    app.tags.delete(r["red"]["id"])

    assert new_ops(app, before) == [("delete", "users", r["ann"]["id"]), ("delete", "tags", r["red"]["id"])]
    assert app.posts.fetch() == [r["p1"], r["p2"], r["p3"]]
    assert app.comments.count() == 3
    assert_replica_agrees(make, app, schema)


def test_default_on_delete_is_no_action(make: Factory) -> None:
    schema = blog("no-action")
    for relation in schema["relations"].values():
        del relation["onDelete"]
    app = make(schema)
    r = seed(app)
    app.posts.delete(r["p1"]["id"])
    assert app.comments.find_by_id(r["c1"]["id"]) == r["c1"]


# -- relations together with constraints -----------------------------------------------------------------


def test_a_cascaded_child_is_not_revived_by_a_referential_constraint_update(make: Factory) -> None:
    """Cascade (relation) and last-write-wins clearing (referential constraint) hit the same child: it must
    stay deleted, since an update written after a delete would revive the record."""
    schema: dict[str, Any] = {
        "version": 1,
        "collections": {
            "posts": {"fields": {"title": t.string()}},
            "comments": {
                "fields": {"postId": t.string().optional(), "body": t.string()},
                "constraints": {
                    "commentPost": {
                        "type": "referential",
                        "fields": ["postId"],
                        "collection": "posts",
                        "onConflict": "last-write-wins",
                    }
                },
            },
        },
        "relations": {
            "commentPost": {
                "from": "comments",
                "to": "posts",
                "type": "many-to-one",
                "field": "postId",
                "onDelete": "cascade",
            }
        },
    }
    app = make(schema)
    post = app.posts.insert({"title": "p"})
    comment = app.comments.insert({"postId": post["id"], "body": "b"})
    before = len(app.operations())

    app.posts.delete(post["id"])

    assert app.comments.count() == 0
    assert new_ops(app, before) == [("delete", "posts", post["id"]), ("delete", "comments", comment["id"])]
    assert_replica_agrees(make, app, schema)


def test_a_constraint_eviction_delete_follows_the_relations(make: Factory) -> None:
    """A unique (last-write-wins, required field) eviction deletes the loser; its cascade children go too."""
    schema: dict[str, Any] = {
        "version": 1,
        "collections": {
            "users": {
                "fields": {"email": t.string()},
                "constraints": {
                    "uniqueEmail": {"type": "unique", "fields": ["email"], "onConflict": "last-write-wins"}
                },
            },
            "notes": {"fields": {"userId": t.string(), "text": t.string()}},
        },
        "relations": {
            "userNotes": {
                "from": "notes",
                "to": "users",
                "type": "many-to-one",
                "field": "userId",
                "onDelete": "cascade",
            }
        },
    }
    app = make(schema)
    loser = app.users.insert({"email": "a@x.io"})
    note = app.notes.insert({"userId": loser["id"], "text": "t"})
    before = len(app.operations())

    winner = app.users.insert({"email": "a@x.io"})

    assert app.users.fetch() == [winner]
    assert app.notes.count() == 0
    assert new_ops(app, before) == [
        ("insert", "users", winner["id"]),
        ("delete", "users", loser["id"]),
        ("delete", "notes", note["id"]),
    ]
    assert_replica_agrees(make, app, schema)


def test_a_constraint_eviction_blocked_by_restrict_refuses_the_write(make: Factory) -> None:
    schema: dict[str, Any] = {
        "version": 1,
        "collections": {
            "users": {
                "fields": {"email": t.string()},
                "constraints": {
                    "uniqueEmail": {"type": "unique", "fields": ["email"], "onConflict": "last-write-wins"}
                },
            },
            "notes": {"fields": {"userId": t.string()}},
        },
        "relations": {
            "userNotes": {
                "from": "notes",
                "to": "users",
                "type": "many-to-one",
                "field": "userId",
                "onDelete": "restrict",
            }
        },
    }
    app = make(schema)
    loser = app.users.insert({"email": "a@x.io"})
    app.notes.insert({"userId": loser["id"]})
    before = len(app.operations())

    with pytest.raises(OfflineError) as exc:
        app.users.insert({"email": "a@x.io"})

    assert exc.value.code == CONSTRAINT_VIOLATION
    assert exc.value.context is not None and exc.value.context["relation"] == "userNotes"
    assert app.users.fetch() == [loser]
    assert len(app.operations()) == before


def test_a_cascaded_record_is_judged_by_referential_constraints_on_it(make: Factory) -> None:
    """posts -> comments cascade; likes hold a first-write-wins reference to comments: deleting the post
    would leave likes pointing at a cascaded comment, so it is refused."""
    schema: dict[str, Any] = {
        "version": 1,
        "collections": {
            "posts": {"fields": {"title": t.string()}},
            "comments": {"fields": {"postId": t.string()}},
            "likes": {
                "fields": {"commentId": t.string()},
                "constraints": {
                    "likeComment": {
                        "type": "referential",
                        "fields": ["commentId"],
                        "collection": "comments",
                        "onConflict": "first-write-wins",
                    }
                },
            },
        },
        "relations": {
            "postComments": {
                "from": "comments",
                "to": "posts",
                "type": "many-to-one",
                "field": "postId",
                "onDelete": "cascade",
            }
        },
    }
    app = make(schema)
    post = app.posts.insert({"title": "p"})
    comment = app.comments.insert({"postId": post["id"]})
    like = app.likes.insert({"commentId": comment["id"]})

    with pytest.raises(OfflineError) as exc:
        app.posts.delete(post["id"])
    assert exc.value.code == CONSTRAINT_VIOLATION
    assert exc.value.context is not None and exc.value.context["constraint"] == "likeComment"
    assert app.comments.count() == 1

    app.likes.delete(like["id"])
    app.posts.delete(post["id"])
    assert app.comments.count() == 0
