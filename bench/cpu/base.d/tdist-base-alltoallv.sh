#!/usr/bin/env bash
# The base tree's all_to_all_v (Zipf split) beside this one's (tdist-base.sh).
set -euo pipefail
N="$1"; BUDGET="$2"
: "${TDIST_BASE_BUILD:?TDIST_BASE_BUILD names the base build-cpu folder}"
exec "$TDIST_BASE_BUILD/bench/cpu/tdist_bench_alltoallv" -n "$N" -T "$BUDGET" -P \
  -t "${TDIST_BASE_TAG:-tdist-base}"
