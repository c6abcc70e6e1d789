// What the page shows of the app's state besides its records: the sync status line and first-sync progress,
// notices (warnings and errors the worker logs, offline caching, updates), and the last failed call.
import { isDesktop } from "./offline-client.js";

const $ = (selector) => document.querySelector(selector);

const STATUS_TEXT = {
  starting: () => "Starting Python…",
  connecting: () => "Connecting…",
  syncing: () => "Syncing…",
  connected: (s) => (s.pending ? `Syncing ${s.pending} change${s.pending === 1 ? "" : "s"}…` : "Synced"),
  offline: (s) =>
    s.pending
      ? `Offline · ${s.pending} change${s.pending === 1 ? "" : "s"} saved on this device`
      : "Offline · changes are saved on this device",
  disconnected: () => "Sync paused",
  disabled: () => (isDesktop() ? "This computer only (no sync server set)" : "This device only (built without a sync URL)"),
  error: (s) => `Sync stopped: ${s.error ? s.error.message : "unknown error"}`,
};

export function showStatus(status) {
  const element = $("#sync-status");
  element.dataset.status = status.status;
  element.dataset.pending = String(status.pending);
  element.textContent = (STATUS_TEXT[status.status] || (() => status.status))(status);
  // A first sync (or a long catch-up) shows how far it is: changes received of the server's total.
  const progress = $("#sync-progress");
  progress.dataset.received = String(status.received);
  progress.dataset.total = String(status.serverTotal);
  progress.hidden = !(status.status === "syncing" && status.received < status.serverTotal);
  if (!progress.hidden) {
    const bar = progress.querySelector("progress");
    bar.max = status.serverTotal;
    bar.value = status.received;
    progress.querySelector("span").textContent =
      `Received ${status.received.toLocaleString("en")} of ${status.serverTotal.toLocaleString("en")} changes from the server`;
  }
}

export function notice(text, { kind = "warning", key = null } = {}) {
  if (key && document.querySelector(`#notices [data-key="${key}"]`)) return;
  const element = document.createElement("p");
  element.className = `notice ${kind}`;
  if (key) element.dataset.key = key;
  element.textContent = text;
  $("#notices").append(element);
}

export function showError(error) {
  const element = $("#error");
  element.hidden = false;
  element.textContent = error.code ? `${error.message} (${error.code})` : String(error.message || error);
}
