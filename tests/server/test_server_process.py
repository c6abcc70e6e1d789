"""The test helper that runs real server processes: entering a server that `start_server` already started
uses that process (it once started a second one on the same port, which failed to listen; the first was
never stopped, and on a busy machine the health check lost the race with the second one's exit)."""

from __future__ import annotations

from pathlib import Path

from tests.hardening.support import start_server


def test_entering_a_started_server_keeps_its_one_process_and_stops_it_on_exit(tmp_path: Path) -> None:
    server = start_server(tmp_path, store="memory")
    first = server.proc
    assert first is not None
    with server as entered:
        assert entered.proc is first and first.poll() is None
    assert first.poll() is not None  # stopped on exit: no server left running after the test
    assert "cannot listen" not in server.log_path.read_text()
