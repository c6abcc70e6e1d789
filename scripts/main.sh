#!/usr/bin/env bash
# The main job on the embedded default: set everything up, then check the example app's schema.
# (When the server lands this becomes `offline dev`, serving the example on SQLite.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/offline schema check examples/todo/schema.py "$@"
