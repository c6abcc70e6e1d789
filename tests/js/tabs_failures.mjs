// Drives web/tabs.js in Node.js when the owner's worker fails to serve a request: the owner's `serveFor`
// throws, or returns a promise that rejects, or `attach` fails while another tab's request waits for it, or
// `serve` (its own page's request) throws. Prints, as JSON, what each page received and what the owner
// logged. The time limits are long: every answer here must come from the owner, not from a timeout.
import "./web_locks.mjs";
const { Tabs } = await import("../../offline_cli/templates/project/web/tabs.js");

const limits = { answerTimeoutMs: 30_000, ownerTimeoutMs: 30_000 };
const seen = { logged: [] };
const page = (name) => (text) => (seen[name] = seen[name] || []).push(JSON.parse(text));
const settle = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const replyTo = (text) => JSON.stringify({ type: "reply", id: JSON.parse(text).id, ok: true, result: "served" });
const request = (id) => JSON.stringify({ id, method: "insert", collection: "todos", data: {} });

// 1. serveFor fails for some requests (thrown, rejected), serves the next one; serve fails for the owner's
// own page.
const follower = new Tabs("failing", page("follower"), limits);
const owner = new Tabs("failing", page("owner"), limits);
await settle(20);
owner.becomeOwner({
  serve() {
    throw new Error("the owner's Python raised");
  },
  attach: async (tabId, send) => ({ send }),
  serveFor(handle, text) {
    const id = JSON.parse(text).id;
    if (id === 1) throw new Error("PythonError: sqlite3.OperationalError: disk I/O error");
    if (id === 2) return Promise.reject(new Error("PythonError: the app is closed"));
    return handle.send(replyTo(text));
  },
  detach() {},
  failed: (error) => seen.logged.push(String(error)),
});
await settle(20);
for (const id of [1, 2, 3]) follower.fromPage(request(id));
owner.fromPage(request(5));

// 2. Attaching the other tab fails while its request waits for it; the next request attaches again.
const early = new Tabs("attaching", page("early"), limits);
early.fromPage(request(9)); // made before any tab owns the database: sent once the owner appears
const host = new Tabs("attaching", page("host"), limits);
await settle(20);
let attempts = 0;
host.becomeOwner({
  serve() {},
  attach: async (tabId, send) => {
    attempts += 1;
    if (attempts === 1) {
      await settle(50);
      throw new Error("PythonError: attach failed");
    }
    return { send };
  },
  serveFor: (handle, text) => handle.send(replyTo(text)),
  detach() {},
  failed: (error) => seen.logged.push(String(error)),
});

const count = (name) => (seen[name] || []).length;
for (let waited = 0; waited < 10_000; waited += 20) {
  if (count("early") >= 1 && !seen.retried) {
    seen.retried = true;
    early.fromPage(request(10));
  }
  if (count("follower") >= 3 && count("owner") >= 1 && count("early") >= 2) break;
  await settle(20);
}
process.stdout.write(JSON.stringify(seen));
process.exit(0);
