#!/usr/bin/env bash
# Large values and a bystander's latency, tdist-store beside Redis (issue 44),
# for ../shared/peers/run.sh (EXTRA_DIRS=<repo>/bench/store/peers.d): called as
# `store-large.sh N BUDGET` from the peers directory. One server process each,
# so it runs for one N only: $TDIST_STORE_LARGE_N (default 2); other N print
# nothing. Both servers are measured by the same client (bench/store/
# store_large.c), one after the other in this run:
#   - SET then GET of 1 KiB .. 64 MiB values ($STORE_LARGE_REPS reps, default 2;
#     x20 up to 1 MiB), the two servers interleaved rep by rep (store_large pair);
#   - connect + handshake + one request every 5 ms for $STORE_LARGE_PING_S
#     seconds (default 6) while 8 clients SET 64 MiB values, idle, and with
#     STORE_LARGE_STRESS=1 also beside `stress-ng --cpu 2` (the loaded case).
# STORE_LARGE_ATTACK_NICE=k (default 0) runs the 8 attacking clients k nice
# levels below the bystander, for both servers: on 2 shared cores the
# bystander's own client otherwise waits for the CPU as much as for the server.
# STORE_LARGE_PIN=1 puts both servers on CPU 1 and the client on CPU 0
# (taskset): unpinned, the scheduler's placement of each server against the
# client favours one of two identical servers by 7-8 % at 1 MiB
# (docs/store-protocol.md); the ping runs that follow are not pinned.
# tdist-store runs with its default budget (1 GiB); redis-server with
# --save '' --appendonly no. Uses the build in $TDIST_BENCH_BUILD (default:
# build/test next to this repository's root).
# Lines: peer=tdist-store|redis op=set|get bytes=B us=MEAN best_us= p50_us= MBps= reps= interleaved=1
#        peer=tdist-store|redis op=ping_under_set64m load=idle|stress attackers=8
#        n= p50_us= p99_us= max_us=
set -euo pipefail
N="$1"
[ "$N" = "${TDIST_STORE_LARGE_N:-2}" ] || exit 0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
B="${TDIST_BENCH_BUILD:-$ROOT/build/test}"
CL="$B/bench/store/store_large"
REPS="${STORE_LARGE_REPS:-2}"
PS="${STORE_LARGE_PING_S:-6}"
port_free() { ! (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() { local p="$1"; while ! port_free "$p"; do p=$((p + 1)); done; echo "$p"; }
RP="$(pick_port 6420)"
TP="$(pick_port 29620)"
SPID=""; RPID=""; XPID=""
stop() { for p in "$@"; do [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done; return 0; }
trap 'stop "$XPID" "$SPID" "$RPID"' EXIT
PIN_S=(); PIN_C=()
if [ "${STORE_LARGE_PIN:-0}" = 1 ] && [ "$(nproc)" -ge 2 ]; then PIN_S=(taskset -c 1); PIN_C=(taskset -c 0); fi
"${PIN_S[@]}" redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  --dir /tmp --logfile "/tmp/store-large-redis-$RP.log" >/dev/null 2>&1 &
RPID=$!
"${PIN_S[@]}" "$B/tools/store/tdist-store" --port "$TP" --host 127.0.0.1 >/dev/null 2>&1 &
SPID=$!
for _ in $(seq 100); do
  (echo > "/dev/tcp/127.0.0.1/$RP") 2>/dev/null && (echo > "/dev/tcp/127.0.0.1/$TP") 2>/dev/null && break
  sleep 0.1
done
"${PIN_C[@]}" "$CL" pair 127.0.0.1 "$RP" "$TP" "$REPS"
if [ "${#PIN_S[@]}" -gt 0 ]; then # the ping runs: every CPU again
  for p in "$RPID" "$SPID"; do taskset -a -p -c "0-$(($(nproc) - 1))" "$p" >/dev/null; done
fi
"$CL" ping redis 127.0.0.1 "$RP" "$PS" 8 idle
"$CL" ping tdist 127.0.0.1 "$TP" "$PS" 8 idle
if [ "${STORE_LARGE_STRESS:-0}" = 1 ]; then
  stress-ng --cpu 2 --timeout $((2 * PS + 10))s >/dev/null 2>&1 &
  XPID=$!
  sleep 1
  "$CL" ping redis 127.0.0.1 "$RP" "$PS" 8 stress
  "$CL" ping tdist 127.0.0.1 "$TP" "$PS" 8 stress
fi
