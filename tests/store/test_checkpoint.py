"""The write-ahead log is checkpointed on a thread of its own (offline.store.checkpoint), not in commits."""

from __future__ import annotations

import gc
import os
import sqlite3
import time
from pathlib import Path

import pytest

from offline import create_app, define_schema, t
from offline.store import checkpoint
from offline.store.database import LocalDatabase

SCHEMA = define_schema({"version": 1, "collections": {"notes": {"fields": {"body": t.string()}}}})


def _checkpointer(db: LocalDatabase) -> checkpoint.Checkpointer:
    assert db._checkpointer is not None
    return db._checkpointer


def _write_megabytes(db: LocalDatabase, megabytes: int, *, pause: float, wait: bool = False) -> None:
    blob = "x" * 250_000
    for index in range(megabytes * 4):
        with db.transaction():
            db.set_meta(f"blob-{index % 50}", blob + str(index))
        if index % 4 == 3:
            time.sleep(pause)  # the thread looks at most every 20 ms
            if wait:
                _wait_for_the_thread(db)


def _wait_for_the_thread(db: LocalDatabase) -> None:
    """Until the checkpoint thread has copied the log back below its threshold: a busy machine may not
    schedule it within the pause (the writer never waits like this; the test does, so its bound holds)."""
    checkpointer = _checkpointer(db)
    deadline = time.monotonic() + 10
    while checkpointer.running and checkpointer._log_bytes() >= checkpoint.CHECKPOINT_BYTES:
        if time.monotonic() > deadline:
            return  # the assertions after the writes say what went wrong
        time.sleep(0.01)


def test_a_file_database_checkpoints_on_its_thread_not_in_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "local.db")
    db = LocalDatabase(path)
    try:
        assert db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # commits only append
        checkpointer = _checkpointer(db)
        assert checkpointer.running
        _write_megabytes(db, 20, pause=0.05, wait=True)
        assert checkpointer.checkpoints >= 1
        # Checkpointed as it went: the log is reused from its start, so it stays near the threshold
        # instead of holding all 20 MB written.
        assert os.path.getsize(path + "-wal") < 3 * checkpoint.CHECKPOINT_BYTES
        # The database file itself holds the checkpointed pages (read by another connection).
        other = sqlite3.connect(path)
        try:
            assert (
                other.execute("SELECT count(*) FROM _offline_meta WHERE key LIKE 'blob-%'").fetchone()[0]
                == 50
            )
        finally:
            other.close()
    finally:
        db.close()
    assert not checkpointer.running  # closing stops the thread
    assert not os.path.exists(path + "-wal")  # the last connection checkpointed the rest and removed the log
    reopened = LocalDatabase(path)
    try:
        assert reopened.get_meta("blob-29") == "x" * 250_000 + "79"  # index 79, the last write
    finally:
        reopened.close()


def test_a_burst_that_ends_above_the_threshold_is_checkpointed_once_writes_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread looks at most once an interval (1 s here), so a burst of commits comes within one interval:
    the look after the burst's last commit still happens, with nothing more written. (It did not: a commit
    woke the thread only when an interval had passed since the last wake, so a burst that crossed the
    threshold in between stayed in the log until the next write, however long the app then sat idle.)"""
    monkeypatch.setattr(checkpoint, "_LOOK_EVERY_S", 1.0)
    path = str(tmp_path / "local.db")
    db = LocalDatabase(path)
    try:
        checkpointer = _checkpointer(db)
        blob = "z" * 250_000
        for index in range(20):  # 5 MB, past CHECKPOINT_BYTES, and under BLOCKING_CHECKPOINT_BYTES
            with db.transaction():
                db.set_meta(f"blob-{index}", blob)
        deadline = time.monotonic() + 30
        while checkpointer.checkpoints == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert checkpointer.checkpoints >= 1
        assert checkpointer.blocking_checkpoints == 0  # (the thread did it, not the writer)
        assert checkpointer._log_bytes() == 0  # every frame copied back
    finally:
        db.close()


def test_the_writer_checkpoints_itself_when_the_thread_falls_behind(tmp_path: Path) -> None:
    """Writes that never pause, with the thread gone (as when the machine is too busy to schedule it): the
    writer's blocking checkpoints between commits keep the log bounded."""
    path = str(tmp_path / "local.db")
    db = LocalDatabase(path)
    try:
        checkpointer = _checkpointer(db)
        checkpointer.stop()
        deadline = time.monotonic() + 10
        while checkpointer.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not checkpointer.running
        blob = "y" * 250_000
        for index in range(80):  # 20 MB
            with db.transaction():
                db.set_meta(f"blob-{index % 50}", blob + str(index))
            # Every commit looks (looks are spaced in time, and this test must not depend on the speed).
            checkpointer._next_look = 0.0
        assert checkpointer.blocking_checkpoints >= 1
        assert os.path.getsize(path + "-wal") < 3 * checkpoint.CHECKPOINT_BYTES
    finally:
        db.close()


