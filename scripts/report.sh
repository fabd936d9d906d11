#!/usr/bin/env bash
# Runs `usermm report` (quick by default; pass --full for seed scale, --out DIR
# for the output folder, default ./usermm-report). Needs userfaultfd.
set -euo pipefail
cd "$(dirname "$0")/.."
# The far-memory rows start redis-server processes (scripts/install-deps.sh);
# without it they say "not measured" and the report goes on.
. scripts/install-deps.sh
usermm_install_deps || echo "the far-memory rows will say \"not measured\"" >&2
cargo build --release --workspace
exec target/release/usermm report "$@"
