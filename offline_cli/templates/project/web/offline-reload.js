// Offline reloads: a service worker (sw.js) keeps this page, Pyodide and the Python code in the browser's
// cache. The `offline init` template's page and the repository's example page both use it.
import { notice } from "./page-status.js";

// The service worker's install downloads every file of this build again to keep it (Pyodide and the Python,
// about 17 MB): on a first visit that competed with starting Python and with the first sync for the network
// and the CPU. It is registered once the first sync is over (the sync status settled: synced, offline,
// paused, off or stopped), or SETTLE_MS after the app is ready whatever sync does, or at once if the app
// could not start. "disconnected" is a paused sync only once sync ran: the worker reports it at ready, before
// its sync starts (taken as settled, the install ran alongside the whole first sync of a large log). A first
// sync still receiving after SETTLE_MS (a large log on a slow device) is waited for as long as it received
// more since the last SETTLE_MS: only a sync that is stuck no longer holds the install back.
const SETTLED = new Set(["connected", "offline", "disconnected", "disabled", "error"]);
const SETTLE_MS = 20000;

/** Resolves once the first sync is over (see above; `settleMs` for tests). */
export function firstSyncOver(client, settleMs = SETTLE_MS) {
  return client.ready.then(
    () =>
      new Promise((resolve) => {
        const settled = () => {
          stop();
          clearTimeout(timer);
          resolve();
        };
        let ran = false; // (sync reported anything but "disconnected": the page's "starting" is no status)
        const check = (status) => {
          ran = ran || (status.status !== "disconnected" && status.status !== "starting");
          if (SETTLED.has(status.status) && ran) settled();
        };
        let received = 0; // (at the last SETTLE_MS)
        const waited = () => {
          const { status, received: now = 0 } = client.status;
          if (status !== "syncing" || now <= received) return settled();
          received = now;
          timer = setTimeout(waited, settleMs);
        };
        const stop = client.on("status", check);
        let timer = setTimeout(waited, settleMs);
        check(client.status);
      }),
    () => undefined,
  );
}

/**
 * Register the service worker once the first sync is over, and say in #cache-status whether this page
 * reloads offline; a new version installed is announced (reload to use it).
 * @param {object} client the page's OfflineClient
 */
export function keepForOffline(client) {
  const cacheStatus = document.querySelector("#cache-status");
  if (!("serviceWorker" in navigator)) {
    cacheStatus.textContent = "· offline reload unavailable in this browser";
    return;
  }
  firstSyncOver(client)
    .then(() => navigator.serviceWorker.register("./sw.js"))
    .then(() => navigator.serviceWorker.ready)
    .then(() => {
      cacheStatus.dataset.cached = "true";
      cacheStatus.textContent = "· works offline";
    })
    .catch((error) => {
      cacheStatus.textContent = "· offline reload unavailable";
      notice(`This page cannot be cached for offline use: ${error.message}`, { key: "sw" });
    });
  // A first visit also gets a controller (the worker claims the page); only a later one means an update.
  const hadController = Boolean(navigator.serviceWorker.controller);
  navigator.serviceWorker.addEventListener("controllerchange", () => {
    if (hadController) notice("A new version of this app is installed; reload the page to use it.", { key: "update" });
  });
}
