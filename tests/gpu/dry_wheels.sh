#!/usr/bin/env bash
# tests/gpu/dry_wheels.sh RUN_SH OUT - ctest gpu_check_dry_wheels: run.sh --dry finds NCCL and
# the CUDA runtime where pip wheels put them (nvidia-nccl-cu13: nvidia/nccl/lib/libnccl.so.2;
# the CUDA 13 runtime wheel: nvidia/cu13/lib/libcudart.so.13, the newest of two versions),
# from a fake site folder on PYTHONPATH holding the (empty) files, with nothing in the
# environment naming them.
set -u
run=${1:?usage: dry_wheels.sh RUN_SH OUT}
out=${2:?usage: dry_wheels.sh RUN_SH OUT}
d=$(mktemp -d "${TMPDIR:-/tmp}/tdist-fake-wheels.XXXXXX")
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/nvidia/nccl/lib" "$d/nvidia/cuda_runtime/lib" "$d/nvidia/cu13/lib"
touch "$d/nvidia/nccl/lib/libnccl.so.2" "$d/nvidia/cuda_runtime/lib/libcudart.so.12" \
  "$d/nvidia/cu13/lib/libcudart.so.13"
log=$(env -u TDIST_NCCL_LIBRARY -u TDIST_CUDART_LIBRARY PYTHONPATH="$d" bash "$run" --dry --out "$out" 2>&1)
rc=$?
echo "$log"
fail=0
grep -qx "NCCL: *$d/nvidia/nccl/lib/libnccl.so.2 (pip wheel nvidia-nccl)" <<< "$log" ||
  { echo "dry_wheels: NCCL not found in the fake wheel"; fail=1; }
grep -qx "CUDA runtime: *$d/nvidia/cu13/lib/libcudart.so.13 (pip wheel nvidia-cuda-runtime)" <<< "$log" ||
  { echo "dry_wheels: the CUDA runtime not found in the fake wheel"; fail=1; }
[ $rc -eq 0 ] || { echo "dry_wheels: run.sh --dry exited $rc"; fail=1; }
[ $fail -eq 0 ] && echo "dry_wheels: ok"
exit $fail
