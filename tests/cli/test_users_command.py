"""`offline users` against a real server process: list, show, disable (a live sync socket closes and the next
sign-in is refused), enable, sign-out, delete (only with --confirm) and audit; tables and JSON on stdout,
messages on stderr, and errors that say what to do next (wrong token, unknown user, a server without an admin
token, nothing listening)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from offline_cli.main import cli
from tests.auth.live import auth_server, sign_in_from, sign_up_from
from tests.hardening.support import RawClient
from tests.support.servers import ServerProcess, free_port

ADMIN_TOKEN = "admin-token-0f1e2d3c4b5a69788796a5b4c3d2e1f0"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # OFFLINE_DEV: the console email sender writes the verification codes to the server's log.
    env = {"OFFLINE_ADMIN_TOKEN": ADMIN_TOKEN, "OFFLINE_DEV": "1"}
    process = auth_server(tmp_path_factory.mktemp("users"), env=env)
    try:
        yield process
    finally:
        assert process.terminate() == 0, process.log_path.read_text()


def offline(server: ServerProcess, *args: str, token: str | None = ADMIN_TOKEN) -> Result:
    options = ["--url", server.http_url] + (["--token", token] if token else [])
    return CliRunner().invoke(cli, ["users", *args, *options], env={"OFFLINE_ADMIN_TOKEN": None})


def signed_up(server: ServerProcess, email: str) -> dict[str, Any]:
    return asyncio.run(sign_up_from(server, email))


def test_help_has_examples() -> None:
    for command in ([], ["list"], ["show"], ["disable"], ["enable"], ["sign-out"], ["delete"], ["audit"]):
        result = CliRunner().invoke(cli, ["users", *command, "--help"])
        assert result.exit_code == 0 and "Examples:" in result.output
        assert "offline users disable" in result.output


def test_list_show_and_search(server: ServerProcess) -> None:
    ann = signed_up(server, "ann@cli.example")
    signed_up(server, "bob@cli.example")
    listed = offline(server, "list", "--query", "cli.example", "--json")
    assert listed.exit_code == 0, listed.output
    assert [u["email"] for u in json.loads(listed.stdout)["users"]] == ["ann@cli.example", "bob@cli.example"]
    table = offline(server, "list", "--query", "ann@cli")
    assert table.exit_code == 0 and "ann@cli.example" in table.stdout and "bob@" not in table.stdout
    paged = offline(server, "list", "--query", "cli.example", "--limit", "1")
    assert "--after" in paged.stderr and "bob@" not in paged.stdout
    none = offline(server, "list", "--query", "nobody-here")
    assert none.exit_code == 0 and "no users found" in none.stderr
    shown = offline(server, "show", ann["user"]["id"])
    assert shown.exit_code == 0 and "ann@cli.example" in shown.stdout and "live" in shown.stdout
    as_json = json.loads(offline(server, "show", ann["user"]["id"], "--json").stdout)
    assert as_json["id"] == ann["user"]["id"] and len(as_json["sessions"]) == 1
    assert as_json["emailVerified"] is False and re.search(r"email verified\W+no", shown.stdout)


def verification_token(server: ServerProcess, email: str) -> str:
    """The verification code the server's console sender logged for ``email``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # No OFFLINE_APP_URL: the message carries the code itself instead of a link.
        pattern = rf"To: {re.escape(email)}\n(?:.*\n)*?Enter this code in the app:\n\n(\S+)"
        found = re.search(pattern, server.log_path.read_text())
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise AssertionError(f"no verification code for {email} in:\n{server.log_path.read_text()[-3000:]}")


def test_show_says_whether_the_email_is_verified(server: ServerProcess) -> None:
    user_id = signed_up(server, "dora@cli.example")["user"]["id"]
    token = verification_token(server, "dora@cli.example")
    verified = httpx.post(server.http_url + "/auth/email/verify", json={"token": token}, timeout=30)
    assert verified.status_code == 200, verified.text
    as_json = json.loads(offline(server, "show", user_id, "--json").stdout)
    assert as_json["emailVerified"] is True
    assert re.search(r"email verified\W+yes", offline(server, "show", user_id).stdout)
    listed = json.loads(offline(server, "list", "--query", "dora@cli", "--json").stdout)
    assert [u["emailVerified"] for u in listed["users"]] == [True]


