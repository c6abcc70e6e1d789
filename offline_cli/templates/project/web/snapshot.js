// A fresh browser's first sync as one file (issue 28): the server builds the replica's SQLite database
// itself, with the same `offline` library (POST <sync path>/snapshot, server_runtime/snapshot.py), while
// this worker is still loading Pyodide (seconds in which the network is idle), and the worker writes that
// file as its database before Python opens it. Adopting the same records from the socket's record-states
// messages takes Python in WebAssembly a second or more after the app is ready. Any answer but a whole
// snapshot (204: no snapshot worth building or another library version; 401: the server wants a sign-in,
// which only Python can give; an error, a network failure) leaves the database new: the sync engine's first
// sync over the socket runs as it always did, and the page is told nothing.

// The snapshot layout this client reads (offline/sync/snapshot.py FORMAT).
export const FORMAT = 4;
// Held back and written last: the first page of a database of any page size (at most 64 KB) is in it, so a
// file whose writing was cut short starts with zeros (see storage.js, which empties such a file).
export const HEAD = 65536;
// How long the server may take to answer (it builds the file first), and the body to go on arriving.
export const ANSWER_WAIT_MS = 30_000;
const MAGIC = new TextEncoder().encode("SQLite format 3\0");

// The snapshot endpoint of the sync URL in the config: only a path on this page's origin ("/offline-sync"
// -> "/offline-sync/snapshot"); a URL of another server is left alone (its answer would need that server to
// allow this page's origin, and the app may not be the only client of it).
export function snapshotUrl(syncUrl, base) {
  if (typeof syncUrl !== "string" || !syncUrl.startsWith("/") || syncUrl.startsWith("//")) return null;
  const url = new URL(syncUrl, base);
  url.pathname = `${url.pathname.replace(/\/+$/, "")}/snapshot`;
  return url.href;
}

// What the request says (the fields the server checks before building anything), or null when this build
// cannot say it: a config.js without the library or schema version (written by an older build). A sync
// scope set in the config's syncOptions is a map of scope values, which the handshake turns into the
// per-collection filters it sends with the schema's bindings (offline.core.scopes.build_scope_map), known
// only to Python: a snapshot of another scope would make the sync engine start over, so none is asked.
export function snapshotRequest(config) {
  const scope = config.syncOptions && config.syncOptions.scope;
  if (scope && Object.keys(scope).length) return null;
  if (typeof config.offlineVersion !== "string" || !Number.isInteger(config.schemaVersion)) return null;
  return { format: FORMAT, offline: config.offlineVersion, schemaVersion: config.schemaVersion, syncScope: null };
}

const sameBytes = (a, b) => a.length === b.length && a.every((byte, i) => byte === b[i]);

// Throws unless `head` (the first bytes of `received` bytes that came) is a SQLite database's header and
// the bytes that came are as many as its pages.
function checkHeader(head, received) {
  checkMagic(head);
  const view = new DataView(head.buffer, head.byteOffset, head.byteLength);
  const raw = view.getUint16(16);
  const pageSize = raw === 1 ? 65536 : raw;
  if (pageSize < 512 || pageSize & (pageSize - 1)) throw new Error(`the database's page size ${raw} is not valid`);
  // The page count in the header counts when the change counter (offset 24) equals the version it was
  // written by (offset 92): then a file cut short (a broken download) is told apart from a whole one.
  const pages = view.getUint32(24) === view.getUint32(92) ? view.getUint32(28) : 0;
  const expected = pages ? pages * pageSize : received - (received % pageSize);
  if (received !== expected || received === 0) throw new Error(`${received} bytes received of a ${expected}-byte database`);
}

