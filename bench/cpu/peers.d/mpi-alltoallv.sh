#!/usr/bin/env bash
# Open MPI's MPI_Alltoallv with the same Zipf-like split as
# tdist-alltoallv.sh, for ../shared/peers/run.sh: called as
# `mpi-alltoallv.sh N BUDGET`. Builds mpi_alltoallv.c with mpicc (into
# $PEERS_WORK/build, else a temporary folder) on first use and runs it the
# way run.sh runs its own mpi_bench (shared memory, all ranks unpinned, on
# loopback). Prints nothing (exit 0) when Open MPI is not installed.
set -euo pipefail
N="$1"; BUDGET="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v mpicc >/dev/null && command -v mpirun >/dev/null || { echo "# mpi-alltoallv: no Open MPI" >&2; exit 0; }
OUT="${PEERS_WORK:-${TMPDIR:-/tmp}/tdist-peers}/build"
mkdir -p "$OUT"
BIN="$OUT/mpi_alltoallv"
if [ ! -x "$BIN" ] || [ "$HERE/mpi_alltoallv.c" -nt "$BIN" ] || [ "$HERE/../zipf_split.h" -nt "$BIN" ]; then
  mpicc ${CFLAGS:--O3 -march=native} -Wall -I"$HERE/.." -o "$BIN" "$HERE/mpi_alltoallv.c" -lm
fi
. "$HERE/../mpirun.sh"
exec "${MPIRUN[@]}" -np "$N" "$BIN" -t mpi-shm -T "$BUDGET"
