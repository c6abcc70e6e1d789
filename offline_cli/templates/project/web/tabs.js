// Several tabs of one app in one browser. Two workers each saving their own copy of the database file to the
// same IndexedDB would overwrite each other's writes, so one tab's worker owns the database (it holds a Web
// Lock for its whole life) and the others send their page's requests to it over a BroadcastChannel. The
// owner serves each of them through a bridge of its own (offline/worker_tabs.py): replies, live query changes
// and status come back in the same worker protocol the page speaks, so the page cannot tell the difference.
//
// When the owner closes, the lock passes to a waiting tab, which opens the database from IndexedDB and
// announces itself; every other tab then re-subscribes its page's live queries there and sends again the
// requests it has not seen answered. A write is answered only once it is saved, so an unanswered one is
// either not in storage (sending it again applies it) or is there with its key (the new owner answers it
// from its table of keys, see worker_tabs.py): none is lost, none is applied twice.
//
// Messages on the channel `offline-tabs:<database>`:
//   {kind: "who", from}                      a tab that starts asks which tab owns the database
//   {kind: "owner", from}                    the owner says so (when it takes over, and to each "who")
//   {kind: "hello", from, to}                a tab attaches to the owner `to`
//   {kind: "request", from, to, key, text}   a page's request (its JSON text), `key` naming it for good
//   {kind: "to", to, text}                   a message of the owner's bridge for tab `to`'s page

// A request sent to the owner and not answered within this long is refused (the owner is stuck: its page
// may be frozen in the background). One waiting for any tab to own the database (this one or another,
// still starting) waits longer: starting Python can take a minute on a busy machine.
export const ANSWER_TIMEOUT_MS = 60_000;
export const OWNER_TIMEOUT_MS = 180_000;

const replyId = (text) => {
  // Replies are posted by Python as `{"type":"reply","id":...`: only those are parsed.
  if (!text.startsWith('{"type":"reply"')) return undefined;
  try {
    return JSON.parse(text).id;
  } catch (error) {
    return undefined;
  }
};

// The reply to a request that failed in the owner's worker (an exception escaped Python, or attaching the
// other tab failed), so its page hears at once instead of after its time limit; undefined for a request
// without an id (nothing waits for it). STORAGE_ERROR as for the other ways the worker holding the database
// cannot answer (see _expire): the write may have reached the database before the failure, so the page is
// told to check before trying again.
export const failureReply = (text, error, ownPage) => {
  let id;
  try {
    id = JSON.parse(text).id;
  } catch (parseError) {
    return undefined;
  }
  if (id === undefined || id === null) return undefined;
  const cause = String((error && error.message) || error);
  const who = ownPage ? "this app's worker" : "the tab that holds this app's database";
  const message = `${who} failed to serve this request (${cause}); the request may or may not have been applied: check, then try again`;
  return JSON.stringify({
    type: "reply",
    id,
    ok: false,
    error: { code: "STORAGE_ERROR", message, context: { reason: "owner-failed", cause } },
  });
};

export class Tabs {
  // `name`: the database's name; `toPage(text)`: posts a message to this tab's page.
  constructor(name, toPage, { answerTimeoutMs = ANSWER_TIMEOUT_MS, ownerTimeoutMs = OWNER_TIMEOUT_MS } = {}) {
    this.name = name;
    this.toPage = toPage;
    this.answerTimeoutMs = answerTimeoutMs;
    this.ownerTimeoutMs = ownerTimeoutMs;
    this.id = self.crypto.randomUUID ? self.crypto.randomUUID() : `${Date.now()}-${Math.random()}`; // (secure contexts only)
    this.owner = null; // the owning tab's id, once known
    this.attached = null; // the owner this tab said hello to (requests go to it)
    this.local = null; // set when this tab owns the database: serves requests itself (see becomeOwner)
    this.pending = new Map(); // page request id -> {text, timer}: sent (or to send) and not answered
    this.subscriptions = new Map(); // live query id -> its subscribe request's text, to send a new owner
    this.followers = new Map(); // (owner) tab id -> {handle, queue}
    // Without Web Locks (a page served over plain HTTP from another host than localhost) tabs cannot agree
    // on an owner: each one then works alone, as if it were the only tab.
    this.solo = !self.navigator.locks;
    this.channel = this.solo ? null : new BroadcastChannel(`offline-tabs:${name}`);
    if (this.solo) return;
    this.channel.onmessage = (event) => this._hear(event.data);
    // This tab's own lock, held for its life: the owner waits on it to learn when this tab is gone.
    this.alive = new Promise((resolve) => {
      self.navigator.locks.request(this._tabLock(this.id), () => {
        resolve();
        return new Promise(() => {});
      });
    });
    this.alive.then(() => this._send({ kind: "who" }));
  }

