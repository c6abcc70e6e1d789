"""The three-tier merge engine, shared by every client and the server."""

from .engine import Conflict, MergeEngine, RecordState
from .trace import MergeTrace

__all__ = ["Conflict", "MergeEngine", "MergeTrace", "RecordState"]
