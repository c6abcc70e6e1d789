"""Auto-update of the real desktop app: two versions of the `offline init` project built into zipapps by
``offline_desktop.build``, a manifest signed by ``sign_release`` served on loopback, and the window checked.

The installed 1.0.0 archive starts, finds 2.0.0, verifies and installs it, and re-executes: the window that
opens belongs to 2.0.0 (its shell reports the version). A tampered manifest is refused and 1.0.0 runs on.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.servers import ROOT

from .shell_driver import ShellProcess, require_shell, running_shell, template_project
from .support import static_server
from .test_update import PASSWORD, cli, env_with, release_key  # noqa: F401 - release_key is a fixture

pytestmark = pytest.mark.slow

SHELL_API = "typeof window.pywebview?.api?.state === 'function'"


def build(project: Path, version: str, out: Path, update_url: str, public_key: str) -> Path:
    key_file = out.parent / "update-key.pub"
    key_file.write_text(public_key)
    done = subprocess.run(
        [sys.executable, "-m", "offline_desktop.build", str(project), "--version", version, "--out", str(out),
         "--update-url", update_url, "--update-public-key", str(key_file)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert f"built todo-app {version}" in done.stderr and "auto-update on" in done.stderr
    return out


def shown_version(shell: ShellProcess) -> str:
    shell.wait_for(SHELL_API)
    return str(shell.evaluate("window.pywebview.api.state().then(s => s.version)"))


@pytest.fixture
def releases(tmp_path: Path, release_key: tuple[str, str]):  # noqa: F811 - the fixture above
    require_shell()
    private, public = release_key
    project = template_project(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    with static_server(site) as base:
        url = f"{base}/manifest.json"
        (tmp_path / "out").mkdir()
        v1 = build(project, "1.0.0", tmp_path / "out" / "todo-app-1.0.0.pyz", url, public)
        v2 = build(project, "2.0.0", tmp_path / "out" / "todo-app-2.0.0.pyz", url, public)
        shutil.copy(v2, site / v2.name)
        signed = cli(
            "sign", str(v2), "--version", "2.0.0", "--url", v2.name, "--app", "todo-app",
            "--out", str(site / "manifest.json"),
            env=env_with(OFFLINE_UPDATE_PRIVATE_KEY=private, OFFLINE_UPDATE_KEY_PASSWORD=PASSWORD),
        )  # fmt: skip
        assert signed.returncode == 0, signed.stderr
        installed = tmp_path / "installed" / "todo-app.pyz"
        installed.parent.mkdir()
        shutil.copy(v1, installed)
        yield {"v1": v1, "v2": v2, "installed": installed, "site": site, "project": project}


def test_the_built_archive_holds_the_page_modules_and_public_build_config(releases: dict[str, Path]) -> None:
    with zipfile.ZipFile(releases["v1"]) as archive:
        names = set(archive.namelist())
        config = json.loads(archive.read("offline_build.json"))
    assert {"__main__.py", "schema.py", "todos.py", "package.json", "web/index.html", "web/app.js"} <= names
    assert config["appName"] == "todo-app" and config["version"] == "1.0.0"
    assert config["syncUrl"] is None  # no BUILD_SYNC_URL at build time: setup asks
    assert "PRIVATE" not in json.dumps(config) and "PUBLIC KEY" in config["updatePublicKey"]


def test_a_signed_update_is_installed_and_the_restarted_window_runs_the_new_version(
    releases: dict[str, Path], tmp_path: Path
) -> None:
    command = [sys.executable, str(releases["installed"])]
    with running_shell(releases["project"], tmp_path / "device", command=command) as shell:
        assert shown_version(shell) == "2.0.0"
        shell.wait_for("document.body.dataset.view === 'setup'")  # the new version's window, working
        log = shell.log()
    assert "installed update 2.0.0 over 1.0.0" in log
    assert releases["installed"].read_bytes() == releases["v2"].read_bytes()
    # The next launch runs 2.0.0 at once: it is current.
    with running_shell(releases["project"], tmp_path / "device", command=command) as again:
        assert shown_version(again) == "2.0.0"
        assert "update check: current" in again.log()


def test_a_tampered_manifest_is_refused_and_the_installed_version_keeps_running(
    releases: dict[str, Path], tmp_path: Path
) -> None:
    manifest = releases["site"] / "manifest.json"
    signed = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**signed, "version": "9.9.9"}))  # claims another version
    command = [sys.executable, str(releases["installed"])]
    with running_shell(releases["project"], tmp_path / "device", command=command) as shell:
        assert shown_version(shell) == "1.0.0"
        shell.wait_for("document.body.dataset.view === 'setup' && document.body.dataset.state === 'idle'")
        log = shell.log()
    assert "update refused" in log and "signature does not match" in log
    assert releases["installed"].read_bytes() == releases["v1"].read_bytes()
