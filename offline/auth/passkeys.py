"""Passkeys (WebAuthn) on the client.

`is_passkey_supported()` is True only in a browser with WebAuthn: Python in the browser client's Web Worker
whose page reported WebAuthn support (`offline.worker`), or Pyodide on a page with
``window.PublicKeyCredential``. Native Python, and desktop shells that do not expose WebAuthn to Python,
have no authenticator to talk to.

The ceremonies run where WebAuthn lives: ``register_passkey()`` and ``sign_in_with_passkey()`` fetch the
options from the server, hand them to a *ceremony* and send the resulting credential back. The default
ceremony is the browser's ``navigator.credentials`` (via ``PublicKeyCredential.parseCreationOptionsFromJSON``
/ ``parseRequestOptionsFromJSON`` and ``toJSON()``); a worker has none, so there the page runs it and posts
the credential back (``offline.platform.page_webauthn``). A prompt the user dismisses (or lets time out) is
PASSKEY_CANCELLED. A desktop app whose WebView does WebAuthn passes its own ceremony: an async function from
the options (WebAuthn JSON form) to the credential (WebAuthn JSON form).
"""

from __future__ import annotations

import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from offline.platform import PageWebAuthn, page_webauthn

from .errors import (
    AUTH_UNAVAILABLE,
    INVALID_INPUT,
    PASSKEY_CANCELLED,
    PASSKEY_EXISTS,
    PASSKEY_FAILED,
    PASSKEYS_UNSUPPORTED,
    AuthError,
)
from .http import HttpResponse

__all__ = ["Ceremony", "PasskeyMethods", "browser_create", "browser_get", "is_passkey_supported"]

User = dict[str, Any]
#: ``async (options_json) -> credential_json``: one WebAuthn ceremony.
Ceremony = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def _js() -> Any:
    if sys.platform != "emscripten":
        return None
    try:
        import js  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    return js


def is_passkey_supported() -> bool:
    """True in a browser that offers WebAuthn: in the browser client's worker when its page reported WebAuthn
    support, or under Pyodide on a page where ``window.PublicKeyCredential`` exists."""
    if page_webauthn() is not None:
        return True
    js = _js()
    window = getattr(js, "window", None) if js is not None else None
    return window is not None and getattr(window, "PublicKeyCredential", None) is not None


def _unsupported() -> AuthError:
    return AuthError(
        "passkeys need WebAuthn, which this environment does not offer (is_passkey_supported() is False); "
        "pass a ceremony function, or sign in another way",
        PASSKEYS_UNSUPPORTED,
        {},
    )


#: DOMException names of a failed ceremony -> (code, what to tell the user).
_CEREMONY_ERRORS: dict[str, tuple[str, str]] = {
    "NotAllowedError": (
        PASSKEY_CANCELLED,
        "the passkey prompt was dismissed, timed out, or found no passkey for this site; try again",
    ),
    "AbortError": (PASSKEY_CANCELLED, "the passkey prompt was aborted; try again"),
    "TimeoutError": (PASSKEY_CANCELLED, "the passkey prompt got no answer in time; try again"),
    "InvalidStateError": (PASSKEY_EXISTS, "this authenticator already holds a passkey for this account"),
}


def _ceremony_failed(kind: str, name: str, message: str) -> AuthError:
    code, hint = _CEREMONY_ERRORS.get(
        name,
        (
            PASSKEY_FAILED,
            "the browser refused the passkey ceremony (check that the server's passkey rp_id and origins "
            "match this page's origin, served over https or from localhost)",
        ),
    )
    return AuthError(f"{hint} ({name}: {message[:200]})", code, {"ceremony": kind, "reason": name})


async def _relayed(kind: str, options: dict[str, Any], relay: PageWebAuthn) -> dict[str, Any]:
    """A ceremony run by the page for Python in its worker (see `offline.platform.page_webauthn`); the
    credential's shape is checked by the caller (`_credential`)."""
    answer = await relay(kind, options)
    if answer.get("ok") is True:
        credential = answer.get("credential")
        return credential if isinstance(credential, dict) else {}
    error = answer.get("error")
    name, message = (error.get("name"), error.get("message")) if isinstance(error, dict) else (None, None)
    raise _ceremony_failed(kind, str(name or "Error"), str(message or "the page gave no reason"))


