"""Step 1: find the project's server entry file (SPEC 4.6 rule 2, in Python: DESIGN.md section 6)."""

from __future__ import annotations

from pathlib import Path

from platform_adapters.base import ENTRY_NOT_FOUND, DeployError

#: Searched in this order in the project root; the same list `python -m server_runtime` uses.
ENTRY_CANDIDATES = ("server.py", "src/server.py")


def find_server_entry(project_dir: Path) -> Path:
    """The first of ENTRY_CANDIDATES that exists in ``project_dir``; DeployError(ENTRY_NOT_FOUND) otherwise."""
    for name in ENTRY_CANDIDATES:
        candidate = project_dir / name
        if candidate.is_file():
            return candidate
    tried = ", ".join(str(project_dir / name) for name in ENTRY_CANDIDATES)
    raise DeployError(
        f"could not find a server entry file in {project_dir} (tried {tried})",
        ENTRY_NOT_FOUND,
        {"project_dir": str(project_dir), "tried": list(ENTRY_CANDIDATES)},
        hint=(
            "Create server.py in the project root that defines `schema = define_schema({...})` "
            "(and optionally `server = create_production_server(...)`), or run `offline deploy` "
            "from your project folder (--project-dir)."
        ),
    )
