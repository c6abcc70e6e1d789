// Drives web/tabs.js in Node.js (which has BroadcastChannel; Web Locks: see web_locks.mjs) with short
// time limits, and prints what each tab's page received, as JSON: a request the owner never answers, and
// one made while no tab owns the database, each fail with a message; one held during a handover is served.
import "./web_locks.mjs";
const { Tabs } = await import("../../offline_cli/templates/project/web/tabs.js");

const limits = { answerTimeoutMs: 150, ownerTimeoutMs: 300 };
const seen = {};
const page = (name) => (text) => (seen[name] = seen[name] || []).push(JSON.parse(text));
const settle = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const replyTo = (text) => JSON.stringify({ type: "reply", id: JSON.parse(text).id, ok: true, result: "served" });

// 1. An owner that never answers (its page frozen, say).
const stuck = new Tabs("stuck", page("stuckOwner"), limits);
const follower = new Tabs("stuck", page("stuckFollower"), limits);
await settle(20);
stuck.becomeOwner({ serve() {}, attach: async () => ({}), serveFor() {}, detach() {}, failed() {} });
await settle(20);
follower.fromPage(JSON.stringify({ id: 1, method: "insert", collection: "todos", data: {} }));

// 2. No tab ever owns the database.
const alone = new Tabs("alone", page("alone"), limits);
alone.fromPage(JSON.stringify({ id: 1, method: "count", collection: "todos" }));

// 3. A request made before any tab owns the database is served once one does.
const waiting = new Tabs("handover", page("waiting"), limits);
waiting.fromPage(JSON.stringify({ id: 7, method: "insert", collection: "todos", data: {} }));
await settle(100);
const owner = new Tabs("handover", page("owner"), limits);
await settle(20);
owner.becomeOwner({
  serve() {},
  attach: async (tabId, send) => ({ send }),
  serveFor: (handle, text) => handle.send(replyTo(text)),
  detach() {},
  failed() {},
});

await settle(600);
process.stdout.write(JSON.stringify(seen));
process.exit(0);
