"""Passkeys (WebAuthn, via py_webauthn): registration for a signed-in user and passwordless sign-in.

Configured by ``create_auth_routes(passkeys={"rp_id": "example.com", "rp_name": "Example",
"origins": ["https://example.com"]})`` (camelCase keys accepted; ``origin`` for a single one;
``user_verification``: ``"preferred"`` (default), ``"required"`` or ``"discouraged"``). Every origin's host must
be the RP id or one of its subdomains; ``http://`` origins only on loopback hosts (development).

Each ``.../options`` answer carries ``challengeId`` (opaque) and the WebAuthn options in their JSON form
(``PublicKeyCredentialCreationOptionsJSON`` / ``RequestOptionsJSON``, for ``PublicKeyCredential
.parseCreationOptionsFromJSON`` or a library such as SimpleWebAuthn); the matching ``.../verify`` takes
``challengeId`` and the credential's JSON form (``credential.toJSON()``). Challenges are stored server-side,
single use, for ``CHALLENGE_TTL`` seconds. Sign-in uses discoverable credentials (no email is asked, so no
account's existence is revealed); registration therefore asks for a resident key. A passkey sign-in is
complete by itself: it does not ask for the TOTP code as well.
"""

from __future__ import annotations

import json
import logging
import secrets
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from offline.core.errors import OfflineError

from ..client_address import is_loopback_host as _is_loopback
from .audit import user_actor
from .storage_ext import ChallengeRow, PasskeyRow
from .tokens import AUTH_CONFIG, hash_secret
from .web import AuthError, client_address, invalid, iso, read_body, string_field

if TYPE_CHECKING:
    from .routes import AuthRoutes

__all__ = ["CHALLENGE_TTL", "PasskeyConfig", "PasskeyRoutes", "passkey_config_from"]

log = logging.getLogger("offline.server.auth")

CHALLENGE_TTL: Final = 5 * 60
_NO_STORE: Final = {"Cache-Control": "no-store"}
_USER_VERIFICATION: Final = ("preferred", "required", "discouraged")


@dataclass(frozen=True, slots=True)
class PasskeyConfig:
    rp_id: str
    rp_name: str
    origins: tuple[str, ...]
    user_verification: str = "preferred"


def _config_error(field: str, message: str) -> OfflineError:
    return OfflineError(message, AUTH_CONFIG, {"field": f"passkeys.{field}"})


