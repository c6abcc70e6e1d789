"""Durability: close/reopen, kill -9 recovery from the operation log, batches, long offline periods.

Local writes commit only their operation; rows are materialised lazily and recovered by `App._recover()`
when a process died before writing them (DESIGN.md section 2: writes are durable on return).
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import OfflineError, create_app, define_schema, t
from offline.core.operations import Operation
from offline.store import App

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "title": t.string(),
                    "n": t.number().default(0),
                    "done": t.boolean().default(False),
                    "notes": t.richtext(),
                }
            },
            "logs": {"fields": {"line": t.string()}},
        },
    }
)

# The child process builds the same schema (kept in sync with SCHEMA above).
CHILD_PRELUDE = """
import os, signal, sys
from offline import create_app, define_schema, t
SCHEMA = define_schema({"version": 1, "collections": {
    "todos": {"fields": {"title": t.string(), "n": t.number().default(0),
                         "done": t.boolean().default(False), "notes": t.richtext()}},
    "logs": {"fields": {"line": t.string()}},
}})
app = create_app(SCHEMA, path=sys.argv[1])
def ack(*parts):
    print(*parts, flush=True)
ack("node", app.node_id)
"""


def run_child(tmp_path: Path, body: str, db: Path, *, expect_signal: bool = True) -> list[list[str]]:
    """Run ``body`` in a fresh interpreter against ``db``; return its acknowledged lines, split."""
    script = tmp_path / "child.py"
    script.write_text(CHILD_PRELUDE + textwrap.dedent(body))
    proc = subprocess.run([sys.executable, str(script), str(db)], capture_output=True, text=True, timeout=120)
    if expect_signal:
        assert proc.returncode == -signal.SIGKILL, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
    return [line.split(" ", 2) for line in proc.stdout.splitlines()]


def raw_rows(db: Path, table: str) -> int:
    conn = sqlite3.connect(str(db))
    try:
        return int(conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "app.db"


@pytest.fixture
def app(db: Path) -> Iterator[App]:
    application = create_app(SCHEMA, path=str(db))
    yield application
    application.close()


def is_causal(ops: list[Operation]) -> bool:
    position = {op.id: i for i, op in enumerate(ops)}
    return all(position[dep] < position[op.id] for op in ops for dep in op.causal_deps if dep in position)


# -- close and reopen ----------------------------------------------------------------------------------------


def test_write_is_visible_after_close_and_reopen(db: Path) -> None:
    with create_app(SCHEMA, path=str(db)) as app:
        a = app.todos.insert({"title": "a", "n": 1.5})
        b = app.todos.insert({"title": "b"})
        a = app.todos.update(a["id"], {"done": True})
        app.todos.delete(b["id"])
        node, vector = app.node_id, app.version_vector
    with create_app(SCHEMA, path=str(db)) as app:
        assert app.todos.find_by_id(a["id"]) == a
        assert app.todos.find_by_id(b["id"]) is None
        assert app.todos.fetch() == [a]
        assert app.node_id == node
        assert app.version_vector == vector == {node: 4}
        assert [op.sequence_number for op in app.operations()] == [1, 2, 3, 4]
        # Writing continues the sequence.
        app.logs.insert({"line": "after"})
        assert app.version_vector == {node: 5}
        assert app.operations()[-1].sequence_number == 5


def test_remote_operations_and_vector_persist(tmp_path: Path, db: Path) -> None:
    with create_app(SCHEMA, path=str(tmp_path / "peer.db")) as peer:
        peer.todos.insert({"title": "remote"})
        peer.todos.insert({"title": "remote 2"})
        remote_ops = peer.operations()
        peer_node = peer.node_id
    with create_app(SCHEMA, path=str(db)) as app:
        app.apply(remote_ops)
        app.todos.insert({"title": "local"})
        node = app.node_id
    with create_app(SCHEMA, path=str(db)) as app:
        assert app.version_vector == {peer_node: 2, node: 1}
        assert sorted(r["title"] for r in app.todos.fetch()) == ["local", "remote", "remote 2"]
        assert app.apply(remote_ops) == []  # still known: idempotent after a restart


def test_clock_stays_ahead_after_reopen_with_an_earlier_wall_clock(db: Path) -> None:
    with create_app(SCHEMA, path=str(db), now=lambda: 2_000_000) as app:
        app.todos.insert({"title": "a"})
        first = app.operations()[-1].timestamp
    with create_app(SCHEMA, path=str(db), now=lambda: 1_000_000) as app:
        app.todos.insert({"title": "b"})
        second = app.operations()[-1].timestamp
    assert (second.wall_time, second.logical) > (first.wall_time, first.logical)


@pytest.mark.parametrize("failure", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_a_write_that_fails_inside_its_transaction_leaves_no_trace(
    app: App, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    app.todos.insert({"title": "one"})

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise failure

    with monkeypatch.context() as patch:
        patch.setattr(app.engine, "apply", broken)
        with pytest.raises((OfflineError, KeyboardInterrupt)) as info:
            app.todos.insert({"title": "lost"})
    if isinstance(failure, RuntimeError):
        assert isinstance(info.value, OfflineError)
        assert info.value.code == "STORAGE_ERROR"
    app.todos.insert({"title": "three"})
    assert [op.sequence_number for op in app.operations()] == [1, 2]
    assert app.version_vector == {app.node_id: 2}
    assert [r["title"] for r in app.todos.fetch()] == ["one", "three"]


# -- kill -9 ----------------------------------------------------------------------------------------------------


def test_kill_9_keeps_every_acknowledged_write_and_recovers_rows(tmp_path: Path, db: Path) -> None:
    lines = run_child(
        tmp_path,
        """
        ids = []
        for i in range(200):
            record = app.todos.insert({"title": f"t{i}", "n": i})
            ids.append(record["id"])
            ack("insert", record["id"], record["title"])
        for i in range(0, 200, 2):
            app.todos.update(ids[i], {"done": True, "n": i * 10})
            ack("update", ids[i])
        app.todos.delete(ids[1])
        ack("delete", ids[1])
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        db,
    )
    node = lines[0][1]
    inserted = [(line[1], line[2]) for line in lines if line[0] == "insert"]
    assert len(inserted) == 200
    # The rows were not all written before the process died: reopening must recover them from the log.
    assert raw_rows(db, "todos") < 200

    with create_app(SCHEMA, path=str(db)) as app:
        assert app.node_id == node
        assert app.version_vector == {node: 301}
        assert raw_rows(db, "todos") == 199  # recovered rows are in the table, not only in memory
        records = {r["id"]: r for r in app.todos.fetch()}
        assert len(records) == 199
        for i, (record_id, title) in enumerate(inserted):
            if i == 1:
                assert app.todos.find_by_id(record_id) is None
                continue
            record = records[record_id]
            assert record["title"] == title
            assert record["done"] is (i % 2 == 0)
            assert record["n"] == (i * 10 if i % 2 == 0 else i)
        assert app.todos.where({"done": True}).count() == 100
        # The sequence continues after the last acknowledged write.
        app.logs.insert({"line": "next"})
        assert app.operations()[-1].sequence_number == 302
    with create_app(SCHEMA, path=str(db)) as app:
        assert app.todos.count() == 199
        assert app.logs.count() == 1


