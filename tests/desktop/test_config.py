"""Build configuration, settings file and launch decisions (no network)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from offline import OfflineError
from offline_desktop import (
    BuildConfig,
    Settings,
    SettingsFile,
    build_config_from_env,
    config_dir,
    decide_launch,
    normalize_sync_url,
    read_build_config,
    write_build_config,
)


def test_build_sync_url_is_taken_from_the_environment_and_normalized() -> None:
    build = build_config_from_env("notes", "1.0.0", environ={"BUILD_SYNC_URL": "https://sync.example.com"})
    assert build.sync_url == "wss://sync.example.com/offline-sync"
    assert build_config_from_env("notes", "1.0.0", environ={}).sync_url is None
    with pytest.raises(OfflineError) as info:
        build_config_from_env("notes", "1.0.0", environ={"BUILD_SYNC_URL": "ftp://x"})
    assert info.value.code == "BAD_URL"


def test_build_config_round_trips_through_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "notes_app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    build = BuildConfig("notes", "1.2.3", sync_url="ws://h:1/offline-sync", update_url="http://u/m.json")
    write_build_config(package, build)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert read_build_config("notes_app") == build
    with pytest.raises(OfflineError) as info:
        read_build_config("json")  # a package without a build config
    assert info.value.code == "DESKTOP_CONFIG"


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("ws://127.0.0.1:3001", "ws://127.0.0.1:3001/offline-sync"),
        ("http://localhost:3001/", "ws://localhost:3001/offline-sync"),
        ("wss://example.com/custom-sync", "wss://example.com/custom-sync"),
        ("  HTTPS://example.com  ", "wss://example.com/offline-sync"),
    ],
)
def test_normalize_sync_url(typed: str, expected: str) -> None:
    assert normalize_sync_url(typed) == expected


@pytest.mark.parametrize("typed", ["example.com", "ftp://example.com", "ws://", "ws://host:notaport/x", ""])
def test_normalize_refuses_what_is_not_a_sync_url(typed: str) -> None:
    with pytest.raises(OfflineError) as info:
        normalize_sync_url(typed)
    assert info.value.code == "BAD_URL"


def test_settings_file_saves_atomically_and_keeps_unknown_keys(tmp_path: Path) -> None:
    store = SettingsFile(tmp_path / "cfg")
    assert store.load() == Settings()
    (tmp_path / "cfg").mkdir()
    store.path.write_text(json.dumps({"syncUrl": "ws://a/offline-sync", "theme": "dark"}))
    loaded = store.load()
    assert loaded.sync_url == "ws://a/offline-sync" and loaded.extra == {"theme": "dark"}
    store.save(Settings(sync_url=None, local_only=True, extra=loaded.extra))
    assert json.loads(store.path.read_text()) == {"theme": "dark", "syncUrl": None, "localOnly": True}
    assert [p.name for p in (tmp_path / "cfg").iterdir()] == ["settings.json"]  # no temporary left behind


def test_a_damaged_settings_file_means_setup_again(tmp_path: Path) -> None:
    store = SettingsFile(tmp_path)
    store.path.write_text("{not json")
    assert store.load() == Settings()


def test_launch_precedence() -> None:
    baked = BuildConfig("a", "1", sync_url="wss://built/offline-sync")
    plain = BuildConfig("a", "1")
    saved = Settings(sync_url="ws://saved/offline-sync")
    assert decide_launch(baked, saved).mode == "build"
    assert decide_launch(baked, saved).sync_url == "wss://built/offline-sync"
    assert decide_launch(plain, saved).mode == "saved"
    assert decide_launch(plain, Settings(local_only=True)).mode == "local-only"
    assert decide_launch(plain, Settings()).needs_setup


def test_config_dir_follows_the_platform_and_the_override(tmp_path: Path) -> None:
    assert config_dir("notes", {"OFFLINE_DESKTOP_CONFIG_DIR": str(tmp_path)}) == tmp_path
    if sys.platform.startswith("linux"):
        assert config_dir("notes", {"XDG_CONFIG_HOME": "/x"}) == Path("/x/notes")
