#!/usr/bin/env bash
# run_overhead.sh BUILD_DIR - the runtime-overhead benchmark beside its peer,
# in the same run: tdist_bench_overhead (test backend: no data moves) and
# Open MPI's MPI_Iallreduce on MPI_COMM_SELF (peer_mpi_overhead.c, built here
# with mpicc when installed). Prints both tables and the ratio MPI / tdist
# (above 1: tdist costs less per op).
set -euo pipefail
B=${1:-build/release}
here=$(cd "$(dirname "$0")" && pwd)
OPS=${OPS:-200000}
"$B/bench/core/tdist_bench_overhead" -o "$OPS" -r 3 | tee /tmp/tdist_overhead.$$
if ! command -v mpicc >/dev/null; then
  echo "(no mpicc: Open MPI peer skipped; apt-get install libopenmpi-dev openmpi-bin)"
  exit 0
fi
mpicc -O2 -o "$B/bench/core/peer_mpi_overhead" "$here/peer_mpi_overhead.c"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  "$B/bench/core/peer_mpi_overhead" "$OPS" 3 | tee /tmp/mpi_overhead.$$
echo
echo "| row | tdist ns/op | Open MPI ns/op | Open MPI / tdist |"
echo "|---|---|---|---|"
for row in pipelined roundtrip; do
  t=$(grep "op=overhead_$row threads=1 " /tmp/tdist_overhead.$$ | sed 's/.*ns_op=\([0-9.]*\).*/\1/')
  m=$(grep "op=overhead_$row " /tmp/mpi_overhead.$$ | sed 's/.*ns_op=\([0-9.]*\).*/\1/')
  echo "| $row, 1 thread | $t | $m | $(awk -v a="$m" -v b="$t" 'BEGIN{printf "%.2f", a/b}') |"
done
rm -f /tmp/tdist_overhead.$$ /tmp/mpi_overhead.$$
