"""`offline init` and the web client build, without a browser.

The build is checked against a stand-in for ``node_modules/pyodide`` that has the files and layout of the
real npm package (the browser tests use the real one): what goes into dist/, the sync URL rules, the
service worker's file list, and the errors for a missing or unusable Pyodide.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import offline
from offline.core.schema import SchemaDefinition
from offline_cli.environment import Environment
from offline_cli.main import cli
from offline_cli.web_build import (
    DEFAULT_SYNC_URL,
    PYODIDE_FILES,
    PYODIDE_VERSION,
    YJS_VERSION,
    build_web_client,
    load_web_project,
    resolve_sync_url,
)
from platform_adapters.base import BUILD_FAILED, DeployError

from .support import load_module

ROOT = Path(__file__).resolve().parents[2]


def run_init(tmp_path: Path, *args: str, path: str | None = None) -> tuple[Any, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = Environment(
        stdout=out,
        stderr=err,
        env={"PATH": path if path is not None else os.environ.get("PATH", "")},
        stdin_isatty=False,
        stdout_isatty=False,
    )
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(cli, ["init", *args], obj=env, catch_exceptions=False)
    finally:
        os.chdir(cwd)
    return result, out.getvalue(), err.getvalue()


def fake_pyodide(project: Path, *, version: str = PYODIDE_VERSION, sqlite: bool = True) -> None:
    """node_modules/pyodide as npm installs it: package.json, the runtime files, the stdlib zip."""
    folder = project / "node_modules" / "pyodide"
    folder.mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps({"name": "pyodide", "version": version}))
    for name in PYODIDE_FILES:
        if name != "python_stdlib.zip":
            (folder / name).write_bytes(f"// {name} {version}\n".encode())
    with zipfile.ZipFile(folder / "python_stdlib.zip", "w") as stdlib:
        stdlib.writestr("json/__init__.py", "")
        if sqlite:
            stdlib.writestr("sqlite3/__init__.py", "")
    (folder / "console.html").write_text("<!-- not needed by pages -->")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    result, _, _ = run_init(tmp_path, "my-todos", "--no-install")
    assert result.exit_code == 0, result.output
    fake_pyodide(tmp_path / "my-todos")
    return tmp_path / "my-todos"


def read_config(dist: Path) -> dict[str, Any]:
    text = (dist / "config.js").read_text()
    match = re.search(r"export default (\{.*\});", text, re.S)
    assert match is not None, text
    return json.loads(match.group(1))  # type: ignore[no-any-return]


def read_manifest(dist: Path) -> dict[str, Any]:
    match = re.search(r"/\*OFFLINE_MANIFEST\*/ (\{.*?\});", (dist / "sw.js").read_text())
    assert match is not None
    return json.loads(match.group(1))  # type: ignore[no-any-return]


# -- offline init -----------------------------------------------------------------------------------------------


def test_init_writes_a_project_that_pins_pyodide(tmp_path: Path) -> None:
    result, out, _ = run_init(tmp_path, "my-todos", "--no-install")
    assert result.exit_code == 0, result.output
    project = tmp_path / "my-todos"
    for name in (
        "schema.py",
        "todos.py",
        "server.py",
        "desktop.py",
        "package.json",
        "build.mjs",
        ".gitignore",
    ):
        assert (project / name).is_file(), name
    for name in (
        "index.html",
        "app.js",
        "list-window.js",
        "todo-list.js",
        "offline-reload.js",
        "page-status.js",
        "offline-client.js",
        "worker.js",
        "tabs.js",
        "storage.js",
        "sw.js",
        "style.css",
    ):
        assert (project / "web" / name).is_file(), name
    manifest = json.loads((project / "package.json").read_text())
    assert manifest["name"] == "my-todos"
    assert manifest["dependencies"] == {"pyodide": PYODIDE_VERSION, "yjs": YJS_VERSION}  # pinned exactly
    assert manifest["scripts"]["build"] == "node build.mjs"
    assert manifest["offline"]["database"] == "my-todos"
    assert "__NAME__" not in (project / "README.md").read_text()
    assert "node_modules/" in (project / ".gitignore").read_text()
    # The schema is a real one, and the app code works on it natively.
    schema = load_module(project / "schema.py", "init_test_schema").schema
    assert isinstance(schema, SchemaDefinition)
    assert set(schema.collections["todos"].fields) == {"title", "done", "createdAt"}
    assert "next:" in out and "cd my-todos" in out and "npm install && npm run build" in out


def test_init_without_npm_creates_the_project_and_says_what_to_do(tmp_path: Path) -> None:
    result, out, err = run_init(tmp_path, "todos", path=str(tmp_path / "empty-bin"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "todos" / "package.json").is_file()
    assert not (tmp_path / "todos" / "dist").exists()
    assert "npm was not found" in err and "nodejs.org" in err
    assert "npm install && npm run build" in out


def test_init_refuses_a_folder_in_use_and_a_bad_name(tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    result, _, _ = run_init(tmp_path, "busy", "--no-install")
    assert result.exit_code == 1
    assert "already exists and is not an empty folder" in result.output
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    result, _, _ = run_init(tmp_path, "My Todos!", "--no-install")
    assert result.exit_code == 1
    assert "cannot name a project" in result.output


def test_init_is_listed_in_help() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "init" in result.output and "browser" in result.output


# -- the build --------------------------------------------------------------------------------------------------


def test_build_bundles_pyodide_the_python_code_and_the_default_sync_url(project: Path) -> None:
    built = build_web_client(project, env={})
    dist = project / "dist"
    assert built.out == dist and built.sync_url == DEFAULT_SYNC_URL == "ws://localhost:3001/offline-sync"
    config = read_config(dist)
    assert config["syncUrl"] == DEFAULT_SYNC_URL
    assert config["database"] == "my-todos"
    assert (config["schemaModule"], config["actionsModule"]) == ("schema", "todos")
    assert config["pyodideVersion"] == PYODIDE_VERSION and config["build"] == built.build_id
    # What a first visit's snapshot request says before Python runs (web/snapshot.js).
    assert (config["offlineVersion"], config["schemaVersion"]) == (offline.__version__, 1)
    # Only what a page needs of the npm package.
    assert sorted(p.name for p in (dist / "pyodide").iterdir()) == sorted(PYODIDE_FILES)
    with zipfile.ZipFile(dist / config["python"]) as bundle:
        names = set(bundle.namelist())
    assert {"schema.py", "todos.py", "offline/worker.py", "offline/sync/browser_transport.py"} <= names
    assert any(name.startswith("rfc8785/") for name in names)  # pure-Python dependency of offline.core
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)
    assert "server.py" not in names and "desktop.py" not in names
    # The service worker caches every file of the build, itself excepted.
    manifest = read_manifest(dist)
    files = sorted(
        p.relative_to(dist).as_posix()
        for p in dist.rglob("*")
        if p.is_file() and p.name != "sw.js" and p.suffix != ".gz"
    )
    assert manifest == {"build": built.build_id, "files": files}
    assert list(built.files) == files


def test_the_schema_version_is_read_from_the_projects_schema_module(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = project / "schema.py"
    schema.write_text(schema.read_text().replace('"version": 1,', '"version": 4,'))
    assert read_config(build_web_client(project, env={}).out)["schemaVersion"] == 4
    # A schema module that does not import here: built all the same, first visits sync over the socket.
    schema.write_text("import not_installed_anywhere\n" + schema.read_text())
    capsys.readouterr()
    assert read_config(build_web_client(project, env={}).out)["schemaVersion"] is None
    assert "could not be imported" in capsys.readouterr().err


def test_build_writes_gzip_copies_of_the_files_gzip_shrinks(project: Path) -> None:
    # (A large compressible file, as Pyodide's WebAssembly is; the fake runtime's files are a few bytes.)
    runtime = project / "node_modules" / "pyodide" / "pyodide.asm.wasm"
    runtime.write_bytes(b"\0asm\1\0\0\0" + bytes(range(256)) * 400)
    built = build_web_client(project, env={})
    dist = built.out
    copies = sorted(p.relative_to(dist).as_posix() for p in dist.rglob("*.gz"))
    # The server sends a copy in place of its file (server_runtime/static.py): the same bytes, and smaller.
    for copy in copies:
        original = dist / copy.removesuffix(".gz")
        assert gzip.decompress((dist / copy).read_bytes()) == original.read_bytes(), copy
        assert (dist / copy).stat().st_size < 0.9 * original.stat().st_size
        assert (dist / copy).stat().st_mtime >= original.stat().st_mtime  # (an older copy is never served)
    assert {"pyodide/pyodide.asm.wasm.gz", "offline-client.js.gz", "storage.js.gz", "sw.js.gz"} <= set(copies)
    # Not for what does not shrink: archives already compressed, files too small to matter.
    assert not any(copy.endswith(".zip.gz") for copy in copies)
    assert "config.js.gz" not in copies and "pyodide/pyodide.mjs.gz" not in copies
    # The copies are the server's business, not the page's: the service worker caches the files only.
    assert not any(name.endswith(".gz") for name in read_manifest(dist)["files"])
    assert build_web_client(project, env={}).build_id == built.build_id  # (and they change no build id)


def test_build_sync_url_comes_from_build_sync_url(project: Path) -> None:
    assert build_web_client(
        project, env={"BUILD_SYNC_URL": "wss://app.example.com/offline-sync"}
    ).sync_url == ("wss://app.example.com/offline-sync")
    assert read_config(project / "dist")["syncUrl"] == "wss://app.example.com/offline-sync"
    assert resolve_sync_url("/offline-sync") == "/offline-sync"  # the server that serves the page
    assert resolve_sync_url("  ") == DEFAULT_SYNC_URL
    for bad in ("http://example.com/offline-sync", "//example.com/x", "ws://", "offline-sync"):
        with pytest.raises(DeployError) as caught:
            resolve_sync_url(bad)
        assert caught.value.code == BUILD_FAILED
        assert "BUILD_SYNC_URL" in caught.value.message and caught.value.context["field"] == "BUILD_SYNC_URL"
    before = read_config(project / "dist")
    with pytest.raises(DeployError):
        build_web_client(project, env={"BUILD_SYNC_URL": "http://nope"})
    assert read_config(project / "dist") == before  # a failed build leaves the last good one in place


def test_builds_are_reproducible_and_change_with_the_code(project: Path) -> None:
    first = build_web_client(project, env={}).build_id
    assert build_web_client(project, env={}).build_id == first
    (project / "todos.py").write_text((project / "todos.py").read_text() + "\n# changed\n")
    assert build_web_client(project, env={}).build_id != first


def test_build_needs_the_pinned_pyodide_installed(project: Path) -> None:
    shutil.rmtree(project / "node_modules")
    with pytest.raises(DeployError) as caught:
        build_web_client(project, env={})
    assert caught.value.code == BUILD_FAILED and "pyodide is not installed" in caught.value.message
    assert "npm install" in caught.value.hint

    fake_pyodide(project, version="0.27.0", sqlite=False)
    with pytest.raises(DeployError) as caught:
        build_web_client(project, env={})
    assert "no sqlite3 module" in caught.value.message and PYODIDE_VERSION in caught.value.hint


def test_build_refuses_compiled_packages_and_missing_modules(project: Path, tmp_path: Path) -> None:
    extension = tmp_path / "site" / "fastthing"
    extension.mkdir(parents=True)
    (extension / "__init__.py").write_text("")
    (extension / "_speedups.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    sys.path.insert(0, str(tmp_path / "site"))
    manifest_path = project / "package.json"
    manifest = json.loads(manifest_path.read_text())
    try:
        manifest["offline"]["packages"] = ["fastthing"]
        manifest_path.write_text(json.dumps(manifest))
        with pytest.raises(DeployError) as caught:
            build_web_client(project, env={})
        assert "compiled extension" in caught.value.message and caught.value.context["package"] == "fastthing"
    finally:
        sys.path.remove(str(tmp_path / "site"))
    manifest["offline"]["packages"] = []
    manifest["offline"]["modules"] = ["schema.py", "missing.py"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DeployError) as caught:
        load_web_project(project)
    assert "missing.py" in caught.value.message


def test_npm_run_build_runs_the_python_build(project: Path) -> None:
    """build.mjs (what `npm run build` runs) finds this Python and builds dist/ with BUILD_SYNC_URL."""
    node = shutil.which("node")
    if node is None:
        reason = "node is not on PATH (install Node.js 20 or newer)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must run this test)", pytrace=False)
        pytest.skip(reason)
    env = {
        **os.environ,
        "OFFLINE_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "BUILD_SYNC_URL": "wss://todo.example.com/offline-sync",
    }
    done = subprocess.run(
        [node, "build.mjs"], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sync wss://todo.example.com/offline-sync" in done.stdout
    assert read_config(project / "dist")["syncUrl"] == "wss://todo.example.com/offline-sync"

    env["OFFLINE_PYTHON"] = str(project / "no-such-python")
    env["PATH"] = os.path.dirname(node)  # node only: no python3 to fall back on
    done = subprocess.run(
        [node, "build.mjs"], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:  # unless node's folder also has a Python with offline installed
        assert "cannot find a Python with the offline package" in done.stderr
        assert "OFFLINE_PYTHON" in done.stderr


def test_the_template_python_passes_strict_mypy(tmp_path: Path) -> None:
    """The template's Python is the user's starting point: typed, and checked as its own project."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[lint]')")
    result, _, _ = run_init(tmp_path, "typed-todos", "--no-install")
    assert result.exit_code == 0
    project = tmp_path / "typed-todos"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "schema.py",
            "todos.py",
            "server.py",
            "desktop.py",
        ],
        cwd=project,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_web_client_javascript_parses_and_speaks_the_bridges_protocol(tmp_path: Path) -> None:
    from offline.worker import PROTOCOL_VERSION

    result, _, _ = run_init(tmp_path, "js-todos", "--no-install")
    assert result.exit_code == 0
    project = tmp_path / "js-todos"
    client = (project / "web" / "offline-client.js").read_text()
    assert f"const PROTOCOL = {PROTOCOL_VERSION};" in client
    node = shutil.which("node")
    if node is None:
        reason = "node is not on PATH (install Node.js 20 or newer)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must run this test)", pytrace=False)
        pytest.skip(reason)
    for script in [project / "build.mjs", *sorted((project / "web").glob("*.js"))]:
        # package.json says "type": "module": node parses them as the browser does, as ES modules.
        done = subprocess.run([node, "--check", str(script)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{script.name}: {done.stderr}"


def test_offline_deploy_builds_the_template_client_with_the_deployed_sync_url(
    project: Path, tmp_path: Path
) -> None:
    """The deploy step `npm run build`s an `offline init` project (real npm and build.mjs) for the live URL."""
    from offline_cli.deploy.client_build import build_client
    from offline_cli.deploy.reporter import RecordingReporter
    from platform_adapters.base import SubprocessRunner

    if shutil.which("npm") is None:
        reason = "npm is not on PATH (install Node.js 20 or newer)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must run this test)", pytrace=False)
        pytest.skip(reason)
    deploy_dir = project / ".offline" / "deploy"
    deploy_dir.mkdir(parents=True)
    reporter = RecordingReporter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("BUILD_SYNC_URL", None)
    client = build_client(
        project,
        deploy_dir,
        sync_url="wss://my-todos.fly.dev/offline-sync",
        runner=SubprocessRunner(env),
        reporter=reporter,
    )
    assert client == deploy_dir / "client"
    assert read_config(client)["syncUrl"] == "wss://my-todos.fly.dev/offline-sync"
    assert (client / "index.html").is_file() and (client / "worker.js").is_file()
    assert "npm run build with BUILD_SYNC_URL=wss://my-todos.fly.dev/offline-sync" in reporter.of("info")


# -- rich text's yjs, bundled for the worker -------------------------------------------------------------------


def fake_package(modules: Path, name: str, manifest: dict[str, Any], files: dict[str, str]) -> None:
    folder = modules / name
    folder.mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps({"name": name, **manifest}))
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)


