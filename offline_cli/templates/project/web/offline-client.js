// The page's handle on the app running in the worker: the same collections and queries as Python's
// `create_app`, as promises, plus live query results, sync status and the project's own functions.
//
//   const client = new OfflineClient();
//   await client.ready;
//   const todos = client.collection("todos");
//   await todos.insert({ title: "milk" });
//   const stop = todos.where({ done: false }).subscribe((records, changes) => render(records, changes));
//   await client.call("toggle_todo", id);          // a function of the project's actions module

// The message protocol of offline/worker.py this page speaks (its PROTOCOL_VERSION).
const PROTOCOL = 3;

export class OfflineError extends Error {
  constructor(message, code, context = {}) {
    super(message);
    this.name = "OfflineError";
    this.code = code;
    this.context = context;
  }
}

// Atomic updates: `todos.update(id, { votes: op.increment(1) })`.
export const op = {
  increment: (value = 1) => ({ $op: "increment", value }),
  decrement: (value = 1) => ({ $op: "decrement", value }),
  max: (value) => ({ $op: "max", value }),
  min: (value) => ({ $op: "min", value }),
  append: (value) => ({ $op: "append", value }),
  remove: (value) => ({ $op: "remove", value }),
};

class Query {
  constructor(client, collection, spec = {}) {
    this.client = client;
    this.collection = collection;
    this.spec = { where: {}, orderBy: [], limit: null, ...spec };
  }
  where(filters) {
    return new Query(this.client, this.collection, { ...this.spec, where: { ...this.spec.where, ...filters } });
  }
  orderBy(field, { desc = false } = {}) {
    return new Query(this.client, this.collection, { ...this.spec, orderBy: [...this.spec.orderBy, [field, desc]] });
  }
  limit(count) {
    return new Query(this.client, this.collection, { ...this.spec, limit: count });
  }
  fetch() {
    return this.client.request("fetch", { collection: this.collection, query: this.spec });
  }
  count() {
    return this.client.request("count", { collection: this.collection, query: this.spec });
  }
  async first() {
    const rows = await this.limit(1).fetch();
    return rows.length ? rows[0] : null;
  }
  // Calls `callback(records, changes)` now and after every change to the results; returns a function that
  // stops it. `records` is the whole results in the query's order (a new array each time); `changes` says
  // what this call changed: `{ inserted, updated, previous, removed }` (records: `previous` holds the updated
  // ones as they were before, `removed` the removed ones as they were) and `reset`
  // (true when the results were replaced as a whole, as on the first call). The worker sends only the
  // changed records, so a page can update just those rows (see app.js).
  subscribe(callback) {
    return this.client.subscribe(this.collection, this.spec, callback);
  }
}

class Collection extends Query {
  constructor(client, name) {
    super(client, name);
  }
  insert(data) {
    return this.client.request("insert", { collection: this.collection, data });
  }
  insertMany(items) {
    return this.client.request("insertMany", { collection: this.collection, items });
  }
  update(id, changes) {
    return this.client.request("update", { collection: this.collection, recordId: id, changes });
  }
  delete(id) {
    return this.client.request("delete", { collection: this.collection, recordId: id });
  }
  findById(id) {
    return this.client.request("findById", { collection: this.collection, recordId: id });
  }
  // Edits one rich text field (t.richtext()), merged with every other edit of it: see RichText.
  richtext(id, field) {
    return new RichText(this.client, this.collection, id, field);
  }
}

// The browser's side of Python's `collection.richtext(id, field)`: `insert(index, text)` and
// `delete(index, length)`, each resolving to the record as it is after the edit. Indices count characters
// (code points) as Python does, not UTF-16 units: [...text].length, not text.length.
class RichText {
  constructor(client, collection, id, field) {
    this.client = client;
    this.target = { collection, recordId: id, field };
  }
  insert(index, text) {
    return this.client.request("richtext", { ...this.target, edit: "insert", index, text });
  }
  delete(index, length) {
    return this.client.request("richtext", { ...this.target, edit: "delete", index, length });
  }
}

// -- live results --------------------------------------------------------------------------------------------
// The worker sends a live query's results once, then only what changed; the page keeps them in the query's
// order (then by id, as the worker's SQL does), comparing values the way SQLite does: null first, numbers
// and booleans (stored as 0/1), then text (JSON arrays are stored as their text).

