#!/usr/bin/env bash
# tests/gpu/run.sh - the GPU check: tdist's NCCL backend on a real GPU (one or more), in one
# command that takes about 5 minutes (at most 8: every step is time-boxed and the whole run
# has a budget). From anywhere:
#
#   tests/gpu/run.sh [--dry] [--build-dir DIR] [--out DIR] [--soak-seconds S] [--budget S]
#
#   --build-dir DIR  take the programs from this build (made with -DTDIST_BUILD_GPU_TESTS=ON,
#                    here or on another machine, e.g. bundled); a DIR without them is
#                    configured with -DTDIST_BUILD_GPU_TESTS=ON and built. Default: configure
#                    and build build-gpu in the checkout (needs nvcc, the CUDA toolkit's
#                    runtime, CMake and the packages of scripts/deps.sh)
#   --out DIR        where the summary and the tarball go (default $OUT, else ./gpu-logs)
#   --dry            check this script's logic only: find the libraries (or say which are
#                    missing), show the plan, build nothing for the GPU, say
#                    "no GPU: skipping" and exit 0. Also chosen when nvidia-smi is absent
#                    or fails (ctest runs it so: gpu_check_dry)
#
# NCCL and the CUDA runtime come from TDIST_NCCL_LIBRARY / TDIST_CUDART_LIBRARY when set,
# else from pip wheels (nvidia-nccl-cu13: nvidia/nccl/lib/libnccl.so.2; nvidia-cuda-runtime:
# nvidia/cuda_runtime/lib or nvidia/cu13/lib, libcudart.so.1x), else the CUDA toolkit, else
# the loader's cache.
# libtdist dlopens them, so the run needs no nccl.h and no unversioned libnccl.so; only the
# raw-NCCL side of the benchmark is built against nccl.h (skipped when there is none).
#
# Steps (each under `timeout`): build; the world-size-1 checks (tdist_gpu_nccl one); the
# tdistrun job (nccl_sim_rank.c as tdist_gpu_rank) at n = 1, 2, 4; the fault soak on real
# NCCL; the submit/completion benchmark beside raw NCCL and torch.distributed; the Python
# package over torch and CuPy arrays of every dtype. With fewer GPUs than ranks, several
# ranks share a GPU, each process with its own NCCL_HOSTID: NCCL then takes them for
# separate hosts and uses its socket transport (a test mode NCCL does not support; it is
# how the lent one-GPU machine runs multi-rank jobs).
#
# Output: $OUT/summary.txt (one table) and $OUT/gpu-check.tgz (every log), rewritten after
# each step so that a run cut short leaves what it did. Exit status: 0 when no step failed
# (skips are not failures), 1 otherwise, 2 for a usage error.
set -u

root=$(cd "$(dirname "$0")/../.." && pwd)
build=""
out=${OUT:-$PWD/gpu-logs}
dry=0
soak_s=100
budget=470 # seconds: the whole run stays under 8 minutes
while [ $# -gt 0 ]; do
  case $1 in
  --dry) dry=1 ;;
  --build-dir) build=${2:?--build-dir needs a folder}; shift ;;
  --out) out=${2:?--out needs a folder}; shift ;;
  --soak-seconds) soak_s=${2:?--soak-seconds needs a number}; shift ;;
  --budget) budget=${2:?--budget needs a number}; shift ;;
  -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "run.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

