#!/usr/bin/env bash
# paired.sh [REPS] [N]: the small-op points of the peers run, tdist and Open
# MPI shared memory measured back to back, point by point, REPS times (default
# 6), each pair beside this host's cache-line floor (tdist_bench_line_floor
# swap, ns per op) just before and after it.
#
# Why: on a guest whose two vCPUs the host moves, the line floor changes
# between about 40 and 320 ns from one run to the next (2026-12-01), and a
# small op costs a few line crossings. A peers run measures each library's
# whole sweep minutes apart, so at the points where both are near the floor
# the comparison mostly says where the vCPUs were. Two runs of one point a
# second apart usually see the same floor: the ratio of a pair is the
# comparison, its spread over REPS pairs the noise.
#
# Prints one line per pair: op, n, bytes, floor before/after, tdist and Open
# MPI mean us (the peers bench's figure), ratio; then each point's median
# ratio and how many pairs tdist lost. Needs the peers build
# (PEERS_WORK=<dir> ../shared/peers/build.sh; MPI_BENCH=<dir>/build/mpi_bench)
# and, for all_to_all_v, MPI_ALLTOALLV (peers.d/mpi-alltoallv.sh builds it
# as <dir>/build/mpi_alltoallv); this tree's build-cpu (or TDIST_BENCH_BUILD).
# POINTS: "op:bytes ..." (default the 8-byte ops, the barrier and the 1 KiB
# all_to_all_v). FLOOR_MAX=<ns>: the summary counts only the pairs whose
# floor was below it before and after (one placement: the fast one's is
# under about 160 ns); every pair is still printed.
set -euo pipefail
REPS="${1:-6}"; N="${2:-2}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
B="${TDIST_BENCH_BUILD:-$ROOT/build-cpu}/bench/cpu"
MPI_BENCH="${MPI_BENCH:?MPI_BENCH names the peers build of mpi_bench}"
MPI_ALLTOALLV="${MPI_ALLTOALLV:-$(dirname "$MPI_BENCH")/mpi_alltoallv}"
POINTS="${POINTS:-allreduce:8 broadcast:8 allgather:8 barrier:0 alltoallv:1024}"
. "$HERE/mpirun.sh"
# the mean (us=) of the first peers line matching $1
mean() { grep -E "$1" | head -1 | sed -n 's/.* us=\([0-9.]*\).*/\1/p'; }
floor() { "$B/tdist_bench_line_floor" swap | sed -n 's/.*process=0 ns_per_op=\([0-9.]*\).*/\1/p'; }
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
for rep in $(seq "$REPS"); do
  for p in $POINTS; do
    op="${p%%:*}"; by="${p##*:}"
    f0="$(floor)"
    case "$op" in
      alltoallv)
        t="$("$B/tdist_bench_alltoallv" -n "$N" -T 0.3 -P -b "$by" | mean "bytes=$by ")"
        m="$("${MPIRUN[@]}" -np "$N" "$MPI_ALLTOALLV" -T 0.3 -b "$by" 2>/dev/null | mean "bytes=$by ")" ;;
      barrier)
        t="$("$B/tdist_bench_cpu" -n "$N" -T 0.3 -P -o barrier | mean "op=barrier")"
        m="$("${MPIRUN[@]}" -np "$N" "$MPI_BENCH" -T 0.3 -o barrier 2>/dev/null | mean "op=barrier")" ;;
      *)
        mop="$op"; [ "$op" = broadcast ] && mop=bcast
        t="$("$B/tdist_bench_cpu" -n "$N" -T 0.3 -P -o "$op" -m "$by" -b "$by" | mean "bytes=$by ")"
        m="$("${MPIRUN[@]}" -np "$N" "$MPI_BENCH" -T 0.3 -o "$mop" -m "$by" 2>/dev/null |
          mean "bytes=$by ")" ;;
    esac
    f1="$(floor)"
    r="$(awk -v t="$t" -v m="$m" 'BEGIN { printf "%.2f", t / m }')"
    echo "pair op=$op n=$N bytes=$by floor_ns=$f0/$f1 tdist_us=$t mpi_us=$m ratio=$r rep=$rep" |
      tee -a "$OUT"
  done
done
echo "# per point: median ratio (tdist / Open MPI), pairs tdist lost (ratio > 1)${FLOOR_MAX:+, floor < $FLOOR_MAX ns}"
for p in $POINTS; do
  op="${p%%:*}"
  grep " op=$op " "$OUT" |
    awk -v fmax="${FLOOR_MAX:-0}" '{ split($5, f, "[=/]") }
      fmax == 0 || (f[2] < fmax + 0 && f[3] < fmax + 0) { sub(".*=", "", $8); print $8 }' |
    sort -n |
    awk -v op="$op" -v n="$N" '{ r[NR] = $1; if ($1 > 1) lost++ }
      END { if (!NR) { printf "median op=%s n=%d no pairs\n", op, n; exit }
            m = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2;
            printf "median op=%s n=%d ratio=%.2f lost=%d/%d\n", op, n, m, lost, NR }'
done
