#!/usr/bin/env bash
# run.sh BUILD_DIR SRC_DIR [JEMALLOC(ON|OFF) [PYTHON]] - see CMakeLists.txt.
set -euo pipefail
B=$1 S=$2 JE=${3:-OFF} PY=${4:-python3}
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

# 1b. The allocator is tdist's own business: libtdist.so exports the API
#     (tdist_[a-z]*) and nothing else, needs no static TLS (dlopen works in
#     any process) and no jemalloc of the system; libtdist.a defines no
#     global symbol outside tdist_ (its jemalloc is tdist__je_*, hidden).
bad=$(nm -D --defined-only "$L/libtdist.so" | awk '{print $3}' | grep -v '^tdist_[a-z]' || true)
[ -z "$bad" ] || fail "libtdist.so exports non-API symbols: $(head -5 <<<"$bad" | paste -sd' ')"
if readelf -d "$L/libtdist.so" | grep -E 'STATIC_TLS|NEEDED.*jemalloc' >/dev/null; then
  readelf -d "$L/libtdist.so" | grep -E 'STATIC_TLS|NEEDED' >&2
  fail "libtdist.so needs static TLS or a shared jemalloc"
fi
bad=$(nm -g --defined-only "$L/libtdist.a" | awk 'NF == 3 {print $3}' | grep -v '^tdist_' || true)
[ -z "$bad" ] || fail "libtdist.a defines global symbols outside tdist_: $(head -5 <<<"$bad" | paste -sd' ')"
if [ "$JE" = ON ]; then
  nm --defined-only "$L/libtdist.a" | grep ' T tdist__je_mallocx$' >/dev/null ||
    fail "libtdist.a does not carry the private jemalloc (tdist__je_mallocx)"
  bad=$(readelf -sW "$L/libtdist.a" | awk '$8 ~ /^tdist__je_/ && $5 != "LOCAL" && $7 != "UND" && $6 != "HIDDEN" {print $8}')
  [ -z "$bad" ] || fail "jemalloc symbols not hidden in libtdist.a: $(head -5 <<<"$bad" | paste -sd' ')"
  nm -D "$L/libtdist.so" | grep 'tdist__je_' >/dev/null && fail "libtdist.so exports jemalloc symbols"
fi
echo "install_consumer: libtdist.so exports $(nm -D --defined-only "$L/libtdist.so" | wc -l) symbols," \
     "all tdist_*; no static TLS; libtdist.a defines only tdist_* (private jemalloc: $JE)"

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
# The shared library needs none of the -dev packages of libuv, libcurl and
# json-c: pkg-config finding nothing (PKG_CONFIG_LIBDIR names no folder), the
# shared-only consumer configures and links; asking for the static component
# then fails, naming the packages.
nopc=(env PKG_CONFIG_LIBDIR="$T/absent" PKG_CONFIG_PATH=)
"${nocuda[@]}" "${nopc[@]}" cmake -S "$T/src" -B "$T/build-shared" -DCMAKE_PREFIX_PATH="$T/prefix" \
  -DWITH_STATIC=OFF >"$T/configure-shared.log" || { cat "$T/configure-shared.log" >&2; fail "shared-only consumer: configure"; }
"${nocuda[@]}" "${nopc[@]}" cmake --build "$T/build-shared" >"$T/build-shared.log" ||
  { cat "$T/build-shared.log" >&2; fail "shared-only consumer: build"; }
if "${nocuda[@]}" "${nopc[@]}" cmake -S "$T/src" -B "$T/build-nodeps" -DCMAKE_PREFIX_PATH="$T/prefix" \
     >"$T/configure-nodeps.log" 2>&1; then
  fail "find_package(tdist COMPONENTS static) succeeded without libuv/libcurl/json-c"
fi
grep -q "libuv1-dev" "$T/configure-nodeps.log" ||
  { cat "$T/configure-nodeps.log" >&2; fail "no message naming the missing packages"; }
echo "install_consumer: tdist::tdist configures and links without the dependencies' -dev packages"
"${nocuda[@]}" cmake -S "$T/src" -B "$T/build" -DCMAKE_PREFIX_PATH="$T/prefix" >"$T/configure.log"
"${nocuda[@]}" cmake --build "$T/build" >"$T/build.log"
# pkg-config sees only tdist.pc (PKG_CONFIG_LIBDIR): Libs.private names what
# a static link needs itself, and there is no Requires(.private) to resolve.
pc() { PKG_CONFIG_LIBDIR="$L/pkgconfig" PKG_CONFIG_PATH= pkg-config "$@" tdist; }
"${nocuda[@]}" cc "$T/src/consumer.c" $(pc --cflags --libs) -o "$T/app_pc"
static_libs=$(pc --static --libs)
"${nocuda[@]}" cc "$T/src/consumer.c" $(pc --cflags) ${static_libs/-ltdist/-l:libtdist.a} -o "$T/app_pc_static"
readelf -d "$T/app_pc_static" | grep 'NEEDED.*libtdist' >/dev/null && fail "app_pc_static links libtdist.so"
echo "install_consumer: pkg-config --static --libs tdist: $static_libs"
if grep -il cuda "$T/build/CMakeFiles/app.dir/link.txt" "$T/build/CMakeFiles/app_static.dir/link.txt"; then
  fail "a consumer's link line names CUDA"
fi