async def _browser(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    if not is_passkey_supported():
        raise _unsupported()
    relay = page_webauthn()
    if relay is not None:
        return await _relayed(kind, options, relay)
    js = _js()
    from pyodide.ffi import to_js  # type: ignore[import-not-found, unused-ignore]

    pkc = js.window.PublicKeyCredential
    as_js = to_js(options, dict_converter=js.Object.fromEntries)
    if kind == "create":
        public_key = pkc.parseCreationOptionsFromJSON(as_js)
        credential = await js.navigator.credentials.create(
            js.Object.fromEntries(to_js([["publicKey", public_key]]))
        )
    else:
        public_key = pkc.parseRequestOptionsFromJSON(as_js)
        credential = await js.navigator.credentials.get(
            js.Object.fromEntries(to_js([["publicKey", public_key]]))
        )
    result: dict[str, Any] = credential.toJSON().to_py()
    return result


async def browser_create(options: dict[str, Any]) -> dict[str, Any]:
    """``navigator.credentials.create`` in the browser (Pyodide); PASSKEYS_UNSUPPORTED elsewhere."""
    return await _browser("create", options)


async def browser_get(options: dict[str, Any]) -> dict[str, Any]:
    """``navigator.credentials.get`` in the browser (Pyodide); PASSKEYS_UNSUPPORTED elsewhere."""
    return await _browser("get", options)


def _options(body: dict[str, Any], server_url: str) -> tuple[str, dict[str, Any]]:
    challenge_id, options = body.get("challengeId"), body.get("options")
    if not isinstance(challenge_id, str) or not isinstance(options, dict):
        raise AuthError(
            "the auth server sent unexpected passkey options (no challengeId or options)",
            AUTH_UNAVAILABLE,
            {"url": server_url},
        )
    return challenge_id, options


def _credential(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("id"), str):
        raise AuthError(
            "the ceremony must return the credential's JSON form (a dict with id, rawId, response, type)",
            INVALID_INPUT,
            {"field": "credential"},
        )
    return value


class PasskeyMethods:
    """Passkey methods of `OfflineAuth` (a mixin; the session plumbing comes from the client)."""

    server_url: str

    async def _authed(self, method: str, path: str, body: dict[str, Any] | None = None) -> HttpResponse:
        raise NotImplementedError  # provided by OfflineAuth

    async def _public(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError  # provided by OfflineAuth

    def _body_of(self, response: HttpResponse) -> dict[str, Any]:
        raise NotImplementedError  # provided by OfflineAuth

    async def _start_session(self, method: str, path: str, body: dict[str, Any]) -> User:
        raise NotImplementedError  # provided by OfflineAuth

    async def register_passkey(self, ceremony: Ceremony | None = None) -> dict[str, Any]:
        """Add a passkey to the signed-in account: ``{"credentialId", "createdAt"}``."""
        create = ceremony or browser_create
        if ceremony is None and not is_passkey_supported():
            raise _unsupported()
        body = self._body_of(await self._authed("POST", "/passkeys/register/options", {}))
        challenge_id, options = _options(body, self.server_url)
        credential = _credential(await create(options))
        payload = {"challengeId": challenge_id, "credential": credential}
        return self._body_of(await self._authed("POST", "/passkeys/register/verify", payload))

    async def sign_in_with_passkey(self, ceremony: Ceremony | None = None) -> User:
        """Sign in with a passkey (no password, no second step); returns `user`. PASSKEY_FAILED when the
        server cannot verify it."""
        get = ceremony or browser_get
        if ceremony is None and not is_passkey_supported():
            raise _unsupported()
        challenge_id, options = _options(
            await self._public("POST", "/passkeys/authenticate/options", {}), self.server_url
        )
        credential = _credential(await get(options))
        return await self._start_session(
            "POST", "/passkeys/authenticate/verify", {"challengeId": challenge_id, "credential": credential}
        )

    async def list_passkeys(self) -> list[dict[str, Any]]:
        found = self._body_of(await self._authed("GET", "/passkeys")).get("passkeys")
        return list(found) if isinstance(found, list) else []

    async def delete_passkey(self, credential_id: str) -> None:
        if not isinstance(credential_id, str) or not credential_id:
            raise AuthError(
                "credential_id must be a passkey's credentialId", INVALID_INPUT, {"field": "credentialId"}
            )
        await self._authed("DELETE", "/passkeys/" + urllib.parse.quote(credential_id, safe=""))
