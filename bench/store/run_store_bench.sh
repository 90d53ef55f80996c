#!/bin/sh
# run_store_bench.sh BUILD_DIR [SECONDS]
# Runs, in the same session on 127.0.0.1: redis-server + redis-benchmark
# (SET, GET, INCR at 1, 16 and 64 clients, no pipelining, 3-byte values), then
# the standalone tdist-store + store_bench with the same shape, and prints both
# and the ratio tdist/redis. Needs: apt-get install redis-server redis-tools.
set -eu
BUILD=${1:-build}
SECS=${2:-2}
STORE_BENCH=$BUILD/bench/store/store_bench
TDIST_STORE=$BUILD/tools/store/tdist-store
command -v redis-server >/dev/null || { echo "redis-server missing: apt-get install redis-server redis-tools"; exit 1; }
TMP=$(mktemp -d)
trap 'kill $RPID $TPID 2>/dev/null || true; rm -rf $TMP' EXIT
RPID=""; TPID=""

RPORT=$(( 20000 + $$ % 20000 ))
redis-server --port $RPORT --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  --dir $TMP >$TMP/redis.log 2>&1 &
RPID=$!
sleep 0.5
for c in 1 16 64; do
  # -n sized so each run lasts about SECS seconds at the measured rates
  n=$(( c == 1 ? 30000 * SECS : 150000 * SECS ))
  redis-benchmark -p $RPORT -c $c -n $n -t set,get,incr -d 3 -r 1000 -q 2>/dev/null |
    tr '\r' '\n' | grep -E '^(SET|GET|INCR): [0-9.]+ requests per second' |
    awk -v c=$c '{ op=tolower($1); sub(":","",op); if (op=="incr") op="add";
                   print op, c, $2 }' >>$TMP/redis.txt
done
kill $RPID; wait $RPID 2>/dev/null || true; RPID=""

$TDIST_STORE --host 127.0.0.1 --port 0 >$TMP/tdist.out &
TPID=$!
for i in 1 2 3 4 5 6 7 8 9 10; do grep -q listening $TMP/tdist.out 2>/dev/null && break; sleep 0.2; done
TPORT=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' $TMP/tdist.out)
$STORE_BENCH --port $TPORT --seconds $SECS --clients 1,16,64 --rendezvous 1024 >$TMP/tdist.txt
kill $TPID; wait $TPID 2>/dev/null || true; TPID=""

echo "op     clients     redis ops/s     tdist ops/s   tdist/redis"
for op in set get add; do
  for c in 1 16 64; do
    r=$(awk -v o=$op -v c=$c '$1==o && $2==c {print $3}' $TMP/redis.txt)
    t=$(awk -v o=$op -v c=$c '$1==o && $2==c {print $3}' $TMP/tdist.txt)
    awk -v o=$op -v c=$c -v r="${r:-0}" -v t="${t:-0}" \
      'BEGIN { printf "%-6s %7d %15.0f %15.0f %12.2f\n", o, c, r, t, (r > 0 ? t / r : 0) }'
  done
done
grep rendezvous $TMP/tdist.txt
