#!/usr/bin/env bash
# Installs what scripts/test.sh and scripts/report.sh need beyond the Rust
# toolchain and gcc, through apt-get as root (otherwise it says what is
# missing). Sourced or run; exit status 1 (return 1 when sourced) if
# something is still missing.
#   redis-server, redis-cli  the far-memory tests' servers, the report's
#                            far-memory rows (`usermm bench farmem`), and a
#                            program `usermm run`'s tests run
#   openssl                  the TLS far-memory test's certificates
#   python3, sqlite3         programs `usermm run`'s tests run
#                            (crates/usermm-cli/tests/run.rs), from /usr/bin
#   nodejs, git,             programs of the report's `usermm bench programs`
#   default-jdk-headless     (node; java and javac; git), from /usr/bin
#   g++                      the C++ program `usermm run`'s tests run and
#                            the header test's C++ builds (`c++`)
#   libcap-dev               the kernel selftest mlock-random-test links -lcap
#                            (crates/usermm-cli/tests/upstream_kernel_mm.rs)
#   linux-source-6.12        the kernel's sources, whose mm selftests that
#                            test extracts and builds (scripts/test.sh only:
#                            usermm_install_kernel_source)
#                            (/usr/src/linux-source-6.12.tar.xz, ~150 MB;
#                            a later linux-source-6.N where 6.12 is not in
#                            the archive)

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

# usermm_install_file PACKAGE PATH: installs PACKAGE unless PATH exists (a
# header, a library).
usermm_install_file() {
  local pkg=$1 p=$2
  [ -e "$p" ] && return 0
  echo "== installing $pkg"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" >/dev/null; }
  fi
  [ -e "$p" ] || { echo "$p is missing and could not be installed (as root: apt-get install $pkg)" >&2; return 1; }
}

# usermm_install_kernel_source: installs Debian's linux-source-6.12 (the
# tarball /usr/src/linux-source-6.12.tar.xz, which the kernel mm selftests
# test reads) unless a tarball of 6.12 or later is in /usr/src, without the
# package's recommendations (a kernel build's tools). Where the archive has
# no linux-source-6.12, the newest linux-source-6.N it has, N >= 12 (6.1's
# selftests are not the ones the test builds); the test compares against
# 6.12's results and says which version it built.
usermm_install_kernel_source() {
  local pkg=linux-source-6.12 t
  for t in /usr/src/linux-source-6.*.tar.xz; do
    if [ -e "$t" ] && [ "$(usermm_minor "$t")" -ge 12 ]; then return 0; fi
  done
  if command -v apt-cache >/dev/null 2>&1 && [ -z "$(apt-cache pkgnames "$pkg" 2>/dev/null | grep -x "$pkg")" ]; then
    t=$(apt-cache pkgnames linux-source-6. 2>/dev/null | while read -r p; do
      [ "$(usermm_minor "$p")" -lt 12 ] || echo "$p"; done | sort -V | tail -n 1) || t=
    [ -n "$t" ] && pkg=$t
  fi
  echo "== installing $pkg (~150 MB)"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" >/dev/null; }
  fi
  if [ ! -e "/usr/src/$pkg.tar.xz" ]; then
    echo "/usr/src/$pkg.tar.xz is missing and could not be installed (as root: apt-get install $pkg)" >&2
    return 1
  fi
}

# usermm_minor NAME: N of a linux-source-6.N name or path (0 if none).
usermm_minor() {
  local n=${1##*linux-source-6.}
  n=${n%%.tar.xz}
  case $n in '' | *[!0-9]*) echo 0 ;; *) echo "$n" ;; esac
}

usermm_install_deps() {
  usermm_install_pkg redis-server /usr/bin/redis-server /usr/bin/redis-cli || return 1
  usermm_install_pkg openssl /usr/bin/openssl || return 1
  usermm_install_pkg python3 /usr/bin/python3 || return 1
  usermm_install_pkg sqlite3 /usr/bin/sqlite3 || return 1
  usermm_install_pkg g++ /usr/bin/g++ /usr/bin/c++ || return 1
  usermm_install_pkg nodejs /usr/bin/node || return 1
  usermm_install_pkg default-jdk-headless /usr/bin/java /usr/bin/javac || return 1
  usermm_install_pkg git /usr/bin/git || return 1
  usermm_install_file libcap-dev /usr/include/sys/capability.h || return 1
}

# usermm_sqlite_source BASE: SQLite's source tree as its own configure makes
# it on this machine, for the test that runs SQLite's `speedtest1` under
# `usermm run` (crates/usermm-cli/tests/run.rs). The tree is Debian's source
# package `sqlite3` (its `.orig` tarball: upstream's tree, none of Debian's
# patches, so configure turns on HAVE_MALLOC_USABLE_SIZE on glibc, which
# Debian's own libsqlite3 patches out), fetched with `apt-get source` through
# a private list of the system's Debian archives as `deb-src`, unpacked into
# BASE/sqlite3-VERSION, configured (`./configure --disable-tcl`) and with its
# amalgamation made (`make sqlite3.c`, which needs tclsh). Kept for the next
# run; prints the tree's directory.
usermm_sqlite_source() {
  local base dir apt
  mkdir -p "$1" && base=$(cd "$1" && pwd) || return 1
  dir=$(ls -d "$base"/sqlite3-*/ 2>/dev/null | head -1)
  dir=${dir%/}
  if [ -n "$dir" ] && [ -f "$dir/sqlite3.c" ] && [ -f "$dir/sqlite_cfg.h" ] && [ -f "$dir/test/speedtest1.c" ]; then
    echo "$dir"
    return 0
  fi
  usermm_install_pkg tcl /usr/bin/tclsh >&2 || return 1
  echo "== fetching and configuring SQLite's source (Debian source package sqlite3) into $base" >&2
  apt=$base/apt
  rm -rf "$apt" && mkdir -p "$apt/sources.list.d" "$apt/lists/partial" "$apt/dl"
  # The system's archives, as deb-src (one-line and deb822 formats).
  sed -n 's/^deb \(.*\)/deb-src \1/p' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null >"$apt/sources.list" || true
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && sed 's/^Types:.*/Types: deb-src/' "$f" >"$apt/sources.list.d/$(basename "$f")"
  done
  local opts=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o "Dir::Etc::sourceparts=$apt/sources.list.d"
    -o "Dir::State::Lists=$apt/lists" -o APT::Sandbox::User=root -q)
  apt-get "${opts[@]}" update >"$apt/update.log" 2>&1 \
    && (cd "$apt/dl" && apt-get "${opts[@]}" source --download-only sqlite3 >"$apt/source.log" 2>&1) \
    || { echo "apt-get source sqlite3 failed: $(tail -3 "$apt/update.log" "$apt/source.log" 2>/dev/null)" >&2; return 1; }
  local orig
  orig=$(ls "$apt"/dl/sqlite3_*.orig.tar.* 2>/dev/null | grep -v -- '-www' | head -1)
  [ -n "$orig" ] || { echo "no sqlite3 .orig tarball in $apt/dl" >&2; return 1; }
  tar -xf "$orig" -C "$base" || return 1
  dir=$(ls -d "$base"/sqlite3-*/ | head -1)
  dir=${dir%/}
  (cd "$dir" && ./configure --disable-tcl >configure.log 2>&1 && make sqlite3.c >make.log 2>&1) \
    || { echo "SQLite's configure or make sqlite3.c failed in $dir (see configure.log, make.log there)" >&2; return 1; }
  rm -rf "$apt"
  echo "$dir"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  usermm_install_deps && usermm_install_kernel_source
fi
