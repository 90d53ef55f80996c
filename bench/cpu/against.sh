#!/usr/bin/env bash
# against.sh BASE_BUILD [REPS] [NS]: every point of the peers run (all_reduce,
# broadcast, all_gather 8 B..64 MiB, the barrier, the Zipf all_to_all_v
# 1 KiB..64 MiB) for this tree's build, another tdist build (BASE_BUILD, e.g.
# 7bb5725's from base-build.sh) and, with MPI_BENCH set, Open MPI's shared
# memory: each op's sweep run by each of them back to back, in an order that
# turns by one each rep, REPS times (default 8) at each n of NS (default
# "2 4").
#
# Why: a peers run takes each point's best of a few reps, each library's
# whole sweep a minute or more from the others'. Where two sit at the same
# floor (a large copy, a line's crossing) its comparison then says mostly
# whose rep caught the host's faster placement of the two vCPUs
# (bench/cpu/RESULTS.md, 2026-12-02 10:21: 7bb5725 once ran the 64 KiB
# all_gather at n = 2 in 4.08 us, its other reps and all of this tree's in
# 6.2-7.6). Here a point's runs are seconds apart, and this tree counts as
# slower at a point only when it lost so many of its pairs that a fair coin
# would do that less than one time in twenty (a one-sided sign test).
#
# Prints one line per pair (op, n, bytes, the means: the peers bench's us=,
# the ratios), then per point and peer the median ratio (this tree / peer),
# pairs lost, the sign test's p, and SLOWER where p < 0.05; the last lines
# count the points SLOWER per peer. TDIST_BENCH_BUILD: this tree's build
# (default build-cpu). BUDGET: each sweep's -T (default 0.3, as the peers
# run). MPI_BENCH: the peers build's mpi_bench (PEERS_WORK/build/mpi_bench);
# MPI_ALLTOALLV: its all_to_all_v (default mpi_alltoallv beside it, as
# peers.d/mpi-alltoallv.sh builds it).
set -euo pipefail
BASE="${1:?usage: against.sh BASE_BUILD [REPS] [NS]}"
REPS="${2:-8}"; NS="${3:-2 4}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
HEAD="${TDIST_BENCH_BUILD:-$ROOT/build-cpu}"
BUDGET="${BUDGET:-0.3}"
for b in "$HEAD" "$BASE"; do
  [ -x "$b/bench/cpu/tdist_bench_cpu" ] && [ -x "$b/bench/cpu/tdist_bench_alltoallv" ] ||
    { echo "against.sh: $b has no tdist_bench_cpu and tdist_bench_alltoallv" >&2; exit 2; }
done
WHO="head base"
if [ -n "${MPI_BENCH:-}" ]; then
  MPI_ALLTOALLV="${MPI_ALLTOALLV:-$(dirname "$MPI_BENCH")/mpi_alltoallv}"
  [ -x "$MPI_BENCH" ] && [ -x "$MPI_ALLTOALLV" ] ||
    { echo "against.sh: no $MPI_BENCH or $MPI_ALLTOALLV" >&2; exit 2; }
  . "$HERE/mpirun.sh"
  WHO="head base mpi"
fi
OUT="$(mktemp)"
trap 'rm -f "$OUT" "$OUT.rep"' EXIT
# sweep WHO N OP: that peer's lines of one op, tagged WHO, as op=broadcast
sweep() {
  case "$1" in
    head | base)
      local b="$HEAD"; [ "$1" = base ] && b="$BASE"
      if [ "$3" = alltoallv ]; then
        "$b/bench/cpu/tdist_bench_alltoallv" -n "$2" -T "$BUDGET" -P -t "$1"
      else
        "$b/bench/cpu/tdist_bench_cpu" -n "$2" -T "$BUDGET" -P -t "$1" -o "$3"
      fi ;;
    mpi)
      if [ "$3" = alltoallv ]; then
        "${MPIRUN[@]}" -np "$2" "$MPI_ALLTOALLV" -t mpi -T "$BUDGET"
      else
        local o="$3"; [ "$o" = broadcast ] && o=bcast
        "${MPIRUN[@]}" -np "$2" "$MPI_BENCH" -t mpi -T "$BUDGET" -o "$o"
      fi ;;
  esac 2>/dev/null | grep '^peer=' | sed 's/ op=bcast / op=broadcast /' ||
    echo "against.sh: $1's $3 at n=$2 failed or printed nothing; its points miss this rep" >&2
}
for rep in $(seq "$REPS"); do
  # this rep's order: WHO turned by rep - 1
  # shellcheck disable=SC2086 # WHO is a list of words
  set -- $WHO
  for _ in $(seq $(((rep - 1) % $#))); do set -- "${@:2}" "$1"; done
  order="$*"
  for n in $NS; do
    for op in allreduce broadcast allgather barrier alltoallv; do
      for w in $order; do sweep "$w" "$n" "$op"; done >"$OUT.rep"
      awk -v rep="$rep" '{
          for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
          k = f["op"] " n=" f["n"] " bytes=" f["bytes"]
          us[f["peer"], k] = f["us"]; keys[k] = 1
        } END {
          for (k in keys) {
            if (!(("head", k) in us)) continue
            line = sprintf("pair %s head_us=%s", k, us["head", k])
            for (p = 1; p <= 2; p++) {
              w = p == 1 ? "base" : "mpi"
              if ((w, k) in us && us[w, k] > 0)
                line = line sprintf(" %s_us=%s %s_ratio=%.3f", w, us[w, k], w, us["head", k] / us[w, k])
            }
            print line " rep=" rep
          }
        }' "$OUT.rep" | sort -k2,2 -k3,3 -k4,4V | tee -a "$OUT"
    done
  done
done
echo "# per point and peer: median ratio (this tree / peer), pairs lost, one-sided sign test p"
for w in $WHO; do
  [ "$w" = head ] && continue
  grep -o "^pair [^ ]* [^ ]* [^ ]* .*${w}_ratio=[0-9.]*" "$OUT" |
    awk -v w="$w" '{ k = $2 " " $3 " " $4; r = $NF; sub(".*=", "", r); v[k] = v[k] " " r }
      END { for (k in v) print k, v[k] }' | sort -k1,1 -k2,2 -k3,3V |
    awk -v w="$w" '{
        m = 0; lost = 0
        for (i = 4; i <= NF; i++) { v[++m] = $i + 0; if (v[m] > 1) lost++ }
        for (i = 2; i <= m; i++)
          for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        med = m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
        # P(X >= lost), X ~ Binomial(m, 1/2)
        p = 0; c = 1
        for (i = 0; i <= m; i++) { if (i >= lost) p += c; c = c * (m - i) / (i + 1) }
        p /= 2 ^ m
        flag = p < 0.05 ? " SLOWER" : ""
        if (flag != "") slower++
        printf "median vs=%s %s %s %s ratio=%.3f lost=%d/%d p=%.3f%s\n", w, $1, $2, $3, med, lost, m, p, flag
      } END { printf "# points slower than %s (p < 0.05): %d\n", w, slower + 0 }'
done
