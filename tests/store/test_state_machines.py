"""Enum state machines on local writes and on merges (SPEC 3.1; DESIGN.md sections 2-3).

Local writes: an allowed transition applies; a disallowed one raises InvalidTransitionError under 'reject'
(both `.transitions()` and a collection `stateMachine`) and writes nothing, or keeps the previous value
under 'last-valid-state' while the rest of the update applies. Merges: a remote write is judged from its
own previousData -> data edge; an invalid one is dropped ('reject') or loses that field
('last-valid-state') on every replica; among valid concurrent writes the later HLC wins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import (
    App,
    HLCTimestamp,
    InvalidTransitionError,
    OfflineError,
    Operation,
    create_app,
    create_operation,
    define_schema,
    generate_uuid_v7,
    t,
)

STATES = ["todo", "doing", "done", "cancelled", "archived"]
TRANSITIONS: dict[str, list[str]] = {
    "todo": ["doing", "cancelled"],
    "doing": ["done", "todo"],
    "done": ["archived"],
    "cancelled": [],
    "archived": [],
}
REJECTING = ["transitions", "reject"]
VARIANTS = [*REJECTING, "last-valid-state"]
T0 = 1_750_000_000_000


def schema_input(variant: str) -> dict[str, Any]:
    """'transitions': t.enum().transitions(map); otherwise a collection stateMachine with that policy."""
    status = t.enum(STATES)
    tasks: dict[str, Any] = {
        "fields": {"status": status, "title": t.string(), "priority": t.number().optional()}
    }
    if variant == "transitions":
        tasks["fields"]["status"] = status.transitions(TRANSITIONS)
    else:
        tasks["stateMachine"] = {
            "field": "status",
            "transitions": TRANSITIONS,
            "onInvalidTransition": variant,
        }
    return {"version": 1, "collections": {"tasks": tasks}}


class Clock:
    def __init__(self, at: int = T0) -> None:
        self.at = at

    def __call__(self) -> int:
        return self.at


Factory = Callable[..., App]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Factory]:
    opened: list[App] = []

    def factory(variant: str, name: str = "a", clock: Clock | None = None) -> App:
        app = create_app(define_schema(schema_input(variant)), path=str(tmp_path / f"{name}.db"), now=clock)
        opened.append(app)
        return app

    yield factory
    for app in opened:
        app.close()


def walk(app: App, record_id: str, *states: str) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for state in states:
        record = app.tasks.update(record_id, {"status": state})
    return record


# -- local writes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_allowed_transitions_apply_and_write_operations(make: Factory, variant: str) -> None:
    app = make(variant)
    task = app.tasks.insert({"status": "todo", "title": "t"})
    before = len(app.operations())

    record = walk(app, task["id"], "doing", "todo", "doing", "done", "archived")

    assert record["status"] == "archived"
    assert app.tasks.find_by_id(task["id"]) == record
    ops = app.operations()[before:]
    assert [dict(o.data or {})["status"] for o in ops] == ["doing", "todo", "doing", "done", "archived"]
    assert [dict(o.previous_data or {})["status"] for o in ops] == ["todo", "doing", "todo", "doing", "done"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_insert_may_start_in_any_state(make: Factory, variant: str) -> None:
    app = make(variant)
    assert app.tasks.insert({"status": "done", "title": "t"})["status"] == "done"


@pytest.mark.parametrize("variant", REJECTING)
def test_disallowed_transition_under_reject_raises_and_writes_nothing(make: Factory, variant: str) -> None:
    app = make(variant)
    task = app.tasks.insert({"status": "todo", "title": "t"})
    before = app.operations()

    with pytest.raises(InvalidTransitionError) as exc:
        app.tasks.update(task["id"], {"status": "done", "title": "changed", "priority": 1})

    error = exc.value
    assert isinstance(error, OfflineError)
    assert error.code == "INVALID_TRANSITION"
    assert error.name == "OfflineError"
    assert error.context == {
        "collection": "tasks",
        "field": "status",
        "from": "todo",
        "to": "done",
        "allowed": ["doing", "cancelled"],
    }
    assert app.tasks.find_by_id(task["id"]) == task  # title and priority did not apply either
    assert app.operations() == before


@pytest.mark.parametrize("variant", VARIANTS)
def test_terminal_state_blocks_every_move(make: Factory, variant: str) -> None:
    app = make(variant)
    task = app.tasks.insert({"status": "todo", "title": "t"})
    walk(app, task["id"], "cancelled")
    terminal = app.tasks.find_by_id(task["id"])
    before = len(app.operations())

    for target in ["todo", "doing", "done", "archived"]:
        if variant in REJECTING:
            with pytest.raises(InvalidTransitionError) as exc:
                app.tasks.update(task["id"], {"status": target})
            assert exc.value.context is not None
            assert exc.value.context["from"] == "cancelled"
            assert exc.value.context["allowed"] == []
        else:
            assert app.tasks.update(task["id"], {"status": target}) == terminal

    assert app.tasks.find_by_id(task["id"]) == terminal
    assert len(app.operations()) == before


def test_last_valid_state_keeps_the_field_and_applies_the_rest(make: Factory) -> None:
    app = make("last-valid-state")
    task = app.tasks.insert({"status": "todo", "title": "t"})
    before = len(app.operations())

    record = app.tasks.update(task["id"], {"status": "archived", "title": "renamed", "priority": 2})

    assert record == {**task, "title": "renamed", "priority": 2}
    assert app.tasks.find_by_id(task["id"]) == record
    [op] = app.operations()[before:]
    assert dict(op.data or {}) == {"title": "renamed", "priority": 2}  # the status is not part of it


def test_last_valid_state_with_only_the_invalid_field_writes_nothing(make: Factory) -> None:
    app = make("last-valid-state")
    task = app.tasks.insert({"status": "todo", "title": "t"})
    before = app.operations()

    assert app.tasks.update(task["id"], {"status": "done"}) == task
    assert app.operations() == before


@pytest.mark.parametrize("variant", VARIANTS)
def test_writing_the_same_state_is_no_transition(make: Factory, variant: str) -> None:
    app = make(variant)
    task = app.tasks.insert({"status": "cancelled", "title": "t"})
    assert app.tasks.update(task["id"], {"status": "cancelled", "title": "x"})["title"] == "x"


# -- merges ----------------------------------------------------------------------------------------------


def remote_update(
    app: App,
    record_id: str,
    data: dict[str, Any],
    previous: dict[str, Any],
    *,
    node: str,
    wall: int,
    seq: int = 1,
) -> Operation:
    """An update written elsewhere, on top of what ``app`` holds of the record (its causal deps)."""
    state = app.cached_state("tasks", record_id)
    assert state is not None
    return create_operation(
        {
            "node_id": node,
            "type": "update",
            "collection": "tasks",
            "record_id": record_id,
            "data": data,
            "previous_data": previous,
            "timestamp": HLCTimestamp(wall, 0, node),
            "sequence_number": seq,
            "causal_deps": state.heads(),
            "schema_version": 1,
        }
    )


def replicas(make: Factory, variant: str) -> tuple[App, App, dict[str, Any]]:
    a = make(variant, "a", Clock())
    b = make(variant, "b", Clock())
    task = a.tasks.insert({"status": "todo", "title": "t"})
    b.apply(a.operations())
    return a, b, task


@pytest.mark.parametrize("variant", REJECTING)
def test_merge_drops_a_remote_write_along_a_forbidden_edge_on_every_replica(
    make: Factory, variant: str
) -> None:
    a, b, task = replicas(make, variant)
    node = generate_uuid_v7()
    bad = remote_update(
        a,
        task["id"],
        {"status": "done", "title": "hijacked"},
        {"status": "todo", "title": "t"},
        node=node,
        wall=T0 + 5,
    )

    assert [op.id for op in a.apply([bad])] == [bad.id]
    b.apply([bad])

    assert a.tasks.find_by_id(task["id"]) == task  # none of its fields apply
    assert b.tasks.find_by_id(task["id"]) == task
    assert bad.id in {op.id for op in a.operations()}  # held (and forwarded), just without effect
    assert a.apply([bad]) == []  # idempotent
    # Later valid writes apply on top as usual, everywhere.
    walk(a, task["id"], "doing")
    b.apply(a.operations())
    assert b.tasks.find_by_id(task["id"]) == a.tasks.find_by_id(task["id"]) == {**task, "status": "doing"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_merge_judges_terminal_states_too(make: Factory, variant: str) -> None:
    a, b, task = replicas(make, variant)
    walk(a, task["id"], "cancelled")
    b.apply(a.operations())
    bad = remote_update(
        b, task["id"], {"status": "todo"}, {"status": "cancelled"}, node=generate_uuid_v7(), wall=T0 + 50
    )
    for app in (a, b):
        app.apply([bad])
        assert app.tasks.find_by_id(task["id"])["status"] == "cancelled"  # type: ignore[index]


def test_merge_last_valid_state_ignores_only_that_field(make: Factory) -> None:
    a, b, task = replicas(make, "last-valid-state")
    bad = remote_update(
        a,
        task["id"],
        {"status": "archived", "title": "renamed", "priority": 7},
        {"status": "todo", "title": "t", "priority": None},
        node=generate_uuid_v7(),
        wall=T0 + 5,
    )

    for app in (a, b):
        app.apply([bad])
        assert app.tasks.find_by_id(task["id"]) == {**task, "title": "renamed", "priority": 7}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("later", ["a", "b"])
def test_among_valid_concurrent_writes_the_later_hlc_wins(make: Factory, variant: str, later: str) -> None:
    """a: todo -> doing, b: todo -> cancelled, concurrently. Each is valid from its own previousData (even
    though doing -> cancelled is no edge), so the later one wins on both replicas."""
    clock_a, clock_b = Clock(), Clock()
    a = make(variant, "a", clock_a)
    b = make(variant, "b", clock_b)
    task = a.tasks.insert({"status": "todo", "title": "t"})
    b.apply(a.operations())
    clock_a.at, clock_b.at = (T0 + 20, T0 + 10) if later == "a" else (T0 + 10, T0 + 20)

    a.tasks.update(task["id"], {"status": "doing"})
    b.tasks.update(task["id"], {"status": "cancelled"})
    a.apply(b.operations())
    b.apply(a.operations())

    expected = "doing" if later == "a" else "cancelled"
    assert a.tasks.find_by_id(task["id"]) == b.tasks.find_by_id(task["id"]) == {**task, "status": expected}


@pytest.mark.parametrize("variant", VARIANTS)
def test_merge_result_does_not_depend_on_arrival_order(make: Factory, variant: str) -> None:
    a, b, task = replicas(make, variant)
    node = generate_uuid_v7()
    good = remote_update(a, task["id"], {"status": "doing"}, {"status": "todo"}, node=node, wall=T0 + 5)
    a.apply([good])
    bad = remote_update(
        a,
        task["id"],
        {"status": "archived", "title": "x"},
        {"status": "doing", "title": "t"},
        node=node,
        wall=T0 + 6,
        seq=2,
    )
    a.apply([bad])
    walk(a, task["id"], "done")

    b.apply(list(reversed(a.operations())))
    third = make(variant, "c", Clock())
    third.apply(a.operations())

    assert (
        a.tasks.find_by_id(task["id"]) == b.tasks.find_by_id(task["id"]) == third.tasks.find_by_id(task["id"])
    )
    assert a.tasks.find_by_id(task["id"])["status"] == "done"  # type: ignore[index]


def test_merge_rejects_a_write_when_any_of_its_state_machines_rejects(tmp_path: Path) -> None:
    schema = define_schema(
        {
            "version": 1,
            "collections": {
                "tasks": {
                    "fields": {
                        "phase": t.enum(["a", "b", "c"]),
                        "status": t.enum(["todo", "doing", "done"]).transitions(
                            {"todo": ["doing"], "doing": ["done"], "done": []}
                        ),
                    },
                    "stateMachine": {
                        "field": "phase",
                        "transitions": {"a": ["b"], "b": ["c"], "c": []},
                        "onInvalidTransition": "last-valid-state",
                    },
                }
            },
        }
    )
    app = create_app(schema, path=str(tmp_path / "two.db"), now=Clock())
    try:
        task = app.tasks.insert({"phase": "a", "status": "todo"})
        with pytest.raises(InvalidTransitionError):  # locally, the 'reject' machine refuses the write
            app.tasks.update(task["id"], {"phase": "c", "status": "done"})
        node = generate_uuid_v7()
        state = app.cached_state("tasks", task["id"])
        assert state is not None
        op = create_operation(
            {
                "node_id": node,
                "type": "update",
                "collection": "tasks",
                "record_id": task["id"],
                "data": {"phase": "c", "status": "done"},
                "previous_data": {"phase": "a", "status": "todo"},
                "timestamp": HLCTimestamp(T0 + 5, 0, node),
                "sequence_number": 1,
                "causal_deps": state.heads(),
                "schema_version": 1,
            }
        )
        app.apply([op])
        assert app.tasks.find_by_id(task["id"]) == task  # dropped, like the local write
    finally:
        app.close()
