#!/usr/bin/env bash
# test_slurm.sh - tdist jobs started by Slurm, without tdistrun, on a
# one-node Slurm this test starts and stops itself (Debian's slurm-wlm and
# munge: scripts/deps.sh test installs them).
#
# The cluster: munged with a key generated here, slurmctld and slurmd with a
# slurm.conf generated here (one node, this host's name at 127.0.0.1, CPUs=4
# over the real cores with config_overrides, no cgroups, no accounting),
# every file (state, spool, logs, sockets) in a temp dir removed at exit, the
# daemons stopped by pid (trap EXIT), ports chosen from this shell's pid.
#
# Cases (mh_allreduce --iters 5, every result checked):
#   1. srun -n 4, no MASTER_*: rank, size and local rank from SLURM_PROCID,
#      SLURM_NTASKS and SLURM_LOCALID; store address and port derived from
#      Slurm's environment (one node: 127.0.0.1; port from the job and step
#      ids), rank 0 hosts the store;
#   2. an sbatch script as in docs/launcher.md: the port is
#      15000 + (16 * job id + step id mod 16) mod 17000, as documented;
#   3. srun with MASTER_PORT set: that port wins;
#   4. mpirun inside a Slurm step (when Open MPI is installed): every process
#      inherits SLURM_PROCID=0 from the step, and OMPI_COMM_WORLD_* must win.
# Exit 0 pass, 1 fail, 77 skipped (not root, or Slurm/munge not installed).
#
# Environment (from CMake): MH_PROG, MH_SLOW=1 under sanitizers.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/mh_lib.sh"
mh_need_root "Slurm daemons"
for b in munged slurmctld slurmd srun sbatch sinfo scancel; do
  command -v $b >/dev/null || mh_skip "$b not found (apt-get install slurm-wlm munge, or scripts/deps.sh test)"
done

