#!/usr/bin/env bash
# test_netbed.sh run|faults - tdist across hosts, on a bed of network
# namespaces (netbed.sh): 3 hosts, `tdistrun -n 2 --nnodes 3 --node-rank I`
# on host I, host 0 hosts the store at 10.213.0.1.
#
#   run     mh_allreduce (checked all_reduce loops; single copy never between
#           hosts and used within one; every rank logs that the ranks of
#           the other hosts it connects to, and none of its own, are "on
#           another host"), then the examples
#           (overlap, mesh 2x3x1, pipeline) across the hosts.
#   faults  a checked loop per fault, the survivors' reports checked:
#           - every process of host 2 killed (SIGKILL: the kernel closes the
#             sockets): survivors 0-3 fail with REMOTE_FAILED/ABORTED naming
#             world rank 4 or 5, within 5 s (docs: "well within a second");
#           - host 1's switch port set down (no FIN, no RST: only the store's
#             heartbeat timeout can find it): survivors 0,1,4,5 name world
#             rank 2 or 3, within the heartbeat timeout + 5 s, long before the
#             op timeout (30 s);
#           - delay and loss on host 2's link (tc netem), when the kernel has
#             netem (else that part prints SKIPPED and the rest still runs),
#             then a bandwidth limit there (tc tbf): the checked loop
#             completes with correct results, nobody is declared dead.
#           No checked all_reduce may ever return a wrong result.
# Exit 0 pass, 1 fail, 77 skipped (not root, or no network namespaces).
#
# Environment (from CMake): TDISTRUN, MH_PROG, EX_OVERLAP, EX_MESH,
# EX_PIPELINE (examples: optional), MH_SLOW=1 under sanitizers.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/mh_lib.sh"
. "$here/netbed.sh"
mode=${1:-run}
NH=3
NPER=2
NAME=tdmh-$$-${mode:0:3}
MASTER=$(nb_addr 0)
WORK=$(mktemp -d /tmp/tdmh.XXXXXX)

cleanup() {
  nb_down "$NAME"
  rm -rf "$WORK"
}

mh_need_root
nb_sweep
trap cleanup EXIT
trap 'exit 130' INT TERM
if ! why=$(nb_up "$NAME" $NH); then
  mh_skip "multi-host test bed: $why"
fi
mh_log "bed $NAME: $NH hosts $(nb_addr 0)..$(nb_addr $((NH - 1))) on a bridge"

# Every process (launchers and ranks) gets these; the store's heartbeat
# timeout is read by the launcher of host 0, which hosts it.
export TDIST_TRACE_PREFIX=$WORK/trace_
export TDIST_TIMEOUT_MS=$(($(mh_t 60) * 1000))
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TDIST_STORE_HOSTED
port=29500
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# start TAG [launcher options --] PROG ARGS...: one launcher per host, in
# the background (hosts 2 and 1 first: clients retry until the store is up).
start() {
  local tag=$1 i lopts=()
  shift
  if [[ " $* " == *" -- "* ]]; then
    while [ "$1" != "--" ]; do lopts+=("$1"); shift; done
    shift
  fi
  port=$((port + 1))
  for ((i = NH - 1; i >= 0; i--)); do
    (
      nb_exec "$NAME" $i timeout -k 5 "$(mh_t 150)" "$TDISTRUN" "${lopts[@]}" -n $NPER \
        --nnodes $NH --node-rank $i --master-addr "$MASTER" --master-port $port "$@" \
        >"$WORK/$tag.h$i.out" 2>"$WORK/$tag.h$i.err"
      echo $? >"$WORK/$tag.h$i.rc"
    ) &
  done
}

# finish TAG: wait for the launchers, 0 if all exited 0.
finish() {
  local tag=$1 i rc ok=0
  wait
  for ((i = 0; i < NH; i++)); do
    rc=$(cat "$WORK/$tag.h$i.rc" 2>/dev/null || echo missing)
    [ "$rc" = 0 ] || { echo "  host $i: tdistrun exit $rc"; ok=1; }
  done
  return $ok
}

out() { cat "$WORK/$1".h*.out; }
err() { cat "$WORK/$1".h*.err; }

# ---- run --------------------------------------------------------------------------

# An example across the hosts: every rank says OK, rank 0 the summary.
example() {
  local tag=$1 summary=$2 t0=$SECONDS r
  shift 2
  start "$tag" "$@"
  local ok=0
  finish "$tag" || ok=1
  for ((r = 0; r < NH * NPER; r++)); do
    [ "$(out "$tag" | grep -c "^\[rank $r\] .*: OK: ")" = 1 ] || ok=1
  done
  [ "$(out "$tag" | grep "^\[rank 0\] " | grep -cF "$summary")" = 1 ] || ok=1
  if [ $ok = 0 ]; then
    mh_log "$tag across $NH hosts: OK ($((SECONDS - t0)) s)"
  else
    fail "$tag across hosts"
    mh_dump "$WORK/$tag".h*
  fi
}

