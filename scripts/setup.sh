#!/usr/bin/env bash
# Set up everything this project needs on a fresh machine: a virtual environment with the package and its
# test/lint tools, and (with --test) the system packages and npm packages the tests use.
# Idempotent: running it again only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
  esac
done

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
if ! .venv/bin/python -c 'import offline, offline_cli' >/dev/null 2>&1 || [ pyproject.toml -nt .venv/.installed ]; then
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
  # is reachable) and Debian's docker-registry for the push test.
  for tool in podman runc iptables debootstrap docker-registry; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing+=("$tool")
  done
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
log "ready"
