"""Loading a user's Python files (schema.py, server.py) as modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from offline.core.errors import OfflineError
from offline.core.schema import SchemaDefinition


class UserFileError(Exception):
    """A user's file could not be found or loaded; the message says what to do next."""


def load_python_file(path: Path, module_name: str | None = None) -> ModuleType:
    """Import ``path`` as a module, with its directory first on sys.path so its own imports resolve."""
    path = path.resolve()
    if not path.is_file():
        raise UserFileError(f"{path} does not exist; pass the path of your schema or server file")
    name = module_name or f"offline_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserFileError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except OfflineError:
        sys.modules.pop(name, None)
        raise
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UserFileError(f"{path} failed to import: {type(exc).__name__}: {exc}") from exc
    return module


def find_schema(module: ModuleType) -> SchemaDefinition:
    """The module's `schema` (a define_schema result), or the only SchemaDefinition it defines."""
    candidate = getattr(module, "schema", None)
    if isinstance(candidate, SchemaDefinition):
        return candidate
    found = [value for value in vars(module).values() if isinstance(value, SchemaDefinition)]
    if len(found) == 1:
        return found[0]
    where = getattr(module, "__file__", module.__name__)
    if not found:
        raise UserFileError(f"{where} defines no schema; add `schema = define_schema({{...}})`")
    raise UserFileError(f"{where} defines several schemas; name the one to use `schema`")
