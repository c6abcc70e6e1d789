"""Sign a desktop release, or make the key pair: ``python -m offline_desktop.sign_release``.

    sign_release keygen --out update-key.pem          encrypted private key (password from the environment);
                                                      prints the public key to build into the app
    sign_release sign app-2.0.0.pyz --version 2.0.0 --url app-2.0.0.pyz [--app NAME] [--out manifest.json]

The private key (PEM, encrypted) comes from OFFLINE_UPDATE_PRIVATE_KEY and its password from
OFFLINE_UPDATE_KEY_PASSWORD, as CI secrets are given. Neither is ever printed, logged or written out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from packaging.version import InvalidVersion, Version

from .update import public_key_pem, sign_manifest

KEY_ENV: Final = "OFFLINE_UPDATE_PRIVATE_KEY"
PASSWORD_ENV: Final = "OFFLINE_UPDATE_KEY_PASSWORD"


class SignError(Exception):
    """A problem with the inputs; the message names what and never contains a secret."""


def _password() -> bytes:
    password = os.environ.get(PASSWORD_ENV)
    if not password:
        raise SignError(f"set {PASSWORD_ENV} to the private key's password (a CI secret)")
    return password.encode("utf-8")


def load_private_key() -> Ed25519PrivateKey:
    """The release key from the environment (PEM text, encrypted with the password)."""
    pem = os.environ.get(KEY_ENV)
    if not pem:
        raise SignError(f"set {KEY_ENV} to the encrypted PEM private key (a CI secret)")
    try:
        key = serialization.load_pem_private_key(pem.encode("utf-8"), password=_password())
    except TypeError as exc:
        # Raised for an unencrypted key given a password: refuse, a release key must be encrypted.
        raise SignError(f"{KEY_ENV} is not encrypted; create it with `keygen`") from exc
    except ValueError as exc:
        raise SignError(f"{KEY_ENV} cannot be decrypted with {PASSWORD_ENV}, or is not a PEM key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SignError(f"{KEY_ENV} is not an Ed25519 key")
    return key


def build_manifest(
    payload: Path, version: str, url: str, app: str | None, key: Ed25519PrivateKey
) -> dict[str, str]:
    try:
        Version(version)
    except InvalidVersion as exc:
        raise SignError(f"--version {version!r} is not a version number (e.g. 2.0.0)") from exc
    if not payload.is_file():
        raise SignError(f"release file {payload} does not exist")
    digest = hashlib.sha256()
    with payload.open("rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    manifest = {"version": version, "url": url, "sha256": digest.hexdigest()}
    if app:
        manifest["app"] = app
    return sign_manifest(manifest, key)


def _keygen(out: Path) -> str:
    if out.exists():
        raise SignError(f"{out} exists; refusing to overwrite a release key")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(_password()),
    )
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    return public_key_pem(key)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offline_desktop.sign_release", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    keygen = sub.add_parser("keygen", help="create an encrypted Ed25519 release key")
    keygen.add_argument("--out", type=Path, required=True, help="where to write the encrypted private key")
    sign = sub.add_parser("sign", help="write the signed manifest of a release file")
    sign.add_argument("payload", type=Path, help="the release file (the app's zipapp)")
    sign.add_argument("--version", required=True)
    sign.add_argument(
        "--url", required=True, help="download URL of the file (may be relative to the manifest)"
    )
    sign.add_argument("--app", default=None, help="app name; the app refuses a manifest for another app")
    sign.add_argument("--out", type=Path, default=None, help="manifest file (default: standard output)")
    args = parser.parse_args(argv)
    try:
        if args.command == "keygen":
            print(_keygen(args.out), end="")
            print(
                f"encrypted private key written to {args.out}; put the public key above in the build",
                file=sys.stderr,
            )
            return 0
        manifest = build_manifest(args.payload, args.version, args.url, args.app, load_private_key())
    except SignError as exc:
        print(f"error [UPDATE_SIGN]: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(manifest, indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"signed manifest for {args.version} written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
