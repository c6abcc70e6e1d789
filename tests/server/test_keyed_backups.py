"""Keyed backups against real server processes (DESIGN.md section 7): an export carries an HMAC keyed by the
server's backup secret; import refuses a file whose HMAC does not verify and judges every operation as a sync
write would, storing nothing when it refuses; ``?legacy=1`` takes the older, unkeyed format."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx

from tests.hardening.support import RawClient, Writer, start_server
from tests.support.servers import ServerProcess

BACKUP = "backup-secret-for-keyed-backups"
OTHER = "another-servers-backup-secret"


def headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"}


def export(server: ServerProcess, token: str = BACKUP) -> bytes:
    response = httpx.post(f"{server.http_url}/__offline/backup/export", headers=headers(token), timeout=30)
    assert response.status_code == 200, response.text
    return response.content


def import_(
    server: ServerProcess, body: bytes, *, legacy: bool = False, token: str = BACKUP
) -> httpx.Response:
    query = "?legacy=1" if legacy else ""
    return httpx.post(
        f"{server.http_url}/__offline/backup/import{query}", content=body, headers=headers(token), timeout=60
    )


def stored(server: ServerProcess, token: str = BACKUP) -> tuple[int, dict[str, Any]]:
    """(operations stored, records per collection) from the status endpoint (the backup token is admin here)."""
    response = httpx.get(f"{server.http_url}/__offline/status", headers=headers(token), timeout=30)
    assert response.status_code == 200, response.text
    status = response.json()
    return status["operations"]["stored"], status["records"]


def write_some(server: ServerProcess) -> list[dict[str, Any]]:
    """Real sync writes: three boards and an update, acknowledged by the server."""

    async def run() -> list[dict[str, Any]]:
        client = RawClient(server.sync_url)
        await client.open()
        try:
            ops = [client.writer.op("boards", {"name": f"board {i}"}) for i in range(3)]
            ops.append(
                client.writer.op("boards", {"name": "renamed"}, record_id=ops[0]["recordId"], kind="update")
            )
            await client.push(ops)
            assert not client.rejections, client.rejections
            return ops
        finally:
            await client.close()

    return asyncio.run(run())


def split(body: bytes) -> tuple[dict[str, Any], list[bytes], dict[str, Any]]:
    lines = body.splitlines(keepends=True)
    return json.loads(lines[0]), lines[1:-1], json.loads(lines[-1])


def operation_line(op: dict[str, Any], delivery: int) -> bytes:
    return (
        json.dumps({"type": "operation", "delivery": delivery, "operation": op, "scope": None}) + "\n"
    ).encode()


def legacy_file(manifest: dict[str, Any], op_lines: list[bytes]) -> bytes:
    """The older format: version 1, no key, a bare sha256 checksum line (anyone can write one)."""
    head = (json.dumps({k: v for k, v in {**manifest, "version": 1}.items() if k != "key"}) + "\n").encode()
    signed = head + b"".join(op_lines)
    tail = {
        "type": "checksum",
        "algorithm": "sha256",
        "sha256": hashlib.sha256(signed).hexdigest(),
        "operations": len(op_lines),
    }
    return signed + (json.dumps(tail) + "\n").encode()


def test_tampered_backups_are_refused_and_an_honest_one_round_trips(tmp_path: Path) -> None:
    env = {"OFFLINE_BACKUP_TOKEN": BACKUP, "OFFLINE_ADMIN_TOKEN": BACKUP}
    with (
        start_server(tmp_path / "source", env=env) as source,
        start_server(tmp_path / "target", env=env) as target,
    ):
        write_some(source)
        body = export(source)
        manifest, op_lines, tail = split(body)
        assert manifest["version"] == 2 and manifest["key"] == "backupToken"
        assert tail["type"] == "hmac" and len(tail["hmac"]) == 64 and "sha256" not in tail
        assert BACKUP not in body.decode()

        # An attacker's operation: correctly hashed, valid for the schema, from a node of its own.
        injected = Writer().op("boards", {"name": "injected by an attacker"})
        tampered = [*op_lines, operation_line(injected, len(op_lines) + 1)]
        signed = b"".join([body.splitlines(keepends=True)[0], *tampered])
        recomputed_plain = legacy_file(manifest, tampered)  # the plain checksum recomputed (older format)
        sha_as_hmac = (
            signed
            + (
                json.dumps({**tail, "hmac": hashlib.sha256(signed).hexdigest(), "operations": len(tampered)})
                + "\n"
            ).encode()
        )
        at = body.index(b'"name":"board 1"') + len(b'"name":"board ')
        flipped = body[:at] + b"7" + body[at + 1 :]
        for what, damaged, code in (
            ("injected, plain checksum recomputed", recomputed_plain, "BACKUP_UNKEYED"),
            ("injected, sha256 in the hmac line", sha_as_hmac, "BACKUP_HMAC_MISMATCH"),
            ("one byte flipped", flipped, "BACKUP_HMAC_MISMATCH"),
        ):
            response = import_(target, damaged)
            assert response.status_code == 400, (what, response.text)
            assert response.json()["error"] == code, (what, response.json())
        assert stored(target) == (0, {})  # nothing of a refused file was stored

        honest = import_(target, body)
        assert honest.status_code == 200, honest.text
        assert honest.json() == {"imported": 4, "duplicates": 0, "refused": {}, "operations": 4}
        assert stored(target) == stored(source)
        again = import_(target, body)
        assert again.status_code == 200 and again.json()["duplicates"] == 4

        # A server keyed with another secret cannot vouch for this file: refused, and told why.
        other_env = {"OFFLINE_BACKUP_TOKEN": OTHER, "OFFLINE_ADMIN_TOKEN": OTHER}
        with start_server(tmp_path / "other", env=other_env) as other:
            response = import_(other, body, token=OTHER)
            assert response.status_code == 400
            assert response.json()["error"] == "BACKUP_HMAC_MISMATCH"
            assert OTHER not in response.text and BACKUP not in response.text
            assert stored(other, OTHER) == (0, {})


def test_legacy_files_need_the_flag_and_every_operation_is_still_judged(tmp_path: Path) -> None:
    env = {"OFFLINE_BACKUP_TOKEN": BACKUP, "OFFLINE_ADMIN_TOKEN": BACKUP}
    with (
        start_server(tmp_path / "source", env=env) as source,
        start_server(tmp_path / "target", env=env) as target,
    ):
        ops = write_some(source)
        manifest, op_lines, _ = split(export(source))
        legacy = legacy_file(manifest, op_lines)

        refused = import_(target, legacy)
        assert refused.status_code == 400 and refused.json()["error"] == "BACKUP_UNKEYED"
        assert "legacy=1" in refused.json()["message"]
        assert stored(target) == (0, {})

        # Legacy files whose checksum is right but whose operations a sync write would refuse: refused whole.
        edited = op_lines[1].replace(b'"board 1"', b'"board X"')  # content no longer matches its id
        assert edited != op_lines[1]
        writer = Writer()
        bad_type = writer.op("boards", {"name": 42})  # correctly hashed, but not a string
        unknown = writer.op("nope", {"name": "x"})  # correctly hashed, no such collection
        for what, lines, codes in (
            ("hash mismatch", [op_lines[0], edited, *op_lines[2:]], {ops[1]["id"]: "HASH_MISMATCH"}),
            (
                "schema violations",
                [*op_lines, operation_line(bad_type, 5), operation_line(unknown, 6)],
                {bad_type["id"]: "INVALID_OPERATION", unknown["id"]: "INVALID_OPERATION"},
            ),
        ):
            response = import_(target, legacy_file(manifest, lines), legacy=True)
            assert response.status_code == 422, (what, response.text)
            answer = response.json()
            assert answer["error"] == "BACKUP_OPERATIONS_REFUSED", what
            assert {op_id: reason.split(":")[0] for op_id, reason in answer["refused"].items()} == codes, what
            assert stored(target) == (0, {}), what  # the valid operations of the file were not stored either

        accepted = import_(target, legacy, legacy=True)
        assert accepted.status_code == 200, accepted.text
        assert accepted.json()["imported"] == 4
        assert stored(target) == stored(source)
