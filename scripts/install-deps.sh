#!/usr/bin/env bash
# Installs what scripts/test.sh and scripts/report.sh need beyond the Rust
# toolchain and gcc, through apt-get as root (otherwise it says what is
# missing). Sourced or run; exit status 1 (return 1 when sourced) if
# something is still missing.
#   redis-server, redis-cli  the far-memory tests' servers, the report's
#                            far-memory rows (`usermm bench farmem`), and a
#                            program `usermm run`'s tests run
#   python3, sqlite3         programs `usermm run`'s tests run
#                            (crates/usermm-cli/tests/run.rs), from /usr/bin

# usermm_install_pkg PACKAGE PATH...: installs PACKAGE unless every PATH is
# an executable already.
usermm_install_pkg() {
  local pkg=$1 p missing=
  shift
  for p in "$@"; do [ -x "$p" ] || missing=1; done
  [ -z "$missing" ] && return 0
  echo "== installing $pkg"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" >/dev/null; }
  fi
  for p in "$@"; do
    if [ ! -x "$p" ]; then
      echo "$p is missing and could not be installed (as root: apt-get install $pkg)" >&2
      return 1
    fi
  done
}

usermm_install_deps() {
  usermm_install_pkg redis-server /usr/bin/redis-server /usr/bin/redis-cli || return 1
  usermm_install_pkg python3 /usr/bin/python3 || return 1
  usermm_install_pkg sqlite3 /usr/bin/sqlite3 || return 1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  usermm_install_deps
fi
