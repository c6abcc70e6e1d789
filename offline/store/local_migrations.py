"""Opening a database written under an older schema version (DESIGN.md section 2, `migrations`).

Structural steps (add/remove/rename fields and indexes) run as SQL on the record tables; then every record
is refolded from the operation log, whose operations are read with today's field names (see
`MergeEngine.op_fields`); backfills become ordinary local update operations, so they sync like any write.
Rows and unsynced operations are kept: operations are immutable and are never rewritten.

All of it, backfills included, is one transaction with storing the new version: a process stopped half way
leaves the database at its old version, and the next open migrates again (a backfill never gets lost
because the version was already stored). A backfill of version v sees and returns the field names of
version v: fields renamed by later versions are mapped to and from today's names. Backfill values are
validated like any write; an invalid one fails the migration (STORAGE_ERROR, database unchanged).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from offline.core.errors import OfflineError
from offline.core.fields import validate_field_value
from offline.core.migrations import MigrationStep, apply_migration_steps
from offline.merge.values import normalize

from . import compaction
from .database import storage_error
from .rows import drop_lookup_indexes

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
        backfills: list[tuple[int, MigrationStep]] = []
        for version in range(old + 1, schema.version + 1):
            migration = schema.migrations.get(version)
            if migration is None:
                continue
            for step in migration.steps:
                if step.type == "backfill":
                    backfills.append((version, step))
                else:
                    structural.append(step)
        try:
            with db.transaction():
                if structural:
                    drop_lookup_indexes(db.conn)  # create_tables makes them again for the new schema
                    apply_migration_steps(db.conn, structural)
                db.create_tables(schema)
                db.set_meta("schema_version", str(schema.version))
                compaction.rename_fields(
                    app, {name: _renames_after(app, name, old) for name in schema.collections}
                )
                app.rebuild()
                for version, step in backfills:
                    _run_backfill(app, version, step)
                app.flush()
        except OfflineError:
            raise
        except Exception as exc:
            raise storage_error(
                f"migrating {app.path!r} from schema version {old} to {schema.version} failed; "
                "the database was left unchanged",
                exc,
                path=app.path,
            ) from exc


def _renames_after(app: App, collection: str, version: int) -> list[tuple[str, str]]:
    """(old, new) field renames of ``collection`` made by the migrations after ``version``, in order."""
    out: list[tuple[str, str]] = []
    for later in range(version + 1, app.schema.version + 1):
        migration = app.schema.migrations.get(later)
        for step in getattr(migration, "steps", ()):
            if step.collection == collection and step.type == "renameField":
                out.append((step.from_, step.to))
    return out


def _run_backfill(app: App, version: int, step: MigrationStep) -> None:
    from .app import Write

    collection = app.collection(step.collection)
    renames = _renames_after(app, step.collection, version)

    def today(name: str) -> str:
        for old, new in renames:
            if name == old:
                name = new
        return name

    def then(name: str) -> str:
        for old, new in reversed(renames):
            if name == new:
                name = old
        return name

    writes: list[Write] = []
    for record in collection.all().fetch():
        transform: Any = step.transform
        seen = {k if k == "id" else then(k): v for k, v in record.items()}
        changes = dict(transform) if not callable(transform) else transform(seen)
        if not changes:
            continue
        data: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "id":
                continue
            field = today(name)
            descriptor = collection.fields.get(field)
            if descriptor is None or descriptor.type == "richtext":
                raise OfflineError(
                    f"backfill of {step.collection} (schema version {version}) sets {name!r}, which is not "
                    f"a field it can write; the database was left unchanged",
                    "STORAGE_ERROR",
                    {"path": app.path, "collection": step.collection, "field": name, "version": version},
                )
            try:
                validate_field_value(step.collection, field, descriptor, value)
            except OfflineError as exc:
                raise OfflineError(
                    f"backfill of {step.collection} (schema version {version}) gives an invalid value: "
                    f"{exc.message}; the database was left unchanged",
                    "STORAGE_ERROR",
                    {**(exc.context or {}), "path": app.path, "version": version},
                ) from None
            value = normalize(descriptor, value)
            if value != record.get(field) or type(value) is not type(record.get(field)):
                data[field] = value
        if data:
            writes.append(
                Write(step.collection, record["id"], "update", data, {k: record.get(k) for k in data})
            )
    if writes:
        app.commit_local(writes)