// UTF-16 order differs from SQLite's (UTF-8 bytes, that is code points) only between surrogates and
// U+E000..U+FFFF: this ranks a code unit in code point order.
const unitRank = (c) => (c >= 0xd800 && c <= 0xdfff ? c + 0x2000 : c >= 0xe000 ? c - 0x800 : c);

function compareText(a, b) {
  if (a === b) return 0;
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x !== y) return unitRank(x) - unitRank(y);
  }
  return a.length - b.length;
}

const typeRank = (v) => (v === null || v === undefined ? 0 : typeof v === "number" || typeof v === "boolean" ? 1 : 2);

function compareValues(a, b) {
  const ra = typeRank(a);
  const rb = typeRank(b);
  if (ra !== rb) return ra - rb;
  if (ra === 0) return 0;
  if (ra === 1) return Number(a) - Number(b);
  return compareText(typeof a === "string" ? a : JSON.stringify(a), typeof b === "string" ? b : JSON.stringify(b));
}

// Changes touching more records than this are merged in one pass instead of one splice each.
const MERGE_ABOVE = 32;

export class LiveResults {
  constructor(orderBy = []) {
    const order = orderBy.map(([field, desc]) => [field, desc ? -1 : 1]);
    this.compare = (a, b) => {
      for (const [field, sign] of order) {
        const c = compareValues(a[field], b[field]);
        if (c) return sign * c;
      }
      return compareText(a.id, b.id);
    };
    this.rows = [];
    this.byId = new Map();
  }

  // The first index whose record sorts at or after `record`.
  _bisect(record) {
    let low = 0;
    let high = this.rows.length;
    while (low < high) {
      const mid = (low + high) >> 1;
      if (this.compare(this.rows[mid], record) < 0) low = mid + 1;
      else high = mid;
    }
    return low;
  }

  _indexOf(record) {
    const index = this._bisect(record);
    return this.rows[index] === record ? index : this.rows.indexOf(record);
  }

  // `{type: "snapshot", records}`: the results as a whole.
  reset(records) {
    this.rows = records.slice().sort(this.compare);
    this.byId = new Map(this.rows.map((record) => [record.id, record]));
    return { reset: true, inserted: this.rows.slice(), updated: [], previous: [], removed: [] };
  }

  // `{type: "changes", inserted, updated, removed}` (removed: ids) -> what changed, as records.
  apply(message) {
    const gone = [];
    const removed = [];
    for (const id of message.removed) {
      const old = this.byId.get(id);
      if (old === undefined) continue;
      this.byId.delete(id);
      gone.push(old);
      removed.push(old);
    }
    const inserted = [];
    const updated = [];
    const previous = [];
    for (const record of message.inserted.concat(message.updated)) {
      const old = this.byId.get(record.id);
      if (old !== undefined) {
        gone.push(old);
        previous.push(old);
      }
      (old === undefined ? inserted : updated).push(record);
      this.byId.set(record.id, record);
    }
    const added = inserted.concat(updated);
    if (gone.length + added.length > MERGE_ABOVE) {
      const dropped = new Set(gone);
      const kept = dropped.size ? this.rows.filter((record) => !dropped.has(record)) : this.rows;
      added.sort(this.compare);
      const rows = new Array(kept.length + added.length);
      let i = 0;
      let j = 0;
      for (let k = 0; k < rows.length; k++) {
        rows[k] = j >= added.length || (i < kept.length && this.compare(kept[i], added[j]) < 0) ? kept[i++] : added[j++];
      }
      this.rows = rows;
    } else {
      for (const old of gone) {
        const index = this._indexOf(old);
        if (index >= 0) this.rows.splice(index, 1);
      }
      for (const record of added) this.rows.splice(this._bisect(record), 0, record);
    }
    return { reset: false, inserted, updated, previous, removed };
  }
}

// True when the page runs in the `offline` desktop shell rather than a browser.
export function isDesktop() {
  return new URLSearchParams(self.location.search).get("runtime") === "desktop";
}

