#!/usr/bin/env bash
# Same as tdist.sh with the core's spin-waits forced on (the defaults of a
# host with spare cores), to show what the oversubscription default saves
# on this 2-core VM (docs/cpu-backend.md).
set -euo pipefail
N="$1"; BUDGET="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BIN="${TDIST_BENCH_BUILD:-$ROOT/build-cpu}/bench/cpu/tdist_bench_cpu"
export TDIST_SPIN_US=100 TDIST_WAIT_SPIN_NS=20000
exec "$BIN" -n "$N" -T "$BUDGET" -P -t tdist-spin -o allreduce,broadcast,allgather,barrier
