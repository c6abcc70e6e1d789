"""Signed auto-update with two real versions of a tiny app, each a zipapp, and a manifest served on loopback.

The app runs as its own process (`python app.pyz`); an installed update replaces the file and re-executes,
so the output of one run shows the old version, then the new one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipapp
from pathlib import Path

import pytest

from offline_desktop import BuildConfig, write_build_config
from tests.support.servers import ROOT, free_port

from .support import static_server

PASSWORD = "pa55-for-the-release-key"
MAIN = """\
import logging, sys
from offline_desktop import read_build_config
from offline_desktop.update import update_at_launch

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
build = read_build_config("tinyapp")
print("running", build.version, flush=True)
result = update_at_launch(build, timeout=5)
print("update:", result.status, flush=True)
"""


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLINE_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "offline_desktop.sign_release", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


@pytest.fixture
def release_key(tmp_path: Path) -> tuple[str, str]:
    """(encrypted private key PEM, public key PEM), made by the CLI's keygen."""
    out = tmp_path / "keys" / "release.pem"
    out.parent.mkdir()
    made = cli("keygen", "--out", str(out), env=env_with(OFFLINE_UPDATE_KEY_PASSWORD=PASSWORD))
    assert made.returncode == 0, made.stderr
    assert out.stat().st_mode & 0o077 == 0  # readable by the owner only
    private = out.read_text()
    assert "ENCRYPTED PRIVATE KEY" in private
    return private, made.stdout


