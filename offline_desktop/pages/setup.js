// The desktop shell's setup screen (first launch) and settings page: test a sync server's address, save it
// and sync, or run on this computer only. Everything is done by the shell's Python (window.pywebview.api).
const $ = (selector) => document.querySelector(selector);
const view = new URLSearchParams(location.search).get("view") === "settings" ? "settings" : "setup";
let state = null;

const MODE_TEXT = {
  build: (s) => `This app syncs with ${s.syncUrl} (set when it was built).`,
  saved: (s) => `Syncing with ${s.syncUrl}.`,
  "local-only": () => "Your data stays on this computer: no sync server is set.",
  setup: () => "No sync server is set yet.",
};

function busy(on) {
  for (const element of [$("#server-url"), $("#connect"), $("#skip")]) element.disabled = on || Boolean(state && state.fixedUrl);
  document.body.dataset.state = on ? "testing" : "idle";
}

function showError(reason, code) {
  const element = $("#error");
  element.hidden = !reason;
  element.textContent = reason || "";
  element.dataset.code = code || "";
}

function render() {
  const settings = view === "settings";
  document.title = settings ? "Sync settings" : "Connect to your sync server";
  $("#heading").textContent = settings ? "Sync settings" : "Connect to your sync server";
  $("#skip").hidden = settings;
  $("#back").hidden = !settings;
  $("#back").href = state.appUrl;
  const current = $("#current");
  current.hidden = !settings;
  current.textContent = (MODE_TEXT[state.mode] || (() => ""))(state);
  current.dataset.mode = state.mode;
  if (state.syncUrl && !$("#server-url").value) $("#server-url").value = state.syncUrl;
  busy(false);
}

async function start() {
  state = await window.pywebview.api.state();
  render();
  document.body.dataset.view = view;
  if (!state.fixedUrl) $("#server-url").focus();
}

$("#connect-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showError(null);
  busy(true);
  $("#progress").textContent = "Testing the connection…";
  try {
    const result = await window.pywebview.api.connect_server($("#server-url").value);
    if (!result.ok) {
      $("#progress").textContent = "";
      showError(`Cannot use this server: ${result.reason}`, result.code);
      return;
    }
    $("#progress").textContent = `Connected to ${result.url}.`;
    if (view === "setup") {
      document.body.dataset.connected = result.url;
      location.href = state.appUrl;
      return;
    }
    state = await window.pywebview.api.state();
    render();
    // (Set once the page shows the new server: a test, or an assistive tool, reading it finds both.)
    document.body.dataset.connected = result.url;
  } catch (error) {
    $("#progress").textContent = "";
    showError(String((error && error.message) || error), "SHELL_ERROR");
  } finally {
    busy(false);
  }
});

$("#skip").addEventListener("click", async () => {
  busy(true);
  await window.pywebview.api.stay_local();
  location.href = state.appUrl;
});

if (window.pywebview && window.pywebview.api && window.pywebview.api.state) start();
else window.addEventListener("pywebviewready", start, { once: true });
