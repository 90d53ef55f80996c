#!/usr/bin/env bash
# loaded.sh [BUSY] [REPS]: the small-op points with BUSY (default 3)
# busy-polling processes of another job on the host (stress-ng --cpu BUSY),
# tdist and Open MPI shared memory in the same conditions, one peers-format
# line per point (tag suffix -loaded). Needs the peers build
# (PEERS_WORK=<dir> ../shared/peers/build.sh; MPI_BENCH=<dir>/build/mpi_bench)
# and this tree's build-cpu (or TDIST_BENCH_BUILD); TDIST_BASE_BUILD adds a
# base tree's tdist (base-build.sh).
set -euo pipefail
BUSY="${1:-3}"; REPS="${2:-3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${TDIST_BENCH_BUILD:-$ROOT/build-cpu}/bench/cpu/tdist_bench_cpu"
MPI_BENCH="${MPI_BENCH:?MPI_BENCH names the peers build of mpi_bench}"
. "$HERE/mpirun.sh"
stress-ng --cpu "$BUSY" --timeout 600s --quiet &
SPID=$!
trap 'kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null || true' EXIT
sleep 1
for rep in $(seq "$REPS"); do
  "$BIN" -n 2 -T 0.3 -P -t tdist-loaded -o allreduce,broadcast,allgather,barrier -b 1024 |
    sed "s/\$/ rep=$rep/"
  if [ -n "${TDIST_BASE_BUILD:-}" ]; then
    "$TDIST_BASE_BUILD/bench/cpu/tdist_bench_cpu" -n 2 -T 0.3 -P -t tdist-base-loaded \
      -o allreduce,broadcast,allgather,barrier -b 1024 | sed "s/\$/ rep=$rep/"
  fi
  "${MPIRUN[@]}" -np 2 "$MPI_BENCH" -t mpi-shm-loaded -m 1024 -T 0.3 2>/dev/null |
    grep '^peer=' | sed "s/\$/ rep=$rep/"
done
