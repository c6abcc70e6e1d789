"""Fixtures shared by the sync tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sync.test_integration import Backend


@pytest.fixture
def memory_backend(tmp_path: Path) -> Iterator[Backend]:
    """For tests of client behaviour that does not depend on the server's store."""
    backend = Backend("memory", None, tmp_path)
    try:
        yield backend
    finally:
        backend.stop_all()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def server_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A server store of each kind (PostgreSQL skipped, saying why, when it is unreachable)."""
    kind = request.param
    db: str | None = None
    if kind == "sqlite":
        db = str(tmp_path / "server.db")
    elif kind == "postgres":
        db = request.getfixturevalue("postgres_url")
    backend = Backend(kind, db, tmp_path)
    try:
        yield backend
    finally:
        backend.stop_all()