mkdir -p "$out" || { echo "run.sh: cannot create $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
logs=$(mktemp -d "${TMPDIR:-/tmp}/tdist-gpu-check.XXXXXX")
trap 'rm -rf "$logs"' EXIT
start=$SECONDS
summary=$logs/summary.txt
printf '%-22s %-7s %6s  %s\n' step result seconds note > "$summary"
failed=0

# ---- helpers ------------------------------------------------------------------------------
say() { echo "== $*"; }

# record STEP RESULT SECONDS NOTE: one summary row; then summary and tarball are rewritten
record() {
  printf '%-22s %-7s %6s  %s\n' "$1" "$2" "$3" "$4" >> "$summary"
  [ "$2" = FAIL ] && failed=1
  cp "$summary" "$out/summary.txt"
  tar -czf "$out/gpu-check.tgz" -C "$logs" . 2> /dev/null
}

# left: seconds of the budget still available
left() { echo $((budget - (SECONDS - start))); }

# box SECONDS: the timeout of a step, cut to what the budget has left (0: no time left)
box() {
  local want=$1 l
  l=$(left)
  [ "$l" -lt 15 ] && { echo 0; return; }
  [ "$want" -gt "$l" ] && want=$l
  echo "$want"
}

# step NAME TIMEOUT LOG CMD...: runs CMD under timeout, output to LOG (and a tail to stdout);
# records PASS or FAIL (timeout: "timed out after N s")
step() {
  local name=$1 t=$2 lname=$3 log=$logs/$3 rc t0
  shift 3
  t=$(box "$t")
  if [ "$t" -eq 0 ]; then
    record "$name" SKIP 0 "out of time (budget ${budget} s)"
    return 1
  fi
  say "$name (at most $t s): $*"
  t0=$SECONDS
  timeout -k 10 "$t" "$@" > "$log" 2>&1
  rc=$?
  tail -n 5 "$log" | sed 's/^/   | /'
  if [ $rc -eq 0 ]; then
    record "$name" PASS $((SECONDS - t0)) "$lname"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    record "$name" FAIL $((SECONDS - t0)) "timed out after $t s ($lname)"
  else
    record "$name" FAIL $((SECONDS - t0)) "exit $rc ($lname)"
  fi
  return $rc
}

port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# wheel_lib NAME: a file NAME (a glob) anywhere under nvidia/ in a site-packages folder (or a
# folder of python3's sys.path), else empty; the highest version when several match. The
# CUDA 12 wheels put the runtime in nvidia/cuda_runtime/lib, the CUDA 13 ones in
# nvidia/cu13/lib; NCCL is in nvidia/nccl/lib.
wheel_lib() {
  python3 - "$1" 2> /dev/null << 'PY'
import glob, site, sys, sysconfig
dirs = list(site.getsitepackages()) + [site.getusersitepackages(), sysconfig.get_paths()["purelib"]]
dirs += [d for d in sys.path if d and d not in dirs]  # PYTHONPATH, a venv's
for d in dirs:
    hits = sorted(glob.glob(f"{d}/nvidia/**/{sys.argv[1]}", recursive=True),
                  key=lambda p: p.rsplit(".so.", 1)[-1])
    if hits:
        print(hits[-1])
        break
PY
}

# ldconfig_lib SONAME: the loader cache's file of that soname, else empty
ldconfig_lib() { /sbin/ldconfig -p 2> /dev/null | awk -v n="$1" '$1 == n {print $NF; exit}'; }

# linked_lib PROGRAM PATTERN: the file PROGRAM loads for a library matching PATTERN (ldd)
linked_lib() { ldd "$1" 2> /dev/null | awk -v p="$2" '$1 ~ p && $3 ~ /^\// {print $3; exit}'; }

# ---- the GPU ------------------------------------------------------------------------------
ngpu=0
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > "$logs/nvidia-smi-L.txt" 2>&1; then
  ngpu=$(grep -c '^GPU ' "$logs/nvidia-smi-L.txt")
  nvidia-smi > "$logs/nvidia-smi.txt" 2>&1
fi
# TDIST_GPU_CHECK_FAKE_GPUS=N: pretend to have N GPUs, to test this script's full path on a
# machine without one (the steps then fail, or pass on libraries that simulate a GPU)
if [ -n "${TDIST_GPU_CHECK_FAKE_GPUS:-}" ]; then ngpu=$TDIST_GPU_CHECK_FAKE_GPUS; fi
if [ "$ngpu" -lt 1 ]; then
  [ $dry -eq 0 ] && echo "run.sh: no GPU (nvidia-smi absent or failing): dry mode"
  dry=1
fi
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -1 | tr -d ' .')
[ -n "$cc" ] || cc=90

# ---- NCCL and the CUDA runtime ------------------------------------------------------------
cuda_home=${CUDA_HOME:-/usr/local/cuda}
nccl=${TDIST_NCCL_LIBRARY:-}
nccl_from="TDIST_NCCL_LIBRARY"
if [ -z "$nccl" ]; then
  nccl_from="pip wheel nvidia-nccl"
  nccl=$(wheel_lib 'libnccl.so.2')
