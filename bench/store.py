"""Local store figures (issue 3): durable inserts (under both durability settings, and the raw SQLite floor
under them), a 1,000-row query, write-to-subscription latency, a write's cost next to a live query of 1,000 and of 20,000
results, and folding remote operations into records."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

from bench.timing import best_of
from offline import create_app, define_schema, op, t
from offline.store import compaction
from offline.store.database import LocalDatabase

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "title": t.string(),
                    "done": t.boolean().default(False),
                    "votes": t.number().merge("counter").default(0),
                    "tags": t.array(t.string()).default([]),
                    "owner": t.string().optional(),
                },
                "indexes": ["done"],
            }
        },
    }
)


def _inserts(folder: str, n: int, batched: bool, durability: str = "normal") -> tuple[float, float]:
    """(wall, CPU) seconds of ``n`` inserts. The CPU time (the process's, every thread) is the store's own
    work, which moves less than the wall time when other processes share the machine's cores and disk."""
    app = create_app(
        SCHEMA,
        path=os.path.join(folder, f"inserts-{batched}-{time.monotonic_ns()}.db"),
        durability=durability,
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    if batched:
        with app.batch():
            for i in range(n):
                app.todos.insert({"title": f"todo {i}"})
    else:
        for i in range(n):
            app.todos.insert({"title": f"todo {i}"})
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    app.close()
    return elapsed, cpu


def _raw_inserts(folder: str, n: int) -> float:
    """The floor under ``_inserts``: the same operation rows (taken from an app's log) inserted with plain
    sqlite3 into a database with the store's own tables and settings, one transaction each."""
    source = create_app(SCHEMA, path=os.path.join(folder, "raw-source.db"))
    with source.batch():
        for i in range(n):
            source.todos.insert({"title": f"todo {i}"})
    rows = source.db.conn.execute(
        "SELECT id, node_id, sequence_number, collection, record_id, hlc, wire, local, status, delivery "
        "FROM _offline_ops ORDER BY sequence_number"
    ).fetchall()
    source.close()
    target = create_app(SCHEMA, path=os.path.join(folder, "raw-target.db"))  # tables and pragmas
    conn = target.db.conn
    start = time.perf_counter()
    for row in rows:
        conn.execute(LocalDatabase._INSERT_OP, row)  # autocommit: one transaction each
    elapsed = time.perf_counter() - start
    target.close()
    return elapsed


def _query_and_notify(folder: str) -> dict[str, float]:
    app = create_app(SCHEMA, path=os.path.join(folder, "query.db"))
    with app.batch():
        for i in range(2000):
            app.todos.insert({"title": f"todo {i}", "done": i % 2 == 0})
    query = app.todos.where({"done": True}).limit(1000)
    assert len(query.fetch()) == 1000
    query_s = best_of(query.fetch, 20)

    latencies: list[float] = []
    marks: dict[str, float] = {}

    def on_change(records: list[dict[str, Any]]) -> None:
        if "t" in marks:
            latencies.append(time.perf_counter() - marks.pop("t"))

    watched = app.todos.where({"owner": "me"})
    unsubscribe = watched.subscribe(on_change)
    target = app.todos.insert({"title": "watched", "owner": "me"})
    for i in range(200):
        marks["t"] = time.perf_counter()
        app.todos.update(target["id"], {"title": f"watched {i}"})
    unsubscribe()
    app.close()
    return {
        "query_1000_rows_ms": round(query_s * 1000, 2),
        "notify_p50_ms": round(statistics.median(latencies) * 1000, 3),
        "notify_p99_ms": round(sorted(latencies)[int(len(latencies) * 0.99) - 1] * 1000, 3),
    }


def _live_query_at_size(folder: str, results: int) -> dict[str, float]:
    """A write's cost (write plus bringing a live query up to date, CPU time) with a subscription whose
    results hold ``results`` records, ordered: the deltas form and the whole-list form. A refresh reads the
    touched record again, not the results (issue 28), so neither should grow much with ``results``."""
    app = create_app(SCHEMA, path=os.path.join(folder, f"live-{results}.db"))
    with app.batch():
        ids = [app.todos.insert({"title": f"todo {i:06d}", "done": True})["id"] for i in range(results)]
    figures: dict[str, float] = {}
    for form in ("changes", "records"):
        query = app.todos.where({"done": True}).order_by("title")
        stop = (
            query.subscribe_changes(lambda c: None) if form == "changes" else query.subscribe(lambda r: None)
        )
        costs: list[float] = []
        for i in range(200):
            started = time.process_time()
            app.todos.update(ids[(i * 97) % results], {"title": f"moved {form} {i:04d}"})
            costs.append(time.process_time() - started)
        stop()
        figures[f"live_{form}_{results}_results_write_p50_ms"] = round(statistics.median(costs) * 1000, 3)
    app.close()
    return figures


def _fold(folder: str, records: int, updates_per_record: int) -> dict[str, float]:
    source = create_app(SCHEMA, path=os.path.join(folder, "fold-source.db"))
    with source.batch():
        ids = [source.todos.insert({"title": f"todo {i}"})["id"] for i in range(records)]
    with source.batch():
        for round_ in range(updates_per_record):
            for record_id in ids:
                source.todos.update(record_id, {"votes": op.increment(1), "title": f"v{round_}"})
    ops = source.operations()
    source.close()
    # The default app: it compacts its log automatically (create_app(compact_after=...)) as it goes.
    target = create_app(SCHEMA, path=os.path.join(folder, "fold-target.db"))
    passes: list[float] = []
    measured = compaction.compact

    def timed_compact(app: Any, **options: Any) -> int:
        started = time.perf_counter()
        try:
            return measured(app, **options)
        finally:
            passes.append(time.perf_counter() - started)

    compaction.compact = timed_compact  # (App calls it through the module: the passes are timed)
    try:
        start, cpu_start = time.perf_counter(), time.process_time()
        for i in range(0, len(ops), 1000):  # the sync layer delivers batches like these
            target.apply(ops[i : i + 1000])
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        compaction.compact = measured
    assert target.todos.count() == records
    (kept,) = target.db.conn.execute("SELECT count(*) FROM _offline_ops").fetchone()
    target.close()
    return {
        "fold_operations": len(ops),
        "fold_ops_per_s": round(len(ops) / elapsed),
        "fold_seconds": round(elapsed, 2),
        "fold_cpu_s": round(cpu, 2),
        # Operations left in the log at the end: fewer than fold_operations when compaction ran.
        "fold_log_operations_kept": int(kept),
        # Of fold_seconds, the automatic compaction passes the fold ran (their number, their time).
        "fold_compaction_passes": len(passes),
        "fold_compaction_s": round(sum(passes), 3),
    }


def run(full: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        each, each_cpu = _inserts(folder, 10_000, batched=False)
        durable_full, full_cpu = _inserts(folder, 10_000, batched=False, durability="full")
        batch, batch_cpu = _inserts(folder, 10_000, batched=True)
        figures: dict[str, Any] = {
            # durability="normal" (the default): each insert survives the process dying; "full" also
            # survives the machine losing power (an fsync per commit). The same 10,000 separate inserts.
            "inserts_10000_each_durable_s": round(each, 3),
            "inserts_10000_each_durability_full_s": round(durable_full, 3),
            "inserts_10000_one_batch_s": round(batch, 3),
            "inserts_10000_raw_sqlite_s": round(_raw_inserts(folder, 10_000), 3),
            # The same inserts' CPU time (compare these across runs on a loaded machine).
            "inserts_10000_each_durable_cpu_s": round(each_cpu, 3),
            "inserts_10000_each_durability_full_cpu_s": round(full_cpu, 3),
            "inserts_10000_one_batch_cpu_s": round(batch_cpu, 3),
            "load_average_at_start": round(os.getloadavg()[0], 2),
        }
        figures.update(_query_and_notify(folder))
        for results in (1_000, 20_000):
            figures.update(_live_query_at_size(folder, results))
        figures.update(_fold(folder, 20_000 if full else 2_000, 4))
    figures["load_average_at_end"] = round(os.getloadavg()[0], 2)
    figures["targets"] = {
        "inserts_10000_each_durable_s": 0.5,
        "query_1000_rows_ms": 10,
        "notify_p50_ms": 5,
        "fold_ops_per_s": 50_000,
    }
    return figures