def test_build_copies_yjs_and_its_imports_with_relative_specifiers(project: Path) -> None:
    """A module worker has no import maps: every bare import of yjs and of what it imports becomes a relative
    URL, and package.json "exports" are read with a browser's conditions (not Node's)."""
    assert read_config((build_web_client(project, env={})).out)["richtext"] is None  # no yjs installed
    modules = project / "node_modules"
    fake_package(
        modules,
        "yjs",
        {"exports": {".": {"types": "./x.d.ts", "module": "./dist/yjs.mjs", "require": "./dist/yjs.cjs"}}},
        {
            "dist/yjs.mjs": "import * as map from 'lib0/map'\n"
            'import {\n  random\n} from "lib0/random";\n'
            "export { own } from './own.mjs'\n"
            "/** import * as never from 'not-installed' (a comment) */\n",
            "dist/own.mjs": "export const own = 1\n",
        },
    )
    fake_package(
        modules,
        "lib0",
        {
            "exports": {
                "./map": {"module": "./map.js", "require": "./dist/map.cjs"},
                "./random": {"node": "./random.node.js", "browser": {"module": "./random.js"}},
            }
        },
        {"map.js": "export const map = 1\n", "random.js": "import './map.js'\nexport const random = 2\n"},
    )
    dist = build_web_client(project, env={}).out
    config = read_config(dist)
    assert config["richtext"] == "vendor/yjs/dist/yjs.mjs"
    entry = (dist / config["richtext"]).read_text()
    assert "from '../../lib0/map.js'" in entry and 'from "../../lib0/random.js"' in entry
    assert "from './own.mjs'" in entry and "'not-installed'" in entry  # comments are left alone
    assert sorted(p.relative_to(dist / "vendor").as_posix() for p in (dist / "vendor").rglob("*.*")) == [
        "lib0/map.js",
        "lib0/random.js",
        "yjs/dist/own.mjs",
        "yjs/dist/yjs.mjs",
    ]
    manifest = (dist / "sw.js").read_text()
    assert "vendor/lib0/random.js" in manifest  # cached for offline starts like the rest

    (modules / "lib0" / "map.js").unlink()
    with pytest.raises(DeployError) as missing:
        build_web_client(project, env={})
    assert missing.value.code == BUILD_FAILED and "map.js" in missing.value.message
    shutil.rmtree(modules / "lib0")
    with pytest.raises(DeployError) as absent:
        build_web_client(project, env={})
    assert "npm package lib0" in absent.value.message and "npm install" in (absent.value.hint or "")
