"""`offline init NAME`: a new project: a to-do list whose web client runs the app's Python in the browser.

The template (``offline_cli/templates/project``) has the schema, the app's functions, the server entry, a
desktop client and the web client; package.json pins the npm package ``pyodide``. Unless ``--no-install``,
init then runs ``npm install`` (Pyodide into the project) and ``npm run build`` (``dist/``), so ``offline
dev`` serves a working page at once. Without npm the project is still created and the next steps say so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

import click

from ..environment import current_environment
from ..web_build import PYODIDE_VERSION, YJS_VERSION

TEMPLATE = ("templates", "project")
# Template files stored under another name (a dot file would be skipped by packaging tools).
RENAMED = {"gitignore": ".gitignore"}
# Files whose __NAME__ / __PYODIDE_VERSION__ / __YJS_VERSION__ placeholders are filled in.
RENDERED = {"package.json", "README.md"}
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_TAIL_LINES = 15


def _template() -> Traversable:
    root = resources.files("offline_cli")
    for part in TEMPLATE:
        root = root / part
    return root


def _copy(source: Traversable, target: Path, name: str) -> list[Path]:
    written: list[Path] = []
    for item in sorted(source.iterdir(), key=lambda entry: entry.name):
        if item.name == "__pycache__" or item.name.endswith((".pyc", ".pyo")):
            continue
        destination = target / RENAMED.get(item.name, item.name)
        if item.is_dir():
            destination.mkdir(exist_ok=True)
            written += _copy(item, destination, name)
        elif item.name in RENDERED:
            text = item.read_text(encoding="utf-8")
            text = text.replace("__NAME__", name).replace("__PYODIDE_VERSION__", PYODIDE_VERSION)
            text = text.replace("__YJS_VERSION__", YJS_VERSION)
            destination.write_text(text, encoding="utf-8")
            written.append(destination)
        else:
            destination.write_bytes(item.read_bytes())
            written.append(destination)
    return written


def project_name(target: Path) -> str:
    """The npm-style name of the project in ``target`` (its folder name, lowercased)."""
    name = target.name.strip().lower().replace(" ", "-")
    if not _NAME.fullmatch(name):
        raise click.ClickException(
            f"{target.name!r} cannot name a project: use lowercase letters, digits, '-', '_' or '.', "
            "starting with a letter or digit (for example my-todos)"
        )
    return name


def create_project(target: Path) -> list[Path]:
    """Write the template into ``target`` (new or empty); return the files written."""
    name = project_name(target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise click.ClickException(
            f"{target} already exists and is not an empty folder; pick another name or remove it"
        )
    target.mkdir(parents=True, exist_ok=True)
    return _copy(_template(), target, name)


def _run(argv: list[str], cwd: Path, env: dict[str, str], what: str, timeout: float) -> None:
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise click.ClickException(
            f"{what} did not finish within {timeout:.0f} s; run it yourself in {cwd}"
        ) from None
    if done.returncode != 0:
        lines = [line for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
        raise click.ClickException(
            f"{what} failed (exit code {done.returncode}):\n"
            + "\n".join(lines[-_TAIL_LINES:])
            + f"\nThe project is in {cwd}; fix the problem and run `{' '.join(argv[-2:])}` there."
        )


@click.command(
    epilog="""\b
Examples:
  offline init my-todos              create ./my-todos, install Pyodide, build dist/
  offline init my-todos --no-install only write the files
  cd my-todos && offline dev         serve it on http://127.0.0.1:3001
"""
)
@click.argument("name", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--install/--no-install",
    default=True,
    show_default=True,
    help="Run npm install (the pinned pyodide) and npm run build (dist/); needs Node.js.",
)
def init(name: Path, install: bool) -> None:
    """Create a project: schema, server, desktop client and a web client running Python in the browser."""
    env = current_environment()
    target = name.expanduser().resolve()
    written = create_project(target)
    out = env.stdout
    out.write(f"created {target} ({len(written)} files)\n")
    built = False
    if install:
        child_env = dict(env.env)
        npm = shutil.which("npm", path=child_env.get("PATH"))
        if npm is None:
            env.err.print(
                "[yellow]npm was not found, so Pyodide is not installed and the web client is not built.[/yellow] "
                "Install Node.js (https://nodejs.org), then run `npm install && npm run build` in the project."
            )
        else:
            # The build bundles the offline library from a Python that has it: this one.
            child_env.setdefault("OFFLINE_PYTHON", sys.executable)
            out.write(f"installing pyodide {PYODIDE_VERSION} and yjs {YJS_VERSION} (npm install) ...\n")
            out.flush()
            _run([npm, "install", "--no-audit", "--no-fund"], target, child_env, "npm install", 900)
            out.write("building the web client (npm run build) ...\n")
            out.flush()
            _run([npm, "run", "build"], target, child_env, "npm run build", 900)
            built = True
    shown = name if not name.is_absolute() else target
    steps = [f"cd {shown}"]
    if not built:
        steps.append("npm install && npm run build")
    steps.append("offline dev                 # then open http://127.0.0.1:3001")
    out.write("\nnext:\n" + "".join(f"  {step}\n" for step in steps))
    out.flush()
