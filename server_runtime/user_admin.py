"""User administration and the audit log over HTTP (DESIGN.md section 7, "Auth"), for the admin token only.

- ``GET /__offline/users`` (``q``: part of an email or a user id; ``after``: the ``next`` of the previous
  page; ``limit`` 1-500, 50 by default) -> ``{users: [{id, email, emailVerified, createdAt, disabled}],
  next}`` (``emailVerified``: the current address is verified, ``server_runtime.auth.verified_emails``).
- ``GET /__offline/users/{id}`` -> the user with ``disabled`` (``{at, by, reason}`` or null), ``sessions``
  (``{id, createdAt, revokedAt, revokedReason, live}``), ``devices`` (node ids registered to the user),
  ``providers``, ``mfa`` (``{totp, passkeys}``) and ``orgs``.
- ``POST /__offline/users/{id}/disable`` (``{reason?}``): revokes every session (live sync sockets are told
  ``SESSION_REVOKED`` and closed), then sign-in, refresh and the sync handshake answer ``USER_DISABLED``
  until ``POST /__offline/users/{id}/enable``. ``POST /__offline/users/{id}/sign-out`` revokes every session.
- ``DELETE /__offline/users/{id}``: deletes the account and its auth data (``server_runtime.auth.accounts``);
  the records it synced and its devices' node-id registrations stay. The answer says so.
- ``GET /__offline/audit`` (``kind`` (comma-separated), ``user``, ``since``/``until`` (ISO 8601 or epoch ms),
  ``before`` (the ``next`` of the previous page), ``limit`` 1-500, 100 by default) -> ``{entries, next}``,
  newest first.

Every admin action is an audit entry (actor ``admin``). Tokens are checked as for every operational endpoint
(``Authorization: Bearer``; wrong ones rate-limited per address, see ``operational``), but unlike those these
endpoints are never open: without ``OFFLINE_ADMIN_TOKEN`` they answer 403 ``ADMIN_TOKEN_REQUIRED``. The
dashboard's cookie does not work here (no cross-site form may disable a user).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from offline.core.errors import OfflineError

from .auth import accounts
from .auth import sessions as _sessions
from .auth.audit import AuditQuery
from .auth.storage import AuthTx
from .auth.verified_emails import is_verified
from .auth.web import AuthError, client_address, iso, read_body
from .sync import principal_of

if TYPE_CHECKING:
    from .auth.routes import AuthRoutes
    from .operational import Operational

__all__ = ["ADMIN", "UserAdmin"]

log = logging.getLogger("offline.server.admin")

#: The ``actor`` of audit entries for actions taken with the admin token.
ADMIN: Final = "admin"
DISABLED_REASON: Final = "disabled by an administrator"
SIGNED_OUT_REASON: Final = "signed out by an administrator"
DELETED_KEPT: Final = (
    "the records this user synced and the registrations of their devices' node ids are kept; "
    "delete the records through your application if they must go"
)
_MAX_ID: Final = 128
_NO_STORE: Final = {"Cache-Control": "no-store"}


def _not_found(user_id: str) -> AuthError:
    return AuthError(
        404, "USER_NOT_FOUND", "no user with this id; find it with GET /__offline/users?q=<email>", field="id"
    )


async def _refuse_stranding_orgs(tx: AuthTx, user_id: str) -> None:
    """Refuse (LAST_OWNER) to delete the last owner of an organization that has other members: nobody could
    invite, re-role or remove them any more. An organization the user is alone in strands nobody."""
    # PostgreSQL row locks: the user's first (as sessions and the other admin actions take it), then each
    # organization's, so neither a sign-in nor a re-role races the check.
    if not await accounts.lock_user(tx, user_id):
        return  # no such user: the caller says so
    stranded: list[str] = []
    for org, membership in await tx.user_orgs(user_id):
        if membership.role != "owner":
            continue
        await tx.org(org.id)  # locks the organization's row (PostgreSQL): no concurrent re-role slips by
        members = [m for m, _ in await tx.org_members(org.id) if m.user_id != user_id]
        if members and not any(m.role == "owner" for m in members):
            stranded.append(f"{org.name!r} ({org.id})")
    if stranded:
        raise AuthError(
            409,
            "LAST_OWNER",
            f"this user is the last owner of {', '.join(stranded)}, which would be left without an owner: "
            "first give another member the owner role (PATCH /auth/orgs/<orgId>/members/<userId> with "
            '{"role": "owner"}, as this user, or have them invite a new owner), then delete the user',
            field="id",
        )


def _limit(request: Request, default: int) -> int:
    text = request.query_params.get("limit")
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= 500:
        raise AuthError(400, "INVALID_INPUT", "limit must be a whole number from 1 to 500", field="limit")
    return int(text)


def _moment(request: Request, name: str) -> int | None:
    """An ISO 8601 time or epoch milliseconds from the query, as epoch milliseconds."""
    text = request.query_params.get(name)
    if text is None or not text.strip():
        return None
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise AuthError(
            400,
            "INVALID_INPUT",
            f"{name} must be an ISO 8601 time (2026-01-31T12:00:00Z) or epoch milliseconds",
            field=name,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def _user_json(user: Any, mark: accounts.DisabledRow | None, verified: bool) -> dict[str, Any]:
    return {
        "id": user.id,
        "email": user.email,
        "emailVerified": verified,
        "createdAt": iso(user.created_at),
        "disabled": None
        if mark is None
        else {"at": iso(mark.disabled_at), "by": mark.disabled_by, "reason": mark.reason},
    }


class UserAdmin:
    """The endpoints above, for one server's auth routes; ``routes()`` gives them to mount."""

    def __init__(self, ops: Operational, auth: AuthRoutes) -> None:
        self.ops = ops
        self.auth = auth

    def routes(self) -> list[Route]:
        h = self._handler
        return [
            Route("/__offline/users", h(self.list_users), methods=["GET"]),
            Route("/__offline/users/{user_id}", h(self.show), methods=["GET"]),
            Route("/__offline/users/{user_id}", h(self.delete), methods=["DELETE"]),
            Route("/__offline/users/{user_id}/disable", h(self.disable), methods=["POST"]),
            Route("/__offline/users/{user_id}/enable", h(self.enable), methods=["POST"]),
            Route("/__offline/users/{user_id}/sign-out", h(self.sign_out), methods=["POST"]),
            Route("/__offline/audit", h(self.audit), methods=["GET"]),
        ]

    def _handler(
        self, method: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if self.ops.auth.expected("admin") is None:
                return AuthError(
                    403,
                    "ADMIN_TOKEN_REQUIRED",
                    "user administration needs an admin token: set OFFLINE_ADMIN_TOKEN on the server",
                ).response()
            refused = self.ops.auth.check(request, "admin")
            if refused is not None:
                return refused
            try:
                return await method(request)
            except AuthError as exc:
                return exc.response()
            except OfflineError as exc:
                log.error("admin request %s failed: [%s] %s", request.url.path, exc.code, exc.message)
                return AuthError(
                    503, "SERVICE_UNAVAILABLE", "the server could not complete the request; try again shortly"
                ).response()

        return endpoint

    def _user_id(self, request: Request) -> str:
        user_id = str(request.path_params.get("user_id", ""))
        if not 0 < len(user_id) <= _MAX_ID:
            raise _not_found(user_id)
        return user_id

    async def _record(self, kind: str, request: Request, user_id: str, **detail: Any) -> None:
        await self.auth.audit.record(
            kind, actor=ADMIN, subject=user_id, address=client_address(request), detail=detail
        )

    # -- reading ------------------------------------------------------------------------------------------------

    async def list_users(self, request: Request) -> Response:
        limit = _limit(request, 50)
        query = request.query_params.get("q")
        after = request.query_params.get("after") or None
        async with self.auth._store().reader() as tx:
            found = await accounts.find_users(tx, query, after=after, limit=limit + 1)
            page = found[:limit]
            users = [_user_json(user, mark, await is_verified(tx, user)) for user, mark in page]
        return JSONResponse(
            {
                "users": users,
                "next": page[-1][0].id if len(found) > limit else None,
            },
            headers=_NO_STORE,
        )

    async def show(self, request: Request) -> Response:
        user_id = self._user_id(request)
        async with self.auth._store().reader() as tx:
            user = await tx.user_by_id(user_id)
            if user is None:
                raise _not_found(user_id)
            mark = await accounts.disabled(tx, user_id)
            verified = await is_verified(tx, user)
            facts = await accounts.facts(tx, user_id)
        store = self.auth.server_store
        devices = await store.principal_nodes(principal_of({"sub": user_id})) if store is not None else []
        body = _user_json(user, mark, verified)
        body.update(
            {
                "sessions": [
                    {
                        "id": s.id,
                        "createdAt": iso(s.created_at),
                        "revokedAt": None if s.revoked_at is None else iso(s.revoked_at),
                        "revokedReason": s.revoked_reason,
                        "live": s.revoked_at is None,
                    }
                    for s in facts.sessions
                ],
                "devices": devices,
                "providers": facts.providers,
                "mfa": {"totp": facts.totp_enabled, "passkeys": facts.passkeys},
                "orgs": [{"id": org_id, "role": role} for org_id, role in facts.orgs],
            }
        )
        return JSONResponse(body, headers=_NO_STORE)

    async def audit(self, request: Request) -> Response:
        limit = _limit(request, 100)
        kinds = tuple(k for k in (request.query_params.get("kind") or "").split(",") if k.strip())
        query = AuditQuery(
            kinds=tuple(k.strip() for k in kinds),
            user=request.query_params.get("user") or None,
            since=_moment(request, "since"),
            until=_moment(request, "until"),
            before=request.query_params.get("before") or None,
            limit=limit + 1,
        )
        found = await self.auth.audit.entries(query)
        page = found[:limit]
        return JSONResponse(
            {"entries": [e.to_json() for e in page], "next": page[-1].id if len(found) > limit else None},
            headers=_NO_STORE,
        )

    # -- changing -----------------------------------------------------------------------------------------------

    async def _revoke_all(self, user_id: str, reason: str, *, disable: str | None = None) -> tuple[int, bool]:
        """Revoke every live session of the user (and mark it disabled when ``disable`` is its reason), then
        end the live sync sessions they hold open. Returns (sessions revoked, whether the mark was new)."""
        now = self.auth._ms()
        async with self.auth._store().transaction() as tx:
            if not await accounts.lock_user(tx, user_id):
                raise _not_found(user_id)
            marked = False
            if disable is not None:
                marked = await accounts.set_disabled(
                    tx, accounts.DisabledRow(user_id, now, ADMIN, disable or None)
                )
            ended = await _sessions.live_session_ids(tx, user_id)
            count = await tx.revoke_user_sessions(user_id, now, reason)
        self.auth._announce_revoked(ended)
        return count, marked

    async def disable(self, request: Request) -> Response:
        user_id = self._user_id(request)
        body = await read_body(request, required=False)
        reason = body.get("reason", "")
        if not isinstance(reason, str) or len(reason) > 500:
            raise AuthError(
                400, "INVALID_INPUT", "reason must be a text of at most 500 characters", field="reason"
            )
        count, changed = await self._revoke_all(user_id, DISABLED_REASON, disable=reason.strip())
        log.warning("user %s disabled by an administrator (%d session(s) revoked)", user_id, count)
        await self._record("user-disabled", request, user_id, sessionsRevoked=count, reason=reason.strip())
        return JSONResponse(
            {"id": user_id, "disabled": True, "changed": changed, "sessionsRevoked": count}, headers=_NO_STORE
        )

    async def enable(self, request: Request) -> Response:
        user_id = self._user_id(request)
        async with self.auth._store().transaction() as tx:
            if not await accounts.lock_user(tx, user_id):
                raise _not_found(user_id)
            changed = await accounts.clear_disabled(tx, user_id)
        log.warning("user %s enabled by an administrator", user_id)
        await self._record("user-enabled", request, user_id, changed=changed)
        return JSONResponse({"id": user_id, "disabled": False, "changed": changed}, headers=_NO_STORE)

    async def sign_out(self, request: Request) -> Response:
        user_id = self._user_id(request)
        count, _ = await self._revoke_all(user_id, SIGNED_OUT_REASON)
        log.warning("user %s signed out by an administrator (%d session(s) revoked)", user_id, count)
        await self._record("user-signed-out", request, user_id, sessionsRevoked=count)
        return JSONResponse({"id": user_id, "sessionsRevoked": count}, headers=_NO_STORE)

    async def delete(self, request: Request) -> Response:
        user_id = self._user_id(request)
        async with self.auth._store().transaction() as tx:
            await _refuse_stranding_orgs(tx, user_id)
            ended = await _sessions.live_session_ids(tx, user_id)
            if not await accounts.delete_user(tx, user_id):
                raise _not_found(user_id)
        # Its sessions are gone from the store: live sync sessions of theirs end now (and at the next poll in
        # other processes, which count a missing session as ended).
        self.auth._announce_revoked(ended)
        log.warning("user %s deleted by an administrator (%d live session(s) ended)", user_id, len(ended))
        await self._record("user-deleted", request, user_id, sessionsEnded=len(ended))
        return JSONResponse(
            {"id": user_id, "deleted": True, "sessionsEnded": len(ended), "kept": DELETED_KEPT},
            headers=_NO_STORE,
        )
