#!/usr/bin/env bash
# tests/gpu/run.sh - build tdist with the GPU programs and run the GPU checks and the
# benchmark on a machine with a GPU. From the repository root:
#   tests/gpu/run.sh [BUILD_DIR]          (default build-gpu)
# On the lent GPU machine (deps from .device/, see docs/nccl-backend.md):
#   source .device/setup.sh && tests/gpu/run.sh
# Logs go to $OUT (or ./gpu-logs). Exit status: failures of the required
# checks (world size 1); the 2-rank run on one GPU and the benchmarks only
# report what happened.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build-gpu}
logs=${OUT:-$root/gpu-logs}
mkdir -p "$logs"
cd "$root"
nvidia-smi > "$logs/nvidia-smi.txt" 2>&1 || true

echo "== configure + build ($build)"
cmake -S . -B "$build" -DTDIST_BUILD_GPU_TESTS=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$logs/configure.log" 2>&1 &&
  cmake --build "$build" -j"$(nproc)" --target tdist_gpu_nccl tdist_bench_nccl nccl_ops nccl_load nccl_load_old \
    nccl_errors nccl_threads > "$logs/build.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  echo "build failed:"; tail -40 "$logs/configure.log" "$logs/build.log"; exit 1
fi
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

echo "== fake-NCCL unit tests (no GPU needed)"
(cd "$build" && ctest -L nccl --output-on-failure) > "$logs/ctest-nccl.log" 2>&1
tail -3 "$logs/ctest-nccl.log"

echo "== world size 1 on the GPU"
timeout 300 "$build/tests/gpu/tdist_gpu_nccl" one "$(port)" 2>&1 | tee "$logs/gpu-one.log"
fails=${PIPESTATUS[0]}
echo "world size 1: exit $fails"

echo "== the simulated GPU's tdistrun job on the real GPU(s): one rank per device"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$ngpu" -ge 1 ] || ngpu=1
timeout 300 "$build/tools/launcher/tdistrun" -n "$ngpu" --backend nccl "$build/tests/gpu/tdist_gpu_rank" \
  2>&1 | tee "$logs/gpu-rank.log"
rank_rc=${PIPESTATUS[0]}
echo "tdistrun job: exit $rank_rc"
fails=$((fails + (rank_rc != 0)))

echo "== two ranks on one GPU (different NCCL_HOSTID; unsupported by NCCL, report only)"
p=$(port)
for r in 0 1; do
  NCCL_HOSTID="tdist-host-$r" NCCL_DEBUG=WARN timeout 120 \
    "$build/tests/gpu/tdist_gpu_nccl" two $r "$p" > "$logs/gpu-two-$r.log" 2>&1 &
  eval "pid$r=$!"
done
wait "$pid0"; two0=$?
wait "$pid1"; two1=$?
cat "$logs/gpu-two-0.log" "$logs/gpu-two-1.log"
echo "two ranks on one GPU: rank 0 exit $two0, rank 1 exit $two1" | tee "$logs/gpu-two.txt"

echo "== benchmark: tdist vs raw NCCL, then torch.distributed"
timeout 300 "$build/bench/nccl/tdist_bench_nccl" "$(port)" 256 20000 2>&1 | tee "$logs/bench-tdist.log"
timeout 300 python3 bench/nccl/torch_allreduce.py "$(port)" 256 20000 2>&1 | tee "$logs/bench-torch.log"
exit "$fails"
