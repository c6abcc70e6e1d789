"""Build a project's web client into ``dist/`` (what ``npm run build`` runs; DESIGN.md section 6).

The output is self-contained, so a page never fetches anything from another site:

- the project's ``web/`` files (page, worker, service worker, styles);
- ``pyodide/``: the Pyodide runtime copied from ``node_modules/pyodide`` (the npm package the project pins;
  its core includes CPython's ``sqlite3`` module, SQLite compiled to WebAssembly);
- ``py/app.<hash>.zip``: the Python the worker imports: the ``offline`` library and its pure-Python
  dependencies, taken from the Python running this build, plus the project's own modules;
- bytecode: the standard library (``pyodide/python_stdlib.zip``) and the app's code compiled by Pyodide's own
  CPython under Node.js (``web_precompile.mjs``), so a first visit compiles nothing in the browser; without
  Node.js (or when that fails) the build ships the sources and says so;
- ``vendor/``: the npm package ``yjs`` (rich text in the browser: pycrdt has no WebAssembly build) and the
  packages it imports, as the browser's ES modules, their bare imports rewritten to relative paths (a module
  worker has no import maps); only when the project has yjs installed (the template pins it);
- ``config.js``: the sync URL (``BUILD_SYNC_URL``, default ``ws://localhost:3001/offline-sync``; a path such
  as ``/offline-sync`` means the server the page came from), the module names the worker loads, and the
  library's and the schema's versions (a first visit's snapshot request says them before Python runs);
- ``sw.js`` with this build's file list, so the service worker can cache all of it for offline starts;
- ``<file>.gz`` beside each file gzip shrinks (the WebAssembly and the scripts; not the zip archives, already
  compressed): the server sends the copy to a browser that accepts gzip (server_runtime/static.py), so a
  first visit downloads about 9 MB instead of 15 and nothing is compressed per request. The copies are not
  in the service worker's list (the browser decodes what it caches).

The project describes itself in package.json under ``"offline"``: ``web`` (folder), ``modules`` (Python
files for the browser), ``schemaModule``, ``actionsModule``, ``database`` (local database name) and
optionally ``packages`` (more pure-Python packages to bundle from this Python).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from platform_adapters.base import BUILD_FAILED, DeployError

#: The Pyodide the template pins: the first line of releases whose core has the sqlite3 module.
PYODIDE_VERSION = "314.0.7"
DEFAULT_SYNC_URL = "ws://localhost:3001/offline-sync"
OUTPUT = "dist"
#: What a page needs of the npm package (the rest is for Node.js, TypeScript and its console demo).
PYODIDE_FILES = (
    "pyodide.mjs",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
)
#: The npm package that merges rich text in the browser (the template pins it), and where its entry lands.
YJS_VERSION = "13.6.33"
VENDOR = "vendor"
#: package.json "exports" conditions a browser's module worker matches (first match in the object's order).
_CONDITIONS = frozenset({"browser", "import", "module", "default"})
#: A static import or re-export at the start of a statement (not in a comment), and its specifier.
_STATIC_IMPORT = re.compile(
    r"""((?:^|[;\n])[ \t]*(?:import|export)\b[^'";]*?\bfrom[ \t]*|(?:^|[;\n])[ \t]*import[ \t]*)(['"])([^'"\n]+)\2"""
)
#: Always bundled: the library and the pure-Python packages it imports at module level.
LIBRARY_PACKAGES = ("offline", "rfc8785")
_MANIFEST_MARK = re.compile(r"/\*OFFLINE_MANIFEST\*/[^\n;]*;")
_NATIVE_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so the same sources give the same bundle (and build id)
#: What gets a gzip copy: text and WebAssembly of at least GZIP_MIN_BYTES, when the copy is 10% smaller.
GZIP_SUFFIXES = frozenset({".wasm", ".js", ".mjs", ".json", ".css", ".html", ".svg", ".txt", ".map"})
GZIP_MIN_BYTES = 1024


def _fail(message: str, hint: str, **context: Any) -> DeployError:
    return DeployError(message, BUILD_FAILED, {"step": "web client", **context}, hint=hint)


@dataclass(frozen=True)
class WebProject:
    root: Path
    web_dir: Path
    modules: tuple[str, ...]
    schema_module: str
    actions_module: str | None
    database: str
    packages: tuple[str, ...]


@dataclass(frozen=True)
class WebBuild:
    out: Path
    build_id: str
    sync_url: str
    pyodide_version: str
    files: tuple[str, ...]
    size: int
    #: Whether the Python ships as bytecode (see `precompile`); False: as source, compiled by each browser.
    bytecode: bool = False


def _string_list(value: Any, field: str, manifest: Path) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _fail(
            f'"offline"."{field}" in {manifest} must be a list of strings',
            f'Write it like "{field}": ["schema.py", "todos.py"].',
            file=str(manifest),
        )
    return tuple(value)


def load_web_project(root: Path) -> WebProject:
    """Read the ``"offline"`` section of ``root/package.json``."""
    manifest = root / "package.json"
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(
            f"no package.json in {root}",
            'Run the build in a project made by `offline init`, or add package.json with an "offline" section.',
            file=str(manifest),
        ) from None
    except ValueError as exc:
        raise _fail(f"{manifest} is not valid JSON: {exc}", "Fix package.json.", file=str(manifest)) from None
    section = data.get("offline") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise _fail(
            f'{manifest} has no "offline" section describing the web client',
            'Add "offline": {"web": "web", "modules": ["schema.py"], "schemaModule": "schema", '
            '"database": "app"}.',
            file=str(manifest),
        )
    web_dir = root / str(section.get("web") or "web")
    if not (web_dir / "index.html").is_file():
        raise _fail(
            f"{web_dir} has no index.html",
            'Point "offline"."web" in package.json at the folder with the page (index.html, worker.js).',
            file=str(web_dir),
        )
    modules = _string_list(section.get("modules"), "modules", manifest) or ("schema.py",)
    for module in modules:
        if not (root / module).exists():
            raise _fail(
                f'{root / module} (listed in package.json "offline"."modules") does not exist',
                "Create it or remove it from the list.",
                file=str(root / module),
            )
    database = str(section.get("database") or data.get("name") or "app")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", database):
        raise _fail(
            f'"offline"."database" {database!r} is not a usable database name',
            "Use letters, digits, '-', '_' or '.' (at most 64).",
            file=str(manifest),
        )
    return WebProject(
        root=root,
        web_dir=web_dir,
        modules=modules,
        schema_module=str(section.get("schemaModule") or "schema"),
        actions_module=str(section["actionsModule"]) if section.get("actionsModule") else None,
        database=database,
        packages=_string_list(section.get("packages"), "packages", manifest),
    )


def find_pyodide(root: Path) -> tuple[Path, str]:
    """The installed npm package ``pyodide`` of the project, and its version; checked for sqlite3."""
    folder = root / "node_modules" / "pyodide"
    try:
        version = str(json.loads((folder / "package.json").read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError):
        raise _fail(
            f"the npm package pyodide is not installed in {root}",
            "Run `npm install` in the project (package.json pins pyodide), then build again.",
            path=str(folder),
        ) from None
    missing = [name for name in PYODIDE_FILES if not (folder / name).is_file()]
    if missing:
        raise _fail(
            f"node_modules/pyodide {version} lacks {', '.join(missing)}",
            f'Pin "pyodide": "{PYODIDE_VERSION}" in package.json and run `npm install` again.',
            version=version,
        )
    with zipfile.ZipFile(folder / "python_stdlib.zip") as stdlib:
        if "sqlite3/__init__.py" not in stdlib.namelist():
            raise _fail(
                f"pyodide {version} has no sqlite3 module in its core (older releases load it from a CDN, "
                "which an offline page cannot reach)",
                f'Pin "pyodide": "{PYODIDE_VERSION}" (or newer) in package.json and run `npm install`.',
                version=version,
            )
    return folder, version


def resolve_sync_url(value: str | None) -> str:
    """``BUILD_SYNC_URL`` checked: a ws:// or wss:// URL, or a path on the page's own server."""
    url = (value or "").strip() or DEFAULT_SYNC_URL
    if url.startswith("/") and not url.startswith("//"):
        return url
    parts = urlsplit(url)
    if parts.scheme in ("ws", "wss") and parts.hostname:
        return url
    raise _fail(
        f"BUILD_SYNC_URL {url!r} is not a ws:// or wss:// URL or a path",
        "Use e.g. wss://my-app.example.com/offline-sync, or /offline-sync for the server that serves the page.",
        field="BUILD_SYNC_URL",
    )


