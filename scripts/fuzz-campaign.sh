#!/usr/bin/env bash
# A random-seed campaign of the differential fuzzer (crates/usermm/tests/fuzz.rs),
# for a developer to run; CI (scripts/test.sh) runs fixed seeds only.
#
# Each round draws a fresh base seed and runs both fuzz tests with it in every
# combination of: the default mode and faults in the faulting thread with the
# frame pool (USERMM_TEST_INTHREAD=1 USERMM_TEST_FRAME_POOL=1), and without and
# with a host swap file (USERMM_FUZZ_HOST_SWAP=1: the test turns a 256 MiB swap
# file on, and off and removes it at its end). It stops at the first failure,
# whose report names the failing sequence's seed and the command that
# reproduces it; that seed then joins REGRESSIONS in fuzz.rs.
#
# Usage: scripts/fuzz-campaign.sh [ROUNDS] [CALLS]
#   ROUNDS  rounds (default 10)
#   CALLS   USERMM_FUZZ_CALLS of each run (default 200000; the two-fault-thread
#           test runs a quarter of it)
# Needs root (userfaultfd with kernel-mode faults, swapon). Logs go to
# target/fuzz-campaign/.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${1:-10}
calls=${2:-200000}
logs=target/fuzz-campaign
mkdir -p "$logs"
if [ "$(tail -n +2 /proc/swaps | wc -l)" -gt 0 ]; then
  echo "note: a host swap is on already (/proc/swaps): every run has one" >&2
fi

cargo test --release -p usermm --test fuzz --no-run

modes=("" "USERMM_TEST_INTHREAD=1 USERMM_TEST_FRAME_POOL=1")
swaps=(0 1)
for round in $(seq "$rounds"); do
  seed=$(printf '0x%016x' "$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')")
  for mode in "${modes[@]}"; do
    for swap in "${swaps[@]}"; do
      env_line="$mode USERMM_FUZZ_HOST_SWAP=$swap USERMM_FUZZ_SEED=$seed USERMM_FUZZ_CALLS=$calls"
      log="$logs/round$round-$([ -n "$mode" ] && echo inthread-pool || echo default)-swap$swap.log"
      echo "== round $round/$rounds: $env_line"
      if ! env $env_line cargo test --release -p usermm --test fuzz -- --test-threads=2 --nocapture >"$log" 2>&1; then
        grep -E 'DIVERGENCE|panicked|HANG' "$log" | head -5 || true
        echo "FAILED: $env_line (log: $log); add the failing sequence's seed to REGRESSIONS in crates/usermm/tests/fuzz.rs" >&2
        exit 1
      fi
      grep -E '^fuzz\[.*clean in' "$log" | sed 's/; deviations used.*//'
    done
  done
done
echo "all $rounds rounds clean"
