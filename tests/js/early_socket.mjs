// Drives web/early-socket.js in Node.js with a stand-in WebSocket (an EventTarget whose test says when it
// opens, what the server sends, when it closes) and prints, as JSON, what each scenario's "Python" saw: the
// socket it got (the early one or a new one), the events it heard, and what became of the early socket.
import { preconnect } from "../../offline_cli/templates/project/web/early-socket.js";

class FakeSocket extends EventTarget {
  static CONNECTING = 0;
  static OPEN = 1;
  static CLOSING = 2;
  static CLOSED = 3;
  static made = [];
  constructor(url, protocols) {
    super();
    Object.assign(this, { url, protocols, readyState: 0, closedByClient: false });
    FakeSocket.made.push(this);
  }
  open() {
    this.readyState = 1;
    this.dispatchEvent(new Event("open"));
  }
  receive(data) {
    const event = new Event("message");
    event.data = data;
    this.dispatchEvent(event);
  }
  drop() {
    this.readyState = 3;
    this.dispatchEvent(new Event("close"));
  }
  close() {
    this.closedByClient = true;
    this.readyState = 3;
  }
}

const URL_ = "ws://127.0.0.1:3001/offline-sync";
const tick = (ms = 0) => new Promise((resolve) => setTimeout(resolve, ms));

// What browser_transport.py does: construct, then (in the same task) listen for open, message and close.
function python(scope, url = URL_) {
  const socket = new scope.WebSocket(url);
  const heard = [];
  for (const type of ["open", "message", "close"]) {
    socket.addEventListener(type, (event) => heard.push(type === "message" ? `message:${event.data}` : type));
  }
  return { socket, heard };
}

async function scenario(prepare, options = {}) {
  FakeSocket.made = [];
  const scope = { WebSocket: FakeSocket };
  const reports = [];
  const handle = preconnect(URL_, { scope, report: (what) => reports.push(what), ...options });
  const early = handle.socket;
  const seen = await prepare(scope, early, handle);
  return {
    ...seen,
    sockets: FakeSocket.made.length,
    earlyClosed: early.closedByClient,
    restored: scope.WebSocket === FakeSocket,
    reports,
  };
}

const out = {};

// Open before Python asks: handed over, told "open" once it listens (before anything else it hears), then
// every message in order, and the close.
out.openBefore = await scenario(async (scope, early) => {
  early.open();
  const { socket, heard } = python(scope);
  setTimeout(() => {
    early.receive("handshake-response");
    early.receive("batch-1");
  }, 0);
  await tick(5);
  early.receive("batch-2");
  early.drop();
  return { same: socket === early, heard };
});

// Still connecting when Python asks: handed over, and its own open event is the only one.
out.connecting = await scenario(async (scope, early) => {
  const { socket, heard } = python(scope);
  await tick();
  early.open();
  early.receive("handshake-response");
  await tick();
  return { same: socket === early, heard };
});

// The server spoke before any handshake (an error): not handed over, closed; Python gets a new socket.
out.heardFirst = await scenario(async (scope, early) => {
  early.open();
  early.receive("error");
  const { socket, heard } = python(scope);
  return { same: socket === early, heard, fresh: socket.url };
});

// Closed by the server before Python asked: a new socket.
out.closedFirst = await scenario(async (scope, early) => {
  early.drop();
  const { socket } = python(scope);
  return { same: socket === early, fresh: socket.url };
});

// Another URL: a new socket for it; the early one is closed.
out.otherUrl = await scenario(async (scope, early) => {
  early.open();
  const { socket } = python(scope, "ws://127.0.0.1:3001/other");
  return { same: socket === early, fresh: socket.url };
});

// Asked for after `within`: a new socket (the server may be about to drop one that sent no handshake).
let clock = 0;
out.tooLate = await scenario(
  async (scope, early) => {
    early.open();
    clock = 5000;
    const { socket } = python(scope);
    return { same: socket === early };
  },
  { now: () => clock },
);

// Nobody asks: closed once `within` passed, and the browser's WebSocket is the global again.
out.unclaimed = await scenario(
  async (scope, early) => {
    early.open();
    await tick(80);
    return {};
  },
  { within: 30 },
);

// Only the first construction is handed anything: a reconnection gets a new socket.
out.second = await scenario(async (scope, early) => {
  early.open();
  const first = python(scope).socket;
  const second = python(scope).socket;
  return { firstSame: first === early, secondSame: second === early };
});

// discard() (the app could not start): closed unless handed over.
out.discarded = await scenario(async (scope, early, handle) => {
  handle.discard();
  handle.discard();
  return {};
});

// discard() after the hand-over leaves the socket to its new owner.
out.discardedAfter = await scenario(async (scope, early, handle) => {
  early.open();
  python(scope);
  handle.discard();
  return {};
});

process.stdout.write(JSON.stringify(out));
