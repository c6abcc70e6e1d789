"""Fixtures of the browser client tests: one `offline init` project per session, built for the server that
serves it (BUILD_SYNC_URL=/offline-sync), shared by every test (Pyodide's files are the slow part)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .support import TEMPLATE, init_project, load_module, missing_tools, require_tools


@pytest.fixture(scope="session")
def chromium() -> str:
    return require_tools()


@pytest.fixture(scope="session")
def web_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if missing_tools():
        require_tools()  # skips, or fails under CI
    return init_project(tmp_path_factory.mktemp("browser-project"))


@pytest.fixture
def todos() -> Any:
    """The template's todos module (its actions), loaded afresh for each test."""
    return load_module(TEMPLATE / "todos.py", "template_todos")
