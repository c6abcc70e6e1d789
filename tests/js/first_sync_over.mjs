// Drives firstSyncOver (web/offline-reload.js: when the page registers its service worker, whose install
// downloads the whole build again) in Node.js with a stand-in client whose test says its sync status, and
// prints, as JSON, for each scenario whether it had resolved after each step.
globalThis.self = globalThis;
globalThis.location = new URL("http://localhost/");
const { firstSyncOver } = await import("../../offline_cli/templates/project/web/offline-reload.js");

const SETTLE_MS = 1000;
// A clock of its own (the machine may be busy: no real timer decides anything): `advance(ms)` runs the
// timers due by then, in order; promise callbacks run between steps (setImmediate is the real one).
let now = 0;
let timers = [];
let lastId = 0;
globalThis.setTimeout = (fn, ms = 0) => {
  timers.push({ at: now + ms, fn, id: ++lastId });
  return lastId;
};
globalThis.clearTimeout = (id) => {
  timers = timers.filter((timer) => timer.id !== id);
};
const settle = async () => {
  for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
};
async function advance(ms) {
  const until = now + ms;
  for (;;) {
    timers.sort((a, b) => a.at - b.at || a.id - b.id);
    const next = timers[0];
    if (!next || next.at > until) break;
    timers.shift();
    now = next.at;
    next.fn();
    await settle();
  }
  now = until;
}

class FakeClient {
  constructor(status = "starting", { fails = false } = {}) {
    this.status = { status, pending: 0, error: null, received: 0, serverTotal: 0 };
    this.listeners = new Set();
    this.ready = fails ? Promise.reject(new Error("could not start")) : Promise.resolve({});
  }
  on(name, listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
  set(status, received = 0, serverTotal = 0) {
    this.status = { ...this.status, status, received, serverTotal };
    for (const listener of this.listeners) listener(this.status);
  }
}

async function scenario(client, steps) {
  let over = false;
  firstSyncOver(client, SETTLE_MS).then(() => {
    over = true;
  });
  const seen = [];
  await settle();
  for (const [wait, ...status] of steps) {
    await advance(wait);
    if (status.length) client.set(...status);
    await settle();
    seen.push(over);
  }
  timers = [];
  return seen;
}

const out = {};
// The worker's first status comes before its sync starts: not a settled sync.
out.firstSync = await scenario(new FakeClient(), [
  [0, "disconnected"],
  [0, "connecting"],
  [0, "syncing", 0, 1000],
  [0, "syncing", 500, 1000],
  [0, "connected", 1000, 1000],
]);
// A paused sync, once sync ran.
out.paused = await scenario(new FakeClient(), [[0, "connecting"], [0, "disconnected"]]);
// Built without a sync URL, or offline: settled at once.
out.disabled = await scenario(new FakeClient("disabled"), [[0]]);
out.offline = await scenario(new FakeClient(), [[0, "offline"]]);
// A server that never answers: over after SETTLE_MS.
out.stuck = await scenario(new FakeClient(), [[0, "connecting"], [SETTLE_MS / 2], [SETTLE_MS]]);
// A long first sync that keeps receiving is waited for past SETTLE_MS...
out.long = await scenario(new FakeClient(), [
  [0, "syncing", 0, 10000],
  [SETTLE_MS / 2, "syncing", 1000, 10000],
  [SETTLE_MS, "syncing", 2000, 10000],
  [SETTLE_MS, "syncing", 3000, 10000],
  [SETTLE_MS, "syncing", 4000, 10000],
  [SETTLE_MS, "connected", 10000, 10000],
]);
// ...but not once it stopped receiving.
out.stalled = await scenario(new FakeClient(), [
  [0, "syncing", 100, 10000],
  [SETTLE_MS * 1.5],
  [SETTLE_MS * 1.5],
]);
// The app could not start: at once.
out.failed = await scenario(new FakeClient("starting", { fails: true }), [[0]]);
process.stdout.write(JSON.stringify(out));
