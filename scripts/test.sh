#!/usr/bin/env bash
# The whole usermm test suite: formatting, lints, the Rust tests (core unit and
# property tests, native integration tests, the conformance harness against
# the host kernel, the stress test) and the C test against include/usermm.h.
#
# Needs userfaultfd with kernel-mode faults (root, or read/write access to
# /dev/userfaultfd). Without it the native tests fail loudly, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

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
