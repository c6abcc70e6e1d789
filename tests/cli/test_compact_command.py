"""`offline compact` against a real server process (SQLite and PostgreSQL stores): the admin endpoint
compacts the log, the CLI prints its JSON on stdout and what happened on stderr; operations resent after the
compaction are taken for repeats, not stored or folded again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from offline_cli.main import cli
from tests.hardening.support import RawClient, start_server, status
from tests.support.servers import ServerProcess

ADMIN = "admin-token-for-compaction"


def offline(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"OFFLINE_ADMIN_TOKEN": None})


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    db = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    process = start_server(tmp_path / "srv", store=request.param, db=db, env={"OFFLINE_ADMIN_TOKEN": ADMIN})
    try:
        yield process
    finally:
        process.terminate()


def push(server: ServerProcess, ops: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Real sync writes (a board renamed five times, two more boards), or ``ops`` again; every one accepted."""

    async def run() -> list[dict[str, Any]]:
        client = RawClient(server.sync_url)
        await client.open()
        try:
            batch = ops
            if batch is None:
                first = client.writer.op("boards", {"name": "v0", "rank": 0})
                batch = [first]
                batch += [
                    client.writer.op("boards", {"name": f"v{i}"}, record_id=first["recordId"], kind="update")
                    for i in range(1, 6)
                ]
                batch += [client.writer.op("boards", {"name": f"other {i}"}) for i in range(2)]
            await client.push(batch)
            assert not client.rejections, client.rejections
            return batch
        finally:
            await client.close()

    return asyncio.run(run())


def test_help_has_examples() -> None:
    result = offline("compact", "--help")
    assert result.exit_code == 0
    assert "Examples:" in result.output and "offline compact --url" in result.output


def test_compact_through_the_cli_and_resent_operations_are_repeats(server: ServerProcess) -> None:
    ops = push(server)
    before = status(server, ADMIN)
    assert before["operations"]["stored"] == 8

    result = offline("compact", "--url", server.http_url, "--token", ADMIN)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    # Kept: each board's latest operation (the renamed one's last update, the others' inserts; the last
    # insert is also the node's highest).
    assert answer == {"horizon": 8, "dropped": 5, "kept": 3}
    assert "deleted 5 operations up to delivery 8" in result.stderr
    after = status(server, ADMIN)
    assert after["operations"]["stored"] == 3
    assert after["records"] == before["records"]

    push(server, ops)  # the whole batch again, as a client that missed the acknowledgement would
    assert status(server, ADMIN)["operations"]["stored"] == 3

    again = offline("compact", "--url", server.http_url, "--token", ADMIN)
    assert json.loads(again.stdout) == {"horizon": 8, "dropped": 0, "kept": 3}

    # A backup taken now says it holds a compacted log.
    backup = httpx.post(
        f"{server.http_url}/__offline/backup/export", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
    )
    manifest = json.loads(backup.content.splitlines()[0])
    assert (manifest["compactionHorizon"], manifest["operations"]) == (8, 3)


def test_compact_refuses_a_wrong_token_and_says_what_to_do(server: ServerProcess) -> None:
    result = offline("compact", "--url", server.http_url, "--token", "wrong")
    assert result.exit_code == 1
    assert "OFFLINE_ADMIN_TOKEN" in result.output
    response = httpx.post(f"{server.http_url}/__offline/compact", timeout=30)
    assert response.status_code == 401
