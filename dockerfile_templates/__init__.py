"""jinja2 templates that `offline deploy` renders into `<project>/.offline/deploy/` (DESIGN.md section 6).

The templates ship as package data, so they are found next to this file after a plain `pip install`.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE_DIR = Path(__file__).resolve().parent


def template_path(name: str) -> Path:
    """The path of the template ``name`` (e.g. ``Dockerfile.j2``); FileNotFoundError when it does not exist."""
    path = TEMPLATE_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"no deploy template named {name!r} in {TEMPLATE_DIR}")
    return path


def template_names() -> list[str]:
    """Every template shipped with the package, sorted."""
    return sorted(p.name for p in TEMPLATE_DIR.glob("*.j2"))
