#!/usr/bin/env bash
# The main job: install what running needs (scripts/setup.sh --run: the package, and the example app's web
# client), then serve the example to-do app on the embedded SQLite store: its page at the printed app URL
# (http://127.0.0.1:3001), sync at ws://127.0.0.1:3001/offline-sync, the dashboard at /__offline.
# Ctrl-C stops it. Extra arguments go to `offline dev`, e.g. `scripts/main.sh --port 4000`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --run
if [ ! -f examples/todo/dist/index.html ]; then
  # No web client (no Node.js to build it): a page saying so, instead of a bare "Not Found".
  export OFFLINE_STATIC_DIR="$PWD/examples/todo/no-web-client"
fi
exec .venv/bin/offline dev examples/todo "$@"
