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
# processes of their own on loopback ports; `usermm run`'s tests
# (crates/usermm-cli/tests/run.rs) run programs nobody here wrote under it:
# the Debian CPython, SQLite shell and Redis server (scripts/install-deps.sh);
# crates/usermm-cli/tests/upstream_kernel_mm.rs builds the kernel's mm
# selftests from Debian's linux-source-6.12.
. scripts/install-deps.sh
usermm_install_deps && usermm_install_kernel_source \
  || { echo "FATAL: the tests need the packages above" >&2; exit 1; }
# SQLite's source tree, configured by its own configure (the speedtest1 test).
mkdir -p target/upstream
usermm_sqlite_source target/upstream >/dev/null || { echo "FATAL: the speedtest1 test needs SQLite's source (above)" >&2; exit 1; }

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --release -- -D warnings
echo "== cargo clippy -D warnings: the libraries a program links (no test hooks, no bench helpers)"
cargo clippy -p usermm -p usermm-sys -p usermm-core -p usermm-preload --lib --release -- -D warnings
echo "== cargo doc -D warnings (every intra-doc link resolves; none points at a private item)"
# (The libraries, then the command apart: `usermm`'s library and the
# `usermm` binary write the same doc directory, and documented in one run
# they raced — "output filename collision", cargo#6313 — and the run failed
# with a missing file now and then.)
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --lib
RUSTDOCFLAGS="-D warnings" cargo doc -p usermm-cli --no-deps --bins
echo "== cargo build --release (also the preload library usermm run's tests need)"
cargo build --release --workspace
echo "== the README's first command: scripts/demo.sh (CPython under usermm run at a quarter of its working set)"
demo_out=$(scripts/demo.sh 2>&1) || { echo "$demo_out"; echo "FATAL: scripts/demo.sh failed" >&2; exit 1; }
echo "$demo_out" | grep -E '^(python3:|== what usermm did)'
echo "$demo_out" | grep -q '^python3: every value checks' || { echo "FATAL: the demo's values did not check" >&2; exit 1; }
echo "$demo_out" | grep -Eq ' [1-9][0-9]* pages \([0-9]+ MiB\) swapped out' || { echo "FATAL: the demo swapped nothing" >&2; exit 1; }
echo "== cargo test -p usermm-core (debug build: every debug_assert! checked)"
cargo test -p usermm-core
echo "== the seeded simulation of core and executor, debug build (the core's debug_assert!s, the page-state transition table among them)"
cargo test -p usermm --test sim
echo "== cargo test --release"
cargo test --release --workspace -- --test-threads=2

# The tests again with every test space resolving its faults in the
# faulting thread (UMM_F_INTHREAD_FAULTS, via USERMM_TEST_INTHREAD read by
# crates/usermm/tests/common, through which every listed test opens its
# spaces: common::open, open_mode, with_test_store) and recycling frames
# (UMM_F_FRAME_POOL, opt-in, via USERMM_TEST_FRAME_POOL). The differential
# fuzzer, the soak and the stress test included. Left out: swapcache (that mode installs no
# write-protected swap-ins, so there is no swap cache to test) and a no_hang
# test of process_vm_readv on a page not resident (the mode's documented
# EFAULT; docs/design.md, "Faults in the faulting thread").
echo "== the tests again, faults resolved in the faulting thread, with the frame pool (UMM_F_FRAME_POOL)"
USERMM_TEST_INTHREAD=1 USERMM_TEST_FRAME_POOL=1 USERMM_STRESS_REDIS_SECS=8 USERMM_SOAK_SECS=20 cargo test --release -p usermm \
  --test inthread --test volatile --test purgeable --test swap_errors --test lru --test reclaim_idle \
  --test lazyfree --test smoke --test heap --test populate --test lock --test lock_limits \
  --test lock_onfault_race --test file --test file_clean_writeback --test fork --test fork_copy --test fuzz \
  --test munmap_concurrent --test api_introspect --test api_sound --test map_options --test dontdump \
  --test guard_touch --test usermode --test farmem --test stress --test soak --test conformance \
  --test no_hang --test wake_ahead --test frame_pool --test file_windows --test thread_signals -- --test-threads=2 \
  --skip a_missing_page_is_served_to_process_vm_readv_not_to_proc_mem

# The differential fuzzer once more with a host swap file on
# (USERMM_FUZZ_HOST_SWAP=1: the test turns a 256 MiB swap file on, and off and
# removes it at its end), where the kernel's MADV_PAGEOUT swaps written pages
# out, in the mode its listed regression seed (REGRESSIONS in
# crates/usermm/tests/fuzz.rs) failed in. Half the default calls: about a
# minute. (Every pass of this script runs fixed seeds; random ones are
# scripts/fuzz-campaign.sh's.)
echo "== the differential fuzzer with a host swap file on"
USERMM_FUZZ_HOST_SWAP=1 USERMM_FUZZ_CALLS=100000 USERMM_TEST_INTHREAD=1 USERMM_TEST_FRAME_POOL=1 \
  cargo test --release -p usermm --test fuzz -- --test-threads=2
if grep -q usermm-fuzz-swap /proc/swaps; then
  echo "FATAL: the fuzzer left its host swap file on: $(cat /proc/swaps)" >&2
  exit 1
