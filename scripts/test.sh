#!/usr/bin/env bash
# test.sh - the README's test command (and what CI runs): installs missing
# packages, then builds and runs the whole suite three ways:
#   1. gcc, -Werror, every test;
#   2. clang with AddressSanitizer + UndefinedBehaviorSanitizer, every test;
#   3. clang with ThreadSanitizer, every test;
# plus a short libFuzzer run over the store's message parser.
# Build trees: build/test, build/asan, build/tsan, build/fuzz. Exit non-zero
# if anything fails. Set TDIST_TEST_QUICK=1 to run only the first pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh test || exit 1
jobs=$(nproc)
status=0
summary=""

pass() { # name, cmake args..., -- ctest args...
  local name=$1; shift
  local cargs=() targs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do cargs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  targs=("$@")
  echo "==== tdist tests: $name"
  local t0=$SECONDS
  if ! cmake -S . -B "build/$name" -G Ninja -DTDIST_WERROR=ON "${cargs[@]}" >"build/$name.configure.log" 2>&1; then
    cat "build/$name.configure.log"; status=1; summary+="$name: configure FAILED"$'\n'; return
  fi
  if ! cmake --build "build/$name" -j "$jobs" >"build/$name.build.log" 2>&1; then
    tail -50 "build/$name.build.log"; status=1; summary+="$name: build FAILED"$'\n'; return
  fi
  local ok=0
  (cd "build/$name" && ctest --output-on-failure "${targs[@]}") 2>&1 | tee "build/$name.ctest.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && ok=1
  # "100% tests passed, 0 tests failed out of 30" -> totals
  local line n f
  line=$(grep -E "tests passed, [0-9]+ tests? failed out of [0-9]+" "build/$name.ctest.log" | tail -1)
  n=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line"); f=$(sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
  total_run=$((total_run + ${n:-0})); total_failed=$((total_failed + ${f:-0}))
  if [ $ok -eq 1 ]; then
    summary+="$name: ${n:-0} tests passed ($((SECONDS - t0)) s)"$'\n'
  else
    status=1; summary+="$name: tests FAILED: ${f:-?} of ${n:-?} ($((SECONDS - t0)) s)"$'\n'
    [ -z "$f" ] && total_failed=$((total_failed + 1))
  fi
}

mkdir -p build
total_run=0
total_failed=0
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
pass test -DCMAKE_BUILD_TYPE=RelWithDebInfo -- -LE fuzz
if [ "${TDIST_TEST_QUICK:-0}" != 1 ]; then
  pass asan -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTDIST_ENABLE_ASAN=ON \
       -DTDIST_BUILD_BENCH=OFF -- -LE fuzz
  pass tsan -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTDIST_ENABLE_TSAN=ON \
       -DTDIST_BUILD_BENCH=OFF -- -LE fuzz
  pass fuzz -DCMAKE_C_COMPILER=clang -DTDIST_BUILD_FUZZ=ON -DTDIST_BUILD_BENCH=OFF \
       -DTDIST_BUILD_EXAMPLES=OFF -- -L fuzz
fi
echo "==== tdist tests: summary"
printf "%s" "$summary"
# One closing line for the whole run (every pass's ctest counted).
echo "tests: $((total_run - total_failed)) passed, $total_failed failed"
exit $status
