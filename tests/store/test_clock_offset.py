"""The store's clock against a device clock that is wrong: received operations are applied however far ahead
they are stamped, and the offset a server reported corrects new timestamps (kept across restarts)."""

from __future__ import annotations

from pathlib import Path

from offline import HybridLogicalClock, create_app, create_operation, define_schema, t
from offline.core.hlc import MAX_DRIFT_MS
from offline.core.operations import Operation
from offline.store import App

SCHEMA = define_schema({"version": 1, "collections": {"notes": {"fields": {"body": t.string()}}}})
NOW = 1_800_000_000_000


def last_write(app: App) -> Operation:
    """This replica's latest local operation (by sequence number; `operations()` is in causal order)."""
    return max((o for o in app.operations() if o.node_id == app.node_id), key=lambda o: o.sequence_number)


def remote_insert(body: str, wall: int) -> dict[str, object]:
    clock = HybridLogicalClock("remote-node", now=lambda: wall)
    op = create_operation(
        {
            "node_id": "remote-node",
            "type": "insert",
            "collection": "notes",
            "record_id": f"id-{body}",
            "data": {"body": body},
            "timestamp": clock.now(),
            "sequence_number": 1,
            "schema_version": 1,
        }
    )
    return dict(op.to_wire())


def test_an_operation_stamped_far_ahead_is_applied_and_moves_the_clock(tmp_path: Path) -> None:
    app = create_app(SCHEMA, path=str(tmp_path / "a.db"), now=lambda: NOW)
    try:
        ahead = NOW + 10 * 60_000  # twice the server's drift limit
        assert ahead - NOW > MAX_DRIFT_MS
        applied = app.apply([remote_insert("from the future", ahead)])
        assert len(applied) == 1
        assert app.notes.find_by_id("id-from the future")["body"] == "from the future"
        app.notes.insert({"body": "after"})
        mine = last_write(app).timestamp
        assert (mine.wall_time, mine.logical) > (ahead, 0)  # ordered after what it saw
    finally:
        app.close()


def test_the_clock_offset_corrects_new_timestamps_and_survives_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "a.db")
    app = create_app(SCHEMA, path=path, now=lambda: NOW)
    try:
        assert app.clock_offset_ms == 0
        app.set_clock_offset(600_000)  # the device is ten minutes slow
        app.notes.insert({"body": "x"})
        assert last_write(app).timestamp.wall_time == NOW + 600_000
    finally:
        app.close()
    again = create_app(SCHEMA, path=path, now=lambda: NOW + 1)
    try:
        assert again.clock_offset_ms == 600_000
        again.notes.insert({"body": "y"})
        assert last_write(again).timestamp.wall_time == NOW + 600_001
    finally:
        again.close()


def test_reseeding_leaves_refused_future_stamps_behind(tmp_path: Path) -> None:
    """What a fast clock stamped before the offset was known does not drag new stamps along once those
    operations are out of the set (see replication.restamp)."""
    path = str(tmp_path / "a.db")
    app = create_app(SCHEMA, path=path, now=lambda: NOW + 360_000)  # six minutes fast
    try:
        app.notes.insert({"body": "early"})
        app.set_clock_offset(-360_000)
        app.notes.insert({"body": "still after the early one"})
        assert last_write(app).timestamp.wall_time == NOW + 360_000  # monotonic: not yet corrected
        app.reseed_clock(NOW)  # as restamp does once the early ones are refused; ignores stamps past NOW
        app.notes.insert({"body": "corrected"})
        assert last_write(app).timestamp.wall_time == NOW
    finally:
        app.close()