fi
if [ -z "$nccl" ] && [ -e "$cuda_home/lib64/libnccl.so.2" ]; then
  nccl_from="CUDA toolkit"; nccl=$cuda_home/lib64/libnccl.so.2
fi
if [ -z "$nccl" ]; then nccl_from="loader cache"; nccl=$(ldconfig_lib libnccl.so.2); fi
cudart=${TDIST_CUDART_LIBRARY:-}
cudart_from="TDIST_CUDART_LIBRARY"
if [ -z "$cudart" ]; then
  cudart_from="pip wheel nvidia-cuda-runtime"
  cudart=$(wheel_lib 'libcudart.so.1[0-9]')
fi
if [ -z "$cudart" ]; then
  cudart_from="CUDA toolkit"
  for f in "$cuda_home"/lib64/libcudart.so.1[0-9]; do [ -e "$f" ] && cudart=$f; done
fi
if [ -z "$cudart" ]; then
  cudart_from="loader cache"
  cudart=$(ldconfig_lib libcudart.so.13)
  [ -n "$cudart" ] || cudart=$(ldconfig_lib libcudart.so.12)
fi
missing=""
if [ -n "$nccl" ] && [ -e "$nccl" ]; then
  echo "NCCL:         $nccl ($nccl_from)"
else
  echo "NCCL:         missing (pip install nvidia-nccl-cu13, or set TDIST_NCCL_LIBRARY)"
  missing="$missing NCCL"
fi
if [ -n "$cudart" ] && [ -e "$cudart" ]; then
  echo "CUDA runtime: $cudart ($cudart_from)"
else
  echo "CUDA runtime: missing (pip install nvidia-cuda-runtime, or set TDIST_CUDART_LIBRARY)"
  missing="$missing CUDA-runtime"
fi
nvcc=$(command -v nvcc 2> /dev/null || { [ -x "$cuda_home/bin/nvcc" ] && echo "$cuda_home/bin/nvcc"; })
nccl_inc=""
for d in "$(dirname "${nccl:-/nonexistent}")/../include" "$cuda_home/include"; do
  [ -e "$d/nccl.h" ] && { nccl_inc=$(cd "$d" && pwd); break; }
done
echo "nvcc:         ${nvcc:-missing (needed to build; or pass --build-dir)}"
echo "nccl.h:       ${nccl_inc:-missing (the raw-NCCL side of the benchmark is not built)}"
echo "GPUs:         $ngpu (compute capability ${cc})"

# ---- the plan -----------------------------------------------------------------------------
given_build=$build
[ -n "$build" ] || build=$root/build-gpu
cat << EOF
plan (budget ${budget} s, build $build, logs -> $out):
  build       cmake -DTDIST_BUILD_GPU_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=$cc; targets tdist tdistrun
              tdist-store tdist_gpu_nccl tdist_gpu_rank soak_short soak_rank tdist_bench_nccl (~1-2 min)
  one         tdist_gpu_nccl one PORT                                   (~10 s, at most 120)
  tdistrun_nN tdistrun -n N --backend nccl tdist_gpu_rank, N = 1 2 4      (~10-30 s each, at most 90)
              ranks > GPUs: each rank its own NCCL_HOSTID (socket transport)
  cfg         TDIST_NCCL_RANKS_PER_ROOT=1 tdistrun -n 2 tdist_gpu_cfg: scalable init, NCCL's
              config + high-priority stream, registration, a window  (~10 s, at most 90)
  graph       tdistrun -n 2 --backend nccl tdist_gpu_graph: CUDA graph capture, 10 checked
              launches, group destroyed with the graph alive          (~10 s, at most 90)
  p2p_nN      tdistrun -n N --backend nccl tdist_gpu_p2p, N = 2 4: separate isend/irecv
              on per-pair communicators (rings, mixed orders, cross-wait) (~10 s each, at most 90)
  soak        soak --backend nccl --seconds $soak_s [--nccl-hostid-per-rank]  (${soak_s} s + the last trial)
  bench       tdist_bench_nccl PORT 256 20000 (tdist beside raw NCCL)   (~20 s, at most 90)
  bench_submit tdist_bench_submit_gpu -T 3 (beside the same work by hand) (~10 s, at most 60)
  bench_torch bench/nccl/torch_allreduce.py PORT 256 20000 if torch     (~20 s, at most 90)
  python      tdistrun -n 2 python3 tests/gpu/py_dtypes.py (torch, CuPy) (~30 s, at most 120)
