"""TOTP two-step sign-in on a live server (SQLite store): enrolment, sign-in with a right and a wrong code,
no replay of a code, recovery codes that work once, the per-account limit on wrong codes, disabling, and
nothing secret in the logs or in the database in clear."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import urllib.parse
from pathlib import Path

import pyotp

from server_runtime import create_sqlite_server_store

from .conftest import Capture, bearer, http, sign_up
from .part_two import Clock, claims_of, code_at, error_code, post, routes_with, serve_with, sign_in


def wrong_code(secret: str, clock: Clock) -> str:
    """A six-digit code that matches no step of the accepted window."""
    totp = pyotp.TOTP(secret)
    valid = {totp.at(clock() + d) for d in (-30, 0, 30)}
    return next(c for c in (f"{n:06d}" for n in range(1_000_000)) if c not in valid)


def test_totp_enrolment_sign_in_recovery_codes_and_limits(tmp_path: Path, captured_logs: Capture) -> None:
    clock = Clock()
    db = tmp_path / "server.db"
    shown: set[str] = set()  # every secret, code and token the test sees: none may reach a log line

    async def scenario() -> None:
        routes = routes_with(clock, rate_limits={"mfa_attempts": 4}, totp_issuer="Acme Notes")
        async with serve_with(create_sqlite_server_store(str(db)), routes) as server, http(server) as client:
            pair = await sign_up(client, "ann@example.com")
            token = pair["accessToken"]
            user_id = pair["user"]["id"]

            # Enrolment: a provisioning URI for the app, pending until a first code confirms it.
            assert error_code(await post(client, "/auth/mfa/totp/enroll", None)) == "AUTH_FAILED"
            enrol = await post(client, "/auth/mfa/totp/enroll", token)
            assert enrol.status_code == 200, enrol.text
            assert enrol.headers["cache-control"] == "no-store"
            secret = enrol.json()["secret"]
            uri = urllib.parse.urlsplit(enrol.json()["provisioningUri"])
            assert (uri.scheme, uri.netloc) == ("otpauth", "totp")
            assert urllib.parse.unquote(uri.path) == "/Acme Notes:ann@example.com"
            assert urllib.parse.parse_qs(uri.query)["secret"] == [secret]
            status = await client.get("/auth/mfa", headers=bearer(token))
            assert status.json() == {"totp": "pending", "recoveryCodesLeft": 0}
            # Still pending: a sign-in needs no second factor yet.
            assert "accessToken" in (await sign_in(client, "ann@example.com")).json()

            bad = await post(client, "/auth/mfa/totp/verify", token, {"code": wrong_code(secret, clock)})
            assert (bad.status_code, error_code(bad)) == (401, "INVALID_MFA_CODE")
            confirm_code = code_at(secret, clock)
            confirmed = await post(client, "/auth/mfa/totp/verify", token, {"code": confirm_code})
            assert confirmed.status_code == 200, confirmed.text
            recovery = confirmed.json()["recoveryCodes"]
            assert confirmed.json()["enabled"] is True
            assert len(recovery) == 10 and len(set(recovery)) == 10
            again = await post(client, "/auth/mfa/totp/verify", token, {"code": confirm_code})
            assert (again.status_code, error_code(again)) == (409, "MFA_NOT_PENDING")
            assert error_code(await post(client, "/auth/mfa/totp/enroll", token)) == "MFA_ALREADY_ENABLED"

            # Sign-in now stops after the password.
            first = await sign_in(client, "ann@example.com")
            assert first.status_code == 200
            step = first.json()
            assert step["mfaRequired"] is True and step["mfaTypes"] == ["totp"]
            assert "accessToken" not in step and "refreshToken" not in step
            mfa_token = step["mfaToken"]
            wrong = await post(
                client,
                "/auth/mfa/challenge",
                None,
                {"mfaToken": mfa_token, "code": wrong_code(secret, clock)},
            )
            assert (wrong.status_code, error_code(wrong)) == (401, "INVALID_MFA_CODE")
            # The code that confirmed the enrolment is spent, even inside its 30-second window.
            replay = await post(
                client, "/auth/mfa/challenge", None, {"mfaToken": mfa_token, "code": confirm_code}
            )
            assert error_code(replay) == "INVALID_MFA_CODE"
            clock.next_step()
            good_code = code_at(secret, clock)
            good = await post(client, "/auth/mfa/challenge", None, {"mfaToken": mfa_token, "code": good_code})
            assert good.status_code == 200, good.text
            assert claims_of(good.json()["accessToken"])["sub"] == user_id
            me = await client.get("/auth/me", headers=bearer(good.json()["accessToken"]))
            assert me.status_code == 200
            # The MFA token was spent by the successful step.
            clock.next_step()
            spent = await post(
                client, "/auth/mfa/challenge", None, {"mfaToken": mfa_token, "code": code_at(secret, clock)}
            )
            assert (spent.status_code, error_code(spent)) == (401, "INVALID_MFA_TOKEN")
            missing = await post(client, "/auth/mfa/challenge", None, {"mfaToken": "x" * 43})
            assert (missing.status_code, error_code(missing)) == (400, "INVALID_INPUT")

            # A recovery code works once; spaces, case and dashes do not matter.
            step_token = (await sign_in(client, "ann@example.com")).json()["mfaToken"]
            used = await post(
                client, "/auth/mfa/challenge", None, {"mfaToken": step_token, "recoveryCode": recovery[0]}
            )
            assert used.status_code == 200, used.text
            step_token = (await sign_in(client, "ann@example.com")).json()["mfaToken"]
            reused = await post(
                client, "/auth/mfa/challenge", None, {"mfaToken": step_token, "recoveryCode": recovery[0]}
            )
            assert (reused.status_code, error_code(reused)) == (401, "INVALID_MFA_CODE")
            typed = " " + recovery[1].replace("-", "").upper() + " "
            second = await post(
                client, "/auth/mfa/challenge", None, {"mfaToken": step_token, "recoveryCode": typed}
            )
            assert second.status_code == 200, second.text
            status = await client.get("/auth/mfa", headers=bearer(token))
            assert status.json() == {"totp": "enabled", "recoveryCodesLeft": 8}

            # Wrong codes are limited per account (4 here; a success clears the count): the fifth attempt is
            # refused whatever the code.
            step_token = (await sign_in(client, "ann@example.com")).json()["mfaToken"]
            for _ in range(4):
                r = await post(
                    client,
                    "/auth/mfa/challenge",
                    None,
                    {"mfaToken": step_token, "code": wrong_code(secret, clock)},
                )
                assert error_code(r) == "INVALID_MFA_CODE"
            clock.next_step()
            limited = await post(
                client, "/auth/mfa/challenge", None, {"mfaToken": step_token, "code": code_at(secret, clock)}
            )
            assert (limited.status_code, error_code(limited)) == (429, "RATE_LIMITED")
            assert int(limited.headers["retry-after"]) > 0
            routes.mfa.limiter.reset(user_id)  # the window is 15 minutes of real time; the test moves on

            # Disabling needs a second factor too (a stolen access token alone cannot switch it off).
            no_code = await post(client, "/auth/mfa/totp/disable", token, {})
            assert (no_code.status_code, error_code(no_code)) == (400, "INVALID_INPUT")
            clock.next_step()
            off_code = code_at(secret, clock)
            off = await post(client, "/auth/mfa/totp/disable", token, {"code": off_code})
            assert off.status_code == 204, off.text
            assert "accessToken" in (await sign_in(client, "ann@example.com")).json()
            assert (await client.get("/auth/mfa", headers=bearer(token))).json()["totp"] == "off"
            shown.update([secret, confirm_code, good_code, off_code, mfa_token, step_token, *recovery])
            shown.update([pair["refreshToken"], token, good.json()["refreshToken"]])

    asyncio.run(scenario())
    lines = "\n".join(captured_logs.lines)
    assert "enabled TOTP" in lines  # the log was captured at all
    for value in shown:
        assert value not in lines
    # Nothing the test saw is in the database in clear (challenges included).
    with sqlite3.connect(db) as conn:
        dump = json.dumps(
            [
                list(map(str, r))
                for t in ("totp", "recovery_codes", "challenges")
                for r in conn.execute(f"SELECT * FROM offline_auth_{t}")
            ]
        )
    for value in shown:
        assert value not in dump


def test_sealed_totp_secret_and_hashed_recovery_codes_in_the_store(tmp_path: Path) -> None:
    clock = Clock()
    db = tmp_path / "server.db"

    async def scenario() -> tuple[str, list[str]]:
        routes = routes_with(clock)
        async with serve_with(create_sqlite_server_store(str(db)), routes) as server, http(server) as client:
            token = (await sign_up(client, "bo@example.com"))["accessToken"]
            secret = (await post(client, "/auth/mfa/totp/enroll", token)).json()["secret"]
            codes = (
                await post(client, "/auth/mfa/totp/verify", token, {"code": code_at(secret, clock)})
            ).json()
            return secret, codes["recoveryCodes"]

    secret, recovery = asyncio.run(scenario())
    with sqlite3.connect(db) as conn:
        (sealed,) = conn.execute("SELECT sealed_secret FROM offline_auth_totp").fetchone()
        hashes = [r[0] for r in conn.execute("SELECT code_hash FROM offline_auth_recovery_codes")]
    assert sealed.startswith("v1:") and secret not in sealed
    assert len(hashes) == 10 and not set(hashes) & set(recovery)
    assert all(len(h) == 64 for h in hashes)


def test_concurrent_wrong_codes_get_at_most_the_limit(tmp_path: Path) -> None:
    clock = Clock()

    async def scenario() -> None:
        routes = routes_with(clock, rate_limits={"mfa_attempts": 4})
        store = create_sqlite_server_store(str(tmp_path / "server.db"))
        async with serve_with(store, routes) as server, http(server) as client:
            token = (await sign_up(client, "burst@example.com"))["accessToken"]
            secret = (await post(client, "/auth/mfa/totp/enroll", token)).json()["secret"]
            confirmed = await post(client, "/auth/mfa/totp/verify", token, {"code": code_at(secret, clock)})
            assert confirmed.status_code == 200, confirmed.text
            step_token = (await sign_in(client, "burst@example.com")).json()["mfaToken"]
            wrong = {"mfaToken": step_token, "code": wrong_code(secret, clock)}
            answers = await asyncio.gather(
                *(post(client, "/auth/mfa/challenge", None, wrong) for _ in range(30))
            )
            codes = [error_code(a) for a in answers]
            # Each code is counted before it is checked: 30 at once get no more tries than 4 in turn.
            assert codes.count("INVALID_MFA_CODE") == 4 and codes.count("RATE_LIMITED") == 26, codes

    asyncio.run(scenario())