# 3. The CPU job runs; --backend nccl with NCCL absent (TDIST_NCCL_LIBRARY
#    names no file) fails with the clear message.
for app in "$T/build/app" "$T/build/app_static" "$T/app_pc" "$T/app_pc_static" "$T/build-shared/app"; do
  "${nocuda[@]}" "$T/prefix/bin/tdistrun" -n 2 "$app" | grep -c "consumer: OK" | grep -qx 2 ||
    fail "$(basename "$app"): the CPU job did not run"
  if "${nocuda[@]}" TDIST_NCCL_LIBRARY="$T/absent/libnccl.so.2" "$T/prefix/bin/tdistrun" -n 2 \
       --backend nccl "$app" >"$T/nccl.log" 2>&1; then
    fail "$(basename "$app"): --backend nccl ran without NCCL"
  fi
  grep -q "init: backend 'nccl': $T/absent/libnccl.so.2 (TDIST_NCCL_LIBRARY) not found" "$T/nccl.log" &&
    grep -q "use --backend cpu" "$T/nccl.log" ||
    { cat "$T/nccl.log" >&2; fail "$(basename "$app"): no clear message for a missing NCCL"; }
  echo "install_consumer: ${app#"$T"/} ok (cpu runs, nccl absent: clear message)"
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

# 5. The consumer's malloc stays libc's. A program linked with libtdist.a
#    runs a store server and client (tdist allocating from its jemalloc) and
#    calls malloc itself: LD_DEBUG=bindings must show its malloc, and every
#    malloc/calloc/realloc/free binding of the process, going to libc.
cc -I"$T/prefix/include" "$S/alloc_check.c" ${static_libs/-ltdist/-l:libtdist.a} -o "$T/alloc_check_static"
LD_DEBUG=bindings LD_DEBUG_OUTPUT="$T/bindings" "$T/alloc_check_static" | grep -qx "alloc_check: OK" ||
  fail "alloc_check_static did not run"
grep -hE "symbol \`(malloc|calloc|realloc|free)'" "$T"/bindings.* >"$T/malloc-bindings.txt" || true
grep -qE "binding file [^ ]*alloc_check_static \[0\] to [^ ]*/libc\.so\.6 \[0\]: normal symbol \`malloc'" \
  "$T/malloc-bindings.txt" || { cat "$T/malloc-bindings.txt" >&2; fail "the program's malloc is not bound to libc"; }
if grep -vE " to [^ ]*/libc\.so\.6 \[[0-9]+\]: " "$T/malloc-bindings.txt" >"$T/bad-bindings.txt"; then
  cat "$T/bad-bindings.txt" >&2
  fail "a malloc-family symbol is bound to something other than libc"
fi
echo "install_consumer: static consumer, LD_DEBUG=bindings: $(grep -E "alloc_check_static \[0\].*\`malloc'" \
  "$T/malloc-bindings.txt" | head -1 | sed -E 's/^[[:space:]]*[0-9]+:[[:space:]]*//')"
echo "install_consumer: $(wc -l <"$T/malloc-bindings.txt") malloc/calloc/realloc/free bindings, all to libc.so.6"

# 6. dlopen into a plain, already running process: a C program (dlopen,
#    RTLD_LOCAL) and python3 (ctypes), GLIBC_TUNABLES unset. With jemalloc,
#    the library's allocator answers to TDIST__JE_MALLOC_CONF, not to the
#    process's MALLOC_CONF.
cc -DUSE_DLOPEN -I"$T/prefix/include" "$S/alloc_check.c" -ldl -o "$T/alloc_check_dlopen"
env -u GLIBC_TUNABLES "$T/alloc_check_dlopen" "$L/libtdist.so" | grep -qx "alloc_check: OK" ||
  fail "dlopen of libtdist.so from a C program"
env -u GLIBC_TUNABLES "$PY" "$S/dlopen_check.py" "$L/libtdist.so" | grep -qx "dlopen_check: OK" ||
  fail "ctypes.CDLL(libtdist.so) in python3 without GLIBC_TUNABLES"
if [ "$JE" = ON ]; then
  env -u GLIBC_TUNABLES TDIST__JE_MALLOC_CONF=stats_print:true "$T/alloc_check_dlopen" "$L/libtdist.so" \
    2>&1 | grep "Begin jemalloc statistics" >/dev/null || fail "the dlopened library does not allocate from its jemalloc"
  if env -u GLIBC_TUNABLES MALLOC_CONF=stats_print:true "$T/alloc_check_dlopen" "$L/libtdist.so" 2>&1 |
     grep "jemalloc statistics" >/dev/null; then
    fail "the process's MALLOC_CONF reached tdist's jemalloc"
  fi
fi
echo "install_consumer: libtdist.so dlopened by a C program and by python3 (ctypes), no GLIBC_TUNABLES: ok"

# 4. A third party's backend: the example plug-in (examples/backend) built
#    against the installed headers alone (pkg-config --cflags, no library),
#    dropped into <libdir>/tdist-backends, where libtdist.so finds it by name
#    without TDIST_BACKEND_PATH (plugin_load tests the path and the
#    refusals).
E="$S/../../examples/backend"
mkdir -p "$L/tdist-backends"
cc -shared -fPIC -Wall -Werror $(pc --cflags) "$E/loopback.c" -o "$L/tdist-backends/libtdist-backend-loopback.so"
cc $(pc --cflags) "$E/demo.c" $(pc --libs) -o "$T/backend_demo"
env -u TDIST_BACKEND_PATH "$T/backend_demo" loopback | grep -q "^OK: backend 'loopback'" ||
  fail "the installed libtdist.so did not run the example backend from $L/tdist-backends"
echo "install_consumer: the example backend, built from the installed headers, loaded by name from $L/tdist-backends: ok"