EOF

if [ $dry -eq 1 ]; then
  # The script's own logic, without a GPU: the programs a given build has, and the soak's
  # library selection (its --help must list it: task 3 of issue 39).
  dry_fail=0
  if [ -d "$build" ]; then
    for p in tools/launcher/tdistrun tests/failures/soak tests/failures/soak_rank; do
      if [ -x "$build/$p" ]; then echo "found:        $build/$p"
      else echo "run.sh --dry: $build/$p missing"; dry_fail=1; fi
    done
    for p in tests/gpu/tdist_gpu_nccl tests/gpu/tdist_gpu_rank tests/gpu/tdist_gpu_cfg \
      tests/gpu/tdist_gpu_graph tests/gpu/tdist_gpu_p2p \
      bench/nccl/tdist_bench_nccl \
      bench/nccl/tdist_bench_submit_gpu; do
      [ -x "$build/$p" ] && echo "found:        $build/$p" ||
        echo "not built:    $build/$p (needs -DTDIST_BUILD_GPU_TESTS=ON and nvcc)"
    done
    if [ -x "$build/tests/failures/soak" ]; then
      if "$build/tests/failures/soak" --help | grep -q 'TDIST_NCCL_LIBRARY' &&
        "$build/tests/failures/soak" --help | grep -q -- '--nccl-hostid-per-rank'; then
        echo "soak --help:  lists the real-library selection and --nccl-hostid-per-rank"
      else
        echo "run.sh --dry: soak --help does not list TDIST_NCCL_LIBRARY / --nccl-hostid-per-rank"
        dry_fail=1
      fi
    fi
  fi
  [ -n "$missing" ] && echo "missing for a GPU run:$missing"
  bash -n "$0" || dry_fail=1
  for s in build one tdistrun_n1 tdistrun_n2 tdistrun_n4 cfg graph p2p_n2 p2p_n4 soak \
    bench bench_submit bench_torch python; do
    record "$s" SKIP 0 "dry run"
  done
  if [ $dry_fail -ne 0 ]; then
    echo "run.sh --dry: the script's checks failed (above)"
    exit 1
  fi
  echo "no GPU: skipping (dry run; summary and tarball in $out)"
  exit 0
fi

if [ -n "$missing" ]; then
  record libraries FAIL 0 "missing:$missing"
  echo "run.sh: missing:$missing"
  exit 1
fi
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} # the ranks are on this host
export TDIST_TIMEOUT_MS=${TDIST_TIMEOUT_MS:-60000}

# ---- build --------------------------------------------------------------------------------
targets="tdist tdistrun tdist-store tdist_gpu_nccl tdist_gpu_rank soak_short soak_rank"
targets="$targets tdist_bench_submit_gpu tdist_gpu_cfg tdist_gpu_graph tdist_gpu_p2p"
# A given build that has the programs is taken as it is (a bundle from another machine has
# no CMake cache); the default build-gpu is always brought up to date (incremental).
if [ -z "$given_build" ] || [ ! -x "$build/tests/gpu/tdist_gpu_nccl" ]; then
  if [ -z "$nvcc" ]; then
    record build FAIL 0 "no nvcc to build with: install the CUDA toolkit or pass --build-dir"
    exit 1
  fi
  cfg=(-S "$root" -B "$build" -DTDIST_BUILD_GPU_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="$cc"
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTDIST_GPU_NCCL_LIB="$nccl")
  [ -n "$nccl_inc" ] && cfg+=(-DTDIST_GPU_NCCL_INCLUDE="$nccl_inc") && targets="$targets tdist_bench_nccl"
  command -v ninja > /dev/null && [ ! -f "$build/CMakeCache.txt" ] && cfg+=(-G Ninja)
  # shellcheck disable=SC2016 # "$@" and "$0" are the inner shell's
  step build 300 build.log sh -c 'cmake "$@" && cmake --build "$0" -j"$(nproc)" --target '"$targets" \
    "$build" "${cfg[@]}" || { echo "run.sh: the build failed (build.log in the tarball)"; exit 1; }
