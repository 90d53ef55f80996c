#!/usr/bin/env bash
# deps.sh [test] - make sure the Debian packages tdist needs are installed,
# and fetch the source of the private jemalloc (below).
# As root, missing packages are installed with apt-get; otherwise the exact
# apt-get line is printed and the script fails. With "test", the packages the
# test suite needs (cmocka, clang and its sanitizer/fuzzer runtimes, etcd,
# Slurm, munge and Open MPI for tests/multihost) too.
#
# jemalloc: the library's own allocations come from a jemalloc that is private
# to libtdist (static, prefixed symbols, nothing exported, no initial-exec TLS:
# cmake/TdistJemalloc.cmake builds it). Its source is Debian's jemalloc source
# package, fetched by scripts/fetch-jemalloc.sh (run last, below; also run by
# `pip install ./python`, docs/python.md).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs="build-essential dpkg-dev cmake ninja-build pkg-config python3 python3-numpy libuv1-dev"
pkgs="$pkgs libcurl4-openssl-dev libjson-c-dev" # the etcd store
if [ "${1:-}" = "test" ]; then
  pkgs="$pkgs libcmocka-dev clang libclang-rt-14-dev stress-ng python3-pytest python3-venv python3-dev python3-torch"
  pkgs="$pkgs etcd-server" # test_store_etcd's 3-member cluster
  pkgs="$pkgs slurm-wlm munge openmpi-bin" # tests/multihost: srun, sbatch, mpirun
fi
root=0
[ "$(id -u)" -eq 0 ] && root=1
export DEBIAN_FRONTEND=noninteractive

missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  if [ $root -eq 0 ]; then
    echo "tdist: missing Debian packages:$missing" >&2
    echo "run: sudo apt-get install -y$missing" >&2
    exit 1
  fi
  echo "tdist: installing$missing"
  apt-get install -y -q $missing >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q $missing >/dev/null; }
fi

# ---- jemalloc's source ----------------------------------------------------------
exec bash scripts/fetch-jemalloc.sh