// Reads the body of `response` into `writer` (storage.js's snapshotWriter()): every byte from HEAD on is
// written as it arrives (a 50,000-record database is 75 MB: never held whole in this worker), the first
// HEAD bytes once the rest is stored. Throws if what came is not a whole SQLite database, or stopped coming
// for `stallMs`.
async function receive(response, writer, stallMs) {
  const head = new Uint8Array(HEAD);
  const reader = response.body.getReader();
  let at = 0;
  let stalled = null;
  let timer = null;
  try {
    for (;;) {
      timer = setTimeout(() => {
        stalled = new Error(`the snapshot stopped arriving for ${stallMs / 1000} s`);
        reader.cancel(stalled).catch(() => {});
      }, stallMs);
      const { done, value } = await reader.read();
      clearTimeout(timer);
      if (stalled) throw stalled;
      if (done) break;
      let bytes = value;
      if (at < HEAD) {
        const n = Math.min(HEAD - at, bytes.length);
        head.set(bytes.subarray(0, n), at);
        bytes = bytes.subarray(n);
        // (A wrong answer is dropped at its first bytes, before anything of it is stored.)
        if (at < MAGIC.length && at + n >= MAGIC.length) checkMagic(head);
        at += n;
      }
      if (bytes.length) {
        writer.write(bytes, at);
        at += bytes.length;
      }
    }
  } catch (error) {
    clearTimeout(timer);
    reader.cancel(error).catch(() => {});
    throw error;
  }
  if (at < 100) throw new Error(`${at} bytes received: not a database`);
  checkHeader(head, at);
  await writer.commit(head.subarray(0, Math.min(at, HEAD)), at);
  return at;
}

function checkMagic(head) {
  if (!sameBytes(head.subarray(0, MAGIC.length), MAGIC)) throw new Error("the answer is not a SQLite database");
}

// Downloads the server's replica of this app's database into `storage` (storage.js; or a promise of it)
// when nothing is stored yet, and resolves true once the file is whole there (durably), else false (nothing
// stored: the database is new, synced over the socket). `fresh` (a promise): whether a first look found
// nothing stored (storage.js's nothingStored), which lets the request go out before the storage is open;
// the open storage's `empty` has the last word before anything is written. `report(stage)`: the startup
// stages, for the page's timings. Rejects only when what was partly written could not be removed again
// (the storage is failing: the app could not open it either).
export async function loadSnapshot(
  config,
  fresh,
  storage,
  { fetch = self.fetch.bind(self), base = self.location.href, report = () => {}, waitMs = ANSWER_WAIT_MS } = {},
) {
  if (!(await fresh)) return false;
  const url = snapshotUrl(config.syncUrl, base);
  const body = url && snapshotRequest(config);
  if (!body) return false;
  const declined = (why) => {
    console.info(`no snapshot of the server's data (${why}): the first sync runs over the sync connection`);
    report("snapshot-declined");
    return false;
  };
  report("snapshot-requested");
  const controller = new AbortController();
  const answered = setTimeout(() => controller.abort(new Error(`no answer in ${waitMs / 1000} s`)), waitMs);
  let response;
  try {
    // (No token: the browser signs in through Python, later; a server that needs one answers 401.)
    response = await fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      cache: "no-store",
      credentials: "same-origin",
      signal: controller.signal,
    });
  } catch (error) {
    return declined(String((error && error.message) || error));
  } finally {
    clearTimeout(answered);
  }
  const format = response.headers.get("X-Offline-Snapshot-Format");
  if (response.status !== 200 || format !== String(FORMAT)) {
    if (response.body) response.body.cancel().catch(() => {});
    return declined(response.status === 200 ? `snapshot format ${format}` : `HTTP ${response.status}`);
  }
  report("snapshot-answered");
  let opened = null;
  try {
    opened = await storage;
  } catch {
    // (main reports why the storage did not open)
  }
  if (!opened || !opened.empty) {
    response.body.cancel().catch(() => {});
    return declined("a database is stored already");
  }
  const writer = opened.snapshotWriter();
  try {
    await receive(response, writer, waitMs);
  } catch (error) {
    await writer.discard(); // (throws when the storage cannot be written: the start fails as it would)
    return declined(String((error && error.message) || error));
  }
  report("snapshot-written");
  return true;
}
