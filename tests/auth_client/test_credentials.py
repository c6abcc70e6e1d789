"""Credential stores: the file store's modes, atomic writes, damaged files; the default store's location."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from pathlib import Path

import pytest

from offline.auth import (
    AuthError,
    Credentials,
    FileCredentialStore,
    MemoryCredentialStore,
    create_offline_auth,
    decode_claims,
    default_credentials_path,
)
from offline.core.errors import STORAGE_ERROR

from .fake_server import FakeAuthServer, FakeClock, sign_jwt

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX permissions")

SERVER = "http://127.0.0.1:3001"
PASSWORD = "correct horse battery"


def credentials(refresh: str = "refresh-token-1", server_url: str = SERVER) -> Credentials:
    return Credentials(
        server_url=server_url,
        user={"id": "user-1", "email": "ada@example.com"},
        access_token=sign_jwt({"sub": "user-1", "exp": 2_000_000_000}),
        refresh_token=refresh,
        access_issued_at=1_700_000_000.0,
        access_expires_at=1_700_000_900.0,
        refresh_expires_at=1_702_592_000.0,
        device_token="1900000000.device-signature",
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_round_trip_and_clear(tmp_path: Path) -> None:
    store = FileCredentialStore(tmp_path / "creds.json")
    assert store.load() is None
    store.save(credentials())
    assert store.load() == credentials()
    store.save(credentials("refresh-token-2"))
    assert store.load() == credentials("refresh-token-2")
    store.clear()
    assert store.load() is None and not (tmp_path / "creds.json").exists()
    store.clear()  # nothing to clear: fine


@posix_only
def test_file_is_private_and_created_directories_too(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # a permissive umask must not widen the modes
    try:
        path = tmp_path / "a" / "b" / "creds.json"
        FileCredentialStore(path).save(credentials())
    finally:
        os.umask(old_umask)
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700 and mode(path.parent.parent) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == ["creds.json"]  # no temporary file left


@posix_only
def test_existing_directory_of_the_caller_is_not_changed(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    FileCredentialStore(shared / "creds.json").save(credentials())
    assert mode(shared) == 0o755 and mode(shared / "creds.json") == 0o600


@posix_only
def test_default_location_is_per_user_and_per_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLINE_CONFIG_DIR", str(tmp_path / "config"))
    path = default_credentials_path(SERVER)
    assert path.parent == tmp_path / "config" / "auth"
    assert path != default_credentials_path("https://other.example")

    server = FakeAuthServer(clock=FakeClock())
    auth = create_offline_auth(server_url=SERVER, http_client=server.http_client(), clock=server.clock)
    assert isinstance(auth.credential_store, FileCredentialStore) and auth.credential_store.path == path
    user = asyncio.run(auth.sign_up("ada@example.com", PASSWORD))
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert PASSWORD not in path.read_text()

    # A later run finds the session.
    again = create_offline_auth(server_url=SERVER, http_client=server.http_client(), clock=server.clock)
    assert again.user == user
    # Another server's client does not see (and would never send) these tokens.
    other = create_offline_auth(server_url="http://127.0.0.1:4000", http_client=server.http_client())
    assert other.user is None


def test_none_keeps_tokens_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLINE_CONFIG_DIR", str(tmp_path / "config"))
    server = FakeAuthServer(clock=FakeClock())
    auth = create_offline_auth(server_url=SERVER, credential_store=None, http_client=server.http_client())
    assert isinstance(auth.credential_store, MemoryCredentialStore)
    asyncio.run(auth.sign_up("ada@example.com", PASSWORD))
    assert auth.user is not None and not (tmp_path / "config").exists()


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "creds.json"
    store = FileCredentialStore(path)
    store.save(credentials("refresh-token-1"))

    def crash(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(AuthError) as info:
        store.save(credentials("refresh-token-2"))
    monkeypatch.undo()
    assert info.value.code == STORAGE_ERROR and str(path) in info.value.message
    assert "refresh-token" not in str(info.value)
    assert store.load() == credentials("refresh-token-1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["creds.json"]


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b'{"version": 1, "serverUrl": "http://127.0.0.1:3001", "accessToken": "a", "refreshTo',  # torn
        b"\xff\xfe\x00garbage",
        b"[]",
        json.dumps({**credentials().to_json(), "version": 99}).encode(),
        json.dumps({**credentials().to_json(), "refreshToken": 5}).encode(),
        json.dumps({**credentials().to_json(), "user": {"email": "x@example.com"}}).encode(),
        json.dumps({**credentials().to_json(), "accessExpiresAt": "soon"}).encode(),
    ],
)
def test_a_damaged_file_reads_as_signed_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    path = tmp_path / "creds.json"
    path.write_bytes(content)
    caplog.set_level(logging.WARNING, logger="offline.auth")
    store = FileCredentialStore(path)
    assert store.load() is None
    assert str(path) in caplog.text and "sign in again" in caplog.text
    assert "refresh-token" not in caplog.text

    # The client starts signed out, and a sign-in replaces the file.
    server = FakeAuthServer(clock=FakeClock())
    auth = create_offline_auth(server_url=SERVER, credential_store=store, http_client=server.http_client())
    assert auth.user is None
    asyncio.run(auth.sign_up("ada@example.com", PASSWORD))
    assert store.load() is not None


def test_an_unreadable_path_is_a_storage_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "creds.json").mkdir()  # a directory where the file should be
    store = FileCredentialStore(tmp_path / "creds.json")
    with pytest.raises(AuthError) as info:
        store.load()
    assert info.value.code == STORAGE_ERROR and info.value.context is not None
    assert info.value.context["path"] == str(tmp_path / "creds.json")
    with pytest.raises(AuthError):
        store.save(credentials())
    # The client keeps working in memory and says why persistence failed.
    server = FakeAuthServer(clock=FakeClock())
    auth = create_offline_auth(server_url=SERVER, credential_store=store, http_client=server.http_client())
    caplog.set_level(logging.WARNING, logger="offline.auth")
    assert auth.user is None
    asyncio.run(auth.sign_up("ada@example.com", PASSWORD))
    assert auth.user is not None and "credential file" in caplog.text


@posix_only
def test_loosened_permissions_are_restored(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    store = FileCredentialStore(path)
    store.save(credentials())
    os.chmod(path, 0o644)
    assert store.load() == credentials()
    assert mode(path) == 0o600


def test_repr_hides_tokens() -> None:
    creds = credentials("very-secret-refresh")
    assert "very-secret-refresh" not in repr(creds) and creds.access_token not in repr(creds)
    assert "device-signature" not in repr(creds)


def test_decode_claims() -> None:
    token = sign_jwt({"sub": "user-1", "exp": 1_700_000_900, "name": "Zoë"})
    assert decode_claims(token) == {"sub": "user-1", "exp": 1_700_000_900, "name": "Zoë"}
    for bad in ("", "abc", "a.b", "a.!!!.c", "a.bm90IGpzb24.c", f"a.{'W10'}.c"):
        with pytest.raises(ValueError) as info:
            decode_claims(bad)
        assert bad == "" or bad not in str(info.value)
