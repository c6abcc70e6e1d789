"""`offline users list|show|disable|enable|sign-out|delete|audit`: a running server's user administration.

Thin over the admin API (``server_runtime.user_admin``): tables (or ``--json``) on stdout, what happened on
stderr, and errors that say what to do next. Every command takes ``--url`` and ``--token`` (default
``$OFFLINE_ADMIN_TOKEN``), like ``offline status``.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from ..environment import Environment, current_environment
from .remote import TOKEN_HELP, URL_HELP, RemoteError, _request_error, _token

_EXAMPLES = """\b
Examples:
  offline users list --url https://myapp.fly.dev --token "$TOKEN"
  offline users list --query @example.com --json | jq -r '.users[].id'
  offline users show 0192f0c4-... --url https://myapp.fly.dev
  offline users disable 0192f0c4-... --reason "spam"
  offline users enable 0192f0c4-...
  offline users sign-out 0192f0c4-...
  offline users delete 0192f0c4-... --confirm
  offline users audit --user 0192f0c4-... --kind sign-in-failed
"""


def _common(command: Any) -> Any:
    for option in reversed(
        [
            click.option("--url", default="http://localhost:3001", show_default=True, help=URL_HELP),
            click.option("--token", default=None, help=TOKEN_HELP),
            click.option(
                "--timeout", default=10.0, show_default=True, help="Seconds to wait for the server."
            ),
        ]
    ):
        command = option(command)
    return command


def _error_of(response: Any) -> tuple[str, str]:
    try:
        body = response.json()
    except ValueError:
        return "", ""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("code", "")), str(error.get("message", ""))
    if isinstance(error, str):
        return error, str(body.get("message", ""))
    return "", ""


def _call(
    method: str, url: str, path: str, token: str | None, timeout: float, **kwargs: Any
) -> dict[str, Any]:
    import httpx

    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, base + path, headers=headers, timeout=timeout, **kwargs)
    except httpx.HTTPError as exc:
        raise _request_error(base, exc, timeout) from None
    if response.status_code < 400:
        data: dict[str, Any] = response.json()
        return data
    code, message = _error_of(response)
    status = response.status_code
    if status == 401:
        raise RemoteError(
            f"{base} refused the token (401): pass --token or set OFFLINE_ADMIN_TOKEN to the server's admin token"
        )
    if code == "ADMIN_TOKEN_REQUIRED":
        raise RemoteError(
            f"{base} has no admin token set: set OFFLINE_ADMIN_TOKEN on the server, then pass it here"
        )
    if code == "USER_NOT_FOUND":
        raise RemoteError("no user with this id; find it with `offline users list --query <email>`")
    if status == 429:
        wait = response.headers.get("Retry-After", "a few")
        raise RemoteError(
            f"{base} refused: too many wrong tokens from this address; wait {wait} s and check --token"
        )
    if status == 404:
        raise RemoteError(
            f"{base} has no user administration: is it an offline server with auth on (AUTH_SECRET set)?"
        )
    detail = f"{code}: {message}" if code else response.text[:200]
    raise RemoteError(f"{base} answered HTTP {status}: {detail}")


def _emit_json(env: Environment, data: Any) -> None:
    env.stdout.write(json.dumps(data, indent=2) + "\n")
    env.stdout.flush()


def _disabled_text(user: dict[str, Any]) -> str:
    mark = user.get("disabled")
    if not mark:
        return "no"
    reason = f" ({mark['reason']})" if mark.get("reason") else ""
    return f"since {mark.get('at')}{reason}"


def _say(env: Environment, text: str) -> None:
    env.err.print(text, highlight=False)


@click.group(epilog=_EXAMPLES)
def users() -> None:
    """Administer a running server's users: list, show, disable, enable, sign out, delete; read the audit log.

    Needs the server's admin token (--token or $OFFLINE_ADMIN_TOKEN)."""