  _tabLock(id) {
    return `offline-tab:${this.name}:${id}`;
  }

  _send(message) {
    if (this.solo) return;
    this.channel.postMessage({ ...message, from: this.id });
  }

  // Waits until this tab may own the database (the previous owner, if any, has closed or resigned).
  lock() {
    if (this.solo) return Promise.resolve();
    return new Promise((resolve, reject) => {
      self.navigator.locks
        .request(`offline-db:${this.name}`, () => {
          if (this.resigned) return undefined; // this worker failed while it waited: pass the lock on at once
          resolve();
          // Held for the life of this worker, unless it fails to serve (resign).
          return new Promise((release) => {
            this.release = release;
          });
        })
        .catch(reject);
    });
  }

  // This tab's worker cannot own the database (Python did not load, the database did not open): it lets
  // the lock go, so that another tab opens the database instead of every tab waiting until this one is
  // closed, and from then on sends this page's requests to that tab like any other tab does. Called again,
  // or before the lock was granted, it does no harm (a lock granted later is passed on at once).
  resign() {
    this.resigned = true;
    if (this.local) {
      this.local = null;
      this.owner = null;
      this.followers.clear(); // (their tabs attach again to the next owner)
    }
    if (this.release) {
      const release = this.release;
      this.release = null;
      release();
    }
  }

  // A message from this tab's page.
  fromPage(text) {
    if (this.local) return this._serveOwn(text, null);
    let request;
    try {
      request = JSON.parse(text);
    } catch (error) {
      request = {};
    }
    const id = request.id;
    if (request.method === "subscribe") this.subscriptions.set(request.sub, { id, text });
    else if (request.method === "unsubscribe") this.subscriptions.delete(request.sub);
    if (id === undefined || id === null) return this._forward(null, text);
    this.pending.set(id, { text, timer: null });
    this._forward(id, text);
  }

  // Sends a page's request to the owner, or keeps it until there is one; either way with a time limit.
  _forward(id, text) {
    const entry = id === null ? null : this.pending.get(id);
    if (entry) {
      clearTimeout(entry.timer);
      const wait = this.owner ? this.answerTimeoutMs : this.ownerTimeoutMs;
      entry.timer = setTimeout(() => this._expire(id, wait), wait);
    }
    if (this.owner && this.attached === this.owner) {
      this._send({ kind: "request", to: this.owner, key: id === null ? null : `${this.id}:${id}`, text });
    }
  }

  _expire(id, wait) {
    if (!this.pending.delete(id)) return;
    const seconds = wait / 1000;
    const [message, reason] = this.owner
      ? [
          `the tab that holds this app's database did not answer within ${seconds} s (it may be frozen in the background); the request may or may not have been applied: check, then try again`,
          "owner-timeout",
        ]
      : [`no tab of this app opened its database within ${seconds} s; reload the page and try again`, "no-owner"];
    this.toPage(
      JSON.stringify({ type: "reply", id, ok: false, error: { code: "STORAGE_ERROR", message, context: { reason } } }),
    );
  }

  // This tab holds the lock and serves requests itself from now on. `local` has serve(text, key) (answers
  // go to this page unless the key says otherwise), attach(tabId, post) -> a handle, serveFor(handle, text,
  // key) and detach(handle).
  becomeOwner(local) {
    this.local = local;
    this.owner = this.id;
    // What this page asked and has not seen answered (sent to a previous owner, or held): its live queries
    // first, then the requests in their order, under the keys they were sent with.
    const pending = [...this.pending];
    this.pending.clear();
    for (const [, entry] of pending) clearTimeout(entry.timer);
    const waiting = new Set(pending.map(([id]) => id));
    for (const { id, text } of this.subscriptions.values()) if (!waiting.has(id)) this._serveOwn(text, null);
    this.subscriptions.clear();
    for (const [id, entry] of pending) this._serveOwn(entry.text, `${this.id}:${id}`);
    this._send({ kind: "owner" });
  }

