#!/usr/bin/env bash
# run.sh - the README's main command: installs missing packages, builds tdist
# (Release) into build/release and runs the main job: tdistrun -n 4 on the
# examples and the CPU collective benchmark (scripts/main-job.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
mkdir -p build
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DTDIST_BUILD_TESTS=OFF >build/release.configure.log 2>&1 \
  || { cat build/release.configure.log; exit 1; }
cmake --build build/release -j "$(nproc)" >build/release.build.log 2>&1 \
  || { tail -50 build/release.build.log; exit 1; }
if [ -x scripts/main-job.sh ] || [ -f scripts/main-job.sh ]; then
  exec bash scripts/main-job.sh build/release "$@"
fi
exec build/release/bench/core/tdist_bench_overhead
