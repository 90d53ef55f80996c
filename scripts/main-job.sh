#!/usr/bin/env bash
# main-job.sh [BUILD_DIR] - the body of the README's first command: runs
# tdistrun -n 4 (TDIST_NPROC to change) on each example and on the CPU
# collective benchmark, on the CPU backend, on this machine (no GPU needed),
# and ends with a summary: the results checked, the overlap gained, the
# bandwidth table.
#
# BUILD_DIR (default build/release) is built first (Release, no tests) when it
# has no tdistrun yet; scripts/run.sh builds it and then calls this script.
# Exit status: 0 if every run succeeded, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/release}
N=${TDIST_NPROC:-4}
LIMIT=${TDIST_JOB_TIMEOUT:-300} # seconds per run; tdistrun stops the ranks on SIGTERM

if [ ! -x "$B/tools/launcher/tdistrun" ]; then
  echo "==== building tdist into $B"
  mkdir -p "$B"
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTDIST_BUILD_TESTS=OFF \
    >"$B/configure.log" 2>&1 || { cat "$B/configure.log"; exit 1; }
  cmake --build "$B" -j "$(nproc)" >"$B/build.log" 2>&1 || { tail -50 "$B/build.log"; exit 1; }
fi
TDISTRUN="$B/tools/launcher/tdistrun"
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
status=0
declare -a SUMMARY

# job NAME PROGRAM ARGS... : run it under tdistrun, show its output as it
# comes, keep it for the summary.
job() {
  local name=$1
  shift
  echo
  echo "==== $name: tdistrun -n $N --backend cpu $* "
  local t0=$SECONDS rc
  timeout --foreground -s TERM "$LIMIT" "$TDISTRUN" -n "$N" --backend cpu "$@" 2>&1 |
    tee "$LOGS/$name.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then
    SUMMARY+=("$(printf '  %-9s OK      (%d s)' "$name" $((SECONDS - t0)))")
  else
    [ "$rc" -eq 124 ] && echo "main-job: $name did not finish in $LIMIT s"
    SUMMARY+=("$(printf '  %-9s FAILED  (exit %d; see its output above)' "$name" "$rc")")
    status=1
  fi
}

# Lines rank 0 printed that start with "PREFIX:" (the examples' summaries).
summary_of() { grep -h "^\[rank 0\] $2" "$LOGS/$1.log" 2>/dev/null | sed 's/^\[rank 0\] /      /'; }

job overlap "$B/examples/overlap"
job mesh "$B/examples/mesh"
job pipeline "$B/examples/pipeline"
job moe "$B/examples/moe"
job dp_train env TDIST_LIBRARY="$B/libtdist.so" PYTHONPATH=python /usr/bin/python3 examples/python/dp_train.py # apt python3 + python3-numpy (deps.sh)

# The CPU backend's collective benchmark, when this build has one.
BENCH=""
if [ -d "$B/bench/cpu" ]; then
  # by name: bench/cpu also holds other benchmarks (tdist_bench_alltoallv)
  BENCH=$(find "$B/bench/cpu" -maxdepth 1 -type f -executable -name 'tdist_bench_cpu*' | sort | head -n 1)
fi
if [ -n "$BENCH" ]; then
  # A short budget per point: the table, not a careful measurement
  # (bench/cpu and ../shared/peers do that).
  job bench "$BENCH" -T "${TDIST_BENCH_BUDGET:-0.1}" -o allreduce,broadcast,allgather,reduce_scatter,alltoall,barrier
else
  SUMMARY+=("$(printf '  %-9s skipped (no CPU collective benchmark in %s/bench/cpu)' bench "$B")")
fi

echo
echo "==== tdist main job: $N ranks on $(hostname), CPU backend (TCP; large same-host messages by single copy), no GPU"
for line in "${SUMMARY[@]}"; do
  echo "$line"
  case "$line" in
  *"overlap "*) summary_of overlap "overlap:" ;;
  *"mesh "*) summary_of mesh "mesh:" ;;
  *"pipeline "*) summary_of pipeline "pipeline:" ;;
  *"moe "*) summary_of moe "moe:" ;;
  esac
done
if [ -n "$BENCH" ] && [ -f "$LOGS/bench.log" ]; then
  echo "  bandwidth ($(basename "$BENCH"), rank 0):"
  grep -h "^\[rank 0\] " "$LOGS/bench.log" | sed 's/^\[rank 0\] /      /'
fi
[ "$status" -eq 0 ] && echo "==== all runs succeeded" || echo "==== some runs FAILED"
exit "$status"
