"""No secret in the audit log, against a real server process: a user signs up with a known password, enrols
TOTP (secret, confirmation code, recovery codes), fails and passes sign-ins (wrong password, wrong code,
recovery code), refreshes, signs out; an administrator disables, enables and signs the user out. Then every
audit entry (the API's JSON, ``offline users audit --json``), the whole ``/__offline/events`` stream and
the server's log are searched for each secret: the passwords, the TOTP secret and codes, the recovery codes,
every access, refresh, MFA and device token, the admin token, AUTH_SECRET and the stored hashes."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from pathlib import Path

import httpx
import pyotp
from click.testing import CliRunner

from offline_cli.main import cli
from tests.server.test_operational import EventReader

from .conftest import PASSWORD, SECRET
from .live import TIMEOUT, auth_server

ADMIN_TOKEN = "admin-token-9d8c7b6a5f4e3d2c1b0a99887766554433"
WRONG_PASSWORD = "wrong horse battery staple"


def wrong_code(secret: str) -> str:
    totp = pyotp.TOTP(secret)
    valid = {totp.at(time.time() + d) for d in range(-90, 91, 30)}
    return next(c for c in (f"{n:06d}" for n in range(1_000_000)) if c not in valid)


def test_no_secret_reaches_the_audit_log_the_event_stream_or_the_server_log(tmp_path: Path) -> None:
    process = auth_server(tmp_path / "server", env={"OFFLINE_ADMIN_TOKEN": ADMIN_TOKEN})
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    secrets: list[str] = [PASSWORD, WRONG_PASSWORD, SECRET, ADMIN_TOKEN]
    codes: list[str] = []  # six digits: searched as a number of their own (not inside a longer one)
    try:

        async def scenario() -> str:
            async with (
                httpx.AsyncClient(timeout=None) as stream_http,
                httpx.AsyncClient(base_url=process.http_url, timeout=TIMEOUT) as http,
            ):
                events = EventReader(stream_http, process.http_url, admin)
                await events.wait(lambda: "ready" in events.kinds(), "the event stream")

                def keep(pair: dict[str, str]) -> dict[str, str]:
                    secrets.extend(
                        pair[k]
                        for k in ("accessToken", "refreshToken", "deviceToken", "mfaToken")
                        if k in pair
                    )
                    return pair

                pair = keep(
                    (
                        await http.post(
                            "/auth/sign-up", json={"email": "kim@example.com", "password": PASSWORD}
                        )
                    ).json()
                )
                user_id = pair["user"]["id"]
                bearer = {"Authorization": f"Bearer {pair['accessToken']}"}
                enrol = (await http.post("/auth/mfa/totp/enroll", headers=bearer)).json()
                secrets.append(enrol["secret"])
                code = pyotp.TOTP(enrol["secret"]).now()
                codes.append(code)
                confirmed = await http.post("/auth/mfa/totp/verify", headers=bearer, json={"code": code})
                assert confirmed.status_code == 200, confirmed.text
                recovery = confirmed.json()["recoveryCodes"]
                secrets.extend(recovery)

                wrong = await http.post(
                    "/auth/sign-in", json={"email": "kim@example.com", "password": WRONG_PASSWORD}
                )
                assert wrong.status_code == 401
                step = keep(
                    (
                        await http.post(
                            "/auth/sign-in", json={"email": "kim@example.com", "password": PASSWORD}
                        )
                    ).json()
                )
                bad = wrong_code(enrol["secret"])
                codes.append(bad)
                refused = await http.post(
                    "/auth/mfa/challenge", json={"mfaToken": step["mfaToken"], "code": bad}
                )
                assert refused.status_code == 401
                done = await http.post(
                    "/auth/mfa/challenge", json={"mfaToken": step["mfaToken"], "recoveryCode": recovery[0]}
                )
                assert done.status_code == 200, done.text
                second = keep(done.json())
                keep((await http.post("/auth/refresh", json={"refreshToken": second["refreshToken"]})).json())
                reused = await http.post("/auth/refresh", json={"refreshToken": second["refreshToken"]})
                assert reused.json()["error"]["code"] == "REFRESH_TOKEN_REUSED"
                await http.post("/auth/sign-out", json={"refreshToken": pair["refreshToken"]})
                for action in ("disable", "enable", "sign-out"):
                    answer = await http.post(f"/__offline/users/{user_id}/{action}", headers=admin, json={})
                    assert answer.status_code == 200, answer.text

                audit = (await http.get("/__offline/audit", headers=admin, params={"limit": 500})).json()
                kinds = {entry["kind"] for entry in audit["entries"]}
                expected = {
                    "sign-up",
                    "mfa-enabled",
                    "sign-in-failed",
                    "sign-in",
                    "refresh-reused",
                    "sign-out",
                    "user-disabled",
                    "user-enabled",
                    "user-signed-out",
                }
                assert expected <= kinds, kinds
                await events.wait(
                    lambda: expected <= {e["kind"] for e in events.of("audit")},
                    "every audit kind on the stream",
                )
                await events.close()
                return json.dumps(audit) + json.dumps(events.events)

        seen = asyncio.run(scenario())
        cli_run = CliRunner().invoke(
            cli,
            ["users", "audit", "--url", process.http_url, "--token", ADMIN_TOKEN, "--limit", "500", "--json"],
        )
        assert cli_run.exit_code == 0, cli_run.output
        assert "mfa-enabled" in cli_run.stdout
        with sqlite3.connect(tmp_path / "server" / "server.db") as db:
            secrets.extend(str(row[0]) for row in db.execute("SELECT password_hash FROM offline_auth_users"))
            secrets.extend(
                str(row[0]) for row in db.execute("SELECT token_hash FROM offline_auth_refresh_tokens")
            )
            secrets.extend(str(row[0]) for row in db.execute("SELECT sealed_secret FROM offline_auth_totp"))
            secrets.extend(
                str(row[0]) for row in db.execute("SELECT code_hash FROM offline_auth_recovery_codes")
            )
    finally:
        assert process.terminate() == 0
    log = process.log_path.read_text()
    assert "kim@example.com" in seen and log  # the scan reads real output
    for secret in secrets:
        assert secret, "an empty secret would match anything"
        for where, text in (
            ("the audit log or event stream", seen),
            ("offline users audit", cli_run.stdout),
            ("the server log", log),
        ):
            assert secret not in text, f"a secret ({secret[:4]}...) appears in {where}"
    assert len(codes) == 2
    for code in codes:
        for text in (seen, cli_run.stdout, log):
            assert not re.search(rf"(?<!\d){code}(?!\d)", text), "a TOTP code appears in the output"
