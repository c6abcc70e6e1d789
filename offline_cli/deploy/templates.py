"""Step 2: render the container build recipe into ``.offline/deploy/`` and keep it out of version control.

Templates receive only build facts (Python version, port, whether a client exists), never environment
values, so no secret can end up in a generated file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dockerfile_templates import TEMPLATE_DIR

DEFAULT_PORT = 3001
#: The unprivileged user the image runs as (numeric: needs no /etc/passwd entry in the base image).
CONTAINER_UID = 10001
GITIGNORE_ENTRY = ".offline/"
_GITIGNORE_EQUIVALENTS = {".offline", ".offline/", "/.offline", "/.offline/", ".offline/*", "/.offline/*"}


def _jinja() -> Any:
    import jinja2

    # StrictUndefined: a template asking for a value we did not pass is a bug, not an empty string.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_template(name: str, **values: Any) -> str:
    """Render ``dockerfile_templates/<name>`` with ``values``."""
    text: str = _jinja().get_template(name).render(**values)
    return text


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def render_deploy_files(
    deploy_dir: Path, *, python_version: str, port: int = DEFAULT_PORT, has_client: bool
) -> list[Path]:
    """Write ``Dockerfile`` and ``.dockerignore`` into ``deploy_dir``; return their paths."""
    values = {"python_version": python_version, "port": port, "has_client": has_client, "uid": CONTAINER_UID}
    written = []
    for template, target in (("Dockerfile.j2", "Dockerfile"), ("dockerignore.j2", ".dockerignore")):
        path = deploy_dir / target
        write_text_atomic(path, render_template(template, **values))
        written.append(path)
    return written


def ensure_gitignored(project_dir: Path) -> bool:
    """Add ``.offline/`` to the project's .gitignore (created when missing). True when the file changed."""
    path = project_dir / ".gitignore"
    existing = path.read_text(encoding="utf-8") if path.is_file() else ""
    if any(line.strip() in _GITIGNORE_EQUIVALENTS for line in existing.splitlines()):
        return False
    separator = "" if not existing or existing.endswith("\n") else "\n"
    addition = f"{separator}# offline deploy: generated files and deploy state\n{GITIGNORE_ENTRY}\n"
    path.write_text(existing + addition, encoding="utf-8")
    return True
