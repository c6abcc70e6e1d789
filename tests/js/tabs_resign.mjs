// Drives web/tabs.js in Node.js when a tab's worker fails after taking the database's lock (Python did not
// load, the database did not open): it resigns, the next tab owns the database and serves both pages. Also
// a worker that fails while still waiting for the lock does not keep it once granted. Prints, as JSON, what
// each page received and who came to own the database. The time limits are long: every answer here must
// come from an owner, not from a timeout.
import "./web_locks.mjs";
const { Tabs } = await import("../../offline_cli/templates/project/web/tabs.js");

const limits = { answerTimeoutMs: 30_000, ownerTimeoutMs: 30_000 };
const seen = { owners: [] };
const page = (name) => (text) => (seen[name] = seen[name] || []).push(JSON.parse(text));
const settle = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const request = (id) => JSON.stringify({ id, method: "insert", collection: "todos", data: {} });
const served = (by) => (text) => JSON.stringify({ type: "reply", id: JSON.parse(text).id, ok: true, result: by });

// Takes the lock (as the worker's main does) and, once granted, owns the database, serving as `name`.
const start = (tabs, name) =>
  tabs.lock().then(() => {
    seen.owners.push(name);
    tabs.becomeOwner({
      serve: (text) => tabs.toPage(served(name)(text)),
      attach: async (tabId, send) => ({ send }),
      serveFor: (handle, text) => handle.send(served(name)(text)),
      detach() {},
      failed() {},
    });
  });

// 1. The first tab takes the lock, then its worker fails before it could serve anything.
const failing = new Tabs("stuck", page("failing"), limits);
await failing.lock();
const next = new Tabs("stuck", page("next"), limits);
start(next, "next");
await settle(20);
next.fromPage(request(1)); // waits for an owner
await settle(50);
seen.ownedWhileFailingHeldIt = seen.owners.length > 0;
failing.resign();
failing.resign(); // (twice: harmless)
await settle(50);
failing.fromPage(request(2)); // the failed tab's page: served by the new owner

// 2. A worker that fails while it waits for the lock passes it on once granted.
const holder = new Tabs("queued", page("holder"), limits);
await holder.lock();
const early = new Tabs("queued", page("early"), limits);
start(early, "early");
await settle(20);
early.resign();
const late = new Tabs("queued", page("late"), limits);
start(late, "late");
await settle(20);
holder.resign();

// Until every answer and owner came (a busy machine may take a while; what is printed decides).
for (let waited = 0; waited < 20_000; waited += 20) {
  if (seen.next && seen.failing && seen.owners.length >= 2) break;
  await settle(20);
}
await settle(50); // (anything more would show too)
process.stdout.write(JSON.stringify(seen));
process.exit(0);
