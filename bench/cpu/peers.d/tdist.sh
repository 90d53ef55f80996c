#!/usr/bin/env bash
# tdist peer for ../shared/peers/run.sh: called as `tdist.sh N BUDGET` from
# the peers directory. Uses the optimised build in $TDIST_BENCH_BUILD
# (default: build-cpu next to this repository's root).
set -euo pipefail
N="$1"; BUDGET="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BIN="${TDIST_BENCH_BUILD:-$ROOT/build-cpu}/bench/cpu/tdist_bench_cpu"
exec "$BIN" -n "$N" -T "$BUDGET" -P -t tdist -o allreduce,broadcast,allgather,barrier