def _package_files(name: str) -> list[tuple[Path, str]]:
    """(file, name inside the bundle) for every source file of the installed package or module ``name``."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or (spec.origin is None and not spec.submodule_search_locations):
        raise _fail(
            f"the Python package {name!r} is not installed in {sys.executable}",
            f"pip install {name} into this Python (or set OFFLINE_PYTHON to one that has it).",
            package=name,
        )
    if not spec.submodule_search_locations:  # a single module
        origin = Path(str(spec.origin))
        if origin.suffix != ".py":
            raise _fail(
                f"{name} is a compiled extension ({origin.name}), which Pyodide cannot load",
                f"Remove {name} from the browser's packages, or find a pure-Python alternative.",
                package=name,
            )
        return [(origin, origin.name)]
    found: list[tuple[Path, str]] = []
    for location in spec.submodule_search_locations:
        base = Path(location)
        for path in sorted(base.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file() or path.suffix in (".pyc", ".pyo"):
                continue
            if path.suffix in _NATIVE_SUFFIXES or ".cpython-" in path.name:
                raise _fail(
                    f"{name} contains a compiled extension ({path.name}), which Pyodide cannot load",
                    f"Remove {name} from the browser's packages, or find a pure-Python alternative.",
                    package=name,
                )
            found.append((path, (Path(name.replace(".", "/")) / path.relative_to(base)).as_posix()))
    return found


#: Run by `schema_version` in a Python of its own: the project's schema module imported as the worker imports
#: it (from the project's folder), its ``schema.version`` printed last.
_SCHEMA_VERSION = """
import importlib, sys
sys.path.insert(0, sys.argv[1])
schema = getattr(importlib.import_module(sys.argv[2]), "schema", None)
print("schema-version", getattr(schema, "version", None))
"""


def schema_version(project: WebProject) -> int | None:
    """The version of the project's schema (``schema.version`` of its schema module), or None after saying
    why on stderr. The worker sends it with a snapshot request (web/snapshot.js) before Python has started;
    read in a Python of its own, so the project's modules run nothing inside the build."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SCHEMA_VERSION, str(project.root), project.schema_module],
            cwd=project.root,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        version = int(lines[-1].removeprefix("schema-version ")) if done.returncode == 0 and lines else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        version = None
    if version is None:
        print(
            f"note: the schema module {project.schema_module!r} could not be imported here, so a first visit "
            "syncs over the sync connection instead of downloading the server's snapshot; "
            f"import it with {sys.executable} to see why",
            file=sys.stderr,
        )
    return version