  _hear(message) {
    if (message.to !== undefined && message.to !== this.id) return;
    switch (message.kind) {
      case "who":
        if (this.local) this._send({ kind: "owner" });
        return;
      case "owner":
        if (!this.local && message.from !== this.owner) this._follow(message.from);
        return;
      case "to": {
        const id = replyId(message.text);
        if (id !== undefined) {
          const entry = this.pending.get(id);
          if (!entry) return; // answered already (by a previous owner), or given up on
          clearTimeout(entry.timer);
          this.pending.delete(id);
        }
        this.toPage(message.text);
        return;
      }
      case "hello":
        if (this.local) this._attach(message.from);
        return;
      case "request":
        if (this.local) this._serveFollower(message.from, message.text, message.key);
        return;
      default:
    }
  }

  // A new owner: attach to it (once this tab holds its own lock, which the owner watches), then send it
  // this page's live queries and every unanswered request again.
  _follow(owner) {
    this.owner = owner;
    this.attached = null;
    this.alive.then(() => {
      if (this.owner !== owner || this.local) return;
      this._send({ kind: "hello", to: owner });
      this.attached = owner;
      const waiting = new Set(this.pending.keys());
      for (const { id, text } of this.subscriptions.values()) if (!waiting.has(id)) this._forward(null, text);
      for (const [id, entry] of this.pending) this._forward(id, entry.text);
    });
  }

  // -- the owner's side ---------------------------------------------------------------------------------------

  // Runs `serve` (the local's serve or serveFor: it may throw, or return a promise that rejects); a failure
  // is logged on this page and answered to the page that asked (`answer`), so no request waits on it.
  _guard(serve, text, answer, ownPage) {
    const refuse = (error) => {
      this.local.failed(error);
      const reply = failureReply(text, error, ownPage);
      if (reply !== undefined) answer(reply);
    };
    let result;
    try {
      result = serve();
    } catch (error) {
      return refuse(error);
    }
    if (result && typeof result.then === "function") result.then(undefined, refuse);
  }

  _serveOwn(text, key) {
    this._guard(() => this.local.serve(text, key), text, this.toPage, true);
  }

  _serveFor(follower, text, key) {
    this._guard(() => this.local.serveFor(follower.handle, text, key), text, follower.post, false);
  }

  _attach(tabId) {
    const old = this.followers.get(tabId);
    if (old && old.handle) this.local.detach(old.handle);
    const post = (text) => this.channel.postMessage({ kind: "to", to: tabId, text });
    const follower = { handle: null, queue: [], post };
    this.followers.set(tabId, follower);
    this.local.attach(tabId, post).then(
      (handle) => {
        if (this.followers.get(tabId) !== follower) return this.local.detach(handle);
        follower.handle = handle;
        for (const [text, key] of follower.queue.splice(0)) this._serveFor(follower, text, key);
      },
      (error) => {
        // The requests waiting for this bridge are refused; that tab's next request attaches it again.
        if (this.followers.get(tabId) === follower) this.followers.delete(tabId);
        this.local.failed(error);
        for (const [text] of follower.queue.splice(0)) {
          const reply = failureReply(text, error, false);
          if (reply !== undefined) post(reply);
        }
      },
    );
    // Granted once that tab is gone (its worker ended): its bridge stops.
    self.navigator.locks.request(this._tabLock(tabId), () => {
      if (this.followers.get(tabId) !== follower) return;
      this.followers.delete(tabId);
      if (follower.handle) this.local.detach(follower.handle);
      follower.handle = null;
    });
  }

  _serveFollower(tabId, text, key) {
    if (!this.followers.has(tabId)) this._attach(tabId);
    const follower = this.followers.get(tabId);
    if (follower.handle) this._serveFor(follower, text, key);
    else follower.queue.push([text, key]);
  }
}