run_mode() {
  local t0=$SECONDS r ok=0
  # INFO logs of the CPU backend: the host-identity decision per peer.
  TDIST_DEBUG=INFO TDIST_DEBUG_SUBSYS=CPU MH_EXPECT_LOCAL_CMA=1 start mh "$MH_PROG" --iters 10
  finish mh || ok=1
  for ((r = 0; r < NH * NPER; r++)); do
    # Within a host: single copy or the group's shared segment; across
    # hosts: neither.
    if ! out mh | grep -qE "^\[rank $r\] MH OK rank=$r .* cma_cross=0 cma_local=[0-9]+ sc_cross=0 sc_local=[0-9]+" ||
      out mh | grep -qE "^\[rank $r\] MH OK rank=$r .* cma_local=0 sc_cross=0 sc_local=0"; then
      echo "  rank $r: no 'MH OK ... cma_cross=0 sc_cross=0, cma_local or sc_local > 0' line"
      ok=1
    fi
    # Lazy connections (TDIST_CPU_CONNECT=lazy) decide per pair when the pair is first
    # used, so a rank sees the peers its all_reduce talks to: at least one
    # of the other hosts' ranks, at most all of them, none of its own host.
    local other=0 same=0 p
    for p in $(err mh | sed -nE "s/^\[rank $r\] .*cma: rank ([0-9]+) is on another host.*/\1/p"); do
      other=$((other + 1))
      [ $((p / NPER)) = $((r / NPER)) ] && same=$((same + 1))
    done
    if [ "$other" -lt 1 ] || [ "$other" -gt $(((NH - 1) * NPER)) ] || [ "$same" != 0 ]; then
      echo "  rank $r: $other peers detected on another host ($same of its own host)," \
        "want 1..$(((NH - 1) * NPER)), none of its own"
      ok=1
    fi
  done
  out mh | grep "MH WRONG" && ok=1
  if [ $ok = 0 ]; then
    mh_log "mh_allreduce across $NH hosts x $NPER ranks: results checked, no single copy" \
      "between hosts, single copy within each host: OK ($((SECONDS - t0)) s)"
  else
    fail "mh_allreduce across hosts"
    mh_dump "$WORK"/mh.h*
  fi
  if [ -n "${EX_OVERLAP:-}" ]; then
    example overlap "overlap: results checked: OK" "$EX_OVERLAP" --buckets 4 --elems 20000 \
      --steps 2 --work 4
    example mesh "mesh: TP=2 x DP=3 x CP=1 over 6 ranks: results checked: OK" "$EX_MESH" 2 3 1
    example pipeline "results checked: OK" "$EX_PIPELINE" --micro 6 --elems 10000
  else
    mh_log "examples not built: skipped"
  fi
}

# ---- faults -----------------------------------------------------------------------

# fault_job TAG: start the checked loop (no fail-fast: every survivor must
# report on its own) and wait until every rank did a few good iterations.
fault_job() {
  local tag=$1
  start "$tag" --no-fail-fast --dump-grace 0 -- "$MH_PROG" --loop "$(mh_t 90)" --ready-after 3
  if ! mh_wait_count $((NH * NPER)) "$(mh_t 60)" "MH READY" "$WORK/$tag.h*.out"; then
    fail "$tag: the ranks did not get going"
    mh_dump "$WORK/$tag".h*
    return 1
  fi
}