fi

# The swap tests again with every space swapping to a Redis server
# (USERMM_TEST_SWAP_URL, read by crates/usermm/tests/common) of this
# script's own on a loopback port (the store's own TCP link, as a space
# reaches a server in production), stopped on exit; the script reads its
# counters through a Unix socket.
echo "== the swap tests again, swapping to a Redis server"
redis_dir=$(mktemp -d)
redis_pids=()
cleanup_redis() {
  kill "${redis_pids[@]}" 2>/dev/null || true
  wait "${redis_pids[@]}" 2>/dev/null || true
  rm -rf "$redis_dir"
}
trap cleanup_redis EXIT
# Ports below the host's ephemeral range, bus ports (+10,000) too, so that no
# client's connect takes one of them (crates/usermm-sys/src/testing.rs,
# free_cluster_port, says why).
ephemeral_first=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
port_span=$((ephemeral_first - 20000))
[ "$port_span" -ge 1000 ] || port_span=1000
# start_redis DIR ARGS…: a redis-server on a free random loopback port with
# its directory DIR/<port> (made here) and ARGS; its port in $started_port
# (empty if none started in 20 tries), its pid added to redis_pids.
start_redis() {
  local base=$1 port pid
  shift
  started_port=
  for _ in $(seq 20); do
    port=$((10000 + RANDOM % port_span))
    mkdir -p "$base/$port"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$base/$port" "$@" \
      >"$base/$port/log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
      [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    if kill -0 "$pid" 2>/dev/null && [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ]; then
      redis_pids+=("$pid")
      started_port=$port
      return 0
    fi
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
start_redis "$redis_dir" --unixsocket "$redis_dir/redis.sock"
single_port=$started_port
[ -n "$single_port" ] || { echo "FATAL: redis-server did not start" >&2; exit 1; }
# (With forks too: a child reads its parent's keys in place, `store/redis/fork.rs`;
# the fuzzer and the soak fork at random moments.)
USERMM_TEST_SWAP_URL="redis://127.0.0.1:$single_port/" cargo test --release -p usermm \
  --test swap_errors --test swapcache --test lru --test reclaim_idle --test lazyfree --test purgeable \
  --test volatile --test smoke --test swap_ahead --test fork_copy --test fuzz --test soak -- --test-threads=2
# The pass really swapped to the server (not to files).
swapped=$(redis-cli -s "$redis_dir/redis.sock" INFO stats | tr -d '\r' | sed -n 's/^total_net_input_bytes://p')
echo "the Redis server took $swapped bytes"
if [ "${swapped:-0}" -lt 100000000 ]; then
  echo "FATAL: the swap tests did not swap to the Redis server" >&2
  exit 1
fi
# The fork tests once more with sealed pages (seal=1): a child reads its
# parent's sealed keys with its copy of the parent's key.
USERMM_TEST_SWAP_URL="redis://127.0.0.1:$single_port/?seal=1" cargo test --release -p usermm \
  --test fork_copy -- --test-threads=2

# And once more against a Redis Cluster of 3 masters with a replica each,
# every write waiting for its replica (replicas=1).
echo "== the swap tests again, swapping to a 3+3 Redis Cluster (replicas=1)"
cluster_ports=()
for node in 1 2 3 4 5 6; do
  start_redis "$redis_dir" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000
  [ -n "$started_port" ] || { echo "FATAL: could not start cluster node $node" >&2; exit 1; }
  cluster_ports+=("$started_port")
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${cluster_ports[@]}") --cluster-replicas 1 --cluster-yes \
  >"$redis_dir/create.log" 2>&1 || { echo "FATAL: redis-cli --cluster create: $(cat "$redis_dir/create.log")" >&2; exit 1; }
for _ in $(seq 600); do
  ready=1
  for port in "${cluster_ports[@]}"; do
    redis-cli -p "$port" cluster info | grep -q cluster_state:ok || ready=
    info=$(redis-cli -p "$port" info replication)
    echo "$info" | grep -q 'role:master' && ! echo "$info" | grep -q 'connected_slaves:1' && ready=
    echo "$info" | grep -q 'role:slave' && ! echo "$info" | grep -q 'master_link_status:up' && ready=
  done
  [ -n "$ready" ] && break
  sleep 0.1
done
[ -n "$ready" ] || { echo "FATAL: the cluster did not become ready" >&2; exit 1; }
seeds=$(printf '127.0.0.1:%s,' "${cluster_ports[@]}")
USERMM_TEST_SWAP_URL="redis+cluster://${seeds%,}/?replicas=1" cargo test --release -p usermm \
  --test swap_errors --test swapcache --test lru --test reclaim_idle --test lazyfree --test purgeable \
  --test volatile --test smoke --test swap_ahead -- --test-threads=2
taken=0
for port in "${cluster_ports[@]}"; do
  n=$(redis-cli -p "$port" INFO stats | tr -d '\r' | sed -n 's/^total_net_input_bytes://p')
  taken=$((taken + ${n:-0}))
done
echo "the cluster took $taken bytes"
if [ "$taken" -lt 100000000 ]; then
  echo "FATAL: the swap tests did not swap to the cluster" >&2
  exit 1
fi
