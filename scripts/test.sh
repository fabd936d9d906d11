#!/usr/bin/env bash
# The whole usermm test suite: formatting, lints, the Rust tests (core unit and
# property tests, native integration tests, the conformance harness against
# the host kernel, the stress test) and the C test against include/usermm.h.
#
# Needs userfaultfd with kernel-mode faults (root, or read/write access to
# /dev/userfaultfd). Without it the native tests fail loudly, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

# The far-memory tests (crates/usermm/tests/farmem.rs) start redis-server
# processes of their own on loopback ports.
if ! command -v redis-server >/dev/null 2>&1; then
  echo "== installing redis-server (the far-memory tests start their own servers)"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q redis-server >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }
  fi
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "FATAL: redis-server is not installed and could not be (apt-get install redis-server)" >&2
    exit 1
  fi
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --release -- -D warnings
echo "== cargo clippy -D warnings: the libraries a program links (no test hooks, no bench helpers)"
cargo clippy -p usermm -p usermm-sys -p usermm-core --lib --release -- -D warnings
echo "== cargo build --release"
cargo build --release --workspace
echo "== cargo test -p usermm-core (debug build: every debug_assert! checked)"
cargo test -p usermm-core
echo "== cargo test --release"
cargo test --release --workspace -- --test-threads=2

# The swap tests again with every space swapping to a Redis server
# (USERMM_TEST_SWAP_URL, read by crates/usermm/tests/common), on a Unix
# socket of a server of this script's own, stopped on exit.
echo "== the swap tests again, swapping to a Redis server"
redis_dir=$(mktemp -d)
redis-server --port 0 --unixsocket "$redis_dir/redis.sock" --save "" --appendonly no --dir "$redis_dir" \
  >"$redis_dir/log" 2>&1 &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null; rm -rf "$redis_dir"' EXIT
for _ in $(seq 100); do [ -S "$redis_dir/redis.sock" ] && break; sleep 0.1; done
[ -S "$redis_dir/redis.sock" ] || { echo "FATAL: redis-server did not start: $(cat "$redis_dir/log")" >&2; exit 1; }
USERMM_TEST_SWAP_URL="redis+unix://$redis_dir/redis.sock" cargo test --release -p usermm \
  --test swap_errors --test swapcache --test lru --test reclaim_idle --test lazyfree --test purgeable \
  --test volatile --test smoke -- --test-threads=2
# The pass really swapped to the server (not to files).
swapped=$(redis-cli -s "$redis_dir/redis.sock" INFO stats | tr -d '\r' | sed -n 's/^total_net_input_bytes://p')
echo "the Redis server took $swapped bytes"
if [ "${swapped:-0}" -lt 100000000 ]; then
  echo "FATAL: the swap tests did not swap to the Redis server" >&2
  exit 1
fi
