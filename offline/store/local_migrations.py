"""Opening a database written under an older schema version (DESIGN.md section 2, `migrations`).

Structural steps (add/remove/rename fields and indexes) run as SQL on the record tables; then every record
is refolded from the operation log, whose operations are read with today's field names (see
`MergeEngine.op_fields`); backfills become ordinary local update operations, so they sync like any write.
Rows and unsynced operations are kept: operations are immutable and are never rewritten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from offline.core.errors import OfflineError
from offline.core.migrations import MigrationStep, apply_migration_steps

from .database import storage_error

if TYPE_CHECKING:
    from .app import App


def migrate_database(app: App) -> None:
    db = app.db
    schema = app.schema
    with db.lock:
        stored = db.get_meta("schema_version")
        if stored is None:
            with db.transaction():
                db.create_tables(schema)
                db.set_meta("schema_version", str(schema.version))
            return
        old = int(stored)
        if old == schema.version:
            db.create_tables(schema)  # idempotent: a collection added without a version bump
            return
        if old > schema.version:
            raise OfflineError(
                f"the local database {app.path!r} was written by schema version {old}, newer than this app's "
                f"version {schema.version}; update the app (or open a different path)",
                "STORAGE_ERROR",
                {"path": app.path, "databaseVersion": old, "schemaVersion": schema.version},
            )
        structural: list[MigrationStep] = []
        backfills: list[MigrationStep] = []
        for version in range(old + 1, schema.version + 1):
            migration = schema.migrations.get(version)
            if migration is None:
                continue
            for step in migration.steps:
                (backfills if step.type == "backfill" else structural).append(step)
        try:
            with db.transaction():
                if structural:
                    apply_migration_steps(db.conn, structural)
                db.create_tables(schema)
                db.set_meta("schema_version", str(schema.version))
                app.rebuild()
        except OfflineError:
            raise
        except Exception as exc:
            raise storage_error(
                f"migrating {app.path!r} from schema version {old} to {schema.version} failed; "
                "the database was left unchanged",
                exc,
                path=app.path,
            ) from exc
    if backfills:
        _run_backfills(app, backfills)


def _run_backfills(app: App, steps: list[MigrationStep]) -> None:
    from .app import Write

    for step in steps:
        collection = app.collection(step.collection)
        writes: list[Write] = []
        for record in collection.all().fetch():
            transform: Any = step.transform
            changes = dict(transform) if not callable(transform) else transform(dict(record))
            if not changes:
                continue
            data = {k: v for k, v in changes.items() if k != "id" and record.get(k) != v}
            if data:
                writes.append(
                    Write(step.collection, record["id"], "update", data, {k: record.get(k) for k in data})
                )
        if writes:
            app.commit_local(writes)
