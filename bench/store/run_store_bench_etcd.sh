#!/bin/sh
# run_store_bench_etcd.sh BUILD_DIR [SECONDS] [MEMBERS]
#
# The etcd store next to the TCP store in one run (store_bench --etcd): set,
# get and add throughput at 1, 16 and 64 clients with the library client on
# both (a thread and a handle per client), then the 1024-client rendezvous
# (each client sets its address, multi-gets all 1024, adds to a counter,
# waits for "go"). Starts a local etcd cluster of MEMBERS (default 3) on
# loopback addresses with data dirs in a temp dir (removed at exit). Needs:
# apt-get install etcd-server.
#
# etcd fsyncs its log on every write, so set and add measure the disk as
# much as etcd; get is a linearizable read (a round to the leader). Ratios
# below 1 are expected: the etcd store buys surviving the loss of any rank
# (and of a minority of members), not speed. tdist's own store traffic is a
# rendezvous at init and a heartbeat per rank per second.
set -eu
BUILD=${1:-build}
SECS=${2:-2}
MEMBERS=${3:-3}
STORE_BENCH=$BUILD/bench/store/store_bench
ETCD=${TDIST_ETCD_BIN:-$(command -v etcd || echo /usr/bin/etcd)}
[ -x "$ETCD" ] || { echo "etcd missing: apt-get install etcd-server"; exit 1; }
[ -x "$STORE_BENCH" ] || { echo "build store_bench in $BUILD first"; exit 1; }
TMP=$(mktemp -d)
PIDS=""
trap 'kill $PIDS 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $TMP' EXIT
free_port() { python3 -c 'import socket,sys; s=socket.socket(); s.bind((sys.argv[1],0)); print(s.getsockname()[1])' "$1"; }
CLUSTER=""; EPS=""
i=0
while [ $i -lt "$MEMBERS" ]; do
  ip=127.0.0.$((100 + i)); cp=$(free_port $ip); pp=$(free_port $ip)
  CLUSTER="$CLUSTER${CLUSTER:+,}m$i=http://$ip:$pp"
  EPS="$EPS${EPS:+,}$ip:$cp"
  echo "$ip $cp $pp" >>$TMP/members
  i=$((i + 1))
done
i=0
while read -r ip cp pp; do
  "$ETCD" --name m$i --data-dir $TMP/m$i --listen-client-urls http://$ip:$cp \
    --advertise-client-urls http://$ip:$cp --listen-peer-urls http://$ip:$pp \
    --initial-advertise-peer-urls http://$ip:$pp --initial-cluster "$CLUSTER" \
    --initial-cluster-state new --initial-cluster-token bench-$$ --log-level error \
    >$TMP/m$i.log 2>&1 &
  PIDS="$PIDS $!"
  i=$((i + 1))
done <$TMP/members
echo "# etcd $("$ETCD" --version | head -1 | awk '{print $3}'), $MEMBERS member(s) on loopback, data in $TMP"
"$STORE_BENCH" --etcd "etcd://$EPS/bench-$$" --seconds "$SECS" --clients 1,16,64 --rendezvous 1024
