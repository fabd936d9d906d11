#!/usr/bin/env bash
# Builds usermm and runs a program nobody here wrote under `usermm run`, with
# a budget below its working set: the Debian CPython builds a dict of
# 48 Ki values of 1 KiB (about 60 MiB of heap) and reads every value back
# under a 16 MiB budget, swapping to a file in /tmp. Prints the program's
# own check line, then what usermm did (the space's statistics at exit,
# `--stats`), then a one-line summary.
#   scripts/demo.sh [BUDGET [KI_VALUES]]     (defaults: 16m 48)
# Needs userfaultfd (root, or access to /dev/userfaultfd).
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${1:-16m}
values=${2:-48}
. scripts/install-deps.sh
usermm_install_pkg python3 /usr/bin/python3
cargo build --release -p usermm-cli -p usermm-preload
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/dict.py" <<'PY'
import sys
n = int(sys.argv[1]) * 1024
d = {i: (b"%08d" % i) * 128 for i in range(n)}
lst = [d[i] for i in range(0, n, 2)]
ok = all(d[i][:8] == b"%08d" % i and len(d[i]) == 1024 for i in range(n))
ok = ok and all(v[:8] == b"%08d" % (2 * j) for j, v in enumerate(lst))
print("python3:", "every value checks" if ok else "WRONG VALUES", len(d), len(lst))
sys.exit(0 if ok else 1)
PY
echo "== usermm run --budget $budget --stats -- /usr/bin/python3 dict.py $values"
start=$(date +%s.%N)
target/release/usermm run --budget "$budget" --stats -- /usr/bin/python3 "$dir/dict.py" "$values" 2>"$dir/err"
end=$(date +%s.%N)
cat "$dir/err" >&2
stats=$(grep -o 'stats: .*' "$dir/err" | tail -1)
get() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<" ${stats#stats: }"; }
mib() { echo $(( ($1 + 524288) / 1048576 )); }
echo "== what usermm did: a budget of $(mib "$(get budget_bytes)") MiB (resident at most $(mib "$(get resident_bytes_max)") MiB)" \
  "for a dict of $values Ki values of 1 KiB; $(get swapouts) pages ($(mib $(( $(get swapouts) * 4096 ))) MiB) swapped out," \
  "$(get swapins) ($(mib $(( $(get swapins) * 4096 ))) MiB) swapped in, $(get faults) faults served;" \
  "$(awk "BEGIN { printf \"%.1f\", $end - $start }") s"
