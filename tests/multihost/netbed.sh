#!/usr/bin/env bash
# netbed.sh - a test bed of "hosts" on one machine: network namespaces joined
# by a bridge, each with its own address, for the multi-host tests
# (tests/multihost/test_netbed.sh). Needs root.
#
#   netbed.sh up   NAME NHOSTS      create NAME-sw (the switch) and NAME-h0..
#   netbed.sh down NAME             kill what runs inside, delete the namespaces
#   netbed.sh link NAME I up|down   host I's port on the switch (bridge side)
#   netbed.sh netem NAME I ARGS...  tc netem on host I's link (both directions)
#   netbed.sh qdisc NAME I KIND ARGS...  any root qdisc there (tbf...)
#   netbed.sh sweep                 remove beds whose creator (pid in NAME) is gone
# or sourced: the same as functions nb_up, nb_down, nb_link, nb_netem, nb_qdisc,
# nb_qdisc_del, nb_sweep,
# nb_exec NAME I CMD..., nb_addr I, nb_pids NAME I.
#
# Layout: the bridge lives in its own namespace NAME-sw, not in the machine's
# own network namespace, so nothing outside the bed changes and no address of
# the bed is reachable from outside or can reach out. Host I is namespace
# NAME-hI with "eth0" = 10.213.0.(I+1)/24 (10.213/16: private, not used here;
# the addresses only exist inside the bed's namespaces, so two beds, or a
# real 10.213 network on the machine, cannot clash) and loopback up; its
# peer "pI" is a port of bridge "br0" in NAME-sw. Traffic goes only between
# those addresses. "link down" downs pI: host I's packets are dropped without
# any FIN or RST, as when a cable or switch port fails; only timeouts notice.
#
# NAME must start with "tdmh-<pid>-" (the creating process): `sweep` removes
# beds of creators that died without cleaning up (ctest kills a test that
# runs past its timeout with SIGKILL, which skips the EXIT trap).
#
# Hosts share the kernel, the pid namespace and the file system; what makes
# them distinct hosts to tdist is the network (own addresses, own loopback)
# and the CPU backend's host identity (boot id + network namespace, see
# docs/cpu-backend.md), which keeps single-copy transfers off between them.

NB_NET=10.213.0

nb_addr() { echo "$NB_NET.$(($1 + 1))"; }

# Namespaces of bed NAME (the switch last, so hosts go first on teardown).
nb_list() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-h[0-9]+\$" | sort
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-sw\$"
}

nb_pids() { ip netns pids "$1-h$2" 2>/dev/null; }

nb_exec() {
  local name=$1 i=$2
  shift 2
  ip netns exec "$name-h$i" "$@"
}

# up NAME N: prints the reason and returns 1 if the kernel or the container
# refuses (no netns, no veth or bridge support); partial state is removed.
nb_up() {
  local name=$1 n=$2 i err
  case $name in tdmh-[0-9]*-*) ;; *) echo "netbed: bad bed name $name" >&2; return 2 ;; esac
  if ! err=$(ip netns add "$name-sw" 2>&1); then
    echo "cannot create a network namespace (ip netns add: $err)"
    return 1
  fi
  if ! err=$({ ip -n "$name-sw" link add br0 type bridge &&
    ip -n "$name-sw" link set br0 up && ip -n "$name-sw" link set lo up; } 2>&1); then
    nb_down "$name"
    echo "cannot create a bridge in a network namespace: $err"
    return 1
  fi
  for ((i = 0; i < n; i++)); do
    if ! err=$({ ip netns add "$name-h$i" &&
      ip -n "$name-sw" link add "p$i" type veth peer name eth0 netns "$name-h$i" &&
      ip -n "$name-sw" link set "p$i" master br0 &&
      ip -n "$name-sw" link set "p$i" up &&
      ip -n "$name-h$i" addr add "$(nb_addr "$i")/24" dev eth0 &&
      ip -n "$name-h$i" link set eth0 up &&
      ip -n "$name-h$i" link set lo up; } 2>&1); then
      nb_down "$name"
      echo "cannot create host $i (veth pair into a namespace): $err"
      return 1
    fi
  done
  # The bridge forwards once its ports are in the forwarding state (STP is
  # off, so at once; bounded wait in case a kernel says otherwise).
  for _ in $(seq 1 50); do
    [ "$(bridge -n "$name-sw" link show 2>/dev/null | grep -c 'state forwarding')" -ge "$n" ] && break
    sleep 0.1
  done
  return 0
}

# Kill every process inside the bed's host namespaces (all of them were
# started by the test inside the bed), by pid.
nb_kill() {
  local name=$1 ns pids
  for ns in $(nb_list "$name"); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    # shellcheck disable=SC2086 # one pid per word
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  done
  # Wait (bounded) until they are gone, so ports and namespaces free up.
  for _ in $(seq 1 50); do
    local left=""
    for ns in $(nb_list "$name"); do left+=$(ip netns pids "$ns" 2>/dev/null); done
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  return 0
}

nb_down() {
  local name=$1 ns
  nb_kill "$name"
  for ns in $(nb_list "$name"); do
    ip netns del "$ns" 2>/dev/null
  done
  return 0
}

nb_link() { ip -n "$1-sw" link set "p$2" "$3"; }

# qdisc NAME I KIND ARGS: the same root qdisc on both ends of host I's link
# (netem: delay/loss; tbf: a bandwidth limit whose queue drops what waits
# longer than its latency). Prints tc's error and returns 1 when the kernel
# lacks that qdisc.
nb_qdisc() {
  local name=$1 i=$2 err
  shift 2
  if ! err=$(tc -n "$name-sw" qdisc add dev "p$i" root "$@" 2>&1); then
    echo "$err"
    return 1
  fi
  if ! err=$(tc -n "$name-h$i" qdisc add dev eth0 root "$@" 2>&1); then
    tc -n "$name-sw" qdisc del dev "p$i" root 2>/dev/null
    echo "$err"
    return 1
  fi
}

nb_netem() { nb_qdisc "$1" "$2" netem "${@:3}"; }

# Remove what nb_qdisc added on host I's link.
nb_qdisc_del() {
  tc -n "$1-sw" qdisc del dev "p$2" root 2>/dev/null
  tc -n "$1-h$2" qdisc del dev eth0 root 2>/dev/null
  return 0
}

# Beds left by creators that no longer run (tdmh-<pid>-...).
nb_sweep() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^tdmh-[0-9]+-.*-sw$'); do
    pid=${ns#tdmh-}
    pid=${pid%%-*}
    if [ ! -d "/proc/$pid" ]; then
      echo "netbed: removing ${ns%-sw}, left by pid $pid" >&2
      nb_down "${ns%-sw}"
    fi
  done
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  cmd=${1:-}
  shift || true
  case $cmd in
  up) nb_up "$@" ;;
  down) nb_down "$@" ;;
  link) nb_link "$@" ;;
  netem) nb_netem "$@" ;;
  qdisc) nb_qdisc "$@" ;;
  sweep) nb_sweep ;;
  *)
    sed -n '2,12p' "$0" >&2
    exit 2
    ;;
  esac
fi
