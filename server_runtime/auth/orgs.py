"""Organizations: create, invite, accept, leave, remove, change roles, and the org claims of access tokens.

Roles are ``owner``, ``admin``, ``member`` plus the names given to ``create_auth_routes(roles=[...])``.
Owners may do everything; admins invite, and remove or re-role members whose role is neither owner nor
admin; every other role only reads the member list and leaves. An organization always keeps an owner.

An access token carries ``orgs`` (``[{"id", "role"}]``, at most ``MAX_TOKEN_ORGS``, oldest membership
first) and, when the session has an active organization, ``orgId`` and ``role``. Scope bindings may read
``orgId`` like any claim (schema ``"sync": {"notes": {"where": {"orgId": "orgId"}}}``). Membership is checked
again on every refresh and by the sync auth provider at every handshake, so a removed member's devices stop
receiving the organization's data at their next connection even with an older token.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from offline.core.errors import OfflineError
from offline.core.uuid7 import generate_uuid_v7

from .storage import AuthTx
from .storage_ext import InviteRow, Membership, Org
from .tokens import AUTH_CONFIG, hash_secret
from .web import AuthError, email_field, invalid, iso, read_body, string_field

if TYPE_CHECKING:
    from .routes import AuthRoutes

__all__ = [
    "BUILTIN_ROLES",
    "MAX_TOKEN_ORGS",
    "OrgRoutes",
    "current_org_claims",
    "org_claims",
    "roles_from",
]

log = logging.getLogger("offline.server.auth")

BUILTIN_ROLES: Final = ("owner", "admin", "member")
MAX_TOKEN_ORGS: Final = 50
MAX_NAME_CHARS: Final = 200
_ROLE_NAME: Final = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_MANAGERS: Final = frozenset({"owner", "admin"})
_NO_STORE: Final = {"Cache-Control": "no-store"}


def roles_from(custom: Iterable[str] | None) -> tuple[str, ...]:
    """The built-in roles followed by the configured ones (validated)."""
    out = list(BUILTIN_ROLES)
    if isinstance(custom, str):
        raise OfflineError(
            "roles must be a list of role names, not one string", AUTH_CONFIG, {"field": "roles"}
        )
    for name in custom or ():
        if not isinstance(name, str) or not _ROLE_NAME.match(name):
            raise OfflineError(
                f"role name {name!r} must start with a lower-case letter and use only a-z, 0-9, '-' or '_' "
                "(at most 32 characters)",
                AUTH_CONFIG,
                {"field": "roles"},
            )
        if name in out:
            raise OfflineError(
                f"role {name!r} is {'built in' if name in BUILTIN_ROLES else 'listed twice'}; "
                f"the built-in roles are {', '.join(BUILTIN_ROLES)}",
                AUTH_CONFIG,
                {"field": "roles"},
            )
        out.append(name)
    return tuple(out)


def _org_list(found: Sequence[tuple[Org, Membership]]) -> list[dict[str, str]]:
    return [{"id": org.id, "role": m.role} for org, m in found[:MAX_TOKEN_ORGS]]


async def org_claims(tx: AuthTx, user_id: str, session_id: str) -> dict[str, Any]:
    """The org claims of a token for this session, from the store. Inside a transaction, an active
    organization the user no longer belongs to is forgotten for the session."""
    found = await tx.user_orgs(user_id)
    claims: dict[str, Any] = {"orgs": _org_list(found)}
    active = await tx.active_org(session_id)
    if active is not None:
        role = next((m.role for org, m in found if org.id == active), None)
        if role is None:
            if getattr(tx, "writable", False):
                await tx.set_active_org(session_id, None)
        else:
            claims["orgId"] = active
            claims["role"] = role
    return claims


async def current_org_claims(tx: AuthTx, claims: Mapping[str, Any]) -> dict[str, Any]:
    """``claims`` with the org claims made current: the active organization is dropped when the user is no
    longer a member, its role is the stored one, ``orgs`` is the present list."""
    found = await tx.user_orgs(str(claims["sub"]))
    out = dict(claims)
    out["orgs"] = _org_list(found)
    active = claims.get("orgId")
    role = next((m.role for org, m in found if org.id == active), None) if active is not None else None
    if role is None:
        out.pop("orgId", None)
        out.pop("role", None)
    else:
        out["role"] = role
    return out


def _not_found() -> AuthError:
    # One answer for "no such organization" and "not a member": outsiders learn nothing about either.
    return AuthError(404, "ORG_NOT_FOUND", "no such organization among yours; check the id (GET /auth/orgs)")


def _forbidden(what: str) -> AuthError:
    return AuthError(403, "FORBIDDEN", f"your role in this organization does not allow you to {what}")


def _last_owner() -> AuthError:
    return AuthError(409, "LAST_OWNER", "an organization needs an owner; make another member owner first")


def _path_id(request: Request, name: str) -> str:
    value = str(request.path_params.get(name, ""))
    if not value or len(value) > 64:
        raise invalid(name, f"{name} in the path must be an id of at most 64 characters")
    return value


class OrgRoutes:
    """The ``/orgs`` and ``/invites`` routes of an ``AuthRoutes``."""

    def __init__(self, core: AuthRoutes, *, roles: tuple[str, ...], invite_ttl: int) -> None:
        self.core = core
        self.roles = roles
        self.invite_ttl = invite_ttl

    def routes(self) -> list[BaseRoute]:
        h = self.core._handler
        return [
            Route("/orgs", h(self.orgs), methods=["GET", "POST"]),
            Route("/orgs/{org_id}/members", h(self.members), methods=["GET"]),
            Route("/orgs/{org_id}/members/{user_id}", h(self.member), methods=["PATCH", "DELETE"]),
            Route("/orgs/{org_id}/invites", h(self.invite), methods=["POST"]),
            Route("/orgs/{org_id}/leave", h(self.leave), methods=["POST"]),
            Route("/orgs/{org_id}/activate", h(self.activate), methods=["POST"]),
            Route("/invites/accept", h(self.accept), methods=["POST"]),
        ]

    def _role_field(self, body: Mapping[str, Any], default: str | None = None) -> str:
        role = body.get("role", default)
        if not isinstance(role, str) or role not in self.roles:
            raise invalid("role", f"role must be one of {', '.join(self.roles)}")
        return role

    async def _caller(self, tx: AuthTx, org_id: str, user_id: str) -> tuple[Org, Membership]:
        org = await tx.org(org_id)  # locks the organization's row in PostgreSQL transactions
        me = await tx.membership(org_id, user_id) if org is not None else None
        if org is None or me is None:
            raise _not_found()
        return org, me

    # -- create and list ------------------------------------------------------------------------------------

    async def orgs(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        user_id = str(claims["sub"])
        if request.method == "GET":
            async with self.core._store().reader() as tx:
                found = await tx.user_orgs(user_id)
            return JSONResponse(
                {
                    "orgs": [
                        {"id": o.id, "name": o.name, "role": m.role, "createdAt": iso(o.created_at)}
                        for o, m in found
                    ]
                },
                headers=_NO_STORE,
            )
        body = await read_body(request)
        name = string_field(body, "name", limit=MAX_NAME_CHARS).strip()
        if not name:
            raise invalid("name", "name must not be blank")
        now = self.core._ms()
        org = Org(generate_uuid_v7(), name, user_id, now)
        async with self.core._store().transaction() as tx:
            await tx.insert_org(org)
            await tx.insert_membership(Membership(org.id, user_id, "owner", now))
        log.info("user %s created organization %s", user_id, org.id)
        return JSONResponse(
            {"id": org.id, "name": org.name, "role": "owner", "createdAt": iso(now)},
            status_code=201,
            headers=_NO_STORE,
        )

    async def members(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        org_id = _path_id(request, "org_id")
        async with self.core._store().reader() as tx:
            if await tx.membership(org_id, str(claims["sub"])) is None:
                raise _not_found()
            found = await tx.org_members(org_id)
        return JSONResponse(
            {
                "members": [
                    {"userId": m.user_id, "email": email, "role": m.role, "joinedAt": iso(m.created_at)}
                    for m, email in found
                ]
            },
            headers=_NO_STORE,
        )

    # -- invites --------------------------------------------------------------------------------------------

    async def invite(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        org_id = _path_id(request, "org_id")
        body = await read_body(request)
        email = email_field(body)
        role = self._role_field(body, "member")
        user_id = str(claims["sub"])
        token = secrets.token_urlsafe(32)
        now = self.core._ms()
        async with self.core._store().transaction() as tx:
            _, me = await self._caller(tx, org_id, user_id)
            if me.role not in _MANAGERS:
                raise _forbidden("invite members")
            if role == "owner" and me.role != "owner":
                raise _forbidden("invite owners")
            await tx.insert_invite(
                InviteRow(hash_secret(token), org_id, email, role, user_id, now, now + self.invite_ttl * 1000)
            )
        log.info("user %s invited someone to organization %s as %s", user_id, org_id, role)
        return JSONResponse(
            {
                "inviteToken": token,
                "orgId": org_id,
                "email": email,
                "role": role,
                "expiresIn": self.invite_ttl,
            },
            status_code=201,
            headers=_NO_STORE,
        )

    async def accept(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        body = await read_body(request)
        token = string_field(body, "inviteToken", limit=256)
        user_id = str(claims["sub"])
        now = self.core._ms()
        outcome = "ok"
        async with self.core._store().transaction() as tx:
            row = await tx.take_invite(hash_secret(token))
            user = await tx.user_by_id(user_id)
            if row is None or row.expires_at <= now or await tx.org(row.org_id) is None:
                outcome = "invalid"
            elif not any(m.role == "owner" for m, _ in await tx.org_members(row.org_id)):
                # Its last member's account was deleted (its invites normally go with it): nobody could
                # manage a member let in now. The invite is spent; it can never be honoured.
                outcome = "ownerless"
            elif user is None or user.email != row.email:
                # Not spent: the invite stays for the person it was meant for.
                raise AuthError(
                    403,
                    "INVITE_EMAIL_MISMATCH",
                    "this invite is for another email address; sign in with the invited account",
                )
            elif not await tx.insert_membership(Membership(row.org_id, user_id, row.role, now)):
                outcome = "member"
        if outcome == "invalid":
            raise AuthError(
                404,
                "INVITE_INVALID",
                "the invite is unknown, already used, expired or withdrawn; ask for a new one",
            )
        assert row is not None
        if outcome == "ownerless":
            raise AuthError(
                409,
                "ORG_WITHOUT_OWNER",
                f"organization {row.org_id} has no owner any more (its last member's account was deleted), "
                "so it takes no new members; ask for an invite to another organization",
            )
        if outcome == "member":
            raise AuthError(409, "ALREADY_MEMBER", "you are already a member of this organization")
        log.info("user %s joined organization %s as %s", user_id, row.org_id, row.role)
        return JSONResponse({"orgId": row.org_id, "role": row.role}, headers=_NO_STORE)

    # -- membership changes ---------------------------------------------------------------------------------

    async def member(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        org_id = _path_id(request, "org_id")
        target_id = _path_id(request, "user_id")
        caller_id = str(claims["sub"])
        if request.method == "PATCH":
            role: str | None = self._role_field(await read_body(request))
        else:  # DELETE takes no body; a malformed one is refused rather than ignored
            await read_body(request, required=False)
            role = None
        async with self.core._store().transaction() as tx:
            _, me = await self._caller(tx, org_id, caller_id)
            target = await tx.membership(org_id, target_id)
            if target is None:
                raise AuthError(404, "MEMBER_NOT_FOUND", "that user is not a member of this organization")
            if target_id != caller_id or role is not None:
                self._check_manage(me.role, target.role, role)
            if target.role == "owner" and role != "owner" and await self._owners(tx, org_id) <= 1:
                raise _last_owner()
            if role is None:
                await tx.delete_membership(org_id, target_id)
            else:
                await tx.set_role(org_id, target_id, role)
        if role is None:
            log.info("user %s removed user %s from organization %s", caller_id, target_id, org_id)
            return Response(status_code=204, headers=_NO_STORE)
        log.info("user %s gave user %s the role %s in organization %s", caller_id, target_id, role, org_id)
        return JSONResponse({"userId": target_id, "role": role}, headers=_NO_STORE)

    def _check_manage(self, mine: str, theirs: str, new_role: str | None) -> None:
        if mine == "owner":
            return
        what = "remove this member" if new_role is None else "change this member's role"
        if mine != "admin" or theirs in _MANAGERS or new_role in _MANAGERS:
            raise _forbidden(what)

    @staticmethod
    async def _owners(tx: AuthTx, org_id: str) -> int:
        return sum(1 for m, _ in await tx.org_members(org_id) if m.role == "owner")

    async def leave(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        org_id = _path_id(request, "org_id")
        user_id = str(claims["sub"])
        await read_body(request, required=False)  # nothing to read, but a malformed body is refused
        async with self.core._store().transaction() as tx:
            _, me = await self._caller(tx, org_id, user_id)
            if me.role == "owner" and await self._owners(tx, org_id) <= 1:
                raise _last_owner()
            await tx.delete_membership(org_id, user_id)
        log.info("user %s left organization %s", user_id, org_id)
        return Response(status_code=204, headers=_NO_STORE)

    async def activate(self, request: Request) -> Response:
        """``{refreshToken}`` -> a new pair with this organization active (the refresh token rotates)."""
        org_id = _path_id(request, "org_id")
        body = await read_body(request)
        token = string_field(body, "refreshToken")
        return await self.core.rotate(token, org_id)
