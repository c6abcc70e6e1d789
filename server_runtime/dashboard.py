"""The built-in dashboard at `/__offline`: a self-contained page (no external requests) that signs in with the
admin token and follows `/__offline/events` live.

Signing in exchanges the admin token for a random session id (`dashboard_sessions`) in an HttpOnly,
SameSite=Strict cookie, Secure when the page came over https; signing out removes the session on the server,
so the cookie is worthless afterwards even if a copy of it survives. Wrong tokens typed into the form count
towards the same per-address limit as wrong Bearer tokens (`operational.OperationalAuth.check`).
"""

from __future__ import annotations

import html
import urllib.parse
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from .auth.rate_limit import retry_after_header
from .client_address import POLICY_KEY, ProxyPolicy
from .operational import COOKIE, SESSION_ENDED, _same

if TYPE_CHECKING:
    from .operational import Operational

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>offline · sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;background:#0f172a;color:#e2e8f0;display:grid;place-items:center;height:100vh;margin:0}
form{background:#1e293b;padding:2rem;border-radius:12px;min-width:320px}
h1{font-size:1.2rem;margin-top:0}input{width:100%;padding:.6rem;margin:.6rem 0;border-radius:6px;border:1px solid #334155;background:#0f172a;color:#e2e8f0;box-sizing:border-box}
button{width:100%;padding:.6rem;border:0;border-radius:6px;background:#38bdf8;color:#0f172a;font-weight:600;cursor:pointer}
.err{color:#f87171;font-size:.9rem}
</style></head><body>
<form method="post" action="/__offline/login">
<h1>offline dashboard</h1>
<label for="token">Admin token (OFFLINE_ADMIN_TOKEN)</label>
<input id="token" name="token" type="password" autocomplete="current-password" autofocus required>
__ERROR__
<button id="signin" type="submit">Sign in</button>
</form></body></html>"""

DASHBOARD_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>offline · dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;background:#0f172a;color:#e2e8f0;margin:0;padding:1.5rem}
h1{font-size:1.3rem;margin:0 0 1rem} h2{font-size:1rem;color:#94a3b8;margin:1.2rem 0 .5rem}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:.8rem}
.card{background:#1e293b;border-radius:10px;padding:.8rem 1rem}.card b{display:block;font-size:1.5rem}
.card span{color:#94a3b8;font-size:.8rem}
table{width:100%;border-collapse:collapse;background:#1e293b;border-radius:10px;overflow:hidden;font-size:.85rem}
td,th{padding:.4rem .6rem;text-align:left;border-bottom:1px solid #334155}th{color:#94a3b8;font-weight:500}
.out{float:right;margin:0}.out button{padding:.35rem .8rem;border:1px solid #334155;border-radius:6px;background:#1e293b;color:#e2e8f0;cursor:pointer}
.live{color:#4ade80}.dead{color:#f87171}.mono{font-family:ui-monospace,monospace;font-size:.8rem}
</style></head><body>
<form class="out" method="post" action="/__offline/logout"><button id="signout" type="submit">Sign out</button></form>
<h1>offline server <span id="conn" class="dead">● connecting</span></h1>
<div class="cards">
<div class="card"><b id="clients">0</b><span>connected clients</span></div>
<div class="card"><b id="ops">0</b><span>operations stored</span></div>
<div class="card"><b id="rate">0</b><span>operations / s</span></div>
<div class="card"><b id="rejected">0</b><span>rejected</span></div>
<div class="card"><b id="store">-</b><span>store</span></div>
<div class="card"><b id="uptime">0</b><span>uptime (s)</span></div>
</div>
<h2>Clients</h2><table><thead><tr><th>node</th><th>connected</th><th>received</th><th>rejected</th></tr></thead><tbody id="clientRows"></tbody></table>
<h2>Recent operations</h2><table><thead><tr><th>delivery</th><th>type</th><th>collection</th><th>record</th><th>node</th></tr></thead><tbody id="opRows"></tbody></table>
<h2>Recent conflicts</h2><table><thead><tr><th>collection</th><th>field</th><th>strategy</th><th>tier</th></tr></thead><tbody id="conflictRows"></tbody></table>
<h2>Recent rejections</h2><table><thead><tr><th>operation</th><th>code</th><th>message</th></tr></thead><tbody id="rejectRows"></tbody></table>
<script>
(function(){
  const $ = (id) => document.getElementById(id);
  const cell = (text, mono) => { const td = document.createElement('td'); td.textContent = text; if (mono) td.className = 'mono'; return td; };
  const prepend = (tbody, cells, max) => { const tr = document.createElement('tr'); cells.forEach(c => tr.appendChild(c)); tbody.insertBefore(tr, tbody.firstChild); while (tbody.children.length > max) tbody.removeChild(tbody.lastChild); };
  let stored = 0, arrivals = [];
  function renderStatus(s) {
    $('clients').textContent = s.connectedClients; stored = s.operations.stored; $('ops').textContent = stored;
    $('rejected').textContent = Object.values(s.operations.rejected || {}).reduce((a, b) => a + b, 0);
    $('store').textContent = s.store; $('uptime').textContent = Math.round(s.uptime);
    const rows = $('clientRows'); rows.textContent = '';
    (s.clients || []).forEach(c => { const tr = document.createElement('tr');
      [cell(c.nodeId, true), cell(new Date(c.connectedAt * 1000).toLocaleTimeString()), cell(c.received), cell(c.rejected)].forEach(td => tr.appendChild(td)); rows.appendChild(tr); });
  }
  // Per-client counts come with the status snapshot: fetch one soon after activity (at most once a second)
  // instead of waiting for the next periodic status event.
  let refreshTimer = null;
  function refresh(delay) {
    if (refreshTimer !== null) return;
    refreshTimer = setTimeout(() => { refreshTimer = null;
      fetch('/__offline/status').then(r => r.ok ? r.json() : null).then(s => s && renderStatus(s)).catch(() => {}); }, delay);
  }
  const es = new EventSource('/__offline/events');
  es.onopen = () => { $('conn').textContent = '● live'; $('conn').className = 'live'; };
  es.onerror = () => { $('conn').textContent = '● reconnecting'; $('conn').className = 'dead'; };
  es.addEventListener('status', (e) => renderStatus(JSON.parse(e.data)));
  es.addEventListener('operation', (e) => { const d = JSON.parse(e.data); const op = d.operation; stored += 1; $('ops').textContent = stored;
    arrivals.push(Date.now()); prepend($('opRows'), [cell(d.delivery), cell(op.type), cell(op.collection), cell(op.recordId, true), cell(op.nodeId, true)], 50); refresh(1000); });
  es.addEventListener('conflict', (e) => { const d = JSON.parse(e.data); prepend($('conflictRows'), [cell(d.collection), cell(d.field), cell(d.strategy), cell(d.tier)], 20); });
  es.addEventListener('rejected', (e) => { const d = JSON.parse(e.data); prepend($('rejectRows'), [cell(d.operationId, true), cell(d.code), cell(d.message)], 20); refresh(1000); });
  es.addEventListener('connection', (e) => { const d = JSON.parse(e.data); if (!d.replay) refresh(0); });
  setInterval(() => { const now = Date.now(); arrivals = arrivals.filter(t => now - t < 5000); $('rate').textContent = (arrivals.length / 5).toFixed(1); }, 1000);
})();
</script></body></html>"""


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)


async def dashboard(request: Request, ops: Operational) -> Response:
    if request.headers.get("authorization"):
        refused = ops.auth.check(request, "admin")
        if refused is None:
            return _html(DASHBOARD_PAGE)
        if refused.status_code == 429:
            return refused
    elif ops.auth.allowed(request, "admin", cookie_ok=True):
        return _html(DASHBOARD_PAGE)
    if "text/html" in request.headers.get("accept", ""):
        return RedirectResponse("/__offline/login", status_code=303, headers=SECURITY_HEADERS)
    return Response(
        status_code=401, headers={"WWW-Authenticate": 'Bearer realm="offline"', **SECURITY_HEADERS}
    )


MAX_FORM_BYTES = 8192


async def _form_token(request: Request) -> str:
    """The `token` field of the sign-in form (application/x-www-form-urlencoded), read with the standard
    library: Starlette's `request.form()` needs python-multipart, which the server does not depend on."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return ""
    try:
        fields = urllib.parse.parse_qs(body.decode("utf-8"), max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        return ""
    values = fields.get("token") or [""]
    return values[0]


async def login_page(request: Request, ops: Operational) -> Response:
    return _html(LOGIN_PAGE.replace("__ERROR__", ""))


def _error_page(message: str, status: int, headers: dict[str, str] | None = None) -> HTMLResponse:
    # Escaped: the message is text, and a future caller may put request data (a path, a name) in it.
    page = LOGIN_PAGE.replace("__ERROR__", f'<p class="err" id="error">{html.escape(message)}</p>')
    response = _html(page, status=status)
    response.headers.update(headers or {})
    return response


async def login_submit(request: Request, ops: Operational) -> Response:
    token = await _form_token(request)
    expected = ops.auth.admin

    if expected is None:
        return RedirectResponse("/__offline", status_code=303, headers=SECURITY_HEADERS)
    wait = ops.auth.locked(request)
    if wait is not None:
        seconds = retry_after_header(wait)
        return _error_page(
            f"Too many wrong tokens from this address; try again in {seconds} s.",
            429,
            {"Retry-After": seconds},
        )
    if not token or not _same(token, expected):
        if token:
            ops.auth.failed(request)
        return _error_page("That token is not the admin token.", 401)
    response = RedirectResponse("/__offline", status_code=303, headers=SECURITY_HEADERS)
    # A fresh id for every sign-in: a cookie planted before sign-in never becomes a session.
    ops.auth.sessions.end(request.cookies.get(COOKIE))
    response.set_cookie(
        COOKIE,
        ops.auth.sessions.create(),
        httponly=True,
        samesite="strict",
        secure=_over_https(request),
        path="/__offline",
        max_age=max(1, int(ops.auth.sessions.ttl)),
    )
    return response


def _over_https(request: Request) -> bool:
    """Whether the browser reached us over https: directly, or through a trusted proxy (OFFLINE_TRUSTED_PROXIES)
    that terminated TLS and says so in X-Forwarded-Proto. Any hop saying https counts: a Secure cookie that
    never comes back costs a sign-in, a cookie without it that travels in clear costs the session."""
    if request.url.scheme == "https":
        return True
    policy = request.scope.get(POLICY_KEY)
    peer = request.client.host if request.client is not None else None
    if not isinstance(policy, ProxyPolicy) or peer is None or not policy.trusts_peer(peer):
        return False
    values = request.headers.getlist("x-forwarded-proto")
    return any(hop.strip().lower() == "https" for value in values for hop in value.split(","))


async def logout(request: Request, ops: Operational) -> Response:
    # POST only (its route): signing out changes state, so a GET (a link, an image or a prefetch on any page)
    # must not do it; other methods get 405 from server_runtime.operational_routes.
    ops.auth.sessions.end(request.cookies.get(COOKIE))
    ops.hub.nudge(SESSION_ENDED)  # live streams of that session end now, not at their next status tick
    response = RedirectResponse("/__offline/login", status_code=303, headers=SECURITY_HEADERS)
    response.delete_cookie(COOKIE, path="/__offline", httponly=True, samesite="strict")
    return response