// The desktop shell's stand-in for the worker: requests go to Python through pywebview's bridge
// (`window.pywebview.api`), in order, many per call; Python pushes replies and updates to
// `window.__offlineDesktop.receive(texts)`.
class DesktopPort {
  constructor() {
    this.onmessage = null;
    this.onerror = null;
    this._queue = [];
    this._sending = false;
    this._attached = false;
    window.__offlineDesktop = {
      receive: (texts) => {
        for (const text of texts) if (this.onmessage) this.onmessage({ data: text });
      },
    };
    const attach = () =>
      window.pywebview.api.attach().then(
        () => {
          this._attached = true;
          this._flush();
        },
        (error) => this._fail(error),
      );
    if (window.pywebview && window.pywebview.api && window.pywebview.api.attach) attach();
    else window.addEventListener("pywebviewready", attach, { once: true });
  }

  postMessage(text) {
    this._queue.push(text);
    this._flush();
  }

  terminate() {}

  _flush() {
    if (!this._attached || this._sending || !this._queue.length) return;
    const batch = this._queue.splice(0);
    this._sending = true;
    window.pywebview.api.post(batch).then(
      () => {
        this._sending = false;
        this._flush();
      },
      (error) => this._fail(error),
    );
  }

  _fail(error) {
    this._sending = false;
    if (this.onerror) this.onerror({ message: `the desktop app is not answering: ${(error && error.message) || error}` });
  }
}

export class OfflineClient {
  constructor({ worker = new URL("./worker.js", import.meta.url) } = {}) {
    this.info = null;
    this.status = { status: "starting", pending: 0, error: null };
    this.timings = { created: performance.now() };
    this._next = 1;
    this._pending = new Map();
    this._subscriptions = new Map();
    this._listeners = { status: new Set(), log: new Set(), progress: new Set() };
    this.ready = new Promise((resolve, reject) => {
      this._resolveReady = resolve;
      this._rejectReady = reject;
    });
    // In the desktop shell (which opens the page with ?runtime=desktop) the app runs natively in Python;
    // in a browser it runs in Pyodide in a worker. Both speak the same messages.
    this.worker = isDesktop() ? new DesktopPort() : new Worker(worker, { type: "module" });
    this.worker.onmessage = (event) => this._receive(JSON.parse(event.data));
    this.worker.onerror = (event) => this._fatal(event.message || "the worker failed to start");
    // The page hears the browser's online/offline events (a worker may not): the worker then restarts
    // its sync session instead of trusting a socket that stopped moving, or waiting out a backoff.
    for (const name of ["online", "offline"]) {
      self.addEventListener(name, () => this.request("network", { online: name === "online" }).catch(() => {}));
    }
  }

  collection(name) {
    return new Collection(this, name);
  }

  // Runs a function of the project's actions module (Python) with the app as its first argument.
  call(name, ...args) {
    return this.request("call", { name, args });
  }

  connect() {
    return this.request("connect");
  }

  disconnect() {
    return this.request("disconnect");
  }

  // Resolves once every write so far is in the browser's persistent storage (writes already wait for it).
  persist() {
    return this.request("persist");
  }

  // "status" (sync status and operations waiting), "log" (warnings from the library), "progress" (startup).
  on(event, callback) {
    this._listeners[event].add(callback);
    return () => this._listeners[event].delete(callback);
  }

  request(method, params = {}) {
    const id = this._next++;
    return new Promise((resolve, reject) => {
      this._pending.set(id, { resolve, reject });
      this.worker.postMessage(JSON.stringify({ ...params, id, method }));
    });
  }

  subscribe(collection, query, callback) {
    const sub = this._next++;
    this._subscriptions.set(sub, { callback, results: new LiveResults(query.orderBy || []) });
    const done = this.request("subscribe", { collection, query, sub });
    done.catch((error) => {
      this._subscriptions.delete(sub);
      this._emit("log", { level: "error", message: `subscription to ${collection} failed: ${error.message}` });
    });
    return () => {
      this._subscriptions.delete(sub);
      done.then(() => this.request("unsubscribe", { sub })).catch(() => {});
    };
  }

  _emit(event, value) {
    for (const callback of this._listeners[event]) {
      try {
        callback(value);
      } catch (error) {
        console.error(error);
      }
    }
  }

  _fatal(message, code = "STORAGE_ERROR", context = undefined) {
    const error = new OfflineError(message, code, context);
    this.status = { status: "error", pending: this.status.pending, error: { code, message, context } };
    this._rejectReady(error);
    for (const { reject } of this._pending.values()) reject(error);
    this._pending.clear();
    this._emit("status", this.status);
  }