def python_bundle(project: WebProject) -> bytes:
    """The zip the worker unpacks onto its ``sys.path``: library, extra packages, project modules."""
    entries: dict[str, bytes] = {}
    for package in (*LIBRARY_PACKAGES, *project.packages):
        for path, name in _package_files(package):
            entries[name] = path.read_bytes()
    for module in project.modules:
        source = project.root / module
        if source.is_dir():
            for path in sorted(source.rglob("*.py")):
                if "__pycache__" not in path.parts:
                    entries[path.relative_to(project.root).as_posix()] = path.read_bytes()
        else:
            entries[Path(module).as_posix()] = source.read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            bundle.writestr(info, entries[name])
    return buffer.getvalue()


#: Where a project keeps its compiled standard library between builds (npm's folder for tools' caches): the
#: compile takes seconds, and the standard library changes only with Pyodide.
_STDLIB_CACHE = Path("node_modules") / ".cache" / "offline-web-build"
_PRECOMPILE_TIMEOUT_S = 600


def precompile(root: Path, pyodide: Path, stdlib: Path, bundle: bytes) -> bytes | None:
    """Compile the standard library (``stdlib``, replaced in place) and ``bundle`` (returned with its bytecode)
    with the CPython of ``pyodide`` (the npm package) under Node.js; None when that cannot be done (no Node.js,
    or it failed), after saying why on stderr: the build then ships the sources."""
    node = shutil.which("node")
    if node is None:
        print(
            "note: Node.js was not found, so the Python code ships as source (each browser compiles it on "
            "its first visit, seconds slower); install Node.js and build again to ship bytecode",
            file=sys.stderr,
        )
        return None
    source_hash = hashlib.sha256(stdlib.read_bytes()).hexdigest()[:16]
    cached = root / _STDLIB_CACHE / f"python_stdlib.{source_hash}.pyc.zip"
    with tempfile.TemporaryDirectory(prefix="offline-precompile-") as folder:
        work = Path(folder)
        (work / "app.zip").write_bytes(bundle)
        # (prefix: where the browser has the files, "/app/" where the worker unpacks the app's code, "" for
        # the standard library's place in Pyodide)
        app = {"source": str(work / "app.zip"), "target": str(work / "app.pyc.zip"), "prefix": "/app/"}
        jobs: list[dict[str, Any]] = [{**app, "sourceless": False}]
        if not cached.is_file():
            jobs.append(
                {"source": str(stdlib), "target": str(work / "stdlib.zip"), "sourceless": True, "prefix": ""}
            )
        (work / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
        script = Path(__file__).with_name("web_precompile.mjs")
        try:
            done = subprocess.run(
                [node, str(script), str(pyodide.resolve()), str(work / "jobs.json")]
                + ([str(cached)] if cached.is_file() else []),
                capture_output=True,
                text=True,
                timeout=_PRECOMPILE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            failure = str(exc)
        else:
            lines = done.stderr.strip().splitlines()
            errors = [line.strip() for line in lines if "Error" in line] or lines[-1:] or ["no output"]
            failure = "" if done.returncode == 0 else errors[0]
        if failure:
            print(
                f"note: compiling the Python code with Pyodide under Node.js failed ({failure}), so it ships "
                "as source (each browser compiles it on its first visit, seconds slower)",
                file=sys.stderr,
            )
            return None
        if not cached.is_file():
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_name(cached.name + ".partial")
            shutil.copyfile(work / "stdlib.zip", partial)
            partial.replace(cached)  # (whole or not at all: another build may read it)
        shutil.copyfile(cached, stdlib)
        return (work / "app.pyc.zip").read_bytes()


def _exported(target: Any) -> str | None:
    """The file a package.json "exports" target names for a browser's module import."""
    if isinstance(target, str):
        return target
    if isinstance(target, dict):
        for condition, value in target.items():
            if condition in _CONDITIONS:
                found = _exported(value)
                if found is not None:
                    return found
    return None


def _resolve_package(node_modules: Path, specifier: str) -> Path:
    """The file a bare specifier (``lib0/array``, ``yjs``) names, by its package's "exports" (else module/main)."""
    parts = specifier.split("/")
    name_parts = 2 if specifier.startswith("@") else 1
    name, subpath = "/".join(parts[:name_parts]), "/".join(parts[name_parts:])
    folder = node_modules / name
    try:
        manifest = json.loads((folder / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise _fail(
            f"the npm package {name} (imported as {specifier!r}) is not installed in {node_modules}",
            "Run `npm install` in the project, then build again.",
            package=name,
        ) from None
    exports = manifest.get("exports")
    key = f"./{subpath}" if subpath else "."
    if isinstance(exports, dict) and any(k.startswith(".") for k in exports):
        relative = _exported(exports.get(key))
    elif exports is not None and not subpath:
        relative = _exported(exports)
    else:
        relative = subpath or manifest.get("module") or manifest.get("main") or "index.js"
    if relative is None:
        raise _fail(
            f"the npm package {name} exports nothing for a browser at {key!r} (imported as {specifier!r})",
            f"Install a version of {name} with ES modules for browsers.",
            package=name,
        )
    return (folder / relative).resolve()


def vendor_modules(node_modules: Path, package: str, out: Path) -> str:
    """Copy npm ``package`` and the modules it imports into ``out`` (as ``out/<package>/<path>``), every import
    rewritten to a relative URL; return its entry's path inside ``out``. No bundler: the files are the
    packages' own ES modules, which a module worker loads as they are once no bare specifier is left."""
    root = node_modules.resolve()
    entry = _resolve_package(root, package)
    pending, written = [entry], set()

    def place(path: Path) -> Path:
        if not path.is_relative_to(root):
            raise _fail(
                f"{path} is outside {root}", "Install the packages inside the project.", path=str(path)
            )
        return out / path.relative_to(root)

    while pending:
        source = pending.pop()
        if source in written:
            continue
        written.add(source)
        if not source.is_file():
            raise _fail(
                f"{source} (a module of the npm package {package}) does not exist",
                "Run `npm install` in the project again.",
                path=str(source),
            )
        target = place(source)

        def rewrite(match: re.Match[str], source: Path = source, target: Path = target) -> str:
            specifier = match.group(3)
            if specifier.startswith((".", "/")):
                resolved = (source.parent / specifier).resolve()
            else:
                resolved = _resolve_package(root, specifier)
            pending.append(resolved)
            relative = os.path.relpath(place(resolved), target.parent).replace(os.sep, "/")
            quote = match.group(2)
            return (
                f"{match.group(1)}{quote}{relative if relative.startswith('.') else './' + relative}{quote}"
            )

        text = _STATIC_IMPORT.sub(rewrite, source.read_text(encoding="utf-8"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return place(entry).relative_to(out.parent).as_posix()


def _write_service_worker(source: Path, target: Path, build_id: str, files: Sequence[str]) -> None:
    text = source.read_text(encoding="utf-8")
    manifest = json.dumps({"build": build_id, "files": list(files)}, separators=(",", ":"))
    replaced, count = _MANIFEST_MARK.subn(lambda _: f"/*OFFLINE_MANIFEST*/ {manifest};", text, count=1)
    if count != 1:
        raise _fail(
            f"{source} has no /*OFFLINE_MANIFEST*/ marker for the build's file list",
            'Keep the line `const MANIFEST = /*OFFLINE_MANIFEST*/ { build: "unbuilt", files: [] };` in sw.js.',
            file=str(source),
        )
    target.write_text(replaced, encoding="utf-8")


def precompress(folder: Path) -> list[Path]:
    """Write ``name.gz`` beside each file of ``folder`` that gzip makes at least 10% smaller (see GZIP_SUFFIXES);
    returns the copies. Level 6: 9 would make Pyodide's WebAssembly 0.5% smaller for twice the build time."""
    import gzip

    copies = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix not in GZIP_SUFFIXES or path.stat().st_size < GZIP_MIN_BYTES:
            continue
        data = path.read_bytes()
        packed = gzip.compress(data, compresslevel=6, mtime=0)  # (mtime 0: the same file, the same copy)
        if len(packed) <= 0.9 * len(data):
            copy = path.with_name(path.name + ".gz")
            copy.write_bytes(packed)
            copies.append(copy)
    return copies


def build_web_client(
    root: Path,
    out: Path | None = None,
    *,
    sync_url: str | None = None,
    env: Mapping[str, str] | None = None,
    bytecode: bool = True,
) -> WebBuild:
    """Build ``root``'s web client into ``out`` (default ``root/dist``), replacing what was there; with
    ``bytecode`` false, the Python ships as source (see `precompile`: as a build without Node.js)."""
    root = root.resolve()
    env = os.environ if env is None else env
    project = load_web_project(root)
    url = resolve_sync_url(sync_url if sync_url is not None else env.get("BUILD_SYNC_URL"))
    pyodide, version = find_pyodide(root)
    out = (out or root / OUTPUT).resolve()
    if out in (root, project.web_dir.resolve()) or out in root.parents:
        raise _fail(f"refusing to build into {out}", "Build into a folder of its own, such as dist/.")
    staging = out.with_name(f".{out.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        shutil.copytree(project.web_dir, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns("sw.js"))
        (staging / "pyodide").mkdir()
        for name in PYODIDE_FILES:
            shutil.copy2(pyodide / name, staging / "pyodide" / name)
        bundle = python_bundle(project)
        stdlib = staging / "pyodide" / "python_stdlib.zip"
        compiled = precompile(root, pyodide, stdlib, bundle) if bytecode else None
        bundle = compiled or bundle
        bundle_name = f"py/app.{hashlib.sha256(bundle).hexdigest()[:12]}.zip"
        (staging / "py").mkdir()
        (staging / bundle_name).write_bytes(bundle)
        # Rich text in the browser needs yjs; a project without it still builds (its page reports rich text
        # fields unavailable, naming the package).
        richtext = None
        if (root / "node_modules" / "yjs" / "package.json").is_file():
            richtext = vendor_modules(root / "node_modules", "yjs", staging / VENDOR)
        config = {
            "syncUrl": url,
            "database": project.database,
            "schemaModule": project.schema_module,
            "actionsModule": project.actions_module,
            "python": bundle_name,
            "pyodideVersion": version,
            # What a first visit's snapshot request says (web/snapshot.js): the server sends a snapshot only
            # to the library version that wrote it, and the schema version is checked as a handshake's is.
            "offlineVersion": importlib.import_module("offline").__version__,
            "schemaVersion": schema_version(project),
            "richtext": richtext,
            # The app's code has its bytecode beside it: the worker keeps none of its own (see worker.js).
            "bytecode": compiled is not None,
        }
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            digest.update(path.relative_to(staging).as_posix().encode() + b"\0" + path.read_bytes())
        build_id = digest.hexdigest()[:16]
        config["build"] = build_id
        (staging / "config.js").write_text(
            "// Written by the build (npm run build); edits are overwritten.\n"
            f"export default {json.dumps(config, indent=2)};\n",
            encoding="utf-8",
        )
        files = tuple(sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file()))
        if (project.web_dir / "sw.js").is_file():
            _write_service_worker(project.web_dir / "sw.js", staging / "sw.js", build_id, files)
        copies = {copy.relative_to(staging) for copy in precompress(staging)}
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # (What a page may load, without the gzip copies: they hold the same files again.)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.relative_to(out) not in copies)
    return WebBuild(
        out=out,
        build_id=build_id,
        sync_url=url,
        pyodide_version=version,
        files=files,
        size=size,
        bytecode=compiled is not None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offline_cli.web_build", description="Build a project's web client into dist/."
    )
    parser.add_argument("project", nargs="?", default=".", help="the project folder (default: here)")
    parser.add_argument("--out", default=None, help="output folder (default: PROJECT/dist)")
    parser.add_argument("--sync-url", default=None, help="sync URL to bake in (default: $BUILD_SYNC_URL)")
    args = parser.parse_args(argv)
    try:
        built = build_web_client(
            Path(args.project), Path(args.out) if args.out else None, sync_url=args.sync_url
        )
    except DeployError as exc:
        print(f"error [{exc.code}]: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(exc.hint, file=sys.stderr)
        return 1
    print(
        f"built {built.out} ({len(built.files) + 1} files, {built.size / 1e6:.1f} MB) · "
        f"sync {built.sync_url} · pyodide {built.pyodide_version} · build {built.build_id}"
        + ("" if built.bytecode else " · Python as source")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
