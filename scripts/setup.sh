#!/usr/bin/env bash
# Set up what this project needs on a fresh machine, in one of three modes:
#   scripts/setup.sh          a virtual environment with the package and its development tools (tests, lint,
#                             the AWS and desktop extras)
#   scripts/setup.sh --test   the same, plus the system packages and npm packages the tests use
#   scripts/setup.sh --run    only what running needs (scripts/main.sh): the package without its extras, and
#                             the example app's web client (Pyodide from npm, so Node.js: installed with apt
#                             when run as root; without it the server runs and its page says what is missing)
# Idempotent: running it again only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
want_run=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    --run) want_run=1 ;;
    *) echo "usage: scripts/setup.sh [--test | --run]" >&2; exit 2 ;;
  esac
done
if [ "$want_test" = 1 ] && [ "$want_run" = 1 ]; then
  echo "usage: scripts/setup.sh [--test | --run] (--test already includes what running needs)" >&2; exit 2
fi

log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PYTHON=$candidate; break
    fi
  done
fi
if [ -z "$PYTHON" ]; then
  echo "offline needs Python 3.11 or newer; install it (e.g. apt-get install python3) and run again" >&2
  exit 1
fi

apt_install() {
  # System packages are installed only where we may: as root with apt. Elsewhere the tests that need
  # them skip with a printed reason (never in CI).
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if [ ! -f /tmp/.offline-apt-updated ]; then
      log "apt-get update"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 && touch /tmp/.offline-apt-updated
    fi
    log "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
  else
    log "not root with apt: cannot install $* (tests that need it will skip and say why)"
  fi
}

if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
installed_since() {  # whether a marker exists and is newer than pyproject.toml
  [ -f "$1" ] && ! [ pyproject.toml -nt "$1" ]
}
if [ "$want_run" = 1 ]; then
  # Running needs the package alone; a development install (.venv/.installed) has it too.
  if ! .venv/bin/python -c 'import offline, offline_cli, server_runtime' >/dev/null 2>&1 \
    || ! { installed_since .venv/.installed || installed_since .venv/.installed-run; }; then
    log "installing offline into .venv (what running needs; scripts/setup.sh adds the development tools)"
    .venv/bin/python -m pip install -q --upgrade pip >&2
    .venv/bin/python -m pip install -q -e . >&2
    touch .venv/.installed-run
  fi
elif ! .venv/bin/python -c 'import offline, offline_cli' >/dev/null 2>&1 || ! installed_since .venv/.installed; then
  log "installing offline and its tools into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >&2
  .venv/bin/python -m pip install -q -e '.[dev]' >&2
  touch .venv/.installed
fi

if [ "$want_test" = 1 ]; then
  missing=()
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  # The dashboard browser test drives Debian's chromium with Playwright (no browser download).
  [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  # The container tests (tests/e2e) run podman's Docker-compatible service with runc (crun refuses
  # hybrid cgroups), iptables for its published ports, debootstrap for their local base image (no registry
  # is reachable) and Debian's docker-registry for the push test. The self-hosted deploy tests also start
  # an OpenSSH server on loopback (--host ssh://) and need podman's dnsname plugin, so that the app reaches
  # its PostgreSQL service by name on the stack's network.
  for tool in podman runc iptables debootstrap docker-registry; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing+=("$tool")
  done
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
  [ -x /usr/lib/cni/dnsname ] || missing+=(golang-github-containernetworking-plugin-dnsname)
  # The rendered compose.yaml is checked with Debian's docker-compose (`config` needs no engine).
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
  # The desktop shell's tests open a real window (pywebview on Qt WebEngine, offscreen). The PyQt6 wheels
  # bundle Qt itself, but not the system libraries it links (X11/xcb, EGL/GL, NSS, fonts, sound).
  if ! .venv/bin/python -c 'from PyQt6 import QtWebEngineWidgets' >/dev/null 2>&1; then
    apt_install libnss3 libnspr4 libxkbcommon0 libxkbcommon-x11-0 libxkbfile1 libegl1 libgl1 libgbm1 \
      libfontconfig1 libfreetype6 libdbus-1-3 libglib2.0-0 libx11-6 libx11-xcb1 libxcb1 libxcb-cursor0 \
      libxcomposite1 libxdamage1 libxext6 libxfixes3 libxrandr2 libxrender1 libxtst6 libxshmfence1 \
      libdrm2 libasound2 libwayland-client0 libwayland-cursor0 libwayland-server0
  fi
  if command -v npm >/dev/null 2>&1; then
    if [ ! -d tests/js/node_modules ] || [ tests/js/package-lock.json -nt tests/js/node_modules ]; then
      log "npm ci in tests/js"
      npm ci --prefix tests/js --no-audit --no-fund --loglevel=error >&2
    fi
  fi
fi
example_web_client() {
  # The example app's page (examples/todo/dist), built the way `offline init` projects build theirs: the
  # pinned pyodide npm package, then offline_cli.web_build. Rebuilt only when a source is newer than the build.
  local example=examples/todo built=examples/todo/node_modules/.offline-example-built
  if ! command -v npm >/dev/null 2>&1; then apt_install nodejs npm; fi
  if ! command -v npm >/dev/null 2>&1; then
    log "Node.js (npm) is missing, so the example's web client cannot be built: the server runs, and its page"
    log "says so. Install Node.js 18 or newer (e.g. apt-get install nodejs npm) and run this again."
    return 1
  fi
  if [ ! -f "$example/node_modules/pyodide/package.json" ] || [ "$example/package.json" -nt "$example/node_modules/pyodide/package.json" ]; then
    log "npm install in $example (the pinned pyodide package)"
    npm install --prefix "$example" --no-audit --no-fund --loglevel=error >&2 || return 1
  fi
  if [ ! -f "$example/dist/index.html" ] || [ ! -f "$built" ] \
    || [ -n "$(find -L "$example/web" "$example"/*.py "$example/package.json" offline -newer "$built" -name '[!.]*' -type f -print -quit)" ]; then
    log "building the example's web client into $example/dist"
    BUILD_SYNC_URL=/offline-sync .venv/bin/python -m offline_cli.web_build "$example" >&2 || return 1
    touch "$built"
  fi
}

if [ "$want_run" = 1 ]; then
  if ! example_web_client; then
    log "the example's web client was not built (see above); scripts/main.sh serves a page that says so"
  fi
fi
log "ready"
