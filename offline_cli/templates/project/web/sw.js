// The service worker that lets the app start without a network: at install it stores every file of this
// build (the page, the worker, Pyodide, the Python code) in the Cache API, then answers this site's
// requests for them from that cache. A new build has a new manifest, so it installs beside the old one,
// takes over, and removes the old cache. Server endpoints (sync, auth, operations) always go to the network.
// The build replaces the next line's value with this build's id and file list.
const MANIFEST = /*OFFLINE_MANIFEST*/ { build: "unbuilt", files: [] };

const PREFIX = "offline-app-";
const CACHE = PREFIX + MANIFEST.build;
const ROOT = new URL("./", self.location.href);
const SERVER_PATHS = ["/offline-sync", "/__offline", "/auth", "/health", "/metrics"];
const SHELL = new URL("index.html", ROOT).href;

self.addEventListener("install", (event) => {
  event.waitUntil(
    (async () => {
      const cache = await caches.open(CACHE);
      // `reload` skips the HTTP cache: the stored files must be this build's, not older copies.
      await cache.addAll(MANIFEST.files.map((file) => new Request(new URL(file, ROOT), { cache: "reload" })));
      await self.skipWaiting();
    })(),
  );
});

self.addEventListener("activate", (event) => {
  event.waitUntil(
    (async () => {
      for (const key of await caches.keys()) {
        if (key.startsWith(PREFIX) && key !== CACHE) await caches.delete(key);
      }
      await self.clients.claim();
    })(),
  );
});

function isServerPath(url) {
  return SERVER_PATHS.some((path) => url.pathname === path || url.pathname.startsWith(path + "/"));
}

self.addEventListener("fetch", (event) => {
  const request = event.request;
  const url = new URL(request.url);
  if (request.method !== "GET" || url.origin !== ROOT.origin || !url.href.startsWith(ROOT.href) || isServerPath(url)) {
    return; // not ours: the browser fetches it as usual
  }
  // Page loads of the app (its root or a client-side route) get the app shell.
  const key = request.mode === "navigate" && !/\.[a-z0-9]+$/i.test(url.pathname) ? SHELL : url.href.split("#")[0];
  event.respondWith(
    (async () => {
      const cache = await caches.open(CACHE);
      const hit = await cache.match(key, { ignoreSearch: true });
      return hit || fetch(request);
    })(),
  );
});
