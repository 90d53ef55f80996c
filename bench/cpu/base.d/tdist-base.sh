#!/usr/bin/env bash
# A base tree's tdist beside this one in the same ../shared/peers/run.sh run
# (before/after columns): `TDIST_BASE_BUILD=<its build-cpu>
# EXTRA_DIRS=bench/cpu/peers.d:bench/cpu/base.d run.sh`. Lines are tagged
# $TDIST_BASE_TAG (default tdist-base). Build the base with
# bench/cpu/base-build.sh REV DIR.
set -euo pipefail
N="$1"; BUDGET="$2"
: "${TDIST_BASE_BUILD:?TDIST_BASE_BUILD names the base build-cpu folder}"
exec "$TDIST_BASE_BUILD/bench/cpu/tdist_bench_cpu" -n "$N" -T "$BUDGET" -P \
  -t "${TDIST_BASE_TAG:-tdist-base}" -o allreduce,broadcast,allgather,barrier