# check_reports TAG T_FAULT_MS BOUND_MS "SURVIVORS" "LOST": every survivor
# reported REMOTE_FAILED or ABORTED naming only lost ranks (as "world rank
# N"), at least one of them, within BOUND_MS of the fault.
check_reports() {
  local tag=$1 tf=$2 bound=$3 survivors=$4 lost=$5 r ok=0 pat
  pat="^\[rank ($(tr ' ' '|' <<<"$survivors"))\] MH FAIL"
  local n
  n=$(echo $survivors | wc -w)
  mh_wait_count "$n" "$(mh_t 40)" "$pat" "$WORK/$tag.h*.out" || ok=1
  local worst=0
  for r in $survivors; do
    local line code t msg named
    line=$(out "$tag" | grep -m1 "^\[rank $r\] MH FAIL")
    if [ -z "$line" ]; then
      echo "  rank $r: no failure report"
      ok=1
      continue
    fi
    code=$(sed -E 's/.* code=([A-Z_]+) .*/\1/' <<<"$line")
    t=$(sed -E 's/.* t_ns=([0-9]+) .*/\1/' <<<"$line")
    msg=${line#* msg=}
    local lat=$((t / 1000000 - tf))
    [ $lat -gt $worst ] && worst=$lat
    # "rank G (world rank W) aborted the group: <cause>" names the member that passed the
    # failure on: only the ranks the cause names count.
    named=$(sed -E 's/rank [0-9]+ \(world rank [0-9]+\) aborted the group//g' <<<"$msg" |
      grep -oE "world rank [0-9]+" | awk '{print $3}' | sort -u | tr '\n' ' ')
    local good=0 bad=0 x
    for x in $named; do
      if [[ " $lost " == *" $x "* ]]; then good=1; else bad=1; fi
    done
    if [[ "$code" != TDIST_ERR_REMOTE_FAILED && "$code" != TDIST_ERR_ABORTED ]] ||
      [ $good = 0 ] || [ $bad = 1 ] || [ $lat -gt "$bound" ]; then
      echo "  rank $r: $code after $lat ms (bound $bound ms), names world rank(s) [${named% }]" \
        "(lost: $lost): $msg"
      ok=1
    else
      echo "  rank $r: $code after $lat ms: $msg"
    fi
  done
  out "$tag" | grep "MH WRONG" && ok=1
  if [ $ok = 0 ]; then
    mh_log "$tag: survivors $survivors named the lost ranks within $worst ms: OK"
  else
    fail "$tag"
    mh_dump "$WORK/$tag".h*
  fi
  nb_kill "$NAME" # the rest of the job (parked survivors, launchers)
  wait
}

faults_mode() {
  local hb_ms=$((2000 * (MH_SLOW + 1)))
  export TDIST_HEARTBEAT_INTERVAL_MS=250 TDIST_HEARTBEAT_TIMEOUT_MS=$hb_ms
  export TDIST_TIMEOUT_MS=30000 TDIST_TRACE_ON_FAILURE=0
  mh_log "heartbeat every 250 ms, timeout $hb_ms ms; op timeout 30 s"

  # 1. a whole host dies: its kernel-side sockets close (FIN/RST).
  if fault_job killhost; then
    local tf pids
    tf=$(mh_now_ms)
    pids=$(nb_pids "$NAME" 2)
    kill -9 $pids 2>/dev/null
    mh_log "killhost: killed every process of host 2 ($(echo $pids | wc -w) processes)"
    check_reports killhost "$tf" 5000 "0 1 2 3" "4 5"
  fi

  # 2. a host's link goes down: nothing is closed, only silence.
  if fault_job linkdown; then
    local tf
    tf=$(mh_now_ms)
    nb_link "$NAME" 1 down
    mh_log "linkdown: host 1's switch port is down"
    check_reports linkdown "$tf" $((hb_ms + 5000)) "0 1 4 5" "2 3"
    nb_link "$NAME" 1 up
  fi

  # 3. a slow link: correct results, nobody declared dead. Delay and loss
  # with netem where the kernel has it; a bandwidth limit (tbf, whose queue
  # also drops) either way.
  local why
  if why=$(nb_netem "$NAME" 2 delay 20ms 5ms loss 2%); then
    slow_link netem "20 ms +- 5 ms delay and 2% loss each way"
    nb_qdisc_del "$NAME" 2
  else
    echo "SKIPPED (part): delay/loss on a link: this kernel has no netem ($why)"
  fi
  if why=$(nb_qdisc "$NAME" 2 tbf rate 20mbit burst 32kbit latency 100ms); then
    slow_link tbf "20 Mbit/s, drops past 100 ms of queue, each way"
    nb_qdisc_del "$NAME" 2
  else
    echo "SKIPPED (part): bandwidth limit on a link: this kernel has no tbf ($why)"
  fi
}

# slow_link TAG WHAT: the checked loop across host 2's shaped link.
slow_link() {
  local tag=$1 t0=$SECONDS r ok=0
  mh_log "$tag: host 2's link: $2"
  start "$tag" "$MH_PROG" --iters 5
  finish "$tag" || ok=1
  for ((r = 0; r < NH * NPER; r++)); do
    out "$tag" | grep -qE "^\[rank $r\] MH OK rank=$r .* cma_cross=0 .* sc_cross=0" || ok=1
  done
  if [ $ok = 0 ]; then
    mh_log "$tag: checked loop across the slow link: OK ($((SECONDS - t0)) s)"
  else
    fail "$tag: checked loop across the slow link"
    mh_dump "$WORK/$tag".h*
  fi
}

case $mode in
run) run_mode ;;
faults) faults_mode ;;
*)
  echo "usage: $0 run|faults" >&2
  exit 2
  ;;
esac
[ $failures = 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "PASSED"
exit 0