else
  record build PASS 0 "taken as built: $build"
fi
build=$(cd "$build" && pwd)
tdistrun=$build/tools/launcher/tdistrun
libtdist=""
for f in "$build"/src/libtdist.so.0 "$build"/libtdist.so.0; do [ -e "$f" ] && libtdist=$f; done

# A program linked with a CUDA runtime (and NCCL) must have the backend open that same file:
# two copies of the runtime in one process would not share streams and events.
with_libs() { # PROGRAM: the environment assignments for it
  local c n
  c=$(linked_lib "$1" '^libcudart')
  n=$(linked_lib "$1" '^libnccl')
  echo "TDIST_CUDART_LIBRARY=${c:-$cudart} TDIST_NCCL_LIBRARY=${n:-$nccl}"
}

# ---- world size 1 -------------------------------------------------------------------------
gpu_nccl=$build/tests/gpu/tdist_gpu_nccl
# shellcheck disable=SC2046 # with_libs gives words
step one 120 one.log env $(with_libs "$gpu_nccl") "$gpu_nccl" one "$(port)"

# ---- the tdistrun job ---------------------------------------------------------------------
rankprog=$build/tests/gpu/tdist_gpu_rank
for n in 1 2 4; do
  if [ "$n" -gt "$ngpu" ]; then
    # shellcheck disable=SC2016,SC2046 # $RANK is the rank's, set by tdistrun
    step "tdistrun_n$n" 90 "tdistrun-n$n.log" env $(with_libs "$rankprog") "$tdistrun" -n "$n" \
      --backend nccl /bin/sh -c 'NCCL_HOSTID=gpucheck-h$RANK; export NCCL_HOSTID; exec "$0"' \
      "$rankprog"
  else
    # shellcheck disable=SC2046
    step "tdistrun_n$n" 90 "tdistrun-n$n.log" env $(with_libs "$rankprog") "$tdistrun" -n "$n" \
      --backend nccl "$rankprog"
  fi
done

# ---- issue 42 items 3-5: scalable init (a root per rank), NCCL's config, registration --------
cfgprog=$build/tests/gpu/tdist_gpu_cfg
hostid=""
# shellcheck disable=SC2016 # $RANK is the rank's, set by tdistrun
[ "$ngpu" -lt 2 ] && hostid='NCCL_HOSTID=gpucheck-h$RANK; export NCCL_HOSTID; '
# shellcheck disable=SC2016,SC2046 # "$0" is the shell's; with_libs gives words
step cfg 90 cfg.log env $(with_libs "$cfgprog") TDIST_NCCL_RANKS_PER_ROOT=1 "$tdistrun" -n 2 \
  --backend nccl /bin/sh -c "$hostid"'exec "$0"' "$cfgprog"
# ---- CUDA graph capture (issue 42 #1): two ranks, one per GPU or each its own NCCL_HOSTID ----
graphprog=$build/tests/gpu/tdist_gpu_graph
# shellcheck disable=SC2016,SC2046 # $RANK is the rank's, set by tdistrun
step graph 90 graph.log env $(with_libs "$graphprog") "$tdistrun" -n 2 --backend nccl \
  /bin/sh -c '[ "$0" -ge 2 ] || { NCCL_HOSTID=gpucheck-h$RANK; export NCCL_HOSTID; }; exec "$1"' \
  "$ngpu" "$graphprog"
# ---- separate isend/irecv (per-pair communicators: src/nccl/nccl_p2p.c) ---------------------
p2pprog=$build/tests/gpu/tdist_gpu_p2p
for n in 2 4; do
  hostid=()
  # shellcheck disable=SC2016 # $RANK is the rank's, set by tdistrun
  [ "$n" -gt "$ngpu" ] && hostid=(/bin/sh -c 'NCCL_HOSTID=gpucheck-h$RANK; export NCCL_HOSTID; exec "$0"')
  # shellcheck disable=SC2046 # with_libs gives words
  step "p2p_n$n" 90 "p2p-n$n.log" env $(with_libs "$p2pprog") "$tdistrun" -n "$n" \
    --backend nccl ${hostid[@]+"${hostid[@]}"} "$p2pprog"
