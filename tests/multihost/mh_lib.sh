# mh_lib.sh - helpers shared by the multi-host test drivers (sourced).
#
# The drivers are bash scripts run by ctest (tests/multihost/CMakeLists.txt);
# paths to the binaries come in the environment (TDISTRUN, MH_PROG, ...).
# Exit codes: 0 pass, 1 fail, 77 skipped (ctest's SKIP_RETURN_CODE): only
# when the machine lacks what the test needs (root, network namespaces, the
# Slurm or Open MPI packages), always with a line saying why.
#
# Every wait is bounded and generous (the CI VM has 2 cores and runs a CPU
# stress test beside the suite); MH_SLOW=1 (sanitizer builds) doubles them.

MH_SKIP=77
MH_SLOW=${MH_SLOW:-0}

mh_log() { echo "[$(date +%T)] $*"; }

mh_skip() {
  echo "SKIPPED: $*"
  exit $MH_SKIP
}

# Seconds scaled for sanitizer builds.
mh_t() { if [ "$MH_SLOW" = 1 ]; then echo $(($1 * 2)); else echo "$1"; fi; }

mh_now_ms() { echo $(($(date +%s%N) / 1000000)); }

# mh_count FILE... -- PATTERN: lines matching an extended regex.
mh_count() {
  local files=()
  while [ "$1" != "--" ]; do files+=("$1"); shift; done
  cat "${files[@]}" 2>/dev/null | grep -cE "$2"
}

# mh_wait_count N SECONDS PATTERN GLOB: wait until N lines of the files that
# GLOB (quoted by the caller, no spaces) names match. The glob is expanded
# on every poll: the files may not exist yet when the wait starts. 0 ok.
mh_wait_count() {
  local n=$1 secs=$2 pat=$3 glob=$4
  local end=$((SECONDS + secs))
  # shellcheck disable=SC2086 # the glob is expanded here on purpose
  while [ "$(cat $glob 2>/dev/null | grep -cE "$pat")" -lt "$n" ]; do
    [ $SECONDS -ge $end ] && return 1
    sleep 0.2
  done
  return 0
}

# mh_dump FILE...: print files for a failure report.
mh_dump() {
  local f
  for f in "$@"; do
    [ -f "$f" ] || continue
    echo "----- $f"
    tail -n 60 "$f"
  done
  echo "-----"
}

mh_need_root() {
  [ "$(id -u)" = 0 ] || mh_skip "needs root (${1:-network namespaces})"
}
