#!/usr/bin/env bash
# Completion latency of the NCCL backend on the simulated GPU, for
# ../shared/peers/run.sh (EXTRA_DIRS=<repo>/bench/nccl/peers.d): called as
# `tdist-nccl-sim.sh N BUDGET` from the peers directory. The bench is one
# process (a world of one rank, ops in flight as `n`), so it runs for one N
# only: $TDIST_COMPLAT_N (default 2); other N print nothing. Each (hold, ops
# in flight) case gets 10 x BUDGET seconds (3 s with the default 0.3: about
# 25 s in all). Uses the build in $TDIST_BENCH_BUILD (default: build-cpu next
# to this repository's root).
# Lines: peer=tdist-nccl-sim op=complat_{query,poll,wait}_{short,long} n=K
#        bytes=0 us=MEAN algbw=0 busbw=0 p50_us= iters= p90_us= p99_us= max_us= load1=
set -euo pipefail
N="$1"; BUDGET="$2"
[ "$N" = "${TDIST_COMPLAT_N:-2}" ] || exit 0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BIN="${TDIST_BENCH_BUILD:-$ROOT/build-cpu}/bench/nccl/tdist_bench_complat_sim"
T="$(awk -v b="$BUDGET" 'BEGIN { t = 10 * b; if (t < 1) t = 1; printf "%.2f", t }')"
exec "$BIN" -P -t tdist-nccl-sim -T "$T"
