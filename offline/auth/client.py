"""The auth client: sign up, sign in, keep the access token fresh, sign out (DESIGN.md section 2, "Auth").

The session is a token pair from the server's auth routes: a short-lived access token (a JWT the sync
handshake carries) and a long-lived opaque refresh token, rotated on every refresh. `get_access_token()`
refreshes shortly before the access token expires; concurrent callers share one refresh, because the server
treats a second use of the same refresh token as theft and ends the whole session.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import ipaddress
import logging
import re
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .account_email import AccountEmailMethods
from .credentials import Credentials, CredentialStore, FileCredentialStore, MemoryCredentialStore
from .errors import (
    AUTH_FAILED,
    AUTH_UNAVAILABLE,
    EMAIL_NOT_VERIFIED,
    INVALID_INPUT,
    INVALID_MFA_TOKEN,
    OAUTH_FAILED,
    SESSION_ENDED_CODES,
    AuthError,
    MfaRequired,
)
from .http import AuthHttp, HttpResponse, credentials_from_pair
from .mfa import MfaMethods, _factor
from .orgs import OrgMethods
from .passkeys import PasskeyMethods
from .tokens import claims_or_empty

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("offline.auth")

MIN_PASSWORD_LENGTH = 8
_PROVIDER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_OAUTH_STATE_TTL = 600.0  # seconds a started OAuth sign-in may take before its state is forgotten

User = dict[str, Any]
ChangeHandler = Callable[[User | None], None]


class _Default(enum.Enum):
    STORE = "default"


#: The value of ``credential_store`` when the argument is left out: a `FileCredentialStore` of the server.
DEFAULT_STORE = _Default.STORE


def _invalid(field: str, message: str) -> AuthError:
    return AuthError(message, INVALID_INPUT, {"field": field})


def check_email(email: Any) -> str:
    """The email without surrounding spaces; INVALID_INPUT (field ``email``) when it cannot be an address."""
    if not isinstance(email, str):
        raise _invalid("email", "email must be a string such as name@example.com")
    value = email.strip()
    local, _, domain = value.partition("@")
    if (
        value.count("@") != 1
        or not local
        or not domain
        or len(value) > 254
        or any(ch.isspace() for ch in value)
        or domain.startswith(".")
        or domain.endswith(".")
        or ".." in domain
    ):
        # The value is not repeated: error messages end up in logs.
        raise _invalid("email", "email is not a valid address; enter one such as name@example.com")
    return value


def check_password(password: Any) -> str:
    """INVALID_INPUT (field ``password``) unless the password is a string of at least 8 characters."""
    if not isinstance(password, str):
        raise _invalid("password", "password must be a string")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise _invalid("password", f"password must be at least {MIN_PASSWORD_LENGTH} characters long")
    return password


def _check_server_url(server_url: Any) -> str:
    if not isinstance(server_url, str):
        raise _invalid(
            "server_url", "server_url must be the http(s) URL of the server, e.g. https://example.com"
        )
    parts = urllib.parse.urlsplit(server_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _invalid(
            "server_url",
            f"server_url must be an http:// or https:// URL of the server hosting /auth, got {server_url!r}",
        )
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        log.warning(
            "auth server %s uses plain http: passwords and tokens travel unencrypted; use https in production",
            parts.hostname,
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OfflineAuth(MfaMethods, OrgMethods, PasskeyMethods, AccountEmailMethods):
    """One user's session with one server. Create it with `create_offline_auth`."""

    def __init__(
        self,
        server_url: str,
        *,
        credential_store: CredentialStore | _Default | None = DEFAULT_STORE,
        http_client: httpx.AsyncClient | None = None,
        timeout: float = 15.0,
        refresh_margin: float = 60.0,
        auth_path: str = "/auth",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.server_url = _check_server_url(server_url)
        if credential_store is DEFAULT_STORE:
            # Under Pyodide the file system is in memory anyway; a browser app passes its own store.
            store: CredentialStore = (
                MemoryCredentialStore()
                if sys.platform == "emscripten"
                else FileCredentialStore.for_server(self.server_url)
            )
        elif credential_store is None:
            store = MemoryCredentialStore()
        elif isinstance(credential_store, CredentialStore):
            store = credential_store
        else:
            raise _invalid(
                "credential_store",
                "credential_store must have load(), save(credentials) and clear() (e.g. FileCredentialStore), "
                "or be None to keep tokens in memory",
            )
        self.credential_store = store
        self.refresh_margin = refresh_margin
        self._clock = clock
        self._http = AuthHttp(
            self.server_url + "/" + auth_path.strip("/"), http_client=http_client, timeout=timeout
        )
        self._credentials: Credentials | None = None
        self._loaded = False
        # Kept after sign-out: the next sign-in from this device sends it (see sign_in).
        self._device_token: str | None = None
        self._generation = 0  # bumped whenever the session is replaced or ended
        self._refresh_task: asyncio.Task[Credentials] | None = None
        self._handlers: list[ChangeHandler] = []
        self._oauth_pending: dict[str, tuple[str, str, float]] = {}
        self._link_pending: dict[str, tuple[str, str, float]] = {}
        # The sign-in token of a sign-in waiting for its second factor, and when it expires (local clock).
        self._mfa_pending: tuple[str, float] | None = None

    def __repr__(self) -> str:
        user = self.user
        return f"OfflineAuth({self.server_url!r}, user={None if user is None else user.get('email')!r})"

    # -- state ------------------------------------------------------------------------------------------------

    @property
    def user(self) -> User | None:
        """``{"id": <the JWT sub>, "email": ...}`` of the signed-in user, or None when signed out."""
        creds = self._current()
        return None if creds is None else dict(creds.user)

    @property
    def is_signed_in(self) -> bool:
        return self._current() is not None

    @property
    def claims(self) -> dict[str, Any]:
        """The current access token's claims, decoded but NOT verified (display only; the server decides)."""
        creds = self._current()
        return claims_or_empty(None if creds is None else creds.access_token)

    def on_change(self, handler: ChangeHandler) -> Callable[[], None]:
        """Call ``handler(user or None)`` whenever the session starts or ends; returns an unsubscribe function."""
        self._handlers.append(handler)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._handlers.remove(handler)

        return unsubscribe

    def _current(self) -> Credentials | None:
        if not self._loaded:
            self._loaded = True
            try:
                stored = self.credential_store.load()
            except AuthError as exc:
                log.warning("%s; starting signed out", exc.message)
                stored = None
            self._credentials = self._usable(stored)
            if self._credentials is not None and self._credentials.device_token:
                self._device_token = self._credentials.device_token
        return self._credentials

    def _usable(self, stored: Credentials | None) -> Credentials | None:
        # Never send one server's tokens to another: a store may be shared or point at an old file.
        if stored is None or stored.server_url != self.server_url:
            return None
        return stored

    def _set_session(self, creds: Credentials | None) -> None:
        before = self._current()
        self._credentials = creds
        if creds is not None and creds.device_token:
            self._device_token = creds.device_token
        try:
            if creds is None:
                self.credential_store.clear()
            else:
                self.credential_store.save(creds)
        except AuthError as exc:
            # The session still works in memory; only persistence failed. Say so, never with a token.
            log.warning("%s", exc.message)
        if (before is None) != (creds is None) or (
            before is not None and creds is not None and before.user != creds.user
        ):
            for handler in list(self._handlers):
                try:
                    handler(None if creds is None else dict(creds.user))
                except Exception:
                    log.exception("auth change handler failed")

    async def _settle_refresh(self) -> None:
        """Let a running refresh finish (whatever its outcome) before the session is replaced or ended."""
        task = self._refresh_task
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    # -- sign up, sign in, sign out -------------------------------------------------------------------------

    async def sign_up(self, email: str, password: str) -> User:
        """Create an account and sign in as it; returns `user`. EMAIL_TAKEN when the email has an account.
        EMAIL_NOT_VERIFIED (``context["account_created"]`` True) when the server requires a verified address
        before sign-in: the account exists, a verification link is on its way; sign in once it is opened."""
        body = {"email": check_email(email), "password": check_password(password)}
        return await self._start_session("POST", "/sign-up", body)

    async def sign_in(self, email: str, password: str) -> User:
        """Sign in; returns `user`. INVALID_CREDENTIALS for a wrong email or password, RATE_LIMITED (with
        ``context["retry_after"]`` seconds) after too many attempts."""
        body = {"email": check_email(email), "password": check_password(password)}
        self._current()  # a stored session's device token is read with it
        if self._device_token:
            # Proof that this device signed in before: guesses at this account from many other addresses
            # then do not keep its owner out here (the server checks it is this account's).
            body["deviceToken"] = self._device_token
        return await self._start_session("POST", "/sign-in", body)

    async def _start_session(self, method: str, path: str, body: dict[str, Any]) -> User:
        await self._settle_refresh()
        sent_at = self._clock()
        response = await self._http.request(method, path, json=body)
        answer = _json(response, self.server_url)
        if isinstance(answer, dict) and answer.get("mfaRequired") is True:
            token, expires_in = answer.get("mfaToken"), answer.get("expiresIn")
            if not isinstance(token, str) or not token:
                raise AuthError(
                    "the auth server asked for a second factor without a sign-in token",
                    AUTH_UNAVAILABLE,
                    {"url": self.server_url},
                )
            lifetime = float(expires_in) if isinstance(expires_in, int | float) and expires_in > 0 else 300.0
            self._mfa_pending = (token, sent_at + lifetime)
            types = answer.get("mfaTypes")
            raise MfaRequired([str(t) for t in types] if isinstance(types, list) else ["totp"], lifetime)
        if isinstance(answer, dict) and answer.get("emailVerificationRequired") is True:
            raise AuthError(
                "the account was created; open the link in the verification message sent to its address, "
                "then sign in",
                EMAIL_NOT_VERIFIED,
                {"url": self.server_url, "account_created": True},
            )
        creds = credentials_from_pair(answer, self.server_url, sent_at)
        previous = self._current()
        self._generation += 1
        self._set_session(creds)
        if previous is not None and previous.refresh_token != creds.refresh_token:
            # Signing in over another session: end that one on the server too (best effort).
            await self._revoke(previous)
        return dict(creds.user)

    async def sign_out(self) -> bool:
        """Forget the session on this device and revoke it on the server.

        The local credentials are cleared first, whatever happens next. Returns True when the server
        confirmed (or already considered the session over), False when it could not be reached; the session
        then ends on its own when its refresh token expires.
        """
        await self._settle_refresh()
        creds = self._current()
        self._generation += 1
        self._mfa_pending = None
        self._set_session(None)
        if creds is None:
            return True
        return await self._revoke(creds)

    async def complete_mfa(self, code: str | None = None, *, recovery_code: str | None = None) -> User:
        """Finish a sign-in that raised `MfaRequired`, with the authenticator app's ``code`` or a
        ``recovery_code`` (each recovery code works once); returns `user`. INVALID_MFA_CODE for a wrong code
        (try again), INVALID_MFA_TOKEN when the sign-in step expired (sign in again)."""
        fields = _factor(code, recovery_code)
        pending = self._mfa_pending
        if pending is None or self._clock() >= pending[1]:
            self._mfa_pending = None
            raise AuthError(
                "no sign-in is waiting for a second factor (or it expired); sign in again",
                INVALID_MFA_TOKEN,
                {"url": self.server_url},
            )
        try:
            user = await self._start_session("POST", "/mfa/challenge", {"mfaToken": pending[0], **fields})
        except AuthError as exc:
            if exc.code == INVALID_MFA_TOKEN:
                self._mfa_pending = None
            raise
        self._mfa_pending = None
        return user

    @property
    def mfa_pending(self) -> bool:
        """True while a sign-in waits for `complete_mfa`."""
        return self._mfa_pending is not None and self._clock() < self._mfa_pending[1]

    # -- calls on behalf of the signed-in user ----------------------------------------------------------------

    async def _authed(self, method: str, path: str, body: dict[str, Any] | None = None) -> HttpResponse:
        token = await self.get_access_token()
        if token is None:
            raise AuthError("not signed in: sign in first", AUTH_FAILED, {"url": self.server_url})
        return await self._http.request(method, path, json=body, bearer=token)

    async def _public(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._body_of(await self._http.request(method, path, json=body))

    def _body_of(self, response: HttpResponse) -> dict[str, Any]:
        body = _json(response, self.server_url)
        if not isinstance(body, dict):
            raise AuthError(
                f"the auth server answered {response.status_code} with something other than a JSON object",
                AUTH_UNAVAILABLE,
                {"url": self.server_url, "status": response.status_code},
            )
        return body

    async def _revoke(self, creds: Credentials) -> bool:
        try:
            await self._http.request("POST", "/sign-out", json={"refreshToken": creds.refresh_token})
        except AuthError as exc:
            if exc.code in SESSION_ENDED_CODES:
                return True
            log.warning(
                "signed out on this device, but the server did not revoke the session (%s: %s)",
                exc.code,
                exc.message,
            )
            return False
        return True

    async def sign_out_everywhere(self) -> None:
        """Revoke every session of this user (all devices), then sign out here."""
        token = await self.get_access_token()
        if token is None:
            raise AuthError("not signed in: sign in first", AUTH_FAILED, {"url": self.server_url})
        await self._http.request("POST", "/revoke", json={"all": True}, bearer=token)
        await self._settle_refresh()
        self._generation += 1
        self._set_session(None)

    async def me(self) -> User:
        """The server's view of the signed-in user (``id``, ``email``, ``emailVerified``, ``createdAt``);
        checks the token."""
        token = await self.get_access_token()
        if token is None:
            raise AuthError("not signed in: sign in first", AUTH_FAILED, {"url": self.server_url})
        body = _json(await self._http.request("GET", "/me", bearer=token), self.server_url)
        if not isinstance(body, dict):
            raise AuthError("unexpected answer from /auth/me", AUTH_UNAVAILABLE, {"url": self.server_url})
        return body

    # -- tokens ---------------------------------------------------------------------------------------------

    def _expiring(self, creds: Credentials, now: float) -> bool:
        if creds.access_expires_at is None:
            return False  # no known expiry: refreshed only when asked to
        lifetime = max(0.0, creds.access_expires_at - creds.access_issued_at)
        # A quarter of the lifetime caps the margin, so short-lived tokens are not refreshed at every call.
        margin = min(self.refresh_margin, lifetime / 4)
        return now >= creds.access_expires_at - margin

    async def get_access_token(self) -> str | None:
        """A valid access token (refreshed first when it expires within the margin), or None when signed out.

        Raises AUTH_FAILED when the server ended the session (the credentials are then cleared: sign in
        again), AUTH_UNAVAILABLE when a needed refresh cannot reach the server.
        """
        creds = self._current()
        if creds is None:
            return None
        now = self._clock()
        if not self._expiring(creds, now):
            return creds.access_token
        try:
            return (await self._refresh_shared()).access_token
        except AuthError as exc:
            still_valid = creds.access_expires_at is not None and now < creds.access_expires_at
            if exc.code in SESSION_ENDED_CODES or not still_valid or self._current() is not creds:
                raise
            # Refreshing early is a courtesy: while the token has not expired, a failed refresh can wait.
            log.warning("could not refresh the access token yet (%s); using it until it expires", exc.code)
            return creds.access_token

    async def refresh(self) -> str:
        """Exchange the refresh token for a new pair now (shared with any refresh already running)."""
        return (await self._refresh_shared()).access_token

    async def _refresh_shared(self) -> Credentials:
        loop = asyncio.get_running_loop()
        task = self._refresh_task
        if task is None or task.done() or task.get_loop() is not loop:
            task = loop.create_task(self._do_refresh(), name="offline-auth-refresh")
            # Retrieve the outcome even when every waiter was cancelled (no "never retrieved" warning).
            task.add_done_callback(lambda t: None if t.cancelled() else t.exception())
            self._refresh_task = task
        # shield: one caller giving up must not cancel the refresh the others wait for.
        return await asyncio.shield(task)

    async def _rotate_with_org(self, org_id: str | None) -> None:
        """Refresh now, making ``org_id`` the session's active organization (shared like any refresh)."""
        await self._settle_refresh()
        task = asyncio.get_running_loop().create_task(self._do_refresh({"orgId": org_id}))
        task.add_done_callback(lambda t: None if t.cancelled() else t.exception())
        self._refresh_task = task
        await asyncio.shield(task)

    async def _do_refresh(self, extra: dict[str, Any] | None = None) -> Credentials:
        current = self._current()
        if current is None:
            raise AuthError("not signed in: sign in first", AUTH_FAILED, {"url": self.server_url})
        creds = self._adopt_newer(current)
        now = self._clock()
        if extra is None and creds is not current and not self._expiring(creds, now):
            return creds  # another instance sharing the store already refreshed
        generation = self._generation
        if creds.refresh_expires_at is not None and now >= creds.refresh_expires_at:
            self._end_session(generation)
            raise AuthError(
                "the session expired; sign in again", AUTH_FAILED, {"reason": "REFRESH_TOKEN_EXPIRED"}
            )
        sent_at = self._clock()
        try:
            response = await self._http.request(
                "POST", "/refresh", json={"refreshToken": creds.refresh_token, **(extra or {})}
            )
        except AuthError as exc:
            if exc.code in SESSION_ENDED_CODES:
                self._end_session(generation)
                raise AuthError(
                    f"the server ended this session ({exc.code}); sign in again",
                    AUTH_FAILED,
                    {"reason": exc.code, "url": self.server_url},
                ) from None
            raise
        fresh = credentials_from_pair(_json(response, self.server_url), self.server_url, sent_at)
        if generation != self._generation:
            # Signed out or in again meanwhile: this pair belongs to a session nobody holds any more.
            raise AuthError("the session changed during the refresh", AUTH_FAILED, {"url": self.server_url})
        self._set_session(fresh)
        return fresh

    def _adopt_newer(self, creds: Credentials) -> Credentials:
        """The store's credentials when another instance (or process) rotated the same user's tokens.

        Refreshing with a refresh token another holder already used would look like theft to the server and
        revoke the session, so the newest stored pair wins.
        """
        try:
            stored = self._usable(self.credential_store.load())
        except AuthError:
            return creds
        if stored is None or stored.refresh_token == creds.refresh_token or stored.user != creds.user:
            return creds
        self._credentials = stored
        return stored

    def _end_session(self, generation: int) -> None:
        if generation == self._generation:
            self._generation += 1
            self._set_session(None)

    # -- OAuth ----------------------------------------------------------------------------------------------

    async def oauth_authorize(self, provider: str, redirect_uri: str) -> str:
        """The provider's authorization URL to open in a browser; the sign-in ends with `complete_oauth`.

        ``redirect_uri`` is where the provider sends the browser back: for a desktop app a loopback URL
        (``http://127.0.0.1:<port>/callback``) served by the app (SPEC 5.2.4).
        """
        provider = _check_provider(provider)
        if not isinstance(redirect_uri, str) or not redirect_uri:
            raise _invalid("redirect_uri", "redirect_uri must be the URL the provider redirects back to")
        response = await self._http.request(
            "GET", f"/oauth/{provider}/authorize", params={"redirectUri": redirect_uri}
        )
        body = _json(response, self.server_url)
        url = body.get("authorizationUrl") if isinstance(body, dict) else None
        state = body.get("state") if isinstance(body, dict) else None
        if not isinstance(url, str) or not isinstance(state, str):
            raise AuthError(
                "the auth server sent an unexpected OAuth answer (no authorizationUrl or state)",
                AUTH_UNAVAILABLE,
                {"url": self.server_url, "provider": provider},
            )
        now = self._clock()
        self._oauth_pending = {s: v for s, v in self._oauth_pending.items() if now - v[2] < _OAUTH_STATE_TTL}
        self._oauth_pending[state] = (provider, redirect_uri, now)
        return url

    async def complete_oauth(
        self,
        provider: str,
        code: str,
        state: str,
        redirect_uri: str | None = None,
        *,
        check_state: bool = True,
    ) -> User:
        """Finish an OAuth sign-in with the ``code`` and ``state`` the provider redirected back with.

        The state must be one this client started with `oauth_authorize` (a loopback listener may receive
        requests from any local program); ``check_state=False`` leaves the check to the server alone, for
        flows where the page that started the sign-in is gone.
        """
        provider = _check_provider(provider)
        if not isinstance(code, str) or not code:
            raise _invalid("code", "code must be the authorization code from the provider's redirect")
        if not isinstance(state, str) or not state:
            raise _invalid("state", "state must be the state from the provider's redirect")
        pending = self._oauth_pending.pop(state, None)
        if check_state and (
            pending is None or pending[0] != provider or self._clock() - pending[2] >= _OAUTH_STATE_TTL
        ):
            raise AuthError(
                "this OAuth redirect does not match a sign-in started here (or it is older than 10 minutes); "
                "start the sign-in again",
                OAUTH_FAILED,
                {"provider": provider},
            )
        body: dict[str, Any] = {"code": code, "state": state}
        redirect = redirect_uri if redirect_uri is not None else (pending[1] if pending else None)
        if redirect is not None:
            body["redirectUri"] = redirect
        return await self._start_session("POST", f"/oauth/{provider}/callback", body)

    # -- account linking ------------------------------------------------------------------------------------

    async def link_oauth_authorize(self, provider: str, redirect_uri: str) -> str:
        """Start linking a provider identity to the signed-in account: the authorization URL to open. The
        redirect's ``code`` and ``state`` then go to `complete_link_oauth`."""
        provider = _check_provider(provider)
        if not isinstance(redirect_uri, str) or not redirect_uri:
            raise _invalid("redirect_uri", "redirect_uri must be the URL the provider redirects back to")
        path = f"/link/oauth/{provider}/authorize?" + urllib.parse.urlencode({"redirectUri": redirect_uri})
        body = self._body_of(await self._authed("GET", path))
        url, state = body.get("authorizationUrl"), body.get("state")
        if not isinstance(url, str) or not isinstance(state, str):
            raise AuthError(
                "the auth server sent an unexpected linking answer (no authorizationUrl or state)",
                AUTH_UNAVAILABLE,
                {"url": self.server_url, "provider": provider},
            )
        now = self._clock()
        self._link_pending = {s: v for s, v in self._link_pending.items() if now - v[2] < _OAUTH_STATE_TTL}
        self._link_pending[state] = (provider, redirect_uri, now)
        return url

    async def complete_link_oauth(
        self, provider: str, code: str, state: str, redirect_uri: str | None = None
    ) -> dict[str, Any]:
        """Link the provider identity behind ``code`` to the signed-in account: ``{"linked", "provider",
        "email", "alreadyLinked"}``. OAUTH_IDENTITY_LINKED when another account already has it."""
        provider = _check_provider(provider)
        if not isinstance(code, str) or not code or not isinstance(state, str) or not state:
            raise _invalid("code", "code and state must be the values from the provider's redirect")
        pending = self._link_pending.pop(state, None)
        if pending is None or pending[0] != provider or self._clock() - pending[2] >= _OAUTH_STATE_TTL:
            raise AuthError(
                "this redirect does not match a linking started here (or it is older than 10 minutes); "
                "start linking again",
                OAUTH_FAILED,
                {"provider": provider},
            )
        body = {"code": code, "state": state, "redirectUri": redirect_uri or pending[1]}
        return self._body_of(await self._authed("POST", f"/link/oauth/{provider}/callback", body))


def _check_provider(provider: Any) -> str:
    if not isinstance(provider, str) or not _PROVIDER.match(provider):
        raise _invalid(
            "provider", "provider must be a provider name such as 'github' (letters, digits, - and _)"
        )
    return provider


def _json(response: HttpResponse, server_url: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise AuthError(
            f"the auth server at {server_url} answered {response.status_code} without JSON; check server_url",
            AUTH_UNAVAILABLE,
            {"url": server_url, "status": response.status_code},
        ) from None


def create_offline_auth(
    server_url: str,
    credential_store: CredentialStore | _Default | None = DEFAULT_STORE,
    *,
    http_client: httpx.AsyncClient | None = None,
    timeout: float = 15.0,
    refresh_margin: float = 60.0,
    auth_path: str = "/auth",
    clock: Callable[[], float] = time.time,
) -> OfflineAuth:
    """The auth client of the server at ``server_url`` (``http(s)://host[:port]``, which serves ``/auth``).

    ``credential_store``: left out, the session is kept in a `FileCredentialStore` (a file only the user can
    read, in the user's config directory, one per server); ``None`` keeps it in memory (sign in at every
    start); or any object with ``load() save(credentials) clear()``. ``http_client`` replaces the HTTP client
    (tests, custom transports). ``clock`` returns epoch seconds (tests).
    """
    return OfflineAuth(
        server_url,
        credential_store=credential_store,
        http_client=http_client,
        timeout=timeout,
        refresh_margin=refresh_margin,
        auth_path=auth_path,
        clock=clock,
    )
