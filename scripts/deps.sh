#!/usr/bin/env bash
# deps.sh [test] - make sure the Debian packages tdist needs are installed.
# As root, missing packages are installed with apt-get; otherwise the exact
# apt-get line is printed and the script fails. With "test", the packages the
# test suite needs (cmocka, clang and its sanitizer/fuzzer runtimes, etcd,
# Slurm, munge and Open MPI for tests/multihost) too.
set -euo pipefail
pkgs="build-essential cmake ninja-build pkg-config python3 python3-numpy libuv1-dev libjemalloc-dev"
pkgs="$pkgs libcurl4-openssl-dev libjson-c-dev" # the etcd store
if [ "${1:-}" = "test" ]; then
  pkgs="$pkgs libcmocka-dev clang libclang-rt-14-dev stress-ng python3-pytest"
  pkgs="$pkgs etcd-server" # test_store_etcd's 3-member cluster
  pkgs="$pkgs slurm-wlm munge openmpi-bin" # tests/multihost: srun, sbatch, mpirun
fi
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "tdist: missing Debian packages:$missing" >&2
  echo "run: sudo apt-get install -y$missing" >&2
  exit 1
fi
echo "tdist: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q $missing >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q $missing >/dev/null; }
