"""Rows written in a few statements of several rows each (offline.store.many_rows), not executemany."""

from __future__ import annotations

import sqlite3

import pytest

from offline.store.many_rows import MAX_PARAMETERS, ROW_SIZES, row_statements, write_rows


@pytest.mark.parametrize("count", [0, 1, 3, 17, 300, 1_000])
def test_rows_are_written_in_order_in_few_statements_of_cached_sizes(count: int) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)")
    rows = [(f"k{i}", i) for i in range(count)]
    statements = row_statements("INSERT INTO t (k, v)", rows)
    sizes = [len(values) // 2 for _, values in statements]
    assert sum(sizes) == count and all(size in ROW_SIZES for size in sizes)
    assert sizes == sorted(sizes, reverse=True)
    assert len(statements) <= count // ROW_SIZES[0] + 3 * len(ROW_SIZES)
    assert len({sql for sql, _ in statements}) == len(set(sizes))  # one statement text a size: cached
    write_rows(conn, "INSERT INTO t (k, v)", rows)
    assert conn.execute("SELECT k, v FROM t ORDER BY v").fetchall() == rows
    # With a tail (an upsert clause), rows already there are updated; a later row of a key wins.
    update = [(k, -v) for k, v in rows]
    write_rows(
        conn, "INSERT INTO t (k, v)", [*update, *update[-1:]], " ON CONFLICT (k) DO UPDATE SET v = excluded.v"
    )
    assert conn.execute("SELECT k, v FROM t ORDER BY -v").fetchall() == update


def test_wide_rows_stay_within_the_parameter_limit() -> None:
    width = 300
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE TABLE wide ({', '.join(f'c{i}' for i in range(width))})")
    rows = [tuple(range(r, r + width)) for r in range(1_000)]
    statements = row_statements(f"INSERT INTO wide ({', '.join(f'c{i}' for i in range(width))})", rows)
    assert max(len(values) for _, values in statements) <= MAX_PARAMETERS
    for sql, values in statements:
        conn.execute(sql, values)
    assert conn.execute("SELECT count(*), sum(c0) FROM wide").fetchone() == (1_000, sum(range(1_000)))


def test_a_failing_row_fails_its_statement_whole() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    conn.execute("INSERT INTO t VALUES ('k5')")
    conn.execute("BEGIN")
    with pytest.raises(sqlite3.IntegrityError):
        write_rows(conn, "INSERT INTO t (k)", [(f"k{i}",) for i in range(10)])
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT k FROM t").fetchall() == [("k5",)]