@users.command("list", epilog=_EXAMPLES)
@_common
@click.option("--query", "-q", default=None, help="Part of an email, or a user id.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500), help="Users per page.")
@click.option("--after", default=None, help="Start after this user id (the 'next' of the previous page).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON page (for scripts).")
def list_users(
    url: str,
    token: str | None,
    timeout: float,
    query: str | None,
    limit: int,
    after: str | None,
    as_json: bool,
) -> None:
    """List users in sign-up order, optionally searched by email or id."""
    env = current_environment()
    params: dict[str, Any] = {"limit": limit}
    if query:
        params["q"] = query
    if after:
        params["after"] = after
    data = _call("GET", url, "/__offline/users", _token(env, token), timeout, params=params)
    if as_json:
        _emit_json(env, data)
        return
    table = Table(title_justify="left")
    for column in ("id", "email", "created", "disabled"):
        table.add_column(column, overflow="fold")
    for user in data.get("users", []):
        table.add_row(user["id"], user.get("email") or "-", user.get("createdAt", ""), _disabled_text(user))
    env.out.print(table)
    if data.get("next"):
        _say(env, f"more users: add --after {data['next']}")
    elif not data.get("users"):
        _say(env, "no users found" + (f" matching {query!r}" if query else ""))


@users.command(epilog=_EXAMPLES)
@_common
@click.argument("user_id")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON (for scripts).")
def show(url: str, token: str | None, timeout: float, user_id: str, as_json: bool) -> None:
    """Show one user: sessions, devices (node ids), sign-in methods, organizations."""
    env = current_environment()
    data = _call("GET", url, f"/__offline/users/{user_id}", _token(env, token), timeout)
    if as_json:
        _emit_json(env, data)
        return
    table = Table(show_header=False, title=f"user {data['id']}", title_justify="left")
    table.add_column("what")
    table.add_column("value", overflow="fold")
    mfa = data.get("mfa") or {}
    for row in (
        ("email", data.get("email") or "-"),
        ("email verified", "yes" if data.get("emailVerified") else "no"),
        ("created", data.get("createdAt", "")),
        ("disabled", _disabled_text(data)),
        ("providers", ", ".join(data.get("providers") or []) or "-"),
        ("TOTP", "on" if mfa.get("totp") else "off"),
        ("passkeys", str(mfa.get("passkeys", 0))),
        ("organizations", ", ".join(f"{o['id']} ({o['role']})" for o in data.get("orgs") or []) or "-"),
        ("devices", "\n".join(data.get("devices") or []) or "-"),
    ):
        table.add_row(*row)
    env.out.print(table)
    sessions = Table(title="sessions", title_justify="left")
    for column in ("id", "created", "state"):
        sessions.add_column(column, overflow="fold")
    for s in data.get("sessions") or []:
        state = "live" if s.get("live") else f"revoked {s.get('revokedAt')} ({s.get('revokedReason')})"
        sessions.add_row(s["id"], s.get("createdAt", ""), state)
    env.out.print(sessions)


def _action(
    path: str, user_id: str, url: str, token: str | None, timeout: float, as_json: bool, body: Any = None
) -> dict[str, Any]:
    env = current_environment()
    method = "DELETE" if path == "" else "POST"
    suffix = f"/{path}" if path else ""
    kwargs: dict[str, Any] = {} if body is None else {"json": body}
    data = _call(method, url, f"/__offline/users/{user_id}{suffix}", _token(env, token), timeout, **kwargs)
    if as_json:
        _emit_json(env, data)
    return data


_JSON = click.option("--json", "as_json", is_flag=True, help="Print the server's JSON answer on stdout.")


@users.command(epilog=_EXAMPLES)
@_common
@click.argument("user_id")
@click.option("--reason", default="", help="Why (kept with the mark and in the audit log).")
@_JSON
def disable(url: str, token: str | None, timeout: float, user_id: str, reason: str, as_json: bool) -> None:
    """Disable a user: revoke every session, close their live sync connections, refuse sign-in and sync."""
    data = _action("disable", user_id, url, token, timeout, as_json, {"reason": reason})
    env = current_environment()
    if data.get("changed"):
        _say(env, f"disabled user {user_id}; {data.get('sessionsRevoked', 0)} session(s) revoked")
    else:
        _say(env, f"user {user_id} was already disabled; {data.get('sessionsRevoked', 0)} session(s) revoked")


@users.command(epilog=_EXAMPLES)
@_common
@click.argument("user_id")
@_JSON
def enable(url: str, token: str | None, timeout: float, user_id: str, as_json: bool) -> None:
    """Enable a disabled user again (they sign in anew: their old sessions stay revoked)."""
    data = _action("enable", user_id, url, token, timeout, as_json)
    env = current_environment()
    _say(env, f"enabled user {user_id}" if data.get("changed") else f"user {user_id} was not disabled")


@users.command("sign-out", epilog=_EXAMPLES)
@_common
@click.argument("user_id")
@_JSON
def sign_out(url: str, token: str | None, timeout: float, user_id: str, as_json: bool) -> None:
    """Sign a user out everywhere: revoke every session and close their live sync connections."""
    data = _action("sign-out", user_id, url, token, timeout, as_json)
    _say(
        current_environment(),
        f"signed out user {user_id}: {data.get('sessionsRevoked', 0)} session(s) revoked",
    )


@users.command(epilog=_EXAMPLES)
@_common
@click.argument("user_id")
@click.option("--confirm", is_flag=True, help="Required: deleting cannot be undone.")
@_JSON
def delete(url: str, token: str | None, timeout: float, user_id: str, confirm: bool, as_json: bool) -> None:
    """Delete a user's account and auth data (sessions, sign-in methods); the records they synced stay."""
    if not confirm:
        raise click.UsageError(
            f"deleting user {user_id} cannot be undone; run again with --confirm "
            "(or `offline users disable` to keep the account but lock it)"
        )
    data = _action("", user_id, url, token, timeout, as_json)
    _say(current_environment(), f"deleted user {user_id}; {data.get('kept', '')}")


@users.command(epilog=_EXAMPLES)
@_common
@click.option("--user", "user_id", default=None, help="Only entries about (or by) this user id.")
@click.option(
    "--kind", default=None, help="Only these kinds, comma-separated (e.g. sign-in-failed,user-disabled)."
)
@click.option(
    "--since", default=None, help="Only entries from this time (ISO 8601, e.g. 2026-01-31T00:00:00Z)."
)
@click.option(
    "--limit", default=100, show_default=True, type=click.IntRange(1, 500), help="Entries per page."
)
@click.option("--before", default=None, help="Entries older than this entry id (the 'next' of a page).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON page (for scripts).")
def audit(
    url: str,
    token: str | None,
    timeout: float,
    user_id: str | None,
    kind: str | None,
    since: str | None,
    limit: int,
    before: str | None,
    as_json: bool,
) -> None:
    """Read the audit log of security events, newest first."""
    env = current_environment()
    params = {
        k: v
        for k, v in {"user": user_id, "kind": kind, "since": since, "limit": limit, "before": before}.items()
        if v is not None
    }
    data = _call("GET", url, "/__offline/audit", _token(env, token), timeout, params=params)
    if as_json:
        _emit_json(env, data)
        return
    table = Table(title_justify="left")
    for column in ("at", "kind", "actor", "subject", "address", "detail"):
        table.add_column(column, overflow="fold")
    for entry in data.get("entries", []):
        detail = ", ".join(f"{k}={v}" for k, v in (entry.get("detail") or {}).items())
        table.add_row(
            entry.get("at", ""),
            entry.get("kind", ""),
            entry.get("actor") or "-",
            entry.get("subject") or "-",
            entry.get("address") or "-",
            detail,
        )
    env.out.print(table)
    if data.get("next"):
        _say(env, f"older entries: add --before {data['next']}")
