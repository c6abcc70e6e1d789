// The sync connection, opened while Python finishes starting: the worker calls `preconnect(url)` once
// Pyodide is up and this tab owns the database, and the sync engine's first `new WebSocket(url)` (Python's
// offline/sync/browser_transport.py) gets that socket, already open, instead of a new one. Opening a
// WebSocket costs round trips (TCP, TLS, the HTTP upgrade) that otherwise start only once the app is ready.
// The wire protocol is unchanged: the client still speaks first (its handshake, from Python); the server
// says nothing before it, so a socket that heard anything (an error, a close) is never handed over (Python
// gets a new one and nothing it would read is lost). Messages that come after the hand-over go to Python's
// listeners, added in the same task as the hand-over. A server drops a connection that sends no handshake
// in time (its handshake_timeout, 5 s by default): a socket opened more than `within` ms ago is not handed
// over, and one nobody claimed by then is closed.
export const HAND_OVER_WITHIN_MS = 3000;

/**
 * Opens a WebSocket to `url` and has `scope.WebSocket` (the worker's global) hand it to the first
 * `new WebSocket(url)` within `within` ms; any other construction gets a new socket, and the global is the
 * browser's own again after the first one. Returns `{ socket, discard }` (`discard()`: close it unless
 * handed over, as when the app could not start), or null when no socket could be opened. `report(what)` is
 * told "opened", "handed-over", "replaced" (Python got a new socket) or "closed" (nobody claimed it).
 */
export function preconnect(
  url,
  { scope = globalThis, within = HAND_OVER_WITHIN_MS, now = () => performance.now(), report = () => {} } = {},
) {
  const Native = scope.WebSocket;
  if (!url || typeof Native !== "function") return null;
  let early;
  try {
    early = new Native(url);
  } catch {
    return null; // (not a ws:// or wss:// URL: Python reports it when it tries)
  }
  const opened = now();
  let heard = false; // a message or a close before the hand-over: the socket is not what Python expects
  let state = "waiting"; // then "handed-over", "replaced" or "closed"
  const spoiled = () => {
    heard = true;
  };
  const onOpen = () => report("opened");
  early.addEventListener("open", onOpen);
  early.addEventListener("message", spoiled);
  early.addEventListener("close", spoiled);

  function restore() {
    clearTimeout(timer);
    early.removeEventListener("open", onOpen);
    early.removeEventListener("message", spoiled);
    early.removeEventListener("close", spoiled);
    if (scope.WebSocket === HandOver) scope.WebSocket = Native;
  }

  function settle(outcome) {
    restore();
    state = outcome;
    report(outcome);
  }

  function discard() {
    if (state !== "waiting") return;
    early.close();
    settle("closed");
  }

  // A constructor returning an object: `new WebSocket(...)` is that object.
  function HandOver(target, protocols) {
    if (state !== "waiting") return protocols === undefined ? new Native(target) : new Native(target, protocols);
    const fresh = heard || target !== url || protocols !== undefined || now() - opened > within;
    if (fresh || early.readyState > Native.OPEN) {
      early.close();
      settle("replaced");
      return protocols === undefined ? new Native(target) : new Native(target, protocols);
    }
    settle("handed-over");
    // Its open event has passed: it is told again once the code that asked has added its listeners (in
    // the same run: Python's transport listens right after construction) and before any later event (a
    // message or a close is a task of its own, after this microtask).
    if (early.readyState === Native.OPEN) {
      queueMicrotask(() => {
        if (early.readyState === Native.OPEN) early.dispatchEvent(new Event("open"));
      });
    }
    return early;
  }
  HandOver.prototype = Native.prototype;
  for (const name of ["CONNECTING", "OPEN", "CLOSING", "CLOSED"]) HandOver[name] = Native[name];
  scope.WebSocket = HandOver;
  const timer = setTimeout(discard, within);
  return { socket: early, discard };
}
