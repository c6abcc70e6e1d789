"""Sync: protocol messages, the client sync engine and its transports (built in the sync issue)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from offline.core.errors import SYNC_ERROR, OfflineError


def create_sync_engine(app: Any, config: Mapping[str, Any]) -> Any:
    raise OfflineError(
        "sync over WebSockets is not available in this version yet; create the app without sync=...",
        SYNC_ERROR,
        {"field": "sync"},
    )
