"""The shared deploy steps one by one: entry, bundle, client build, state (offline_cli.deploy)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from offline_cli.deploy import bundle
from offline_cli.deploy.build_context import prepare_build_context, python_version_of_image
from offline_cli.deploy.client_build import build_client
from offline_cli.deploy.entry import ENTRY_CANDIDATES, find_server_entry
from offline_cli.deploy.reporter import RecordingReporter
from offline_cli.deploy.state import (
    STATE_SCHEMA_VERSION,
    DeployState,
    load_state,
    reset_state,
    save_state,
    state_path,
)
from platform_adapters.base import BUILD_FAILED, ENTRY_NOT_FOUND, DeployError, SubprocessRunner

from ._core_fakes import install_fake_npm, write_project

# -- entry ---------------------------------------------------------------------------------------------------


def test_entry_candidates_match_the_server_runtime() -> None:
    from server_runtime.environment import ENTRY_CANDIDATES as RUNTIME_CANDIDATES

    assert ENTRY_CANDIDATES == RUNTIME_CANDIDATES


def test_server_py_wins_over_src_server_py(tmp_path: Path) -> None:
    write_project(tmp_path, entry="src/server.py")
    assert find_server_entry(tmp_path) == tmp_path / "src" / "server.py"
    (tmp_path / "server.py").write_text("")
    assert find_server_entry(tmp_path) == tmp_path / "server.py"


def test_missing_entry_names_the_paths_tried_and_how_to_fix_it(tmp_path: Path) -> None:
    (tmp_path / "schema.py").write_text("")
    with pytest.raises(DeployError) as caught:
        find_server_entry(tmp_path)
    error = caught.value
    assert error.code == ENTRY_NOT_FOUND
    assert "could not find a server entry file" in error.message
    assert (
        str(tmp_path / "server.py") in error.message and str(tmp_path / "src" / "server.py") in error.message
    )
    assert "Create server.py" in error.hint


# -- bundle: requirements, files, argv (as data) ---------------------------------------------------------------


def test_runtime_requirements_drop_cli_only_and_extras_and_judge_markers_for_linux() -> None:
    requires = [
        "click>=8.1",
        "rich>=13",
        "Jinja2>=3.1",
        "questionary>=2",
        "shiv>=1.0.6",
        "boto3>=1.34; extra == 'aws'",
        "docker>=7.1",
        "starlette>=0.40",
        "asyncpg>=0.29; platform_system != 'Emscripten'",
        "pywin32>=300; sys_platform == 'win32'",
        "tomli>=2; python_version < '3.11'",
        "pytest>=8; extra == 'test'",
    ]
    # Jinja2 stays: the server renders its email templates with it.
    assert bundle.runtime_requirements(bundle.TargetPython("3.11"), requires) == [
        "Jinja2>=3.1",
        "starlette>=0.40",
        "asyncpg>=0.29",
    ]
    # The marker is judged for the image's Python, not the one running the CLI.
    assert "tomli>=2" in bundle.runtime_requirements(bundle.TargetPython("3.10"), requires)


def test_runtime_requirements_of_the_installed_distribution_include_the_server_stack() -> None:
    names = {
        r.split(">")[0].split("=")[0].lower()
        for r in bundle.runtime_requirements(bundle.TargetPython("3.11"))
    }
    assert {"starlette", "uvicorn", "websockets", "aiosqlite", "asyncpg", "jinja2", "aiosmtplib"} <= names
    assert not names & {"click", "rich", "questionary", "shiv", "boto3", "docker", "pytest"}


def test_pip_arguments_target_x86_64_manylinux_and_the_image_python(tmp_path: Path) -> None:
    args = bundle.pip_arguments(bundle.TargetPython("3.12"), ["starlette>=0.40"], tmp_path / "req.txt")
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert "manylinux2014_x86_64" in platforms and "manylinux_2_17_x86_64" in platforms
    assert "manylinux_2_28_x86_64" in platforms
    assert all(p.endswith("_x86_64") for p in platforms)
    assert args[args.index("--python-version") + 1] == "312"
    assert args[args.index("--implementation") + 1] == "cp"
    assert "--only-binary=:all:" in args
    assert args[-2:] == ["-r", str(tmp_path / "req.txt")]


def test_shiv_argv_runs_the_generated_entry_and_unpacks_under_tmp(tmp_path: Path) -> None:
    argv = bundle.shiv_argv("/py", tmp_path / "sp", tmp_path / "out.pyz", ["x"])
    assert argv[:3] == ["/py", "-m", "shiv"]
    assert argv[argv.index("--site-packages") + 1] == str(tmp_path / "sp")
    assert argv[argv.index("--entry-point") + 1] == "_offline_zipapp_main:main"
    assert argv[argv.index("--root") + 1].startswith("/tmp/")
    assert "--reproducible" in argv and argv[-1] == "x"


@pytest.mark.parametrize("value", ["3", "3.x", "2.7", "python3.12", "3.12.1"])
def test_python_version_must_be_a_cpython_minor(value: str) -> None:
    with pytest.raises(DeployError) as caught:
        bundle.check_python_version(value)
    assert "--python-version" in caught.value.message


def test_python_version_defaults_to_this_interpreter_or_the_image_tag() -> None:
    assert bundle.check_python_version(None) == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert python_version_of_image("python:3.12-slim") == "3.12"
    assert python_version_of_image("docker.io/library/python:3.13.1-bookworm") == "3.13"
    assert python_version_of_image("localhost/debian-python:test") is None


def test_project_files_skip_generated_venvs_tests_and_hidden_folders(tmp_path: Path) -> None:
    write_project(tmp_path, client="dist")
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    (tmp_path / "helpers" / "data.json").write_text("{}")
    (tmp_path / "helpers" / "__pycache__").mkdir()
    (tmp_path / "helpers" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"")
    for skipped in (".offline/deploy", ".venv/lib", "myenv", "node_modules/pkg", "tests", ".git", "assets"):
        (tmp_path / skipped).mkdir(parents=True, exist_ok=True)
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    (tmp_path / "myenv" / "x.py").write_text("")
    (tmp_path / "node_modules" / "pkg" / "x.py").write_text("")
    (tmp_path / "tests" / "test_x.py").write_text("")
    (tmp_path / ".offline" / "deploy" / "x.py").write_text("")
    (tmp_path / "assets" / "logo.png").write_bytes(b"png")  # no Python: not server code
    (tmp_path / "notes.txt").write_text("")
    files = sorted(str(p) for p in bundle.project_files(tmp_path))
    assert files == ["helpers/__init__.py", "helpers/data.json", "schema.py", "server.py"]


def test_project_requirements_drop_offline_itself_and_keep_nested_files(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("offline>=0.1\nhumanize==4.9  # formatting\n-r extra.txt\n")
    out = tmp_path / "out"
    out.mkdir()
    copy = bundle.filtered_project_requirements(tmp_path, out)
    assert copy is not None
    lines = copy.read_text().splitlines()
    assert lines == ["humanize==4.9  # formatting", f"-r {tmp_path / 'extra.txt'}"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert bundle.filtered_project_requirements(empty, out) is None


def test_staged_site_packages_hold_framework_project_and_entry_module(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", entry="src/server.py")
    staging = tmp_path / "sp"
    staging.mkdir()
    bundle.stage_site_packages(project, project / "src" / "server.py", staging)
    assert (staging / "offline" / "__init__.py").is_file()
    assert (staging / "server_runtime" / "__main__.py").is_file()
    assert not list(staging.rglob("__pycache__"))
    assert (staging / "offline_app" / "schema.py").is_file()
    assert (staging / "offline_app" / "src" / "server.py").is_file()
    main = (staging / "_offline_zipapp_main.py").read_text()
    assert 'APP_DIR / "src/server.py"' in main
    compile(main, "_offline_zipapp_main.py", "exec")


SEND_FROM_THE_BUNDLE = """
import asyncio, sys
staging = sys.argv[1]
sys.path.insert(0, staging)
import server_runtime
assert server_runtime.__file__.startswith(staging), server_runtime.__file__
import aiosmtplib  # the SMTP sender's client, bundled as a runtime requirement
from server_runtime.email.sender import ConsoleEmailSender, EmailMessage
from server_runtime.email.templates import EmailTemplates
rendered = EmailTemplates().render(
    "verify-email",
    {"email": "ada@example.com", "token": "t0k", "link": "https://notes.example/verify-email?token=t0k",
     "app_url": "https://notes.example", "expires_in_minutes": 60},
)
message = EmailMessage("ada@example.com", rendered.subject, rendered.text, rendered.html)
asyncio.run(ConsoleEmailSender(reveal=True).send(message))
"""


def test_the_staged_server_renders_its_email_templates_and_sends_with_the_console_sender(
    tmp_path: Path,
) -> None:
    """The server's email templates are package data: they must be in the bundle, not only in the source."""
    project = write_project(tmp_path / "p")
    staging = tmp_path / "sp"
    staging.mkdir()
    bundle.stage_site_packages(project, project / "server.py", staging)
    assert (staging / "server_runtime" / "email" / "templates" / "verify-email.txt").is_file()
    sent = subprocess.run(
        [sys.executable, "-c", SEND_FROM_THE_BUNDLE, str(staging)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sent.returncode == 0, sent.stderr
    assert "To: ada@example.com" in sent.stderr
    assert "https://notes.example/verify-email?token=t0k" in sent.stderr


def test_failed_pip_becomes_build_failed_with_pips_last_lines(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p")
    (project / "requirements.txt").write_text("this-package-does-not-exist-offline-test==0.0.0\n")

    class FailingRunner(SubprocessRunner):
        def run(self, argv, **kwargs):  # type: ignore[no-untyped-def]
            from platform_adapters.base import CommandResult

            self.argv = list(argv)
            return CommandResult(
                tuple(argv),
                1,
                "Collecting this-package-does-not-exist-offline-test==0.0.0\n",
                "ERROR: No matching distribution found for this-package-does-not-exist-offline-test==0.0.0\n",
            )

    runner = FailingRunner(dict(os.environ))
    with pytest.raises(DeployError) as caught:
        bundle.bundle_server(
            project,
            project / "server.py",
            project / ".offline" / "deploy",
            python_version="3.11",
            runner=runner,
            reporter=RecordingReporter(),
        )
    assert caught.value.code == BUILD_FAILED
    assert "No matching distribution found" in caught.value.message
    assert "CPython 3.11" in caught.value.hint
    assert not (project / ".offline" / "deploy" / "server.pyz").exists()
    assert "-r" in runner.argv  # the project's requirements went to pip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _require_package_index() -> None:
    """Skip (fail under CI) when pip's index cannot be reached: the real bundle downloads wheels."""
    import urllib.parse

    index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    parts = urllib.parse.urlsplit(index)
    host, port = parts.hostname or "pypi.org", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        message = f"the package index {host}:{port} is not reachable ({exc}); the real bundle needs it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.slow
def test_real_bundle_runs_the_project_from_the_zipapp_alone(tmp_path: Path) -> None:
    """shiv + pip for real (needs the package index): the zipapp serves /health with nothing else on
    sys.path (python -S: no site-packages of this virtualenv)."""
    _require_package_index()
    project = write_project(tmp_path / "notes", client="dist")
    reporter = RecordingReporter()
    deploy_dir = prepare_build_context(
        project, reporter=reporter, sync_url="wss://notes.example/offline-sync"
    )
    pyz = deploy_dir / "server.pyz"
    assert pyz.is_file(), reporter.events
    assert any(m.startswith("bundled:") for m in reporter.of("info"))
    with zipfile.ZipFile(pyz) as archive:
        names = archive.namelist()
    assert "site-packages/offline_app/server.py" in names
    assert "site-packages/server_runtime/__main__.py" in names
    assert any(n.startswith("site-packages/starlette/") for n in names)
    assert not any(n.startswith(("site-packages/rich/", "site-packages/boto3/")) for n in names)
    assert (deploy_dir / "client" / "index.html").is_file()

    port = _free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PORT": str(port),
        "HOST": "127.0.0.1",
        "OFFLINE_SERVER_STORE": "memory",
        "SHIV_ROOT": str(tmp_path / "shiv-root"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-S", str(pyz)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        body = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    body = json.loads(response.read())
                    break
            except OSError:
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    output = proc.stdout.read().decode() if proc.stdout else ""
    assert body is not None and body["status"] == "ok", output
    assert proc.returncode == 0, output
    assert (tmp_path / "shiv-root").is_dir()  # unpacked where SHIV_ROOT said, not in ~/.shiv


# -- client build ----------------------------------------------------------------------------------------------


@pytest.fixture
def npm_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    install_fake_npm(bin_dir)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "FAKE_NPM_LOG": str(tmp_path / "npm.log"),
    }


def test_client_build_runs_npm_with_the_deployed_sync_url(tmp_path: Path, npm_env: dict[str, str]) -> None:
    project = write_project(tmp_path / "p", client="npm")
    deploy_dir = project / ".offline" / "deploy"
    client = build_client(
        project,
        deploy_dir,
        sync_url="wss://notes.fake.test/offline-sync",
        runner=SubprocessRunner(npm_env),
        reporter=RecordingReporter(),
    )
    assert client == deploy_dir / "client"
    log = Path(npm_env["FAKE_NPM_LOG"]).read_text().splitlines()
    assert log == ["run build", "BUILD_SYNC_URL=wss://notes.fake.test/offline-sync"]
    assert "wss://notes.fake.test/offline-sync" in (client / "index.html").read_text()


def test_client_build_tells_npm_which_python_to_use(
    tmp_path: Path, npm_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template's build runs `python -m offline_cli.web_build`: it must use the deploying Python."""
    monkeypatch.delenv("OFFLINE_PYTHON", raising=False)
    npm = tmp_path / "bin" / "npm"
    # The fake npm, also recording the Python the build would use.
    record = 'printf \'OFFLINE_PYTHON=%s\\n\' "${OFFLINE_PYTHON-<unset>}" >> "$FAKE_NPM_LOG"\n'
    npm.write_text(npm.read_text().replace("mkdir -p dist\n", record + "mkdir -p dist\n"))
    project = write_project(tmp_path / "p", client="npm")
    build_client(
        project,
        project / ".offline" / "deploy",
        sync_url=None,
        runner=SubprocessRunner(npm_env),
        reporter=RecordingReporter(),
    )
    log = Path(npm_env["FAKE_NPM_LOG"]).read_text().splitlines()
    assert log == ["run build", "BUILD_SYNC_URL=<unset>", f"OFFLINE_PYTHON={sys.executable}"]


def test_client_build_failure_shows_npm_output(tmp_path: Path, npm_env: dict[str, str]) -> None:
    project = write_project(tmp_path / "p", client="npm")
    with pytest.raises(DeployError) as caught:
        build_client(
            project,
            project / ".offline" / "deploy",
            sync_url=None,
            runner=SubprocessRunner({**npm_env, "FAKE_NPM_FAIL": "vite exploded"}),
            reporter=RecordingReporter(),
        )
    assert caught.value.code == BUILD_FAILED
    assert "vite exploded" in caught.value.message


def test_client_build_without_npm_says_to_install_node(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", client="npm")
    with pytest.raises(DeployError) as caught:
        build_client(
            project,
            project / ".offline" / "deploy",
            sync_url=None,
            runner=SubprocessRunner({"PATH": str(tmp_path / "empty")}),
            reporter=RecordingReporter(),
        )
    assert "npm" in caught.value.message and "Node.js" in caught.value.hint


def test_existing_dist_is_copied_without_npm(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", client="dist")
    reporter = RecordingReporter()
    client = build_client(
        project,
        project / ".offline" / "deploy",
        sync_url=None,
        runner=SubprocessRunner({}),
        reporter=reporter,
    )
    assert client is not None and (client / "index.html").read_text().startswith("<!doctype html>")


def test_no_client_warns_that_only_the_server_is_deployed(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p")
    stale = project / ".offline" / "deploy" / "client"
    stale.mkdir(parents=True)
    reporter = RecordingReporter()
    assert (
        build_client(project, stale.parent, sync_url=None, runner=SubprocessRunner({}), reporter=reporter)
        is None
    )
    assert any("only the server is deployed" in w for w in reporter.of("warn"))
    assert not stale.exists()


# -- state ----------------------------------------------------------------------------------------------------


def test_state_round_trips_with_schema_version(tmp_path: Path) -> None:
    state = DeployState(platform="host-a", app="notes", region="fra", url="https://notes.fly.dev")
    state.sync_url = "wss://notes.fly.dev/offline-sync"
    state.record_deployment("d1", kind="deploy", at="2025-01-01T00:00:00+00:00")
    state.adapter = {"image": "registry.fly.io/notes:d1"}
    state.options = {"subnets": ["subnet-1"]}
    save_state(tmp_path, state)
    data = json.loads(state_path(tmp_path).read_text())
    assert data["schema_version"] == STATE_SCHEMA_VERSION == 1
    assert data["platform"] == "host-a" and data["deployments"][0]["id"] == "d1"
    loaded = load_state(tmp_path)
    assert loaded == state
    assert loaded is not None and loaded.deployment_ids == ["d1"]


def test_state_from_a_newer_offline_is_refused_clearly(tmp_path: Path) -> None:
    state_path(tmp_path).parent.mkdir(parents=True)
    state_path(tmp_path).write_text(json.dumps({"schema_version": 2, "platform": "host-a", "app": "x"}))
    with pytest.raises(DeployError) as caught:
        load_state(tmp_path)
    assert "schema_version 2" in caught.value.message and "Upgrade offline" in caught.value.hint


@pytest.mark.parametrize(
    "text", ["not json", "[]", '{"platform": "host-a", "app": "x"}', '{"schema_version": 1}']
)
def test_broken_state_is_reported_with_the_file_name(tmp_path: Path, text: str) -> None:
    state_path(tmp_path).parent.mkdir(parents=True)
    state_path(tmp_path).write_text(text)
    with pytest.raises(DeployError) as caught:
        load_state(tmp_path)
    assert "deploy.json" in caught.value.message and "--reset" in caught.value.hint


def test_state_never_stores_secret_values(tmp_path: Path) -> None:
    secret = "s3cr3t-auth-value-123"
    state = DeployState(platform="host-a", app="notes")
    state.adapter = {"env": {"AUTH_SECRET": secret, "PORT": "3001"}, "cmd": ["run", f"--token={secret}"]}
    dropped = save_state(tmp_path, state, [secret])
    text = state_path(tmp_path).read_text()
    assert secret not in text
    assert sorted(dropped) == ["$.adapter.cmd[1]", "$.adapter.env.AUTH_SECRET"]
    assert json.loads(text)["adapter"] == {"env": {"PORT": "3001"}, "cmd": ["run"]}


def test_state_write_is_atomic_and_reset_removes_everything(tmp_path: Path) -> None:
    save_state(tmp_path, DeployState(platform="host-a", app="a"))
    save_state(tmp_path, DeployState(platform="host-a", app="b"))
    folder = state_path(tmp_path).parent
    assert sorted(p.name for p in folder.iterdir()) == ["deploy.json"]  # no temporary files left behind
    (folder / "Dockerfile").write_text("FROM x\n")
    assert reset_state(tmp_path) is True
    assert not folder.exists()
    assert reset_state(tmp_path) is False
