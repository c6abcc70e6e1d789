"""Backup export and import throughput (keyed backups, ``server_runtime.backup``).

A server on SQLite holds ``--operations`` inserts (stored through its sync service, as client writes are);
its backup is exported over HTTP and imported over HTTP into a fresh server on SQLite. Figures: export and
import in operations per second, the file's size, and the share of the import spent judging the file in the
scratch in-memory server (the price of refusing a bad file whole instead of storing part of it).

Run: ``python -m bench backup`` (or ``python -m bench.backup --operations 50000``). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BACKUP_TOKEN = "bench-backup-token"


def _log(message: str) -> None:
    print(f"[bench backup] {message}", file=sys.stderr, flush=True)


async def _measure(folder: Path, count: int) -> dict[str, Any]:
    import httpx

    from bench.seeding import insert_operations
    from offline import define_schema, t
    from server_runtime import backup, create_production_server, create_sqlite_server_store

    schema = define_schema(
        {"version": 1, "collections": {"notes": {"fields": {"body": t.string(), "n": t.number()}}}}
    )
    servers = []
    for name in ("source", "target"):
        store = create_sqlite_server_store(str(folder / f"{name}.db"))
        await store.set_schema(schema)
        server = create_production_server(
            store=store, port=0, host="127.0.0.1", operational_auth={"backupToken": BACKUP_TOKEN}
        )
        await server.start()
        servers.append(server)
    source, target = servers
    try:
        ops = list(insert_operations("notes", count, lambda i: {"body": f"note {i} " + "x" * 40, "n": i}, 1))
        for start in range(0, count, 500):
            await source.sync.commit(None, ops[start : start + 500])
        _log(f"{count} operations stored")
        headers = {"Authorization": f"Bearer {BACKUP_TOKEN}"}
        async with httpx.AsyncClient(timeout=600) as http:
            started = time.perf_counter()
            exported = await http.post(f"{source.url}/__offline/backup/export", headers=headers)
            export_seconds = time.perf_counter() - started
            body = exported.content

            parsed = backup.read_backup(body, source.operational.auth.backup_key, max_operation_bytes=1 << 20)
            started = time.perf_counter()
            refused = await backup._judge_in_scratch(source.sync, parsed.operations, None)
            judge_seconds = time.perf_counter() - started
            assert not refused, refused

            started = time.perf_counter()
            imported = await http.post(f"{target.url}/__offline/backup/import", headers=headers, content=body)
            import_seconds = time.perf_counter() - started
            assert imported.status_code == 200 and imported.json()["imported"] == count, imported.text
    finally:
        for server in servers:
            await server.stop()
            await server.store.close()
    return {
        "operations": count,
        "file_mb": round(len(body) / 1e6, 2),
        "export_ops_per_s": round(count / export_seconds),
        "import_ops_per_s": round(count / import_seconds),
        "import_seconds": round(import_seconds, 2),
        "scratch_judging_seconds": round(judge_seconds, 2),
        "scratch_judging_share": round(judge_seconds / import_seconds, 2),
    }


def run(operations: int = 20_000) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        return asyncio.run(_measure(Path(folder), operations))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.backup", description=__doc__)
    parser.add_argument("--operations", type=int, default=20_000)
    args = parser.parse_args()
    json.dump(run(args.operations), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
