#!/usr/bin/env bash
# The main job on the embedded default: set everything up, then serve the example app's sync server on
# SQLite (http://127.0.0.1:3001, sync at ws://127.0.0.1:3001/offline-sync, dashboard at /__offline).
# Ctrl-C stops it. Extra arguments go to `offline dev`, e.g. `scripts/main.sh --port 4000`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/offline dev examples/todo "$@"
