#!/usr/bin/env bash
# run.sh BUILD_DIR SRC_DIR - see CMakeLists.txt.
set -euo pipefail
B=$1 S=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "install_consumer: FAIL: $*" >&2; exit 1; }
cmake --install "$B" --prefix "$T/prefix" >"$T/install.log"
L="$T/prefix/lib"

# 1. No link-time dependency on NCCL or the CUDA runtime, and no CUDA path
#    in the installed package: the NCCL backend opens them at run time.
if readelf -d "$L/libtdist.so" | grep NEEDED | grep -Eiq 'nccl|cuda'; then
  readelf -d "$L/libtdist.so" | grep NEEDED >&2
  fail "libtdist.so has a NCCL/CUDA NEEDED entry"
fi
if grep -rEil 'cuda|libnccl|nccl\.h' "$L/pkgconfig" "$L/cmake" >"$T/cuda-paths.txt"; then
  cat "$T/cuda-paths.txt" >&2
  fail "the installed package names CUDA or NCCL"
fi
echo "install_consumer: no NCCL/CUDA NEEDED entry, no CUDA path in tdist.pc/tdistConfig.cmake"

# 2. Consumers built on a view without CUDA: no CUDA variable, an empty
#    LD_LIBRARY_PATH, only the prefix on the search paths (find_package,
#    shared and static, and pkg-config, whose Libs carries the rpath: no
#    -Wl,-rpath of our own). The loader's default paths cannot be hidden, so
#    absence is simulated below with TDIST_NCCL_LIBRARY naming no file.
nocuda=(env -u CUDA_HOME -u CUDA_PATH -u CUDAToolkit_ROOT -u NCCL_HOME LD_LIBRARY_PATH=
        "PATH=$(echo "$PATH" | tr : '\n' | grep -v cuda | paste -sd:)")
mkdir "$T/src"
cp "$S/consumer.c" "$T/src/"
cp "$S/consumer.cmake" "$T/src/CMakeLists.txt"
"${nocuda[@]}" cmake -S "$T/src" -B "$T/build" -DCMAKE_PREFIX_PATH="$T/prefix" >"$T/configure.log"
"${nocuda[@]}" cmake --build "$T/build" >"$T/build.log"
pc() { PKG_CONFIG_PATH="$L/pkgconfig" pkg-config "$@" tdist; }
"${nocuda[@]}" cc "$T/src/consumer.c" $(pc --cflags --libs) -o "$T/app_pc"
if grep -il cuda "$T/build/CMakeFiles/app.dir/link.txt" "$T/build/CMakeFiles/app_static.dir/link.txt"; then
  fail "a consumer's link line names CUDA"
fi

# 3. The CPU job runs; --backend nccl with NCCL absent (TDIST_NCCL_LIBRARY
#    names no file) fails with the clear message.
for app in "$T/build/app" "$T/build/app_static" "$T/app_pc"; do
  "${nocuda[@]}" "$T/prefix/bin/tdistrun" -n 2 "$app" | grep -c "consumer: OK" | grep -qx 2 ||
    fail "$(basename "$app"): the CPU job did not run"
  if "${nocuda[@]}" TDIST_NCCL_LIBRARY="$T/absent/libnccl.so.2" "$T/prefix/bin/tdistrun" -n 2 \
       --backend nccl "$app" >"$T/nccl.log" 2>&1; then
    fail "$(basename "$app"): --backend nccl ran without NCCL"
  fi
  grep -q "init: backend 'nccl': $T/absent/libnccl.so.2 (TDIST_NCCL_LIBRARY) not found" "$T/nccl.log" &&
    grep -q "use --backend cpu" "$T/nccl.log" ||
    { cat "$T/nccl.log" >&2; fail "$(basename "$app"): no clear message for a missing NCCL"; }
  echo "install_consumer: $(basename "$app") ok (cpu runs, nccl absent: clear message)"
done

# 4. Where the loader finds the real NCCL but there is no GPU (this CI), the
#    same library opens it and says what is missing.
if ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 ' && [ ! -e /dev/nvidia0 ]; then
  if "${nocuda[@]}" "$T/prefix/bin/tdistrun" -n 1 --backend nccl "$T/build/app" >"$T/gpu.log" 2>&1; then
    fail "--backend nccl ran without a GPU"
  fi
  grep -q "init: backend 'nccl': no CUDA device: " "$T/gpu.log" ||
    { cat "$T/gpu.log" >&2; fail "no clear message without a GPU"; }
  echo "install_consumer: real NCCL without a GPU: $(grep -o "no CUDA device: .*" "$T/gpu.log" | head -1)"
fi
