#!/usr/bin/env bash
# Installs what scripts/test.sh and scripts/report.sh need beyond the Rust
# toolchain and gcc: redis-server (and redis-cli), for the far-memory tests'
# servers and the report's far-memory rows (`usermm bench farmem`). Through
# apt-get, as root; otherwise it says what is missing. Sourced or run.
# Exit status 1 (return 1 when sourced) if redis-server is still missing.
usermm_install_deps() {
  if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    return 0
  fi
  echo "== installing redis-server (far-memory tests and report rows start their own servers)"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; }
  fi
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server is not installed and could not be (as root: apt-get install redis-server)" >&2
    return 1
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  usermm_install_deps
fi