# Nothing of an enclosing job (this test may itself run under Slurm or mpirun).
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TDIST_STORE_HOSTED
unset $(env | grep -oE '^(SLURM|OMPI|PMIX)_[A-Z0-9_]*') 2>/dev/null
D=$(mktemp -d /tmp/tdmh-slurm.XXXXXX)
chmod 711 "$D" # munged's socket must be reachable
export SLURM_CONF=$D/slurm.conf
daemons=()
cleanup() {
  scancel --quiet --user=root >/dev/null 2>&1
  local p
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${daemons[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  rm -rf "$D"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
export TDIST_TIMEOUT_MS=$(($(mh_t 60) * 1000))
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

host=$(hostname)
# slurmctld, slurmd, then srun's ports: below 15000, out of the range the
# library derives a store port from (docs/launcher.md: [15000, 32000)), where
# mpirun's derived port once fell into srun's range (address already in use).
base=$((10000 + ($$ % 100) * 50))
first_job=$((100 + $$ % 5000))
mkdir -p "$D/state" "$D/spool"
: >"$D/plugstack.conf"
dd if=/dev/urandom of="$D/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$D/munge.key"
cat >"$SLURM_CONF" <<EOF
ClusterName=tdmh
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SrunPortRange=$((base + 10))-$((base + 49))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd.log
PlugStackConfig=$D/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
FirstJobId=$first_job
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=tdmh Nodes=$host Default=YES MaxTime=10 State=UP OverSubscribe=YES
EOF

munged -F -f --socket="$D/munge.sock" --key-file="$D/munge.key" --pid-file="$D/munged.pid" \
  --log-file="$D/munged.log" --seed-file="$D/munged.seed" >"$D/munged.out" 2>&1 &
daemons+=($!)
for _ in $(seq 1 50); do [ -S "$D/munge.sock" ] && break; sleep 0.1; done
slurmctld -D -f "$SLURM_CONF" >"$D/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D -f "$SLURM_CONF" >"$D/slurmd.out" 2>&1 &
daemons+=($!)
up=0
for _ in $(seq 1 $(($(mh_t 30) * 5))); do
  if [ "$(sinfo -h -o %T 2>/dev/null)" = idle ]; then up=1; break; fi
  sleep 0.2
done
if [ $up != 1 ]; then
  echo "FAIL: the one-node Slurm did not come up (sinfo: $(sinfo -h 2>&1))"
  mh_dump "$D"/*.log "$D"/*.out
  exit 1
fi
mh_log "Slurm up: node $host (CPUs=4), ports $base.., first job id $first_job"

# check TAG FILE: 4 ranks checked OK; each START line consistent with Slurm's
# variables (rank = SLURM_PROCID, size 4, local rank = rank on one node).
check() {
  local tag=$1 f=$2 r ok=0
  for r in 0 1 2 3; do
    grep -qE "^MH START rank=$r size=4 local=$r node=0 env_rank=$r\$" "$f" || ok=1
    grep -qE "^MH OK rank=$r " "$f" || ok=1
  done
  grep -q "MH WRONG" "$f" && ok=1
  if [ $ok = 0 ]; then
    mh_log "$tag: 4 ranks, rank/size/local rank from Slurm, results checked: OK"
  else
    fail "$tag"
    mh_dump "$f" "$D/slurmd.log"
  fi
  return $ok
}

# The port the library derives for job J, step S (docs/launcher.md).
slurm_port() { echo $((15000 + (16 * $1 + $2 % 16) % 17000)); }

# 1. srun, everything from Slurm's environment.
t0=$SECONDS
TDIST_DEBUG=INFO TDIST_DEBUG_SUBSYS=INIT timeout -k 5 "$(mh_t 90)" \
  srun -n 4 -t 2 --kill-on-bad-exit=1 "$MH_PROG" --iters 5 >"$D/srun.out" 2>&1
rc=$?
if check "srun -n 4 (exit $rc, $((SECONDS - t0)) s)" "$D/srun.out" && [ $rc = 0 ]; then
  grep -qE "store at 127\.0\.0\.1:[0-9]+ \(address and port from Slurm's environment\)" \
    "$D/srun.out" || fail "srun: no log line saying the store address came from Slurm"
else
  [ $rc = 0 ] || fail "srun exit $rc"
fi

# 2. an sbatch script (one node: 127.0.0.1, the port from the job id).
cat >"$D/job.sh" <<EOF
#!/bin/bash
#SBATCH --ntasks=4
#SBATCH --time=2
#SBATCH --output=$D/batch.out
export TDIST_DEBUG=INFO TDIST_DEBUG_SUBSYS=INIT
srun --kill-on-bad-exit=1 "$MH_PROG" --iters 5
EOF
t0=$SECONDS
job=$(sbatch --parsable "$D/job.sh" 2>"$D/sbatch.err")
job=${job%%;*}
# Poll the job ourselves: sbatch --wait sleeps up to 10 s between checks.
rc=1
if [ -n "$job" ]; then
  end=$((SECONDS + $(mh_t 90)))
  while [ $SECONDS -lt $end ] && [ -n "$(squeue -h -j "$job" 2>/dev/null)" ]; do sleep 0.3; done
  state=$(scontrol show job "$job" 2>/dev/null | grep -oE "JobState=[A-Z]+|ExitCode=[0-9:]+" | tr '\n' ' ')
  [[ "$state" == *"JobState=COMPLETED ExitCode=0:0"* ]] && rc=0
  [ $rc = 0 ] || echo "  job $job: ${state:-unknown}"
fi
check "sbatch (job $job, exit $rc, $((SECONDS - t0)) s)" "$D/batch.out"
[ $rc = 0 ] || fail "sbatch job $job did not complete with exit 0: $(cat "$D/sbatch.err")"
if [ -n "$job" ]; then
  want=$(slurm_port "$job" 0)
  grep -q "store at 127.0.0.1:$want " "$D/batch.out" ||
    fail "sbatch: the store port is not $want = 15000 + (16 * $job + 0) mod 17000"
fi

# 3. MASTER_PORT set: it wins over the derived port.
port=$((base + 5))
MASTER_PORT=$port TDIST_DEBUG=INFO TDIST_DEBUG_SUBSYS=INIT timeout -k 5 "$(mh_t 90)" \
  srun -n 4 -t 2 --kill-on-bad-exit=1 "$MH_PROG" --iters 3 >"$D/port.out" 2>&1
rc=$?
check "srun with MASTER_PORT=$port (exit $rc)" "$D/port.out"
grep -q "store at 127.0.0.1:$port (address from Slurm's environment)" "$D/port.out" ||
  fail "MASTER_PORT=$port was not used"

# 4. mpirun inside a Slurm step: OMPI_COMM_WORLD_* over the inherited
# SLURM_PROCID (the same on every process).
if command -v mpirun >/dev/null; then
  timeout -k 5 "$(mh_t 90)" srun -n 1 -c 4 -t 2 mpirun --allow-run-as-root --oversubscribe \
    -np 4 "$MH_PROG" --iters 3 >"$D/mpi.out" 2>&1
  rc=$?
  check "mpirun -np 4 inside srun (exit $rc)" "$D/mpi.out"
  [ $rc = 0 ] || fail "mpirun inside srun: exit $rc"
else
  echo "SKIPPED (part): mpirun inside a Slurm step: Open MPI is not installed"
fi

[ $failures = 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "PASSED"
exit 0
