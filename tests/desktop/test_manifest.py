"""Manifest signing and verification, in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from offline_desktop import BuildConfig
from offline_desktop.update import (
    UpdateRefused,
    canonical_manifest_bytes,
    check_and_install,
    public_key_pem,
    sign_manifest,
    verify_manifest,
)

from .support import static_server

KEY = Ed25519PrivateKey.generate()
UNSIGNED = {"version": "2.0.0", "url": "app.pyz", "sha256": "ab" * 32, "app": "notes"}


def test_signature_covers_the_canonical_form_whatever_the_key_order() -> None:
    signed = sign_manifest(UNSIGNED, KEY)
    reordered = json.dumps(dict(reversed(list(signed.items())))).encode()
    manifest = verify_manifest(reordered, KEY.public_key(), app_name="notes")
    assert (manifest.version, manifest.url, manifest.app) == ("2.0.0", "app.pyz", "notes")
    assert b"signature" not in canonical_manifest_bytes(signed)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "not JSON"),
        (json.dumps(UNSIGNED).encode(), "not signed"),
        (json.dumps({**sign_manifest(UNSIGNED, KEY), "extra": 1}).encode(), "signature does not match"),
        (
            json.dumps({**sign_manifest(UNSIGNED, KEY), "signature": "@@"}).encode(),
            "signature does not match",
        ),
    ],
)
def test_bad_manifests_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(UpdateRefused) as info:
        verify_manifest(raw, KEY.public_key())
    assert message in info.value.message and info.value.code == "UPDATE_REFUSED"


def test_a_manifest_for_another_app_is_refused() -> None:
    with pytest.raises(UpdateRefused, match="for app 'notes'"):
        verify_manifest(json.dumps(sign_manifest(UNSIGNED, KEY)).encode(), KEY.public_key(), app_name="other")


def test_an_older_or_equal_version_is_not_installed(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "manifest.json").write_text(json.dumps(sign_manifest({**UNSIGNED, "version": "1.0.0"}, KEY)))
    target = tmp_path / "app.pyz"
    target.write_bytes(b"current")
    with static_server(site) as base:
        build = BuildConfig(
            "notes", "1.0.0", update_url=base + "/manifest.json", update_public_key=public_key_pem(KEY)
        )
        assert check_and_install(build, target).status == "current"
        missing = BuildConfig(
            "notes", "1.0.0", update_url=base + "/nope.json", update_public_key=public_key_pem(KEY)
        )
        assert check_and_install(build.__class__("notes", "1.0.0"), target).status == "disabled"
        assert check_and_install(missing, target).status == "unavailable"
    assert target.read_bytes() == b"current"
