"""The SQL statements a connection runs, as tests that check what a store asks of SQLite read them."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def traced(conn: sqlite3.Connection) -> Iterator[list[str]]:
    """Collects the text of every statement ``conn`` runs inside the block (values written in, as SQLite's
    trace gives them), into the list it yields; the trace is removed on the way out."""
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        conn.set_trace_callback(None)
