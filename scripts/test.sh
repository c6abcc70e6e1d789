#!/usr/bin/env bash
# Set everything up (including system and npm packages the tests need) and run the whole test suite.
# Extra arguments go to pytest, e.g. `scripts/test.sh -k hlc -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest "$@"
