"""Server-side authentication: the ``/auth`` routes and the sync auth provider (DESIGN.md section 2, "Auth").

``auth = create_auth_routes(secret=os.environ["AUTH_SECRET"])``, then
``create_production_server(store=..., auth_routes=auth, sync_options={"auth": auth.to_sync_auth_provider()})``.
Users, sessions and refresh tokens live in the server's store (``offline_auth_*`` tables).

HTTP contract (JSON bodies, camelCase keys; every error is ``{"error": {"code", "message", "field"?}}``):

- ``POST /auth/sign-up`` ``{email, password}`` (password: at least 8 characters) -> 201 token pair;
  409 ``EMAIL_TAKEN`` (sign-up reveals that an email is registered; sign-in never does).
- ``POST /auth/sign-in`` ``{email, password}`` -> 200 token pair; 401 ``INVALID_CREDENTIALS`` (the same body
  for an unknown email and a wrong password); 429 ``RATE_LIMITED`` with ``Retry-After``.
- ``POST /auth/refresh`` ``{refreshToken}`` -> 200 new pair (the old refresh token is spent); 401
  ``REFRESH_TOKEN_REUSED`` (a spent token came back: its session is revoked) or ``INVALID_REFRESH_TOKEN``.
- ``POST /auth/sign-out`` ``{refreshToken}`` and/or ``Authorization: Bearer`` -> 204, revoking that session.
- ``POST /auth/revoke`` (Bearer) ``{all: true}`` revokes every session of the user, else the current one -> 204.
- ``GET /auth/me`` (Bearer) -> ``{id, email, createdAt}`` (ISO 8601 UTC); 401 ``AUTH_FAILED`` with
  ``WWW-Authenticate: Bearer``.
- ``GET /auth/oauth/{provider}/authorize?redirectUri=`` -> ``{authorizationUrl, state}``;
  ``POST /auth/oauth/{provider}/callback`` ``{code, state, redirectUri?}`` -> 200 token pair; 404
  ``OAUTH_PROVIDER_UNKNOWN``, 400/502 ``OAUTH_FAILED``, 409 ``OAUTH_ACCOUNT_EXISTS`` (the provider's email
  belongs to another account).

A token pair is ``{user: {id, email}, accessToken, refreshToken, tokenType: "Bearer", expiresIn,
refreshExpiresIn}``. The access token is a JWT (HS256, AUTH_SECRET) with ``sub email sid iat exp typ iss``,
``orgs`` (``[{id, role}]``) and, with an active organization, ``orgId`` and ``role``.

Part two (each module's docstring has the details):

- Two-step sign-in (``mfa``, ``totp``): ``POST /auth/mfa/totp/enroll|verify|disable``, ``GET /auth/mfa``; a
  sign-in of an enrolled user answers ``{mfaRequired: true, mfaToken, mfaTypes, expiresIn}`` and
  ``POST /auth/mfa/challenge`` ``{mfaToken, code | recoveryCode}`` gives the pair.
- Organizations (``orgs``): ``/auth/orgs``, ``/auth/orgs/{id}/members[/{userId}]``, ``/invites``, ``/leave``,
  ``/activate``, ``POST /auth/invites/accept``; ``POST /auth/refresh`` takes an optional ``orgId``.
- Account linking (``linking``): ``/auth/link/oauth/{provider}/authorize|callback`` with the access token.
- Passkeys (``passkeys``): ``/auth/passkeys/register|authenticate/options|verify``, ``GET /auth/passkeys``,
  ``DELETE /auth/passkeys/{credentialId}``.
- External identity providers (``external_issuers``): ``create_auth_routes(..., external_issuers=[{issuer,
  audience, jwksUrl?, userIdClaim?, scopeClaims?}])`` or ``OFFLINE_JWT_ISSUERS``; sync and ``GET /auth/me``
  (``{id, email, issuer, createdAt: null}``) accept those issuers' tokens, checked against their JWKS (``jwks``).
- Write rules: ``sync_options={"rules": {collection: fn(claims, operation) -> bool}}`` (``server_runtime.sync``).
"""

from .rate_limit import RateLimits
from .routes import AuthRoutes, SyncAuthProvider, create_auth_routes

__all__ = ["AuthRoutes", "RateLimits", "SyncAuthProvider", "create_auth_routes"]