done

# ---- the fault soak on real NCCL ----------------------------------------------------------
soak=$build/tests/failures/soak
soak_opts=(--backend nccl --seconds "$soak_s")
[ "$ngpu" -lt 5 ] && soak_opts+=(--nccl-hostid-per-rank) # a trial has 3 to 5 ranks
step soak $((soak_s + 90)) soak.log env TDIST_NCCL_LIBRARY="$nccl" TDIST_CUDART_LIBRARY="$cudart" \
  "$soak" "${soak_opts[@]}"

# ---- the benchmark ------------------------------------------------------------------------
bench=$build/bench/nccl/tdist_bench_nccl
if [ -x "$bench" ]; then
  # shellcheck disable=SC2046
  step bench 90 bench-tdist.log env $(with_libs "$bench") "$bench" "$(port)" 256 20000
else
  record bench SKIP 0 "tdist_bench_nccl not built (no nccl.h)"
fi
# tdist beside the same work done by hand on a non-blocking communicator (submit_bench.c)
bsub=$build/bench/nccl/tdist_bench_submit_gpu
if [ -x "$bsub" ]; then
  # shellcheck disable=SC2046
  step bench_submit 60 bench-submit.log env $(with_libs "$bsub") "$bsub" -T 3
else
  record bench_submit SKIP 0 "tdist_bench_submit_gpu not built"
fi
if python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2> /dev/null; then
  step bench_torch 90 bench-torch.log python3 "$root/bench/nccl/torch_allreduce.py" "$(port)" 256 20000
else
  record bench_torch SKIP 0 "torch with CUDA not importable"
fi
# the numbers, under the table: per-call means (raw NCCL, tdist, torch) and what tdist adds
for f in "$logs"/bench-*.log; do
  [ -e "$f" ] && grep -h -E ' mean |^added|^idle|^(submit|complete)_(raw|tdist|added|poll|wait) ' "$f" |
    sed "s/^/$(basename "$f" .log): /"
done > "$logs/bench-numbers.txt"

# ---- Python over torch and CuPy -----------------------------------------------------------
if [ -z "$libtdist" ]; then
  record python FAIL 0 "no libtdist.so.0 in $build"
elif python3 -c 'import torch' 2> /dev/null || python3 -c 'import cupy' 2> /dev/null; then
  pyn=2
  pyprog=(python3 "$root/tests/gpu/py_dtypes.py")
  # shellcheck disable=SC2016 # $RANK is the rank's, set by tdistrun
  [ "$pyn" -gt "$ngpu" ] &&
    pyprog=(/bin/sh -c 'NCCL_HOSTID=gpucheck-h$RANK; export NCCL_HOSTID; exec "$0" "$@"'
      "${pyprog[@]}")
  step python 120 python.log env TDIST_LIBRARY="$libtdist" PYTHONPATH="$root/python" \
    TDIST_NCCL_LIBRARY="$nccl" TDIST_CUDART_LIBRARY="$cudart" \
    "$tdistrun" -n "$pyn" --backend nccl "${pyprog[@]}"
  # one count per outcome, rank 0's lines (every rank runs the same cases)
  grep -E '^(\[rank 0\] )?PYDTYPE' "$logs/python.log" | awk '{c[$1 == "[rank" ? $6 : $4]++}
    END {printf "python dtypes:"; for (k in c) printf " %s %d", k, c[k]; print ""}' \
    > "$logs/python-counts.txt"
else
  record python SKIP 0 "neither torch nor CuPy importable"
fi

cat "$logs/bench-numbers.txt" "$logs/python-counts.txt" >> "$summary" 2> /dev/null
record total "$([ $failed -eq 0 ] && echo PASS || echo FAIL)" $((SECONDS - start)) \
  "GPUs $ngpu; NCCL $nccl; CUDA runtime $cudart"
echo
cat "$out/summary.txt"
echo "total $((SECONDS - start)) s; logs: $out/gpu-check.tgz"
exit $failed
