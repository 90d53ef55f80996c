#!/usr/bin/env bash
# base-build.sh REV DIR: a release build of this repository at REV in DIR
# (DIR/build-cpu), for the before/after columns of a peers run
# (base.d/tdist-base.sh). jemalloc's source is copied from this tree.
set -euo pipefail
REV="$1"; DIR="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ -d "$DIR/.git" ] || git clone -q "$ROOT" "$DIR"
git -C "$DIR" checkout -q "$REV"
if [ -d "$ROOT/third_party/jemalloc/src" ] && [ ! -d "$DIR/third_party/jemalloc/src" ]; then
  mkdir -p "$DIR/third_party/jemalloc" && cp -a "$ROOT/third_party/jemalloc/src" "$DIR/third_party/jemalloc/"
fi
cmake -S "$DIR" -B "$DIR/build-cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTDIST_BUILD_TESTS=OFF \
  -DTDIST_BUILD_EXAMPLES=OFF -DTDIST_BUILD_PYTHON=OFF -DTDIST_BUILD_GPUSIM=OFF >/dev/null
ninja -C "$DIR/build-cpu" tdist_bench_cpu tdist_bench_alltoallv
