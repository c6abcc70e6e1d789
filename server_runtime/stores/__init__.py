"""Server stores: the persistence behind the server's sync core (memory, SQLite, PostgreSQL).

``from server_runtime.stores import MemoryServerStore, create_sqlite_server_store,
create_relational_server_store``; every store implements ``ServerStore`` (see ``base``).
"""

from .base import (
    NotifyCallback,
    RecordKey,
    RecordRow,
    ServerStore,
    StoredOperation,
    StoreKind,
    StoreWriter,
    WriteConflict,
)
from .memory import MemoryServerStore
from .postgres import PostgresServerStore, create_relational_server_store, normalize_postgres_url
from .sqlite import DEFAULT_SQLITE_FILENAME, SQLiteServerStore, create_sqlite_server_store

__all__ = [
    "DEFAULT_SQLITE_FILENAME",
    "MemoryServerStore",
    "NotifyCallback",
    "PostgresServerStore",
    "RecordKey",
    "RecordRow",
    "SQLiteServerStore",
    "ServerStore",
    "StoreKind",
    "StoreWriter",
    "StoredOperation",
    "WriteConflict",
    "create_relational_server_store",
    "create_sqlite_server_store",
    "normalize_postgres_url",
]