def passkey_config_from(raw: Mapping[str, Any] | None) -> PasskeyConfig | None:
    """Validate the ``passkeys`` option (module docstring); None leaves passkeys switched off."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _config_error("", "passkeys must be a dict with rp_id, rp_name and origins")

    def pick(snake: str, camel: str) -> Any:
        return raw.get(snake, raw.get(camel))

    rp_id = pick("rp_id", "rpId")
    if not isinstance(rp_id, str) or not rp_id or "/" in rp_id or ":" in rp_id:
        raise _config_error(
            "rp_id", "passkeys.rp_id must be a host name such as example.com (no scheme or port)"
        )
    rp_id = rp_id.lower()
    origins = pick("origins", "origins") or ([raw["origin"]] if raw.get("origin") else [])
    if isinstance(origins, str) or not origins:
        raise _config_error(
            "origins", "passkeys.origins must be a list of origins such as https://example.com"
        )
    for origin in origins:
        parts = urllib.parse.urlsplit(origin if isinstance(origin, str) else "")
        host = (parts.hostname or "").lower()
        if (
            parts.scheme not in ("https", "http")
            or not host
            or (parts.scheme == "http" and not _is_loopback(host))
            or parts.path not in ("", "/")
            or not (host == rp_id or host.endswith("." + rp_id))
        ):
            raise _config_error(
                "origins",
                f"passkeys origin {origin!r} must be https://<rp_id or a subdomain>[:port] "
                "(http:// only on a loopback host)",
            )
    verification = pick("user_verification", "userVerification") or "preferred"
    if verification not in _USER_VERIFICATION:
        raise _config_error(
            "user_verification", f"passkeys.user_verification must be one of {_USER_VERIFICATION}"
        )
    name = pick("rp_name", "rpName") or rp_id
    return PasskeyConfig(rp_id, str(name), tuple(str(o).rstrip("/") for o in origins), str(verification))


def _webauthn() -> Any:
    """py_webauthn, imported on first use (servers without passkeys never load it)."""
    import webauthn
    import webauthn.helpers
    import webauthn.helpers.exceptions
    import webauthn.helpers.structs

    return webauthn


def _failed(status: int, code: str, message: str) -> AuthError:
    return AuthError(status, code, message)


class PasskeyRoutes:
    """The ``/passkeys`` routes of an ``AuthRoutes``."""

    def __init__(self, core: AuthRoutes, config: PasskeyConfig | None) -> None:
        self.core = core
        self.config = config

    def routes(self) -> list[BaseRoute]:
        h = self.core._handler
        return [
            Route("/passkeys", h(self.list_passkeys), methods=["GET"]),
            Route("/passkeys/register/options", h(self.register_options), methods=["POST"]),
            Route("/passkeys/register/verify", h(self.register_verify), methods=["POST"]),
            Route("/passkeys/authenticate/options", h(self.authenticate_options), methods=["POST"]),
            Route("/passkeys/authenticate/verify", h(self.authenticate_verify), methods=["POST"]),
            Route("/passkeys/{credential_id}", h(self.delete), methods=["DELETE"]),
        ]

    def _conf(self) -> PasskeyConfig:
        if self.config is None:
            raise AuthError(
                404,
                "PASSKEYS_NOT_CONFIGURED",
                "this server does not offer passkeys (create_auth_routes(passkeys={...}) configures them)",
            )
        return self.config

    async def _new_challenge(self, kind: str, user_id: str | None, challenge: bytes) -> str:
        handle = secrets.token_urlsafe(32)
        now = self.core._ms()
        payload = json.dumps({"challenge": _webauthn().helpers.bytes_to_base64url(challenge)})
        async with self.core._store().transaction() as tx:
            await tx.insert_challenge(
                ChallengeRow(hash_secret(handle), kind, user_id, payload, now, now + CHALLENGE_TTL * 1000)
            )
        return handle

    async def _take_challenge(self, body: Mapping[str, Any], kind: str, user_id: str | None) -> bytes:
        handle = string_field(body, "challengeId", limit=256)
        now = self.core._ms()
        async with self.core._store().transaction() as tx:
            row = await tx.take_challenge(hash_secret(handle))
        if (
            row is None
            or row.kind != kind
            or row.expires_at <= now
            or (user_id is not None and row.user_id != user_id)
        ):
            raise _failed(
                400,
                "PASSKEY_CHALLENGE_INVALID",
                "the passkey challenge is unknown, used or expired; start again",
            )
        challenge: bytes = _webauthn().base64url_to_bytes(json.loads(row.payload)["challenge"])
        return challenge

    @staticmethod
    def _credential(body: Mapping[str, Any]) -> dict[str, Any]:
        credential = body.get("credential")
        if not isinstance(credential, dict) or not isinstance(credential.get("id"), str):
            raise invalid(
                "credential", "credential must be the JSON form of the WebAuthn credential (toJSON())"
            )
        if not 0 < len(credential["id"]) <= 1024:
            raise invalid("credential", "credential.id is not a credential id")
        if not isinstance(credential.get("response"), dict):
            raise invalid(
                "credential",
                "credential.response must be an object (the JSON form of the WebAuthn credential, toJSON())",
            )
        return credential

    # -- registration ----------------------------------------------------------------------------------------

    async def register_options(self, request: Request) -> Response:
        conf = self._conf()
        claims = await self.core._claims(request)
        user_id = str(claims["sub"])
        await read_body(request, required=False)  # nothing to read, but a malformed body is refused
        wa = _webauthn()
        structs = wa.helpers.structs
        async with self.core._store().reader() as tx:
            user = await tx.user_by_id(user_id)
            existing = await tx.user_passkeys(user_id)
        if user is None:
            raise AuthError(401, "AUTH_FAILED", "the account no longer exists; sign in again")
        options = wa.generate_registration_options(
            rp_id=conf.rp_id,
            rp_name=conf.rp_name,
            user_id=user_id.encode("utf-8"),
            user_name=user.email or user_id,
            timeout=CHALLENGE_TTL * 1000,
            authenticator_selection=structs.AuthenticatorSelectionCriteria(
                resident_key=structs.ResidentKeyRequirement.REQUIRED,
                user_verification=structs.UserVerificationRequirement(conf.user_verification),
            ),
            exclude_credentials=[
                structs.PublicKeyCredentialDescriptor(id=wa.base64url_to_bytes(p.credential_id))
                for p in existing
            ],
        )
        handle = await self._new_challenge("passkey-register", user_id, options.challenge)
        return JSONResponse(
            {"challengeId": handle, "options": wa.helpers.options_to_json_dict(options)}, headers=_NO_STORE
        )

    async def register_verify(self, request: Request) -> Response:
        conf = self._conf()
        claims = await self.core._claims(request)
        user_id = str(claims["sub"])
        body = await read_body(request)
        credential = self._credential(body)
        challenge = await self._take_challenge(body, "passkey-register", user_id)
        wa = _webauthn()
        try:
            verified = wa.verify_registration_response(
                credential=credential,
                expected_challenge=challenge,
                expected_rp_id=conf.rp_id,
                expected_origin=list(conf.origins),
                require_user_verification=conf.user_verification == "required",
            )
        except wa.helpers.exceptions.WebAuthnException as exc:
            log.info("passkey registration of user %s refused: %s", user_id, str(exc)[:200])
            raise _failed(
                400, "PASSKEY_INVALID", "the passkey registration could not be verified; try again"
            ) from None
        response = credential.get("response") if isinstance(credential.get("response"), dict) else {}
        transports = response.get("transports") if isinstance(response, dict) else None
        hints = (
            ",".join(t for t in transports if isinstance(t, str))[:200]
            if isinstance(transports, list)
            else None
        )
        now = self.core._ms()
        credential_id = wa.helpers.bytes_to_base64url(verified.credential_id)
        row = PasskeyRow(
            credential_id,
            user_id,
            wa.helpers.bytes_to_base64url(verified.credential_public_key),
            int(verified.sign_count),
            hints or None,
            now,
        )
        async with self.core._store().transaction() as tx:
            added = await tx.insert_passkey(row)
        if not added:
            raise _failed(409, "PASSKEY_EXISTS", "this passkey is already registered")
        log.info("user %s registered a passkey", user_id)
        await self.core.audit.record(
            "passkey-added",
            actor=user_actor(user_id),
            subject=user_id,
            address=client_address(request),
            detail={"credentialId": credential_id},
        )
        return JSONResponse(
            {"credentialId": credential_id, "createdAt": iso(now)}, status_code=201, headers=_NO_STORE
        )

    # -- sign-in ---------------------------------------------------------------------------------------------

    async def authenticate_options(self, request: Request) -> Response:
        conf = self._conf()
        await read_body(request, required=False)
        wa = _webauthn()
        options = wa.generate_authentication_options(
            rp_id=conf.rp_id,
            timeout=CHALLENGE_TTL * 1000,
            user_verification=wa.helpers.structs.UserVerificationRequirement(conf.user_verification),
        )
        handle = await self._new_challenge("passkey-auth", None, options.challenge)
        return JSONResponse(
            {"challengeId": handle, "options": wa.helpers.options_to_json_dict(options)}, headers=_NO_STORE
        )

    async def authenticate_verify(self, request: Request) -> Response:
        conf = self._conf()
        body = await read_body(request)
        credential = self._credential(body)
        address = client_address(request)
        retry = self.core.address_limiter.retry_after(address)
        if retry is not None:
            raise self.core._rate_limited(retry, "failed sign-ins")
        challenge = await self._take_challenge(body, "passkey-auth", None)
        async with self.core._store().reader() as reader:
            stored = await reader.passkey(credential["id"])
            user = await reader.user_by_id(stored.user_id) if stored is not None else None
        wa = _webauthn()
        reason = "unknown credential"
        verified = None
        if stored is not None and user is not None:
            try:
                verified = wa.verify_authentication_response(
                    credential=credential,
                    expected_challenge=challenge,
                    expected_rp_id=conf.rp_id,
                    expected_origin=list(conf.origins),
                    credential_public_key=wa.base64url_to_bytes(stored.public_key),
                    credential_current_sign_count=stored.sign_count,
                    require_user_verification=conf.user_verification == "required",
                )
            except wa.helpers.exceptions.WebAuthnException as exc:
                reason = str(exc)[:200]
            else:
                # The library leaves the user handle alone; an authenticator that names a user must name this one.
                response = credential.get("response")
                handle = response.get("userHandle") if isinstance(response, dict) else None
                if handle and handle != wa.helpers.bytes_to_base64url(user.id.encode("utf-8")):
                    verified, reason = None, "user handle does not match the credential's user"
        now = self.core._ms()
        pair = None
        if verified is not None and stored is not None and user is not None:
            async with self.core._store().transaction() as tx:
                if await tx.record_passkey_use(
                    stored.credential_id, stored.sign_count, int(verified.new_sign_count), now
                ):
                    pair = await self.core._open_session(tx, user)
                else:
                    reason = "the credential was used concurrently"
        if pair is None:
            self.core.address_limiter.hit(address)
            log.info("passkey sign-in refused from %s: %s", address, reason)
            await self.core.audit.record(
                "sign-in-failed",
                subject=None if user is None else user.id,
                address=address,
                detail={"method": "passkey", "reason": "passkey-not-verified"},
            )
            raise _failed(
                401, "PASSKEY_FAILED", "the passkey could not be verified; try again or sign in another way"
            )
        assert user is not None
        log.info("user %s signed in with a passkey (session %s)", user.id, pair.session_id)
        await self.core.audit.record(
            "sign-in",
            actor=user_actor(user.id),
            subject=user.id,
            address=address,
            detail={"method": "passkey", "session": pair.session_id},
        )
        return self.core._pair_response(pair)

    # -- management ------------------------------------------------------------------------------------------

    async def list_passkeys(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        async with self.core._store().reader() as tx:
            found = await tx.user_passkeys(str(claims["sub"]))
        return JSONResponse(
            {
                "passkeys": [
                    {
                        "credentialId": p.credential_id,
                        "createdAt": iso(p.created_at),
                        "lastUsedAt": None if p.last_used_at is None else iso(p.last_used_at),
                    }
                    for p in found
                ]
            },
            headers=_NO_STORE,
        )

    async def delete(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        credential_id = str(request.path_params.get("credential_id", ""))
        if not 0 < len(credential_id) <= 1024:
            raise invalid("credentialId", "credentialId in the path is not a credential id")
        async with self.core._store().transaction() as tx:
            deleted = await tx.delete_passkey(str(claims["sub"]), credential_id)
        if not deleted:
            raise _failed(404, "PASSKEY_NOT_FOUND", "no such passkey on this account")
        await self.core.audit.record(
            "passkey-removed",
            actor=user_actor(str(claims["sub"])),
            subject=str(claims["sub"]),
            address=client_address(request),
            detail={"credentialId": credential_id},
        )
        return Response(status_code=204, headers=_NO_STORE)
