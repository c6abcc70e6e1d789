"""The production server: sync endpoint, server stores, operational endpoints (DESIGN.md sections 4-5)."""

from .auth import create_auth_routes
from .server import ProductionServer, create_production_server
from .stores import (
    MemoryServerStore,
    RecordRow,
    ServerStore,
    StoredOperation,
    create_relational_server_store,
    create_sqlite_server_store,
)

__all__ = [
    "MemoryServerStore",
    "ProductionServer",
    "RecordRow",
    "ServerStore",
    "StoredOperation",
    "create_auth_routes",
    "create_production_server",
    "create_relational_server_store",
    "create_sqlite_server_store",
]