  _receive(message) {
    switch (message.type) {
      case "reply": {
        const waiter = this._pending.get(message.id);
        if (!waiter) return;
        this._pending.delete(message.id);
        if (message.ok) waiter.resolve(message.result);
        else waiter.reject(new OfflineError(message.error.message, message.error.code, message.error.context));
        return;
      }
      case "snapshot":
      case "changes": {
        const subscription = this._subscriptions.get(message.sub);
        if (!subscription) return;
        const { results, callback } = subscription;
        let changes;
        if (message.type === "snapshot") {
          // A large snapshot comes in parts (the worker never holds it whole): the results are replaced
          // once the last part is here.
          const parts = subscription.parts || (subscription.parts = []);
          if (!("results-first-part" in this.timings)) this.timings["results-first-part"] = performance.now();
          parts.push(message.records);
          if (message.more) return;
          subscription.parts = null;
          changes = results.reset(parts.length === 1 ? parts[0] : parts.flat());
        } else {
          changes = results.apply(message);
        }
        try {
          callback(results.rows.slice(), changes);
        } catch (error) {
          console.error(error);
        }
        return;
      }
      case "status":
        this.status = {
          status: message.status,
          pending: message.pending,
          error: message.error,
          // How much of the server's log this device has (delivery sequences): a first sync's progress.
          received: message.received || 0,
          serverTotal: message.serverTotal || 0,
        };
        this._emit("status", this.status);
        return;
      case "ready":
        if (message.protocol !== PROTOCOL) {
          // A page and a worker from different builds (a half-updated cache): reloading fetches one build.
          this._fatal(`the app's worker speaks protocol ${message.protocol}, this page ${PROTOCOL}: reload the page`);
          return;
        }
        this.info = message;
        this.timings.ready = performance.now();
        // What this page has and a worker lacks: WebAuthn, for passkeys from Python (before any request).
        this.request("pageInfo", { webauthn: webauthnAvailable() }).catch(() => {});
        this._resolveReady(message);
        return;
      case "progress":
        // (On this page's clock, from navigation: the worker says when it reached the stage.)
        this.timings[message.stage] = message.at ? message.at - performance.timeOrigin : performance.now();
        this._emit("progress", message);
        return;
      case "log":
        this._emit("log", message);
        return;
      case "webauthn": // a passkey ceremony for the worker's Python: run here, answer with the credential
        runWebAuthn(message).then((answer) =>
          this.request("webauthnResult", { ...answer, ceremony: message.id }).catch(() => {}),
        );
        return;
      case "fatal": // the worker cannot serve: its code and context say why (storage refused, damaged data)
        this._fatal(message.message, message.code || undefined, message.context);
        return;
      default:
        console.warn("unknown message from the offline worker", message);
    }
  }
}

// -- WebAuthn for the worker ----------------------------------------------------------------------------------
// A Web Worker has no navigator.credentials: offline/worker.py asks the page to run each ceremony, with the
// options and the credential in WebAuthn's JSON forms (the server's /auth/passkeys/... answers and bodies).

function webauthnAvailable() {
  return (
    self.isSecureContext === true &&
    typeof PublicKeyCredential === "function" &&
    typeof PublicKeyCredential.parseCreationOptionsFromJSON === "function" &&
    typeof PublicKeyCredential.parseRequestOptionsFromJSON === "function" &&
    !!(navigator.credentials && navigator.credentials.create)
  );
}

// `{op: "create" | "get", options}` -> `{ok: true, credential}` or `{ok: false, error: {name, message}}`.
async function runWebAuthn({ op, options }) {
  try {
    if (!webauthnAvailable()) throw new DOMException("this page does not offer WebAuthn", "NotSupportedError");
    if (op !== "create" && op !== "get") throw new TypeError(`unknown WebAuthn ceremony ${op}`);
    const publicKey =
      op === "create"
        ? PublicKeyCredential.parseCreationOptionsFromJSON(options)
        : PublicKeyCredential.parseRequestOptionsFromJSON(options);
    const credential = await navigator.credentials[op]({ publicKey });
    if (!credential) throw new DOMException("no credential was returned", "NotAllowedError");
    return { ok: true, credential: credential.toJSON() };
  } catch (error) {
    const name = (error && error.name) || "Error";
    return { ok: false, error: { name, message: String((error && error.message) || error) } };
  }
}
