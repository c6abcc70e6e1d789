"""Organizations on the client: create, invite, accept, leave, manage members, and the active organization.

The access token carries ``orgs`` and, for the active organization, ``orgId`` and ``role``; a sync scope
bound to ``orgId`` then follows the active organization. ``activate_org(id)`` switches it (a refresh), and
the server checks membership again at every refresh and sync handshake.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from .errors import INVALID_INPUT, AuthError
from .http import HttpResponse

__all__ = ["OrgMethods"]


def _id(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 64:
        raise AuthError(
            f"{name} must be an id string (at most 64 characters)", INVALID_INPUT, {"field": name}
        )
    return urllib.parse.quote(value, safe="")


class OrgMethods:
    """Organization methods of `OfflineAuth` (a mixin; the session plumbing comes from the client)."""

    async def _authed(self, method: str, path: str, body: dict[str, Any] | None = None) -> HttpResponse:
        raise NotImplementedError  # provided by OfflineAuth

    def _body_of(self, response: HttpResponse) -> dict[str, Any]:
        raise NotImplementedError  # provided by OfflineAuth

    async def _rotate_with_org(self, org_id: str | None) -> None:
        raise NotImplementedError  # provided by OfflineAuth

    @property
    def claims(self) -> dict[str, Any]:
        raise NotImplementedError  # provided by OfflineAuth

    @property
    def active_org(self) -> dict[str, Any] | None:
        """``{"id", "role"}`` of the active organization according to the current token, or None."""
        claims = self.claims
        org_id = claims.get("orgId")
        return {"id": org_id, "role": claims.get("role")} if isinstance(org_id, str) else None

    async def create_org(self, name: str) -> dict[str, Any]:
        """Create an organization (you become its owner): ``{"id", "name", "role", "createdAt"}``."""
        if not isinstance(name, str) or not name.strip():
            raise AuthError("name must be a non-empty string", INVALID_INPUT, {"field": "name"})
        return self._body_of(await self._authed("POST", "/orgs", {"name": name}))

    async def list_orgs(self) -> list[dict[str, Any]]:
        """Your organizations: ``[{"id", "name", "role", "createdAt"}]``."""
        orgs = self._body_of(await self._authed("GET", "/orgs")).get("orgs")
        return list(orgs) if isinstance(orgs, list) else []

    async def org_members(self, org_id: str) -> list[dict[str, Any]]:
        """``[{"userId", "email", "role", "joinedAt"}]`` of an organization you belong to."""
        members = self._body_of(await self._authed("GET", f"/orgs/{_id(org_id, 'org_id')}/members")).get(
            "members"
        )
        return list(members) if isinstance(members, list) else []

    async def invite_member(self, org_id: str, email: str, role: str = "member") -> dict[str, Any]:
        """Invite someone by email (owners and admins). Returns ``{"inviteToken", "email", "role",
        "expiresIn", "orgId"}``: send the token to the invitee yourself (the server sends no email)."""
        body = {"email": email, "role": role}
        return self._body_of(await self._authed("POST", f"/orgs/{_id(org_id, 'org_id')}/invites", body))

    async def accept_invite(self, invite_token: str) -> dict[str, Any]:
        """Join with an invite meant for your email: ``{"orgId", "role"}``. Call `activate_org` to use it."""
        if not isinstance(invite_token, str) or not invite_token:
            raise AuthError(
                "invite_token must be the token from the invite", INVALID_INPUT, {"field": "inviteToken"}
            )
        return self._body_of(await self._authed("POST", "/invites/accept", {"inviteToken": invite_token}))

    async def leave_org(self, org_id: str) -> None:
        await self._authed("POST", f"/orgs/{_id(org_id, 'org_id')}/leave", {})

    async def remove_member(self, org_id: str, user_id: str) -> None:
        await self._authed("DELETE", f"/orgs/{_id(org_id, 'org_id')}/members/{_id(user_id, 'user_id')}")

    async def set_member_role(self, org_id: str, user_id: str, role: str) -> dict[str, Any]:
        path = f"/orgs/{_id(org_id, 'org_id')}/members/{_id(user_id, 'user_id')}"
        return self._body_of(await self._authed("PATCH", path, {"role": role}))

    async def activate_org(self, org_id: str | None) -> dict[str, Any] | None:
        """Make ``org_id`` the active organization of this session (None: no active organization); the
        tokens are refreshed at once, and the next sync handshake uses the new scope. Returns `active_org`."""
        if org_id is not None:
            _id(org_id, "org_id")
        await self._rotate_with_org(org_id)
        return self.active_org
