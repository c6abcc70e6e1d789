"""offline: offline-first data and sync for Python.

The meta-package re-exports everything in `offline.core` (SPEC 9.3), plus `create_app` and `op`.
"""

from offline.core import *  # noqa: F403
from offline.core import __all__ as _core_all
from offline.merge import MergeTrace
from offline.store import App, OfflineEvent, create_app, op

__version__ = "0.1.0"
__all__ = [*_core_all, "App", "MergeTrace", "OfflineEvent", "__version__", "create_app", "op"]
