"""Step 3: bundle the server into one zipapp, ``server.pyz``, with shiv (DESIGN.md section 6).

The zipapp targets linux/amd64 and one CPython minor version (the image's), whatever machine builds it: pip
runs through shiv with ``--platform manylinux…_x86_64 --python-version XY --implementation cp
--only-binary=:all:``, so an ARM laptop downloads the same x86-64 wheels a Linux CI runner would. The
framework itself (``offline``, ``server_runtime``) is copied from the installed distribution rather than
downloaded, so bundling works after a plain ``pip install`` and always ships the version the user runs.
The project's Python files go in ``offline_app/`` inside the zipapp; a generated entry module runs
``server_runtime`` on the project's entry file from there.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from platform_adapters.base import BUILD_FAILED, CommandRunner, DeployError, Reporter

from .templates import render_template

#: Packages of the installed distribution copied into the zipapp as they are.
FRAMEWORK_PACKAGES = ("offline", "server_runtime")
#: Requirements of the `offline` distribution that only the CLI uses; the server never imports them (jinja2
#: is not among them: the server renders its email templates with it).
CLI_ONLY_REQUIREMENTS = frozenset({"click", "rich", "questionary", "shiv", "packaging", "boto3", "docker"})
#: Folder in the zipapp holding the project's own files, and the generated entry module beside it.
APP_PACKAGE_DIR = "offline_app"
ENTRY_MODULE = "_offline_zipapp_main"
#: Where the zipapp unpacks its dependencies when SHIV_ROOT is unset; /tmp is writable in read-only containers.
SHIV_ROOT = "/tmp/offline-shiv"
#: Every glibc manylinux tag a current Debian-based python:*-slim image (glibc 2.36 or later) can load.
#: pip does not expand PEP 600 tags to older ones by itself, so all of them are listed.
MANYLINUX_PLATFORMS = (
    "manylinux2014_x86_64",
    *(f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)),
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
# Folders of a project that never hold server code.
_SKIPPED_DIRS = frozenset(
    {"node_modules", "tests", "test", "dist", "build", "venv", "env", "__pycache__", "site-packages"}
)
_VERSION = re.compile(r"^3\.(\d{1,2})$")
_ERROR_TAIL_LINES = 15


def default_python_version() -> str:
    """The running interpreter's ``major.minor``."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def check_python_version(value: str | None) -> str:
    """``value`` (or the running interpreter's version) as ``3.N``; DeployError for anything else."""
    version = (value or default_python_version()).strip()
    if not _VERSION.match(version):
        raise DeployError(
            f"--python-version must look like 3.12, got {version!r}",
            BUILD_FAILED,
            {"option": "--python-version", "value": version},
            hint="Pass the CPython minor version of the image, e.g. --python-version 3.12.",
        )
    return version