def test_disable_enable_sign_out_and_delete(server: ServerProcess) -> None:
    user = signed_up(server, "carol@cli.example")
    user_id = user["user"]["id"]

    async def held_socket() -> RawClient:
        client = RawClient(server.sync_url, token=user["accessToken"])
        await client.open()
        return client

    async def disable_while_connected() -> list[str]:
        client = await held_socket()
        try:
            result = await asyncio.to_thread(offline, server, "disable", user_id, "--reason", "testing")
            assert result.exit_code == 0, result.output
            assert "disabled user" in result.stderr and "1 session(s) revoked" in result.stderr
            assert result.stdout == ""
            assert await client.wait_closed() == 1008
            return [e.code for e in client.errors]
        finally:
            await client.close()

    assert asyncio.run(disable_while_connected()) == ["SESSION_REVOKED"]
    refused = asyncio.run(sign_in_from(server, "carol@cli.example"))
    assert refused.json()["error"]["code"] == "USER_DISABLED"
    again = offline(server, "disable", user_id, "--json")
    assert json.loads(again.stdout)["changed"] is False and "already disabled" in again.stderr
    assert "testing" in offline(server, "show", user_id).stdout

    enabled = offline(server, "enable", user_id)
    assert enabled.exit_code == 0 and "enabled user" in enabled.stderr
    back = asyncio.run(sign_in_from(server, "carol@cli.example"))
    assert back.status_code == 200

    out = offline(server, "sign-out", user_id, "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["sessionsRevoked"] == 1

    unconfirmed = offline(server, "delete", user_id)
    assert unconfirmed.exit_code == 2 and "--confirm" in unconfirmed.stderr
    assert offline(server, "show", user_id).exit_code == 0  # still there
    deleted = offline(server, "delete", user_id, "--confirm")
    assert deleted.exit_code == 0 and "records" in deleted.stderr
    missing = offline(server, "show", user_id)
    assert missing.exit_code == 1 and "offline users list --query" in missing.stderr

    audit = offline(server, "audit", "--user", user_id, "--json")
    kinds = [e["kind"] for e in reversed(json.loads(audit.stdout)["entries"])]
    assert kinds == [
        "sign-up",
        "user-disabled",
        "sign-in-failed",  # refused: disabled
        "user-disabled",  # again (changed: false)
        "user-enabled",
        "sign-in",
        "user-signed-out",
        "user-deleted",
    ]
    table = offline(server, "audit", "--kind", "user-deleted")
    assert table.exit_code == 0 and "user-deleted" in table.stdout and "admin" in table.stdout
    # `offline logs` shows the recent audit events too.
    logs = CliRunner().invoke(
        cli,
        ["logs", "--url", server.http_url, "--token", ADMIN_TOKEN, "--no-follow"],
        env={"OFFLINE_ADMIN_TOKEN": None},
    )
    assert logs.exit_code == 0 and f"AUDIT   user-deleted user={user_id} by=admin" in logs.stdout


def test_errors_say_what_to_do(server: ServerProcess, tmp_path: Path) -> None:
    wrong = offline(server, "list", token="not-the-token")
    assert wrong.exit_code == 1 and "--token" in wrong.stderr and "OFFLINE_ADMIN_TOKEN" in wrong.stderr
    bad_since = offline(server, "audit", "--since", "last tuesday")
    assert bad_since.exit_code == 1 and "ISO 8601" in bad_since.stderr
    nothing = CliRunner().invoke(cli, ["users", "list", "--url", f"http://127.0.0.1:{free_port()}"])
    assert nothing.exit_code == 1 and "is the server running" in nothing.stderr

    bare = auth_server(tmp_path / "bare")
    try:
        closed = offline(bare, "list")
        assert closed.exit_code == 1 and "set OFFLINE_ADMIN_TOKEN on the server" in closed.stderr
    finally:
        assert bare.terminate() == 0