def build_app(folder: Path, version: str, update_url: str, public_key: str) -> Path:
    """One release of the tiny app: a zipapp with its build configuration inside."""
    source = folder / f"src-{version}"
    package = source / "tinyapp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f'"""tinyapp {version}"""\n')
    write_build_config(
        package,
        BuildConfig("tinyapp", version, update_url=update_url, update_public_key=public_key),
    )
    (source / "__main__.py").write_text(MAIN)
    target = folder / f"tinyapp-{version}.pyz"
    zipapp.create_archive(source, target)
    return target


def sign(payload: Path, version: str, url: str, private: str, out: Path) -> subprocess.CompletedProcess[str]:
    done = cli(
        "sign", str(payload), "--version", version, "--url", url, "--app", "tinyapp", "--out", str(out),
        env=env_with(OFFLINE_UPDATE_PRIVATE_KEY=private, OFFLINE_UPDATE_KEY_PASSWORD=PASSWORD),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for secret in (PASSWORD, private.splitlines()[1]):
        assert secret not in done.stdout + done.stderr
    return done


def run_app(pyz: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(pyz)],
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=pyz.parent,
    )


class Releases:
    def __init__(self, root: Path, base_url: str, public_key: str) -> None:
        self.site = root / "site"
        self.site.mkdir(exist_ok=True)
        self.update_url = base_url + "/manifest.json"
        self.v1 = build_app(root, "1.0.0", self.update_url, public_key)
        self.v2 = build_app(root, "2.0.0", self.update_url, public_key)
        shutil.copy(self.v2, self.site / "tinyapp-2.0.0.pyz")
        self.installed = root / "installed" / "tinyapp.pyz"
        self.installed.parent.mkdir()
        shutil.copy(self.v1, self.installed)


def test_a_signed_update_is_installed_and_the_restarted_process_runs_the_new_version(
    tmp_path: Path, release_key: tuple[str, str]
) -> None:
    private, public = release_key
    with static_server(tmp_path / "site") as base:
        rel = Releases(tmp_path, base, public)
        sign(rel.v2, "2.0.0", "tinyapp-2.0.0.pyz", private, rel.site / "manifest.json")

        first = run_app(rel.installed)
        assert first.returncode == 0, first.stderr
        assert first.stdout.splitlines() == ["running 1.0.0", "running 2.0.0", "update: just-updated"]
        assert rel.installed.read_bytes() == rel.v2.read_bytes()
        assert sorted(p.name for p in rel.installed.parent.iterdir()) == ["tinyapp.pyz"]  # no temporary left

        again = run_app(rel.installed)
        assert again.stdout.splitlines() == ["running 2.0.0", "update: current"]


@pytest.mark.parametrize("tamper", ["version", "url", "sha256"])
def test_a_tampered_manifest_is_refused_and_the_app_keeps_running(
    tmp_path: Path, release_key: tuple[str, str], tamper: str
) -> None:
    private, public = release_key
    with static_server(tmp_path / "site") as base:
        rel = Releases(tmp_path, base, public)
        manifest_path = rel.site / "manifest.json"
        sign(rel.v2, "2.0.0", "tinyapp-2.0.0.pyz", private, manifest_path)
        manifest = json.loads(manifest_path.read_text())
        # An attacker serves another file (here: the old version, as a downgrade) or claims another version.
        changed = {"version": "9.0.0", "url": "evil.pyz", "sha256": "0" * 64}[tamper]
        manifest[tamper] = changed
        manifest_path.write_text(json.dumps(manifest))
        shutil.copy(rel.v1, rel.site / "evil.pyz")

        result = run_app(rel.installed)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["running 1.0.0", "update: refused"]
        assert "signature does not match" in result.stderr
        assert rel.installed.read_bytes() == rel.v1.read_bytes()


def test_a_tampered_payload_is_refused_and_nothing_is_replaced(
    tmp_path: Path, release_key: tuple[str, str]
) -> None:
    private, public = release_key
    with static_server(tmp_path / "site") as base:
        rel = Releases(tmp_path, base, public)
        sign(rel.v2, "2.0.0", "tinyapp-2.0.0.pyz", private, rel.site / "manifest.json")
        served = rel.site / "tinyapp-2.0.0.pyz"
        served.write_bytes(served.read_bytes() + b"\0")  # one byte appended after signing

        result = run_app(rel.installed)
        assert result.stdout.splitlines() == ["running 1.0.0", "update: refused"]
        assert "does not match the signed sha256" in result.stderr
        assert rel.installed.read_bytes() == rel.v1.read_bytes()
        assert sorted(p.name for p in rel.installed.parent.iterdir()) == ["tinyapp.pyz"]


def test_a_manifest_signed_with_another_key_is_refused(tmp_path: Path, release_key: tuple[str, str]) -> None:
    _private, public = release_key
    other = tmp_path / "other.pem"
    assert (
        cli("keygen", "--out", str(other), env=env_with(OFFLINE_UPDATE_KEY_PASSWORD=PASSWORD)).returncode == 0
    )
    with static_server(tmp_path / "site") as base:
        rel = Releases(tmp_path, base, public)
        sign(rel.v2, "2.0.0", "tinyapp-2.0.0.pyz", other.read_text(), rel.site / "manifest.json")
        result = run_app(rel.installed)
        assert result.stdout.splitlines() == ["running 1.0.0", "update: refused"]
        assert rel.installed.read_bytes() == rel.v1.read_bytes()


def test_network_down_is_skipped_silently(tmp_path: Path, release_key: tuple[str, str]) -> None:
    _private, public = release_key
    app = build_app(tmp_path, "1.0.0", f"http://127.0.0.1:{free_port()}/manifest.json", public)
    result = run_app(app)
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["running 1.0.0", "update: offline"]
    assert result.stderr == ""  # nothing above debug level


def test_signing_refuses_bad_secrets_without_printing_them(
    tmp_path: Path, release_key: tuple[str, str]
) -> None:
    private, _public = release_key
    payload = tmp_path / "app.pyz"
    payload.write_bytes(b"release")
    args = ("sign", str(payload), "--version", "2.0.0", "--url", "app.pyz")
    missing = cli(*args, env=env_with(OFFLINE_UPDATE_KEY_PASSWORD=PASSWORD))
    assert missing.returncode == 1 and "OFFLINE_UPDATE_PRIVATE_KEY" in missing.stderr
    wrong = cli(
        *args, env=env_with(OFFLINE_UPDATE_PRIVATE_KEY=private, OFFLINE_UPDATE_KEY_PASSWORD="nope-wrong")
    )
    assert wrong.returncode == 1 and "cannot be decrypted" in wrong.stderr
    assert "nope-wrong" not in wrong.stderr + wrong.stdout
    assert private.splitlines()[1] not in wrong.stderr + wrong.stdout
    bad_version = cli(
        "sign", str(payload), "--version", "latest", "--url", "app.pyz",
        env=env_with(OFFLINE_UPDATE_PRIVATE_KEY=private, OFFLINE_UPDATE_KEY_PASSWORD=PASSWORD),
    )  # fmt: skip
    assert bad_version.returncode == 1 and "--version" in bad_version.stderr
