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
