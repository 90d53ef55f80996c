#!/usr/bin/env bash
# tdist's all_to_all_v with a Zipf-like (MoE expert load) split, for
# ../shared/peers/run.sh: called as `tdist-alltoallv.sh N BUDGET` from the
# peers directory. Uses the optimised build in $TDIST_BENCH_BUILD (default:
# build-cpu next to this repository's root). Its Open MPI counterpart is
# mpi-alltoallv.sh (same split: ../zipf_split.h).
set -euo pipefail
N="$1"; BUDGET="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BIN="${TDIST_BENCH_BUILD:-$ROOT/build-cpu}/bench/cpu/tdist_bench_alltoallv"
exec "$BIN" -n "$N" -T "$BUDGET" -P -t tdist