def test_memory_databases_keep_sqlite_checkpointing() -> None:
    db = LocalDatabase(":memory:")
    try:
        assert db._checkpointer is None
    finally:
        db.close()


def test_the_thread_needs_a_file() -> None:
    assert checkpoint.supported("/tmp/x.db")
    assert not checkpoint.supported(":memory:")
    assert not checkpoint.supported("file:x.db?mode=memory")


def test_an_app_keeps_every_write_across_reopen_with_the_thread(tmp_path: Path) -> None:
    path = str(tmp_path / "app.db")
    app = create_app(SCHEMA, path=path)
    checkpointer = _checkpointer(app.db)
    body = "b" * 2_000
    ids = []
    for start in range(0, 6_000, 500):
        with app.batch():
            ids += [app.notes.insert({"body": f"{body}{i}"})["id"] for i in range(start, start + 500)]
    single = [app.notes.insert({"body": f"single {i}"})["id"] for i in range(200)]  # committed on their own
    app.close()
    assert not checkpointer.running
    again = create_app(SCHEMA, path=path)
    try:
        assert again.notes.count() == 6_200
        assert again.notes.find_by_id(ids[-1])["body"] == f"{body}5999"
        assert again.notes.find_by_id(single[-1])["body"] == "single 199"
    finally:
        again.close()


def test_a_database_collected_without_being_closed_stops_its_thread(tmp_path: Path) -> None:
    db = LocalDatabase(str(tmp_path / "forgotten.db"))
    checkpointer = _checkpointer(db)
    del db
    gc.collect()
    deadline = time.monotonic() + 10
    while checkpointer.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not checkpointer.running


def test_a_checkpoint_runs_per_4_mib_written_not_per_look(tmp_path: Path) -> None:
    """Once a checkpoint has copied the log back, the writer reuses the log file from its start (its size
    stays): small commits after that are not a reason to checkpoint (and sync) again at every look."""
    db = LocalDatabase(str(tmp_path / "local.db"))
    try:
        checkpointer = _checkpointer(db)
        _write_megabytes(db, 20, pause=0.05)
        # (How many depends on the machine: a checkpoint that runs while the writer writes copies only part.)
        done = checkpointer.checkpoints
        assert done >= 1

        def small_commits() -> None:
            for index in range(30):
                with db.transaction():
                    db.set_meta("small", str(index))
                time.sleep(0.025)  # each commit finds the thread ready to look

        # The first looks may copy back what the last large writes left (the log's frames in use are still
        # past 4 MiB until the log starts over); on a busy machine a checkpoint overlapping a commit leaves
        # that commit to the next look. A few checkpoints, never one a look (30 looks).
        small_commits()
        assert done <= checkpointer.checkpoints <= done + 5
        done = checkpointer.checkpoints
        small_commits()  # the log has started over: 30 small commits are nothing to copy back yet
        assert checkpointer.checkpoints <= done + 1  # (one, if the last look still found a remainder)
    finally:
        db.close()
