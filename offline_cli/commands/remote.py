"""`offline status`, `offline logs` and `offline compact`: a running server's operational endpoints."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import click
from rich.table import Table

from ..environment import Environment, current_environment

TOKEN_HELP = "Admin token (default: $OFFLINE_ADMIN_TOKEN)."
URL_HELP = "Server URL, e.g. https://myapp.fly.dev (default: http://localhost:3001)."
FOLLOW_IDLE_TIMEOUT = 15.0  # seconds of silence after which a followed event stream counts as dead


class RemoteError(click.ClickException):
    pass


def _token(env: Environment, token: str | None) -> str | None:
    return token or env.getenv("OFFLINE_ADMIN_TOKEN") or None


def _request_error(url: str, exc: Exception, timeout: float, read: float | None = None) -> RemoteError:
    import httpx

    if isinstance(exc, httpx.ConnectError):
        return RemoteError(f"cannot connect to {url}: is the server running, and is the URL right?")
    if isinstance(exc, httpx.TimeoutException):
        waited = read if read is not None and isinstance(exc, httpx.ReadTimeout) else timeout
        return RemoteError(
            f"{url} did not answer within {waited:g} s; check the URL or pass a larger --timeout"
        )
    return RemoteError(f"request to {url} failed: {exc}")


def _check(response: Any, url: str) -> None:
    if response.status_code == 401:
        raise RemoteError(
            f"{url} refused the token (401): pass --token or set OFFLINE_ADMIN_TOKEN to the server's admin token"
        )
    if response.status_code >= 400:
        raise RemoteError(f"{url} answered HTTP {response.status_code}: {response.text[:200]}")


@click.command(
    epilog="""\b
Examples:
  offline status --url http://localhost:3001
  OFFLINE_ADMIN_TOKEN=... offline status --url https://myapp.fly.dev
  offline status --url https://myapp.fly.dev --token "$TOKEN" --json | jq .connectedClients
