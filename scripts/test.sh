#!/usr/bin/env bash
# test.sh - the README's test command (and what CI runs): installs missing
# packages, then builds and runs the whole suite three ways:
#   1. gcc, -Werror, every test;
#   2. clang with AddressSanitizer + UndefinedBehaviorSanitizer, every test
#      (soaks and other long repetition tests as their *_short variants),
#      plus a short libFuzzer run over the store's message parser, built in
#      the same tree (its library objects are the ASan ones);
#   3. clang with ThreadSanitizer, every test (short variants as in 2).
# Build trees: build/test, build/asan, build/tsan; the two sanitizer trees
# build in the background while the gcc pass's tests run. Each pass runs its tests in
# parallel (ctest -j, TDIST_TEST_JOBS, default 4 on any core count: most
# tests wait on sockets and timers); the tests that need the machine to
# themselves are RUN_SERIAL, the ones that must not overlap one another share
# a RESOURCE_LOCK (see the blocks at the end of tests/*/CMakeLists.txt).
# At its end it prints, per pass, the build and test seconds and the 15
# slowest tests, then the closing line `tests: N passed, M failed` (every
# pass counted). Exit non-zero if anything fails. Set TDIST_TEST_QUICK=1 to
# run only the first pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh test || exit 1
jobs=$(nproc)
ctest_jobs=${TDIST_TEST_JOBS:-4}
status=0
summary=""
report=""

# The 15 slowest tests of a ctest log ("  3/113 Test  #7: name ....   Passed   12.34 sec").
slowest() {
  sed -nE 's/^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: ([^ ]+) .* ([0-9]+\.[0-9]+) sec$/\2 \1/p' "$1" |
    sort -rn | head -15 | awk '{ printf "    %8.1f s  %s\n", $1, $2 }'
}

# Configure and build build/NAME with the given cmake args; the outcome in
# build/NAME.build.status ("ok", "configure" or "build": what failed) and
# its seconds in build/NAME.build.secs.
build_tree() {
  local name=$1; shift
  local t0=$SECONDS st=ok
  if ! cmake -S . -B "build/$name" -G Ninja -DTDIST_WERROR=ON "$@" >"build/$name.configure.log" 2>&1; then
    st=configure
  elif ! cmake --build "build/$name" -j "$jobs" >"build/$name.build.log" 2>&1; then
    st=build
  fi
  echo $((SECONDS - t0)) >"build/$name.build.secs"
  echo "$st" >"build/$name.build.status"
}

pass() { # name, cmake args..., -- ctest args...
  local name=$1; shift
  local cargs=() targs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do cargs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  targs=("$@")
  echo "==== tdist tests: $name"
  local t0=$SECONDS note=""
  if [ -n "${bg_pid:-}" ] && [ "$name" != test ]; then
    # Built in the background (below): wait for its outcome.
    while [ ! -s "build/$name.build.status" ] && kill -0 "$bg_pid" 2>/dev/null; do sleep 2; done
    note=" (in the background, $((SECONDS - t0)) s waited for it)"
  else
    build_tree "$name" "${cargs[@]}"
  fi
  local st
  st=$(cat "build/$name.build.status" 2>/dev/null || echo build)
  if [ "$st" = configure ]; then
    cat "build/$name.configure.log"; status=1; summary+="$name: configure FAILED"$'\n'; return
  elif [ "$st" != ok ]; then
    tail -50 "build/$name.build.log"; status=1; summary+="$name: build FAILED"$'\n'; return
  fi
  if [ "$name" = test ] && [ "${TDIST_TEST_QUICK:-0}" != 1 ]; then
    # The sanitizer trees build while the gcc pass's tests run (most of
    # them wait on sockets and timers): CI's 2 cores spent ~180 s on these
    # two builds between passes. The load is one the suite must bear anyway
    # (it passes under stress-ng --cpu 2). Not niced: at nice 10 beside
    # stress-ng's two nice-0 workers the build got ~5 % of the CPUs and was
    # still at half when the ASan pass began waiting for it.
    (
      build_tree asan "${asan_args[@]}"
      build_tree tsan "${tsan_args[@]}"
    ) &
    bg_pid=$!
  fi
  local tb=$SECONDS ok=0
  (cd "build/$name" && ctest --output-on-failure -j "$ctest_jobs" "${targs[@]}") 2>&1 | tee "build/$name.ctest.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && ok=1
  local build_s ctest_s=$((SECONDS - tb))
  build_s=$(cat "build/$name.build.secs" 2>/dev/null || echo "?")
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
  report+="$name: build ${build_s} s${note}, ctest -j$ctest_jobs ${ctest_s} s, ${n:-?} tests; slowest:"$'\n'
  report+="$(slowest "build/$name.ctest.log")"$'\n'
}

mkdir -p build
rm -f build/*.build.status build/*.build.secs
asan_args=(-DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTDIST_ENABLE_ASAN=ON
           -DTDIST_BUILD_FUZZ=ON -DTDIST_BUILD_BENCH=OFF)
tsan_args=(-DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTDIST_ENABLE_TSAN=ON
           -DTDIST_BUILD_BENCH=OFF)
total_run=0
total_failed=0
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
pass test -DCMAKE_BUILD_TYPE=RelWithDebInfo --
if [ "${TDIST_TEST_QUICK:-0}" != 1 ]; then
  pass asan "${asan_args[@]}" --
  pass tsan "${tsan_args[@]}" --
fi
if [ -n "${bg_pid:-}" ]; then wait "$bg_pid"; fi
echo "==== tdist tests: per pass (build, tests, 15 slowest)"
printf "%s" "$report"
echo "==== tdist tests: summary"
printf "%s" "$summary"
# One closing line for the whole run (every pass's ctest counted).
echo "tests: $((total_run - total_failed)) passed, $total_failed failed"
exit $status
