#!/usr/bin/env bash
# Submit and completion cost of tdist_all_reduce beside the same work done by hand through
# the same library (bench/nccl/submit_bench.c), on the simulated GPU, for
# ../shared/peers/run.sh (EXTRA_DIRS=<repo>/bench/nccl/peers.d): called as
# `tdist-submit-sim.sh N BUDGET` from the peers directory. One process (a world of one
# rank), so it runs for one N only: $TDIST_SUBMIT_N (default 2); other N print nothing.
# Each measure gets 10 x BUDGET seconds (3 s with the default 0.3). Uses the build in
# $TDIST_BENCH_BUILD (default: build-cpu next to this repository's root).
# Lines: peer=tdist-submit-sim op={submit,complete}_{raw,tdist,poll,wait,added} n=1
#        bytes=1024 us=MEAN algbw=0 busbw=0 p50_us= iters= [p90_us= p99_us=]
set -euo pipefail
N="$1"; BUDGET="$2"
[ "$N" = "${TDIST_SUBMIT_N:-2}" ] || exit 0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BIN="${TDIST_BENCH_BUILD:-$ROOT/build-cpu}/bench/nccl/tdist_bench_submit_sim"
T="$(awk -v b="$BUDGET" 'BEGIN { t = 10 * b; if (t < 1) t = 1; printf "%.2f", t }')"
exec "$BIN" -P -t tdist-submit-sim -T "$T"
