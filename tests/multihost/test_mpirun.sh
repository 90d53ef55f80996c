#!/usr/bin/env bash
# test_mpirun.sh - tdist jobs started by Open MPI's mpirun, without tdistrun
# (Debian's openmpi-bin: scripts/deps.sh test installs it).
#
# Cases (mh_allreduce, every result checked; as root mpirun needs
# --allow-run-as-root, and --oversubscribe for 4 ranks on 2 cores):
#   1. mpirun -np 4, no MASTER_*: rank, size and local rank from
#      OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK; every rank is on this node
#      (OMPI_COMM_WORLD_LOCAL_SIZE = size), so the store is on 127.0.0.1 at
#      the port derived from the job's PMIx namespace (docs/launcher.md);
#   2. mpirun -np 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=P, the way
#      docs/launcher.md gives for several nodes: that address and port;
#   3. a rank that exits with an error: mpirun ends the job (its fail-fast)
#      within a bounded time, non-zero, and no rank hangs.
# Exit 0 pass, 1 fail, 77 skipped (Open MPI not installed).
#
# Environment (from CMake): MH_PROG, MH_SLOW=1 under sanitizers.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/mh_lib.sh"
command -v mpirun >/dev/null ||
  mh_skip "mpirun not found (apt-get install openmpi-bin, or scripts/deps.sh test)"
mpirun --version 2>/dev/null | grep -q "Open MPI" ||
  mh_skip "mpirun is not Open MPI's ($(mpirun --version 2>&1 | head -n 1))"

# Nothing of an enclosing job (this test may itself run under Slurm or mpirun).
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TDIST_STORE_HOSTED
unset $(env | grep -oE '^(SLURM|OMPI|PMIX)_[A-Z0-9_]*') 2>/dev/null
D=$(mktemp -d /tmp/tdmh-mpi.XXXXXX)
trap 'rm -rf "$D"' EXIT
trap 'exit 130' INT TERM
export TDIST_TIMEOUT_MS=$(($(mh_t 60) * 1000))
mpi=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# check TAG FILE: 4 ranks checked OK, rank/size/local rank from Open MPI.
check() {
  local tag=$1 f=$2 r ok=0
  for r in 0 1 2 3; do
    grep -qE "^MH START rank=$r size=4 local=$r node=0 env_rank=$r\$" "$f" || ok=1
    grep -qE "^MH OK rank=$r " "$f" || ok=1
  done
  grep -q "MH WRONG" "$f" && ok=1
  if [ $ok = 0 ]; then
    mh_log "$tag: 4 ranks, rank/size/local rank from Open MPI, results checked: OK"
  else
    fail "$tag"
    mh_dump "$f"
  fi
}

# 1. nothing but mpirun's environment.
t0=$SECONDS
TDIST_DEBUG=INFO TDIST_DEBUG_SUBSYS=INIT timeout -k 5 "$(mh_t 90)" \
  "${mpi[@]}" -x TDIST_DEBUG -x TDIST_DEBUG_SUBSYS -np 4 "$MH_PROG" --iters 5 >"$D/plain.out" 2>&1
rc=$?
check "mpirun -np 4 (exit $rc, $((SECONDS - t0)) s)" "$D/plain.out"
[ $rc = 0 ] || fail "mpirun exit $rc"
grep -qE "store at 127\.0\.0\.1:(1[5-9]|2[0-9]|3[01])[0-9]{3} \(address and port from Open MPI's environment\)" \
  "$D/plain.out" || fail "mpirun: no log line saying the store came from Open MPI's environment"

# 2. the multi-node way of the docs: MASTER_ADDR/MASTER_PORT passed with -x.
port=$((20000 + $$ % 5000))
t0=$SECONDS
MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TDIST_DEBUG=INFO TDIST_DEBUG_SUBSYS=INIT \
  timeout -k 5 "$(mh_t 90)" "${mpi[@]}" -x MASTER_ADDR -x MASTER_PORT -x TDIST_DEBUG \
  -x TDIST_DEBUG_SUBSYS -np 4 "$MH_PROG" --iters 5 >"$D/x.out" 2>&1
rc=$?
check "mpirun -np 4 -x MASTER_ADDR -x MASTER_PORT=$port (exit $rc, $((SECONDS - t0)) s)" "$D/x.out"
[ $rc = 0 ] || fail "mpirun -x exit $rc"
grep -q "joined on 127.0.0.1:$port" "$D/x.out" || fail "mpirun -x: the store is not at 127.0.0.1:$port"

# 3. a failing rank: mpirun's own fail-fast ends the job. Rank 2 gets a bad
# argument and exits 2 at once; the others must not outlive the bound.
cat >"$D/wrap.sh" <<EOF
#!/bin/sh
[ "\$OMPI_COMM_WORLD_RANK" = 2 ] && exec "$MH_PROG" --bad-argument
exec "$MH_PROG" --loop 60
EOF
chmod +x "$D/wrap.sh"
t0=$SECONDS
timeout -k 5 "$(mh_t 60)" "${mpi[@]}" -np 4 "$D/wrap.sh" >"$D/fail.out" 2>&1
rc=$?
took=$((SECONDS - t0))
if [ $rc = 0 ] || [ $rc = 124 ] || [ $rc = 137 ] || grep -q "MH WRONG" "$D/fail.out"; then
  fail "a failing rank under mpirun: exit $rc after $took s (want non-zero, well within the bound)"
  mh_dump "$D/fail.out"
else
  mh_log "a failing rank under mpirun: job ended with exit $rc after $took s: OK"
fi

[ $failures = 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "PASSED"
exit 0
