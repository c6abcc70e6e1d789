"""The `offline` command-line tool."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("offline")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"
