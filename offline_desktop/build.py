"""Build a project's desktop app into one versioned zipapp: ``python -m offline_desktop.build``.

    BUILD_SYNC_URL=wss://my-app.fly.dev/offline-sync \\
      python -m offline_desktop.build my-todos --version 1.2.0 --out releases/my-todos-1.2.0.pyz \\
        --update-url https://my-app.example.com/desktop/manifest.json --update-public-key update-key.pub

The archive holds the project's Python modules (``"offline"."modules"`` of package.json), its page (``web``),
its package.json and ``offline_build.json`` (app name, version, BUILD_SYNC_URL, the update manifest URL and
the public key that checks updates; public values only). ``python my-todos-1.2.0.pyz`` runs it on a Python
with ``offline[desktop]`` installed: it checks for a signed update first, then opens the window. A release
is signed with ``python -m offline_desktop.sign_release sign``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import zipapp
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from offline import OfflineError

from .config import BuildConfig, build_config_from_env, write_build_config
from .shell import SHELL_ERROR

# The archive's entry: unpack into a per-version folder (the page is served from real files), then run.
MAIN = '''\
"""A desktop app built by offline_desktop.build; run it with a Python that has offline[desktop]."""
import sys
from offline_desktop.build import run_archive

sys.exit(run_archive(__file__))
'''


def _package_config(project: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        package = json.loads((project / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise OfflineError(
            f"cannot read {project / 'package.json'} ({exc}); build a project made by `offline init`",
            SHELL_ERROR,
            {"path": str(project)},
        ) from exc
    config = package.get("offline") if isinstance(package, dict) else None
    if not isinstance(config, dict):
        raise OfflineError(f'{project / "package.json"} has no "offline" section', SHELL_ERROR)
    return package, config


def build_desktop_app(
    project: Path,
    out: Path,
    *,
    version: str,
    update_url: str | None = None,
    update_public_key: str | None = None,
    environ: dict[str, str] | None = None,
) -> BuildConfig:
    """Write the zipapp ``out`` for ``project``; returns the build configuration baked into it."""
    project = project.resolve()
    package, config = _package_config(project)
    name = str(config.get("database") or package.get("name") or project.name)
    build = build_config_from_env(
        name, version, update_url=update_url, update_public_key=update_public_key, environ=environ
    )
    web = project / str(config.get("web") or "web")
    if not (web / "index.html").is_file():
        raise OfflineError(f"no index.html in {web}: the desktop app shows the project's page", SHELL_ERROR)
    modules = config.get("modules") or []
    with tempfile.TemporaryDirectory(prefix="offline-desktop-build-") as tmp:
        stage = Path(tmp) / "app"
        stage.mkdir()
        for module in modules:
            source = project / str(module)
            if not source.exists():
                raise OfflineError(f"{module} (listed in package.json) does not exist", SHELL_ERROR)
            copy = shutil.copytree if source.is_dir() else shutil.copy2
            copy(source, stage / source.name)
        shutil.copytree(web, stage / web.name, ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
        shutil.copy2(project / "package.json", stage / "package.json")
        write_build_config(stage, build)
        (stage / "__main__.py").write_text(MAIN, encoding="utf-8")
        out.parent.mkdir(parents=True, exist_ok=True)
        zipapp.create_archive(stage, out, interpreter="/usr/bin/env python3")
    return build


def run_archive(archive: str) -> int:
    """The archive's entry point: unpack it once per version, then run the app from there."""
    import zipfile

    from .config import BUILD_CONFIG_NAME, config_dir
    from .project import main

    path = Path(archive).resolve().parent  # __main__.py's folder inside the zip: the archive itself
    with zipfile.ZipFile(path) as bundle:
        build = BuildConfig.from_json(json.loads(bundle.read(BUILD_CONFIG_NAME)))
        target = config_dir(build.app_name) / "releases" / build.version
        if not (target / BUILD_CONFIG_NAME).is_file():
            # Unpacked beside its final place, then renamed: a crash never leaves half a release there.
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
            bundle.extractall(staging)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
    return main([str(target), "--archive", str(path)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offline_desktop.build",
        description="Build a project's desktop app into one zipapp (BUILD_SYNC_URL is baked in when set).",
        epilog=(
            "examples:\n"
            "  python -m offline_desktop.build . --version 1.0.0 --out releases/app-1.0.0.pyz\n"
            "  BUILD_SYNC_URL=wss://my-app.fly.dev/offline-sync python -m offline_desktop.build my-todos \\\n"
            "      --version 2.0.0 --out app.pyz --update-url https://example.com/manifest.json \\\n"
            "      --update-public-key update-key.pub\n"
            "\nMake the key pair and sign releases with python -m offline_desktop.sign_release."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("project", nargs="?", default=".", help="the project folder (default: .)")
    parser.add_argument("--version", required=True, help="this release's version, e.g. 1.2.0")
    parser.add_argument("--out", required=True, type=Path, help="the zipapp to write")
    parser.add_argument("--update-url", help="URL of the signed manifest of the latest release")
    parser.add_argument("--update-public-key", type=Path, help="PEM file of the release key's public half")
    args = parser.parse_args(argv)
    if bool(args.update_url) != bool(args.update_public_key):
        parser.error("--update-url and --update-public-key go together")
    try:
        key = args.update_public_key.read_text(encoding="utf-8") if args.update_public_key else None
        build = build_desktop_app(
            Path(args.project),
            args.out,
            version=args.version,
            update_url=args.update_url,
            update_public_key=key,
        )
    except (OSError, OfflineError) as exc:
        message = exc.message if isinstance(exc, OfflineError) else str(exc)
        print(f"error: {message}", file=sys.stderr)
        return 1
    print(args.out)
    print(
        f"built {build.app_name} {build.version}"
        + (f", syncing with {build.sync_url}" if build.sync_url else ", setup asks for the sync server")
        + (", auto-update on" if build.update_url else ""),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
