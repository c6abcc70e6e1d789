"""A software WebAuthn authenticator for the passkey tests: what a browser plus a platform authenticator hand
to the page, built from the specification with `cryptography` (WebAuthn Level 2, sections 5-6).

- ``create(options)`` takes ``PublicKeyCredentialCreationOptionsJSON`` and returns the registration
  credential's JSON form: a fresh EC P-256 key (COSE ES256), ``attestation: none``, authenticator data with
  the RP id hash, flags UP|UV|AT, a signature counter and the attested credential data.
- ``get(options)`` takes ``PublicKeyCredentialRequestOptionsJSON`` and returns the assertion's JSON form:
  authenticator data (UP|UV, counter + 1) and an ECDSA-SHA256 signature over ``authData || SHA-256(
  clientDataJSON)``, with the user handle of a discoverable credential.

The client data's origin is the one the "browser" is on; the RP id in the options must be that origin's
host or a parent of it, as a browser enforces.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import struct
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from webauthn.helpers import encode_cbor

UP, UV, AT = 0x01, 0x04, 0x40


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Credential:
    credential_id: bytes
    key: ec.EllipticCurvePrivateKey
    rp_id: str
    user_handle: bytes
    sign_count: int = 0


@dataclass
class SoftAuthenticator:
    origin: str
    credentials: list[Credential] = field(default_factory=list)

    def _check_rp(self, rp_id: str) -> None:
        host = urllib.parse.urlsplit(self.origin).hostname or ""
        if not (host == rp_id or host.endswith("." + rp_id)):
            raise AssertionError(f"a browser on {self.origin} refuses RP id {rp_id!r}")

    def _client_data(self, kind: str, challenge: str) -> bytes:
        return json.dumps(
            {"type": kind, "challenge": challenge, "origin": self.origin, "crossOrigin": False},
            separators=(",", ":"),
        ).encode("utf-8")

    async def create(self, options: dict[str, Any]) -> dict[str, Any]:
        rp_id = options["rp"]["id"]
        self._check_rp(rp_id)
        assert any(p["alg"] == -7 for p in options["pubKeyCredParams"]), "ES256 not offered"
        excluded = {c["id"] for c in options.get("excludeCredentials", [])}
        assert not any(b64url(c.credential_id) in excluded for c in self.credentials if c.rp_id == rp_id)
        cred = Credential(
            secrets.token_bytes(16),
            ec.generate_private_key(ec.SECP256R1()),
            rp_id,
            unb64url(options["user"]["id"]),
        )
        self.credentials.append(cred)
        numbers = cred.key.public_key().public_numbers()
        cose = {1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")}
        attested = (
            bytes(16) + struct.pack(">H", len(cred.credential_id)) + cred.credential_id + encode_cbor(cose)
        )
        auth_data = (
            hashlib.sha256(rp_id.encode()).digest() + bytes([UP | UV | AT]) + struct.pack(">I", 0) + attested
        )
        attestation = encode_cbor({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return {
            "id": b64url(cred.credential_id),
            "rawId": b64url(cred.credential_id),
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(self._client_data("webauthn.create", options["challenge"])),
                "attestationObject": b64url(attestation),
                "transports": ["internal"],
            },
            "clientExtensionResults": {},
            "authenticatorAttachment": "platform",
        }

    async def get(self, options: dict[str, Any]) -> dict[str, Any]:
        rp_id = options["rpId"]
        self._check_rp(rp_id)
        allowed = {c["id"] for c in options.get("allowCredentials", [])}
        usable = [
            c
            for c in self.credentials
            if c.rp_id == rp_id and (not allowed or b64url(c.credential_id) in allowed)
        ]
        assert usable, "no credential for this RP"
        cred = usable[-1]
        cred.sign_count += 1
        client_data = self._client_data("webauthn.get", options["challenge"])
        auth_data = (
            hashlib.sha256(rp_id.encode()).digest() + bytes([UP | UV]) + struct.pack(">I", cred.sign_count)
        )
        signature = cred.key.sign(auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256()))
        return {
            "id": b64url(cred.credential_id),
            "rawId": b64url(cred.credential_id),
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(client_data),
                "authenticatorData": b64url(auth_data),
                "signature": b64url(signature),
                "userHandle": b64url(cred.user_handle),
            },
            "clientExtensionResults": {},
            "authenticatorAttachment": "platform",
        }
