"""The concrete convergence cases promised by DESIGN.md section 3 and SPEC 2.6, through real apps."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction
from typing import Any

import pytest

from offline import op
from offline.core.errors import OfflineError
from offline.store.app import App

from ._support import SCHEMA, FakeClock, canonical, exchange_all, make_op, make_schema, new_apps


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def pair(clock: FakeClock) -> Any:
    apps = new_apps(2, clock=clock)
    yield apps
    for app in apps:
        app.close()


def seed(apps: list[App], clock: FakeClock, **fields: Any) -> None:
    """Insert r1 on the first replica and give it to everyone (the common base)."""
    apps[0].collection("items").insert({"id": "r1", **fields})
    exchange_all(apps)
    clock.advance()


def record(app: App, record_id: str = "r1") -> dict[str, Any] | None:
    return app.collection("items").find_by_id(record_id)


def assert_converged(apps: list[App]) -> list[dict[str, Any]]:
    first = apps[0].collection("items").fetch()
    for app in apps[1:]:
        assert app.collection("items").fetch() == first
        assert canonical(app.collection("items").fetch()) == canonical(first)
        assert app.version_vector == apps[0].version_vector
    return first


# -- counter --------------------------------------------------------------------------------------------


def test_concurrent_increments_add_up(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, count=10)
    assert a.items.update("r1", {"count": op.increment(3)})["count"] == 13
    assert b.items.update("r1", {"count": op.increment(5)})["count"] == 15
    exchange_all(pair)
    assert record(a)["count"] == record(b)["count"] == 18
    assert_converged(pair)


def test_concurrent_plain_counter_writes_merge_as_deltas(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, count=10)
    a.items.update("r1", {"count": 15})  # +5
    b.items.update("r1", {"count": 12})  # +2
    exchange_all(pair)
    assert record(a)["count"] == record(b)["count"] == 17


def test_decrement_and_increment_on_three_replicas(clock: FakeClock) -> None:
    apps = new_apps(3, clock=clock)
    seed(apps, clock, count=0)
    apps[0].items.update("r1", {"count": op.increment(4)})
    apps[1].items.update("r1", {"count": op.decrement(1)})
    apps[2].items.update("r1", {"count": op.increment(2)})
    apps[2].items.update("r1", {"count": op.increment(2)})
    exchange_all(apps)
    assert [record(app)["count"] for app in apps] == [7, 7, 7]


def test_float_counter_is_byte_identical_in_every_delivery_order(clock: FakeClock) -> None:
    writers = new_apps(3, clock=clock)
    seed(writers, clock, count=0)
    for app, amount in zip(writers, (0.1, 0.2, 0.3), strict=True):
        app.items.update("r1", {"count": op.increment(amount)})
    base = [o for o in writers[0].operations() if o.type == "insert"]
    increments = [o for app in writers for o in app.operations() if o.type == "update"]
    assert len(base) == 1 and len({o.id for o in increments}) == 3

    results = set()
    for order in itertools.permutations(increments):
        (reader,) = new_apps(1, clock=clock)
        reader.apply(base)
        for operation in order:  # one at a time: the order really is the arrival order
            reader.apply([operation])
        results.add(canonical(record(reader)))
        reader.close()
    assert len(results) == 1
    exchange_all(writers)
    assert {canonical(record(app)) for app in writers} == results
    value = record(writers[0])["count"]
    # The deltas are summed exactly and rounded once, so no order's float rounding can leak in.
    assert value == float(Fraction(0.1) + Fraction(0.2) + Fraction(0.3)) == 0.6
    assert json.dumps(value) == "0.6"


# -- union (add-wins set) ------------------------------------------------------------------------------


def test_add_wins_set_honours_each_removal_and_keeps_both_additions(
    pair: list[App], clock: FakeClock
) -> None:
    a, b = pair
    seed(pair, clock, tags=["a", "b", "c", "d"])
    a.items.update("r1", {"tags": ["a", "c", "e"]})
    b.items.update("r1", {"tags": ["a", "b", "f"]})
    exchange_all(pair)
    assert record(a)["tags"] == record(b)["tags"] == ["a", "e", "f"]


def test_removal_only_removes_additions_it_had_seen(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, tags=[])
    a.items.update("r1", {"tags": op.append("x")})
    a.items.update("r1", {"tags": op.remove("x")})
    b.items.update("r1", {"tags": op.append("x")})  # concurrent: A's removal never saw it
    assert record(a)["tags"] == []
    exchange_all(pair)
    assert record(a)["tags"] == record(b)["tags"] == ["x"]


def test_removal_after_seeing_the_concurrent_addition_removes_it(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, tags=[])
    a.items.update("r1", {"tags": op.append("x")})
    b.items.update("r1", {"tags": op.append("x")})
    exchange_all(pair)
    clock.advance()
    a.items.update("r1", {"tags": op.remove("x")})  # has seen both additions
    exchange_all(pair)
    assert record(a)["tags"] == record(b)["tags"] == []


# -- max / min / append-only / server-authoritative ------------------------------------------------------


def test_max_keeps_the_highest_value_whatever_the_order(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, hi=5)
    a.items.update("r1", {"hi": op.max(9)})
    b.items.update("r1", {"hi": 7})
    clock.advance()
    b.items.update("r1", {"hi": 6})  # a later, lower write cannot lower a maximum
    exchange_all(pair)
    assert record(a)["hi"] == record(b)["hi"] == 9
    b.items.update("r1", {"hi": 1})
    assert record(b)["hi"] == 9


def test_min_keeps_the_lowest_value_whatever_the_order(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, lo=5)
    a.items.update("r1", {"lo": op.min(-2)})
    clock.advance()
    b.items.update("r1", {"lo": 3})
    b.items.update("r1", {"lo": 4.5})
    exchange_all(pair)
    assert record(a)["lo"] == record(b)["lo"] == -2


def test_append_only_keeps_every_addition_and_ignores_removals(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, log=["start"])
    a.items.update("r1", {"log": op.append("a1")})
    clock.advance()
    b.items.update("r1", {"log": op.append("b1")})
    clock.advance()
    b.items.update("r1", {"log": []})  # removals are ignored, even locally
    assert record(b)["log"] == ["start", "b1"]
    exchange_all(pair)
    # Ordered by each element's first addition (HLC order).
    assert record(a)["log"] == record(b)["log"] == ["start", "a1", "b1"]


def test_server_authoritative_value_wins_over_later_client_writes(clock: FakeClock) -> None:
    server, client = apps = new_apps(2, clock=clock)
    for app in apps:
        app.set_authoritative_nodes([server.node_id])
    seed([client, server], clock, owner="client-initial")
    server.items.update("r1", {"owner": "server"})
    clock.advance(10)
    client.items.update("r1", {"owner": "client-later"})  # later HLC, still loses
    exchange_all(apps)
    assert record(server)["owner"] == record(client)["owner"] == "server"
    assert_converged(apps)


def test_client_writes_are_lww_until_the_server_writes(clock: FakeClock) -> None:
    server, c1, c2 = apps = new_apps(3, clock=clock)
    for app in apps:
        app.set_authoritative_nodes([server.node_id])
    seed([c1, c2, server], clock, owner="base")
    c1.items.update("r1", {"owner": "c1"})
    clock.advance()
    c2.items.update("r1", {"owner": "c2"})
    exchange_all(apps)
    assert {record(app)["owner"] for app in apps} == {"c2"}


def test_declaring_the_server_later_refolds_held_records(clock: FakeClock) -> None:
    server, client = apps = new_apps(2, clock=clock)
    seed([server, client], clock)
    server.items.update("r1", {"owner": "server"})
    clock.advance()
    client.items.update("r1", {"owner": "client"})
    exchange_all(apps)
    assert record(client)["owner"] == "client"  # nobody is authoritative yet: plain lww
    for app in apps:
        app.set_authoritative_nodes([server.node_id])
    assert record(client)["owner"] == record(server)["owner"] == "server"


def test_declaring_a_server_refolds_only_the_records_it_wrote_authoritative_fields_of(
    clock: FakeClock,
) -> None:
    """Learning a new authoritative node changes only records holding its writes in collections with a
    'server-authoritative' field: those alone are refolded, the others keep their stored state."""
    server, client = apps = new_apps(2, clock=clock)
    seed([server, client], clock)
    for i in range(20):
        client.items.insert({"id": f"other{i}", "title": "x"})
    server.items.update("r1", {"owner": "server"})
    clock.advance()
    client.items.update("r1", {"owner": "client"})
    exchange_all(apps)
    folded: list[str] = []
    fold = client.engine.fold

    def counting(collection: str, record_id: str, ops: Any) -> Any:
        folded.append(record_id)
        return fold(collection, record_id, ops)

    client.engine.fold = counting  # type: ignore[method-assign]
    client.set_authoritative_nodes([server.node_id])
    assert folded == ["r1"]
    assert record(client)["owner"] == "server"
    assert client.items.count() == 21


# -- existence: update vs delete ------------------------------------------------------------------------


def test_update_newer_than_a_concurrent_delete_revives_the_record(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, title="base", count=1)
    a.items.delete("r1")
    clock.advance()
    b.items.update("r1", {"title": "edited later"})
    exchange_all(pair)
    revived = record(a)
    assert revived is not None
    assert revived == record(b)
    assert revived["title"] == "edited later"
    assert revived["count"] == 1


def test_update_older_than_a_concurrent_delete_does_not_revive(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, title="base")
    b.items.update("r1", {"title": "edited earlier"})
    clock.advance()
    a.items.delete("r1")
    exchange_all(pair)
    assert record(a) is None and record(b) is None
    assert a.items.fetch() == b.items.fetch() == []


# -- rich text ------------------------------------------------------------------------------------------


def test_concurrent_rich_text_inserts_keep_both_edits(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, body="hello")
    assert a.items.richtext("r1", "body").insert(0, "A ")["body"] == "A hello"
    assert b.items.richtext("r1", "body").insert(5, " B")["body"] == "hello B"
    exchange_all(pair)
    assert record(a)["body"] == record(b)["body"] == "A hello B"
    assert str(a.items.richtext("r1", "body")) == "A hello B"


def test_concurrent_rich_text_delete_and_insert(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, body="hello world")
    a.items.richtext("r1", "body").delete(0, 6)  # "world"
    b.items.richtext("r1", "body").insert(11, "!")  # "hello world!"
    exchange_all(pair)
    assert record(a)["body"] == record(b)["body"] == "world!"


def test_rich_text_edits_use_character_indices_with_non_ascii_text(pair: list[App], clock: FakeClock) -> None:
    # pycrdt counts UTF-8 bytes; the handle's indices are Python string indices.
    a, b = pair
    seed(pair, clock, body="héllo wörld")
    handle = a.items.richtext("r1", "body")
    assert handle.insert(6, "big ")["body"] == "héllo big wörld"
    assert handle.delete(0, 6)["body"] == "big wörld"
    assert b.items.richtext("r1", "body").insert(11, " 😀!")["body"] == "héllo wörld 😀!"
    exchange_all(pair)
    assert record(a)["body"] == record(b)["body"] == "big wörld 😀!"
    assert a.items.richtext("r1", "body").delete(10, 1)["body"] == "big wörld !"
    assert a.items.update("r1", {"body": "ça va"})["body"] == "ça va"
    exchange_all(pair)
    assert record(b)["body"] == "ça va"


# -- Tier 3 resolver and state machines ------------------------------------------------------------------


def test_custom_resolver_gets_the_concurrent_values_in_hlc_order(clock: FakeClock) -> None:
    calls: list[tuple[Any, Any, Any]] = []

    def resolver(a: Any, b: Any, base: Any) -> str:
        calls.append((a, b, base))
        return f"{a}+{b}"

    schema = make_schema(resolver=resolver)
    a, b = apps = new_apps(2, schema, clock=clock)
    seed(apps, clock, notes="base")
    a.items.update("r1", {"notes": "first"})
    clock.advance()
    b.items.update("r1", {"notes": "second"})
    exchange_all(apps)
    assert record(a)["notes"] == record(b)["notes"] == "first+second"
    assert calls and set(calls) == {("first", "second", "base")}


def test_sequential_writes_do_not_call_the_resolver(clock: FakeClock) -> None:
    calls: list[Any] = []
    schema = make_schema(resolver=lambda a, b, base: calls.append(1) or "resolved")
    a, b = apps = new_apps(2, schema, clock=clock)
    seed(apps, clock, notes="base")
    a.items.update("r1", {"notes": "one"})
    exchange_all(apps)
    clock.advance()
    b.items.update("r1", {"notes": "two"})
    exchange_all(apps)
    assert record(a)["notes"] == record(b)["notes"] == "two"
    assert calls == []


def test_concurrent_valid_transitions_later_hlc_wins(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock)
    a.items.update("r1", {"phase": "b"})
    b.items.update("r1", {"phase": "b"})
    clock.advance()
    b.items.update("r1", {"phase": "c"})
    exchange_all(pair)
    assert record(a)["phase"] == record(b)["phase"] == "c"


def test_forged_invalid_transition_is_dropped_on_merge(pair: list[App], clock: FakeClock) -> None:
    a, _ = pair
    seed(pair, clock, title="base")
    insert_id = a.operations()[0].id
    # 'status' uses .transitions() (reject): the whole write is dropped, other fields included.
    forged = make_op(
        node="rogue-node",
        seq=1,
        type="update",
        data={"status": "done", "title": "forged"},
        previous={"status": "todo", "title": "base"},
        wall=clock.ms,
        deps=[insert_id],
    )
    # 'phase' uses last-valid-state: the field keeps its value, the rest of the write applies.
    sneaky = make_op(
        node="rogue-node",
        seq=2,
        type="update",
        data={"phase": "c", "count": 4},
        previous={"phase": "a", "count": 0},
        wall=clock.ms,
        logical=1,
        deps=[forged.id],
    )
    for app in pair:
        app.apply([sneaky.to_wire(), forged.to_wire()])
    for app in pair:
        current = record(app)
        assert current["status"] == "todo"
        assert current["title"] == "base"
        assert current["phase"] == "a"
        assert current["count"] == 4
    assert_converged(pair)


def test_invalid_local_transition_is_refused(pair: list[App], clock: FakeClock) -> None:
    a, _ = pair
    seed(pair, clock)
    with pytest.raises(OfflineError) as info:
        a.items.update("r1", {"status": "done"})
    assert info.value.code == "INVALID_TRANSITION"
    assert a.items.update("r1", {"phase": "c"})["phase"] == "a"  # last-valid-state: silently kept


# -- robustness: what a remote peer sends cannot break a replica ------------------------------------------


def test_remote_values_of_the_wrong_type_are_ignored_everywhere(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    seed(pair, clock, title="base", count=1, tags=["t"])
    bad = make_op(
        node="rogue-node",
        seq=1,
        type="update",
        data={
            "count": "abc",
            "title": 5,
            "tags": "xyz",
            "status": "bogus",
            "hi": 3,
            "body": b"not a yjs update",
            "log": ["ok"],
        },
        previous={"count": 1, "title": "base", "tags": ["t"], "status": "todo", "hi": None, "log": []},
        wall=clock.ms,
        deps=[a.operations()[0].id],
    )
    for app in pair:
        assert [o.id for o in app.apply([bad])] == [bad.id]
    for app in pair:
        current = record(app)
        assert current["count"] == 1
        assert current["title"] == "base"
        assert current["tags"] == ["t"]
        assert current["status"] == "todo"
        assert current["body"] == ""
        assert current["hi"] == 3  # the valid parts of the write still apply
        assert current["log"] == ["ok"]
    assert_converged(pair)
    a.items.update("r1", {"count": op.increment(1)})  # the record keeps working
    exchange_all(pair)
    assert record(b)["count"] == 2


def test_plain_text_rich_text_values_merge_identically_on_every_replica(clock: FakeClock) -> None:
    # A peer may send a rich text value as plain text ("initial text"); two concurrent ones must come
    # out in the same order on every replica and in every arrival order.
    left = make_op(node="node-l", seq=1, type="insert", data={"body": "left"})
    right = make_op(node="node-r", seq=1, type="insert", data={"body": "right"})
    bodies = set()
    for order in ([left, right], [right, left], [left, right, left]):
        (app,) = new_apps(1, clock=clock)
        for operation in order:
            app.apply([operation])
        bodies.add(record(app)["body"])
        app.close()
    assert len(bodies) == 1
    assert bodies.pop() in ("leftright", "rightleft")


def test_schema_fixture_has_one_field_per_strategy() -> None:
    fields = SCHEMA.collections["items"].fields
    assert {name: d.effective_merge_strategy for name, d in fields.items()} == {
        "title": "lww",
        "count": "counter",
        "hi": "max",
        "lo": "min",
        "tags": "union",
        "log": "append-only",
        "owner": "server-authoritative",
        "status": "lww",
        "phase": "lww",
        "notes": "lww",
        "body": "crdt-text",
    }
