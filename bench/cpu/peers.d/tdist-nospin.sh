#!/usr/bin/env bash
# Same as tdist.sh with the core's spin-waits off (TDIST_SPIN_US=0,
# TDIST_WAIT_SPIN_NS=0): on this 2-core VM, ranks that spin steal the core
# their peer needs, which costs more than a wakeup (docs/cpu-backend.md).
set -euo pipefail
N="$1"; BUDGET="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BIN="${TDIST_BENCH_BUILD:-$ROOT/build-cpu}/bench/cpu/tdist_bench_cpu"
export TDIST_SPIN_US=0 TDIST_WAIT_SPIN_NS=0
exec "$BIN" -n "$N" -T "$BUDGET" -P -t tdist-nospin -o allreduce,broadcast,allgather,barrier