@dataclass(frozen=True)
class TargetPython:
    """The interpreter the zipapp runs on: CPython ``version`` on linux/amd64."""

    version: str

    @property
    def nodot(self) -> str:
        return self.version.replace(".", "")

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker values of the target, so requirement markers are judged for the image, not here."""
        return {
            "implementation_name": "cpython",
            "implementation_version": f"{self.version}.0",
            "os_name": "posix",
            "platform_machine": "x86_64",
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": f"{self.version}.0",
            "python_version": self.version,
            "sys_platform": "linux",
            "extra": "",
        }


def runtime_requirements(target: TargetPython, requires: Iterable[str] | None = None) -> list[str]:
    """The server's third-party requirements: the installed ``offline`` distribution's, minus extras and
    CLI-only packages, with markers evaluated for ``target``. ``requires`` overrides the metadata (tests)."""
    if requires is None:
        requires = importlib.metadata.requires("offline") or []
    environment = target.marker_environment()
    kept: list[str] = []
    for line in requires:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) in CLI_ONLY_REQUIREMENTS:
            continue
        marker = requirement.marker
        if marker is not None:
            if "extra" in str(marker):
                continue
            if not marker.evaluate(environment):
                continue
        requirement.marker = None
        kept.append(str(requirement))
    return kept


def filtered_project_requirements(project_dir: Path, out_dir: Path) -> Path | None:
    """A copy of the project's requirements.txt fit for the bundle, or None when there is none.

    Lines naming `offline` itself are dropped (the framework is copied from the installed distribution, and
    a same-named package on an index is not this one); nested ``-r``/``-c`` files are made absolute because
    the copy lives elsewhere.
    """
    source = project_dir / "requirements.txt"
    if not source.is_file():
        return None
    lines = []
    for raw in source.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        option = re.match(r"^(-r|-c|--requirement|--constraint)(\s+|=)(\S+)$", line)
        if option:
            nested = Path(option.group(3))
            if not nested.is_absolute():
                nested = (project_dir / nested).resolve()
            lines.append(f"{option.group(1)} {nested}")
            continue
        if line and not line.startswith(("#", "-")):
            try:
                if canonicalize_name(Requirement(line.split(" #", 1)[0]).name) == "offline":
                    continue
            except InvalidRequirement:
                pass  # a URL or path requirement: pip judges it
        lines.append(raw)
    target = out_dir / "requirements.txt"
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def pip_arguments(
    target: TargetPython, requirements: Sequence[str], requirements_file: Path | None = None
) -> list[str]:
    """What shiv passes on to ``pip install --target``: x86-64 manylinux wheels for ``target`` only."""
    args: list[str] = []
    for platform in MANYLINUX_PLATFORMS:
        args += ["--platform", platform]
    args += [
        "--python-version",
        target.nodot,
        "--implementation",
        "cp",
        "--only-binary=:all:",
        "--no-compile",
        "--progress-bar",
        "off",
        *requirements,
    ]
    if requirements_file is not None:
        args += ["-r", str(requirements_file)]
    return args


def shiv_argv(python: str, site_packages: Path, output: Path, pip_args: Sequence[str]) -> list[str]:
    """The shiv command line (as data, so it is tested without running pip)."""
    return [
        python,
        "-m",
        "shiv",
        "--site-packages",
        str(site_packages),
        "--entry-point",
        f"{ENTRY_MODULE}:main",
        "--output-file",
        str(output),
        "--python",
        "/usr/bin/env python3",
        "--root",
        SHIV_ROOT,
        "--reproducible",
        *pip_args,
    ]


def _is_skipped_dir(path: Path) -> bool:
    return path.name.startswith(".") or path.name in _SKIPPED_DIRS or (path / "pyvenv.cfg").exists()


def _holds_python(folder: Path) -> bool:
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not _is_skipped_dir(Path(root) / d)]
        if any(name.endswith(".py") for name in files):
            return True
    return False


def project_files(project_dir: Path) -> list[Path]:
    """The project's server files, relative to ``project_dir``: every ``*.py`` in the root and every folder
    holding Python code, minus generated state, virtualenvs, node_modules, tests, dist and hidden folders."""
    found: list[Path] = []
    for child in sorted(project_dir.iterdir()):
        if child.is_file() and child.suffix == ".py":
            found.append(child.relative_to(project_dir))
        elif child.is_dir() and not _is_skipped_dir(child) and _holds_python(child):
            for root, dirs, files in os.walk(child):
                dirs[:] = sorted(d for d in dirs if not _is_skipped_dir(Path(root) / d))
                for name in sorted(files):
                    if not name.endswith((".pyc", ".pyo")):
                        found.append((Path(root) / name).relative_to(project_dir))
    return found


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DeployError(
            f"the installed distribution has no package {name!r} to bundle",
            BUILD_FAILED,
            {"package": name},
            hint="Reinstall offline (pip install --force-reinstall offline) and retry.",
        )
    return Path(next(iter(spec.submodule_search_locations)))


def stage_site_packages(project_dir: Path, entry: Path, staging: Path) -> list[Path]:
    """Fill ``staging`` with the framework packages, the project's files and the entry module; return the
    project files copied (relative paths)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")
    for name in FRAMEWORK_PACKAGES:
        shutil.copytree(_package_dir(name), staging / name, ignore=ignore)
    app_dir = staging / APP_PACKAGE_DIR
    files = project_files(project_dir)
    for relative in files:
        (app_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(project_dir / relative, app_dir / relative)
    entry_relative = entry.resolve().relative_to(project_dir.resolve()).as_posix()
    main = render_template("zipapp_main.py.j2", entry=entry_relative)
    (staging / f"{ENTRY_MODULE}.py").write_text(main, encoding="utf-8")
    return files


def _tail(result_text: str, lines: int = _ERROR_TAIL_LINES) -> str:
    kept = [line for line in result_text.strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def _check_tools() -> None:
    for module, package in (("shiv", "shiv"), ("pip", "pip")):
        if importlib.util.find_spec(module) is None:
            raise DeployError(
                f"{package} is needed to bundle the server but is not installed in {sys.executable}",
                BUILD_FAILED,
                {"missing": package},
                hint=f"Install it into the same environment as offline: {sys.executable} -m pip install {package}",
            )


def bundle_server(
    project_dir: Path,
    entry: Path,
    deploy_dir: Path,
    *,
    python_version: str | None,
    runner: CommandRunner,
    reporter: Reporter,
    timeout: float = 1800.0,
) -> Path:
    """Build ``deploy_dir/server.pyz`` for linux/amd64 and CPython ``python_version``; return its path."""
    target = TargetPython(check_python_version(python_version))
    reporter.step(f"Bundling the server (linux/amd64, CPython {target.version})")
    _check_tools()
    deploy_dir.mkdir(parents=True, exist_ok=True)
    output = deploy_dir / "server.pyz"
    partial = deploy_dir / "server.pyz.partial"
    with tempfile.TemporaryDirectory(prefix="offline-bundle-") as tmp:
        staging = Path(tmp) / "site-packages"
        staging.mkdir()
        files = stage_site_packages(project_dir, entry, staging)
        reporter.info(
            f"project files: {', '.join(str(f) for f in files[:8])}{' …' if len(files) > 8 else ''}"
        )
        requirements = runtime_requirements(target)
        requirements_file = filtered_project_requirements(project_dir, Path(tmp))
        if requirements_file is not None:
            reporter.info("adding the project's requirements.txt")
        reporter.info("downloading x86-64 wheels with pip (this takes a while the first time)")
        argv = shiv_argv(
            sys.executable, staging, partial, pip_arguments(target, requirements, requirements_file)
        )
        result = runner.run(
            argv,
            env={"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"},
            cwd=project_dir,
            timeout=timeout,
            stream=True,
        )
    if result.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise DeployError(
            f"bundling the server failed (shiv/pip exit code {result.returncode}):\n"
            + _tail(result.stdout + "\n" + result.stderr),
            BUILD_FAILED,
            {"step": "bundle", "returncode": result.returncode},
            hint=(
                f"Every dependency needs a wheel for linux x86-64 (manylinux) and CPython {target.version}. "
                "Check requirements.txt, or pick the image's Python with --python-version."
            ),
        )
    os.replace(partial, output)
    installed = next(
        (line for line in result.stdout.splitlines() if line.startswith("Successfully installed")), ""
    )
    if installed:
        reporter.info(installed.replace("Successfully installed", "bundled:"))
    reporter.info(f"{output.name}: {output.stat().st_size / 1_000_000:.1f} MB")
    return output
