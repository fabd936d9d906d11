#!/usr/bin/env bash
# Runs `usermm report` (quick by default; pass --full for seed scale, --out DIR
# for the output folder, default ./usermm-report). Needs userfaultfd.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace
exec target/release/usermm report "$@"
