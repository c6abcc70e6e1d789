"""The browser worker's bytecode cache: the app's imported modules compiled once, kept for the build.

Pyodide unpacks the app's code into a fresh in-memory folder on every page load, so CPython would compile
each module from source on every reload (a few hundred ms of a warm start). After the first start the
worker calls :func:`compile_imported` and keeps the archive it writes in the browser's Cache Storage, keyed
by the code archive's name (which carries its hash), and unpacks it beside the code on the next load.

The ``.pyc`` files are hash-based (PEP 552) and checked: unpacking gives the sources new file times, so
timestamp-based ones would never match, and a checked hash costs a hash of each source (microseconds beside
compiling it) while making stale bytecode impossible to run even if a cache entry outlived its build.
"""

from __future__ import annotations

import importlib.util
import py_compile
import sys
import zipfile
from pathlib import Path


def compile_imported(root: str, archive: str) -> int:
    """Compile every module imported so far from under ``root`` into a zip at ``archive`` (paths relative
    to ``root``, as ``__pycache__/<name>.<tag>.pyc``); return how many it holds."""
    base = Path(root).resolve()
    sources = set()
    for module in list(sys.modules.values()):
        origin = getattr(module, "__file__", None)
        if not origin or not origin.endswith(".py"):
            continue
        path = Path(origin).resolve()
        if path.is_relative_to(base) and path.is_file():
            sources.add(path)
    count = 0
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as bundle:
        for source in sorted(sources):
            target = importlib.util.cache_from_source(str(source))
            try:
                py_compile.compile(
                    str(source),
                    cfile=target,
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
                )
            except (py_compile.PyCompileError, OSError):
                continue  # that module is compiled from source next time, as without the cache
            bundle.write(target, Path(target).relative_to(base).as_posix())
            count += 1
    return count
