"""Run a project's desktop app: the same schema, Python functions and web page as its browser client.

``python -m offline_desktop [PROJECT]`` (and ``offline dev --desktop``) read the project's ``package.json``
section ``"offline"`` (the one the web build reads): ``web`` (the page's folder), ``schemaModule``,
``actionsModule`` and ``database`` (the app's name). The build configuration comes from
``offline_build.json`` in the project when the app was built, else from the environment (``BUILD_SYNC_URL``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from offline import OfflineError
from offline.core.schema import SchemaDefinition

from .config import BUILD_CONFIG_NAME, BuildConfig, build_config_from_env
from .shell import SHELL_ERROR, DesktopShell

log = logging.getLogger("offline_desktop")


@dataclass(frozen=True)
class DesktopProject:
    root: Path
    schema: SchemaDefinition
    actions: ModuleType | None
    web_dir: Path
    build: BuildConfig


def _fail(message: str, **context: Any) -> OfflineError:
    return OfflineError(message, SHELL_ERROR, context)


def load_project(root: Path, environ: dict[str, str] | None = None) -> DesktopProject:
    """Import the project's schema and actions modules and find its page (errors say what to fix)."""
    root = root.resolve()
    manifest = root / "package.json"
    try:
        package = json.loads(manifest.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(
            f"no package.json in {root}: run this in a project made by `offline init`", path=str(root)
        ) from None
    except ValueError as exc:
        raise _fail(f"{manifest} is not JSON: {exc}", path=str(manifest)) from exc
    config = package.get("offline") if isinstance(package, dict) else None
    if not isinstance(config, dict) or not isinstance(config.get("schemaModule"), str):
        raise _fail(f'{manifest} has no "offline" section with "schemaModule"', field="offline.schemaModule")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    schema_module = importlib.import_module(config["schemaModule"])
    schema = getattr(schema_module, "schema", None)
    if not isinstance(schema, SchemaDefinition):
        raise _fail(f"{config['schemaModule']}.py must define `schema = define_schema(...)`", field="schema")
    actions_name = config.get("actionsModule")
    actions = (
        importlib.import_module(actions_name) if isinstance(actions_name, str) and actions_name else None
    )
    web_dir = root / str(config.get("web") or "web")
    name = str(config.get("database") or package.get("name") or root.name)
    built = root / BUILD_CONFIG_NAME
    if built.is_file():
        build = BuildConfig.from_json(json.loads(built.read_text(encoding="utf-8")))
    else:
        build = build_config_from_env(name, str(package.get("version") or "0.0.0"), environ=environ)
    return DesktopProject(root, schema, actions, web_dir, build)


def _check_for_update(build: BuildConfig, archive: Path | None) -> None:
    # Only a packaged app (a zipapp built by offline_desktop.build, with an update URL) replaces itself; a
    # project run from its folder never does.
    if archive is None or not build.update_url or not archive.is_file() or not zipfile.is_zipfile(archive):
        return
    from .update import update_at_launch  # the cryptography import only when it is needed

    result = update_at_launch(build, archive, argv=[])
    log.info("update check: %s%s", result.status, f" ({result.reason})" if result.reason else "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offline_desktop",
        description="Open a project's desktop app: its web page in a native window, its data in local SQLite.",
        epilog=(
            "examples:\n"
            "  python -m offline_desktop                      the project in this folder\n"
            "  BUILD_SYNC_URL=ws://localhost:3001/offline-sync python -m offline_desktop my-todos\n"
            "  python -m offline_desktop --app-url http://localhost:5173/   the page from a dev server\n"
            "\nSettings and the database live in the per-user config folder of the app\n"
            "(OFFLINE_DESKTOP_CONFIG_DIR overrides it)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("project", nargs="?", default=".", help="the project folder (default: .)")
    parser.add_argument(
        "--app-url", help="load the page from this URL (a frontend dev server) instead of web/"
    )
    parser.add_argument("--archive", type=Path, help=argparse.SUPPRESS)  # the zipapp this runs from
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        project = load_project(Path(args.project))
        log.info("%s %s", project.build.app_name, project.build.version)
        _check_for_update(project.build, args.archive)
        DesktopShell(
            schema=project.schema,
            build=project.build,
            web_dir=None if args.app_url else project.web_dir,
            app_page_url=args.app_url,
            actions=project.actions,
        ).run()
    except OfflineError as exc:
        print(f"error: {exc.message} [{exc.code}]", file=sys.stderr)
        return 1
    return 0