def test_kill_9_from_outside_mid_stream(tmp_path: Path, db: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(
        CHILD_PRELUDE
        + textwrap.dedent(
            """
            i = 0
            while True:
                record = app.todos.insert({"title": f"t{i}"})
                ack("insert", record["id"], record["title"])
                i += 1
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    acknowledged: list[str] = []
    node = proc.stdout.readline().split()[1]
    try:
        while len(acknowledged) < 300:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            acknowledged.append(line.split()[1])
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    with create_app(SCHEMA, path=str(db)) as app:
        assert app.node_id == node
        for record_id in acknowledged:
            assert app.todos.find_by_id(record_id) is not None
        held = app.todos.count()
        assert held >= len(acknowledged)
        assert app.version_vector == {node: held}
        assert len(app.operations()) == held


def test_os_exit_without_close_keeps_writes(tmp_path: Path, db: Path) -> None:
    lines = run_child(
        tmp_path,
        """
        record = app.todos.insert({"title": "kept", "notes": "rich"})
        app.todos.richtext(record["id"], "notes").insert(4, " text")
        ack("id", record["id"])
        os._exit(0)
        """,
        db,
        expect_signal=False,
    )
    record_id = lines[1][1]
    with create_app(SCHEMA, path=str(db)) as app:
        record = app.todos.find_by_id(record_id)
        assert record is not None
        assert record["title"] == "kept"
        assert record["notes"] == "rich text"
        assert str(app.todos.richtext(record_id, "notes")) == "rich text"


def test_kill_9_after_remote_apply_and_local_writes(tmp_path: Path, db: Path) -> None:
    with create_app(SCHEMA, path=str(tmp_path / "peer.db")) as peer:
        shared = peer.todos.insert({"title": "shared", "n": 1})
        remote = [op.to_wire() for op in peer.operations()]
    import json

    (tmp_path / "remote.json").write_text(json.dumps(remote))
    run_child(
        tmp_path,
        f"""
        import json
        app.todos.insert({{"title": "before"}})
        app.apply(json.loads(open({str(tmp_path / "remote.json")!r}).read()))
        app.todos.update({shared["id"]!r}, {{"n": 2}})
        app.todos.insert({{"title": "after"}})
        ack("done")
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        db,
    )
    with create_app(SCHEMA, path=str(db)) as app:
        assert sorted(r["title"] for r in app.todos.fetch()) == ["after", "before", "shared"]
        assert app.todos.find_by_id(shared["id"])["n"] == 2


def test_kill_9_after_batch_that_read_inside_it(tmp_path: Path, db: Path) -> None:
    # A read inside a batch materialises rows; every row of the batch must still exist after a crash.
    lines = run_child(
        tmp_path,
        """
        first = app.todos.insert({"title": "first"})
        with app.batch():
            second = app.todos.insert({"title": "second"})
            ack("count", app.todos.count())
            third = app.todos.insert({"title": "third"})
        ack("ids", first["id"], second["id"] + " " + third["id"])
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        db,
    )
    assert lines[1] == ["count", "2"]
    ids = [lines[2][1], *lines[2][2].split()]
    with create_app(SCHEMA, path=str(db)) as app:
        assert [app.todos.find_by_id(i)["title"] for i in ids] == ["first", "second", "third"]
        assert [r["title"] for r in app.todos.where({}).fetch()] == ["first", "second", "third"]


# -- batch ----------------------------------------------------------------------------------------------------


def test_batch_commits_all_writes(app: App) -> None:
    with app.batch():
        a = app.todos.insert({"title": "a"})
        b = app.todos.insert({"title": "b"})
        app.todos.update(a["id"], {"done": True})
        app.logs.insert({"line": "l"})
    assert app.todos.find_by_id(a["id"])["done"] is True
    assert app.todos.find_by_id(b["id"])["title"] == "b"
    assert app.logs.count() == 1
    assert [op.sequence_number for op in app.operations()] == [1, 2, 3, 4]


def test_batch_sees_its_own_writes(app: App) -> None:
    before = app.todos.insert({"title": "before"})
    with app.batch():
        inside = app.todos.insert({"title": "inside"})
        assert app.todos.find_by_id(inside["id"]) == inside
        assert [r["title"] for r in app.todos.where({}).fetch()] == ["before", "inside"]
        assert app.todos.count() == 2
        updated = app.todos.update(inside["id"], {"n": 5})
        assert app.todos.where({"n": 5}).fetch() == [updated]
    assert app.todos.fetch() == [before, updated]


def test_batch_rolls_back_every_write_on_error(app: App) -> None:
    kept = app.todos.insert({"title": "kept"})
    events: list[Any] = []
    app.events.on("*", events.append)
    seen: list[list[dict[str, Any]]] = []
    app.todos.where({}).subscribe(seen.append)
    events.clear()
    with pytest.raises(RuntimeError, match="abort"), app.batch():
        app.todos.insert({"title": "lost 1"})
        app.todos.update(kept["id"], {"title": "changed"})
        app.logs.insert({"line": "lost 2"})
        raise RuntimeError("abort")
    assert app.todos.fetch() == [kept]
    assert app.logs.count() == 0
    assert len(app.operations()) == 1
    assert app.version_vector == {app.node_id: 1}
    assert events == []
    assert len(seen) == 1
    # Sequence numbers of the rolled-back writes are reused by the next write.
    app.logs.insert({"line": "next"})
    assert [op.sequence_number for op in app.operations()] == [1, 2]


def test_failed_batch_after_a_read_keeps_earlier_writes(app: App) -> None:
    # Writes made before the batch (not yet materialised) must not vanish when the batch rolls back.
    kept = app.todos.insert({"title": "kept"})
    with pytest.raises(RuntimeError), app.batch():
        app.todos.insert({"title": "lost"})
        assert app.todos.count() == 2
        raise RuntimeError
    assert app.todos.find_by_id(kept["id"]) == kept
    assert app.todos.fetch() == [kept]
    assert app.todos.count() == 1


def test_batch_rolls_back_on_validation_error(app: App) -> None:
    with pytest.raises(OfflineError), app.batch():
        app.todos.insert({"title": "ok"})
        app.todos.insert({"title": 5})
    assert app.todos.count() == 0
    assert app.operations() == []
    app.todos.insert({"title": "after"})
    assert [op.sequence_number for op in app.operations()] == [1]


def test_batch_rolled_back_is_not_recovered_after_restart(db: Path) -> None:
    with create_app(SCHEMA, path=str(db)) as app:
        app.todos.insert({"title": "kept"})
        with pytest.raises(RuntimeError), app.batch():
            app.todos.insert({"title": "lost"})
            raise RuntimeError
        node = app.node_id
    with create_app(SCHEMA, path=str(db)) as app:
        assert [r["title"] for r in app.todos.fetch()] == ["kept"]
        assert app.version_vector == {node: 1}


def test_batch_fires_events_and_subscriptions_once_after_commit(app: App) -> None:
    created: list[Any] = []
    app.events.on("operation:created", created.append)
    seen: list[list[dict[str, Any]]] = []
    app.todos.where({}).subscribe(seen.append)
    with app.batch():
        for i in range(3):
            app.todos.insert({"title": str(i)})
        assert created == [] and len(seen) == 1
    assert [e.operation for e in created] == app.operations()
    assert len(seen) == 2
    assert [r["title"] for r in seen[-1]] == ["0", "1", "2"]


def test_remote_apply_inside_a_batch_is_kept(tmp_path: Path, app: App) -> None:
    with create_app(SCHEMA, path=str(tmp_path / "peer.db")) as peer:
        record = app.todos.insert({"title": "x"})
        peer.apply(app.operations())
        peer.todos.update(record["id"], {"n": 5})
        remote = peer.operations(after=app.version_vector)
    with app.batch():
        app.todos.update(record["id"], {"title": "local"})
        app.apply(remote)
        assert app.todos.find_by_id(record["id"])["n"] == 5
        app.todos.update(record["id"], {"done": True})
    expected = {**record, "title": "local", "n": 5, "done": True}
    assert app.todos.find_by_id(record["id"]) == expected
    assert app.todos.where({"n": 5}).fetch() == [expected]


def test_nested_batch_commits_with_the_outer_one(app: App) -> None:
    with pytest.raises(RuntimeError), app.batch():
        app.todos.insert({"title": "outer"})
        with app.batch():
            app.todos.insert({"title": "inner"})
        raise RuntimeError
    assert app.todos.count() == 0
    with app.batch():
        app.todos.insert({"title": "outer"})
        with app.batch():
            app.todos.insert({"title": "inner"})
    assert app.todos.count() == 2


# -- long offline periods and operations(after=...) --------------------------------------------------------------


def test_writes_after_ten_thousand_pending_operations(db: Path) -> None:
    with create_app(SCHEMA, path=str(db)) as app:
        ids: list[str] = []
        for start in range(0, 10_000, 1_000):
            with app.batch():
                ids.extend(app.logs.insert({"line": str(i)})["id"] for i in range(start, start + 1_000))
        assert app.version_vector == {app.node_id: 10_000}
        checkpoint = app.version_vector
        # Ordinary writes still work, one by one, and read back at once.
        record = app.todos.insert({"title": "late"})
        app.todos.update(record["id"], {"n": 1})
        app.logs.update(ids[5_000], {"line": "edited"})
        assert app.todos.find_by_id(record["id"])["n"] == 1
        assert app.logs.find_by_id(ids[5_000])["line"] == "edited"
        assert app.logs.count() == 10_000
        assert app.logs.where({"line": "9999"}).first()["id"] == ids[-1]

        newer = app.operations(after=checkpoint)
        assert [op.sequence_number for op in newer] == [10_001, 10_002, 10_003]
        assert [op.type for op in newer] == ["insert", "update", "update"]
        everything = app.operations()
        assert len(everything) == 10_003
        assert [op.sequence_number for op in everything] == list(range(1, 10_004))
        assert is_causal(everything)
    with create_app(SCHEMA, path=str(db)) as app:
        assert app.logs.count() == 10_000
        assert app.todos.where({"title": "late"}).first()["n"] == 1


def test_operations_after_vector_returns_exactly_the_uncovered_ones(tmp_path: Path, app: App) -> None:
    with create_app(SCHEMA, path=str(tmp_path / "peer.db")) as peer:
        shared = app.todos.insert({"title": "shared"})
        peer.apply(app.operations())
        for i in range(5):
            peer.todos.update(shared["id"], {"n": i + 1})
        app.todos.update(shared["id"], {"done": True})
        app.apply(peer.operations(after=app.version_vector))
        app.todos.update(shared["id"], {"title": "after merge"})
        peer_node = peer.node_id

    node = app.node_id
    assert app.version_vector == {node: 3, peer_node: 5}
    everything = app.operations()
    assert len(everything) == 8
    assert is_causal(everything)
    # The merged update depends on both branches.
    last = everything[-1]
    assert last.node_id == node and last.sequence_number == 3
    assert len(last.causal_deps) == 2

    assert app.operations(after=app.version_vector) == []
    assert app.operations(after={}) == everything
    assert app.operations(after=None) == everything

    def covered(op: Operation, vector: dict[str, int]) -> bool:
        return op.sequence_number <= vector.get(op.node_id, 0)

    for vector in (
        {node: 1},
        {peer_node: 3},
        {node: 2, peer_node: 5},
        {node: 3, peer_node: 2},
        {node: 99},
        {"someone-else": 4},
    ):
        got = app.operations(after=vector)
        assert {op.id for op in got} == {op.id for op in everything if not covered(op, vector)}
        assert is_causal(got)
        assert len(got) == len({op.id for op in got})


def test_operations_after_feeds_a_fresh_replica(tmp_path: Path, app: App) -> None:
    a = app.todos.insert({"title": "a"})
    app.todos.update(a["id"], {"n": 2})
    with create_app(SCHEMA, path=str(tmp_path / "replica.db")) as replica:
        replica.apply(app.operations(after=replica.version_vector))
        assert replica.todos.fetch() == app.todos.fetch()
        app.todos.delete(a["id"])
        b = app.todos.insert({"title": "b"})
        delta = app.operations(after=replica.version_vector)
        assert [op.type for op in delta] == ["delete", "insert"]
        replica.apply(delta)
        assert replica.todos.fetch() == [b]
        assert replica.version_vector == app.version_vector


@pytest.mark.parametrize(("durability", "synchronous"), [("normal", 1), ("full", 2)])
def test_the_durability_setting_chooses_what_a_commit_waits_for(
    db: Path, durability: str, synchronous: int
) -> None:
    """normal: the log is synced at checkpoints (a process crash loses nothing, a power cut may lose the last
    commits); full: at every commit. Both write ahead (WAL)."""
    app = create_app(SCHEMA, path=str(db), durability=durability)
    try:
        assert app.db.conn.execute("PRAGMA synchronous").fetchone()[0] == synchronous
        assert app.db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        app.logs.insert({"line": durability})
    finally:
        app.close()
    again = create_app(SCHEMA, path=str(db), durability=durability)
    try:
        assert [r["line"] for r in again.logs.all().fetch()] == [durability]
    finally:
        again.close()


def test_an_unknown_durability_is_refused_by_name(db: Path) -> None:
    with pytest.raises(OfflineError) as info:
        create_app(SCHEMA, path=str(db), durability="paranoid")
    assert info.value.code == "INVALID_OPERATION"
    assert info.value.context is not None and info.value.context["field"] == "durability"
    assert "paranoid" in info.value.message
