"""Sync: protocol messages (JSON over WebSocket), the client sync engine and its transports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from offline.store.app import App

    from .client import SyncEngine


def create_sync_engine(app: App, config: Mapping[str, Any]) -> SyncEngine:
    from .client import SyncEngine

    return SyncEngine(app, config)


__all__ = ["create_sync_engine"]