"""
)
@click.option("--url", default="http://localhost:3001", show_default=True, help=URL_HELP)
@click.option("--token", default=None, help=TOKEN_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the raw status JSON (for scripts).")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for the server.")
def status(url: str, token: str | None, as_json: bool, timeout: float) -> None:
    """Show a running server's status: clients, operations, store, uptime."""
    import httpx

    env = current_environment()
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {tok}"} if (tok := _token(env, token)) else {}
    try:
        response = httpx.get(f"{base}/__offline/status", headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise _request_error(base, exc, timeout) from None
    _check(response, base)
    data = response.json()
    if as_json:
        env.stdout.write(json.dumps(data, indent=2) + "\n")
        env.stdout.flush()
        return
    out = env.out
    table = Table(title=f"offline server at {base}", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    ops = data.get("operations", {})
    rows = [
        ("status", str(data.get("status"))),
        ("version", str(data.get("version"))),
        ("uptime", f"{data.get('uptime', 0):.0f} s"),
        ("store", str(data.get("store"))),
        ("schema version", str(data.get("schemaVersion"))),
        ("connected clients", str(data.get("connectedClients"))),
        ("operations stored", str(ops.get("stored"))),
        ("received / accepted / sent", f"{ops.get('received')} / {ops.get('accepted')} / {ops.get('sent')}"),
        ("rejected", ", ".join(f"{k}: {v}" for k, v in (ops.get("rejected") or {}).items()) or "0"),
        ("records", ", ".join(f"{k}: {v}" for k, v in (data.get("records") or {}).items()) or "0"),
    ]
    for row in rows:
        table.add_row(*row)
    out.print(table)
    clients = data.get("clients") or []
    if clients:
        ctable = Table(title="clients", title_justify="left")
        for column in ("node", "connected", "received", "rejected"):
            ctable.add_column(column)
        for client in clients:
            ctable.add_row(
                client["nodeId"],
                time.strftime("%H:%M:%S", time.localtime(client["connectedAt"])),
                str(client["received"]),
                str(client["rejected"]),
            )
        out.print(ctable)


def _events(response: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    kind = "message"
    for line in response.iter_lines():
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            try:
                yield kind, json.loads(line[5:].strip())
            except ValueError:
                continue
        elif not line:
            kind = "message"


def format_event(kind: str, data: dict[str, Any]) -> str | None:
    stamp = time.strftime("%H:%M:%S", time.localtime(data.get("time", time.time())))
    if kind == "log":
        return f"{stamp} {data.get('level', 'info').upper():7} {data.get('logger', '')}: {data.get('message', '')}"
    if kind == "operation":
        op = data.get("operation", {})
        return f"{stamp} OP      #{data.get('delivery')} {op.get('type')} {op.get('collection')}/{op.get('recordId')}"
    if kind == "rejected":
        return f"{stamp} REJECT  {data.get('operationId')} {data.get('code')}: {data.get('message')}"
    if kind == "conflict":
        return f"{stamp} CONFLICT {data.get('collection')}.{data.get('field')} ({data.get('strategy')}, tier {data.get('tier')})"
    if kind == "connection":
        return f"{stamp} CLIENT  {data.get('nodeId')} {data.get('state')}"
    if kind == "audit":
        return f"{stamp} AUDIT   {data.get('kind')} user={data.get('subject')} by={data.get('actor')} from={data.get('address')}"
    return None


@click.command(
    epilog="""\b
Examples:
  offline logs --url http://localhost:3001
  offline logs --url https://myapp.fly.dev --token "$TOKEN" --no-follow
"""
)
@click.option("--url", default="http://localhost:3001", show_default=True, help=URL_HELP)
@click.option("--token", default=None, help=TOKEN_HELP)
@click.option("--follow/--no-follow", default=True, show_default=True, help="Keep streaming new events.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event (NDJSON).")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for the server to answer.")
def logs(url: str, token: str | None, follow: bool, as_json: bool, timeout: float) -> None:
    """Stream a running server's log records and events (from /__offline/events)."""
    import httpx

    env = current_environment()
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {tok}"} if (tok := _token(env, token)) else {}
    # Following, the stream may idle between events, but the server sends a status event at least every 5 s:
    # longer silence means a server (or connection) that is not answering, never a reason to hang forever.
    read = max(timeout, FOLLOW_IDLE_TIMEOUT) if follow else timeout
    timeouts = httpx.Timeout(timeout, read=read)
    try:
        with httpx.stream("GET", f"{base}/__offline/events", headers=headers, timeout=timeouts) as response:
            _check(response, base)
            for kind, data in _events(response):
                if kind == "ready":
                    if not follow:
                        return
                    continue
                if kind == "status":
                    continue
                if as_json:
                    env.stdout.write(json.dumps({"event": kind, **data}) + "\n")
                else:
                    line = format_event(kind, data)
                    if line is None:
                        continue
                    env.stdout.write(line + "\n")
                env.stdout.flush()
    except httpx.HTTPError as exc:
        raise _request_error(base, exc, timeout, read) from None
    except KeyboardInterrupt:
        return


@click.command(
    epilog="""\b
Examples:
  offline compact --url http://localhost:3001 --token "$OFFLINE_ADMIN_TOKEN"
  OFFLINE_ADMIN_TOKEN=... offline compact --url https://myapp.fly.dev
  offline compact --url https://myapp.fly.dev | jq .dropped

\b
Deletes the stored operations already folded into the server's records, except each
record's latest and each node's highest; clients that were offline since are sent
record states instead (see the README, "Compaction").
"""
)
@click.option("--url", default="http://localhost:3001", show_default=True, help=URL_HELP)
@click.option("--token", default=None, help=TOKEN_HELP)
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for the compaction.")
def compact(url: str, token: str | None, timeout: float) -> None:
    """Compact a running server's operation log (prints {"horizon", "dropped", "kept"} as JSON)."""
    import httpx

    env = current_environment()
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {tok}"} if (tok := _token(env, token)) else {}
    env.err.print(f"compacting the operation log of {base} ...", highlight=False)
    try:
        response = httpx.post(f"{base}/__offline/compact", headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise _request_error(base, exc, timeout) from None
    if response.status_code == 409:
        raise RemoteError(f"{base} is compacting already; run this again once that ends")
    if response.status_code == 429:
        wait = response.headers.get("Retry-After", "a few")
        raise RemoteError(
            f"{base} refused: too many wrong tokens from this address; wait {wait} s and check --token"
        )
    if response.status_code == 404:
        raise RemoteError(f"{base} has no /__offline/compact: is it an offline server of this version?")
    _check(response, base)
    data = response.json()
    env.err.print(
        f"deleted {data.get('dropped')} operations up to delivery {data.get('horizon')}; kept {data.get('kept')}",
        highlight=False,
    )
    env.stdout.write(json.dumps(data) + "\n")
    env.stdout.flush()
