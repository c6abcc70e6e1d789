"""Restoring a backup into an empty PostgreSQL database that other running server processes share is
refused (409 OTHER_SERVERS_RUNNING, saying to stop them): the restore gives the importing process a new
identity and numbering of deliveries, which the others would not pick up. With the others stopped the same
file is restored, and a process started afterwards serves it. Real processes on one PostgreSQL schema."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.hardening.support import start_server

from .test_keyed_backups import BACKUP, export, import_, stored, write_some

TIMEOUT = 60.0


def test_a_restore_is_refused_while_another_process_shares_the_database(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue("postgres_url"))
    env = {"OFFLINE_BACKUP_TOKEN": BACKUP, "OFFLINE_ADMIN_TOKEN": BACKUP}
    with start_server(tmp_path / "source", env=env) as source:
        write_some(source)
        body = export(source)
        expected = stored(source)
    with start_server(tmp_path / "one", store="postgres", db=url, env=env) as one:
        with start_server(tmp_path / "two", store="postgres", db=url, env=env) as two:
            refused = import_(one, body)
            assert refused.status_code == 409, refused.text
            error = refused.json()
            assert error["error"] == "OTHER_SERVERS_RUNNING"
            assert "1 other server process" in error["message"] and "Stop" in error["message"]
            assert stored(one) == (0, {}) and stored(two) == (0, {})  # nothing was stored

        # The other process stopped: its connections close (PostgreSQL may take a moment to see it).
        deadline = time.monotonic() + TIMEOUT
        while (restored := import_(one, body)).status_code == 409:
            assert time.monotonic() < deadline, restored.text
            time.sleep(0.2)
        assert restored.status_code == 200, restored.text
        assert restored.json()["imported"] == expected[0]
        assert stored(one) == expected
        with start_server(tmp_path / "two", store="postgres", db=url, env=env) as again:
            assert stored(again) == expected  # a process started after the restore reads it whole
