#!/usr/bin/env bash
# deps.sh [test] - make sure the Debian packages tdist needs are installed,
# and fetch the source of the private jemalloc (below).
# As root, missing packages are installed with apt-get; otherwise the exact
# apt-get line is printed and the script fails. With "test", the packages the
# test suite needs (cmocka, clang and its sanitizer/fuzzer runtimes, etcd,
# Slurm, munge and Open MPI for tests/multihost) too.
#
# jemalloc: the library's own allocations come from a jemalloc that is private
# to libtdist (static, prefixed symbols, nothing exported, no initial-exec TLS:
# cmake/TdistJemalloc.cmake builds it). Its source is Debian's jemalloc source
# package: `apt-get source jemalloc`, unpacked into third_party/jemalloc/src
# (ignored by git; delete the folder to fetch it again). apt-get source needs a
# deb-src entry: as root this script adds one for the distribution's own
# archive (/etc/apt/sources.list.d/tdist-deb-src.list, derived from the
# existing deb entries) when none is configured.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs="build-essential dpkg-dev cmake ninja-build pkg-config python3 python3-numpy libuv1-dev"
pkgs="$pkgs libcurl4-openssl-dev libjson-c-dev" # the etcd store
if [ "${1:-}" = "test" ]; then
  pkgs="$pkgs libcmocka-dev clang libclang-rt-14-dev stress-ng python3-pytest python3-venv python3-dev python3-torch"
  pkgs="$pkgs etcd-server" # test_store_etcd's 3-member cluster
  pkgs="$pkgs slurm-wlm munge openmpi-bin" # tests/multihost: srun, sbatch, mpirun
fi
root=0
[ "$(id -u)" -eq 0 ] && root=1
export DEBIAN_FRONTEND=noninteractive

missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  if [ $root -eq 0 ]; then
    echo "tdist: missing Debian packages:$missing" >&2
    echo "run: sudo apt-get install -y$missing" >&2
    exit 1
  fi
  echo "tdist: installing$missing"
  apt-get install -y -q $missing >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q $missing >/dev/null; }
fi

# ---- jemalloc's source ----------------------------------------------------------
je_dir=third_party/jemalloc
[ -f "$je_dir/src/configure" ] && exit 0 # fetched before

# deb-src lines for the distribution's own suites (those named after its
# codename: bookworm, bookworm-updates, bookworm-security; third-party
# repositories are left out), from one-line and deb822 sources alike.
deb_src_lines() {
  local codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  {
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '$1 == "deb" { $1 = "deb-src"; print }'
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] || continue
      # One line per stanza and suite: deb-src [signed-by=K] URI SUITE COMPONENTS
      awk 'function flush() {
             if (types ~ /(^| )deb( |$)/ && enabled != "no")
               for (i = 1; i <= ns; i++)
                 for (j = 1; j <= nu; j++)
                   print "deb-src" (key != "" ? " [signed-by=" key "]" : "") " " u[j] " " s[i] " " comps
             types = ""; enabled = ""; key = ""; comps = ""; nu = 0; ns = 0
           }
           /^[ \t]*#/ { next }
           /^[ \t]*$/ { flush(); next }
           { k = tolower($1); sub(/:$/, "", k); $1 = ""; v = substr($0, 2) }
           k == "types" { types = v } k == "enabled" { enabled = tolower(v) }
           k == "signed-by" { key = v } k == "components" { comps = v }
           k == "uris" { nu = split(v, u, " ") } k == "suites" { ns = split(v, s, " ") }
           END { flush() }' "$f"
    done
  } | awk -v c="$codename" '{ n = $2 ~ /^\[/ ? 4 : 3; if (c == "" || $n == c || index($n, c "-") == 1) print }' |
    sort -u
}

have_src() { apt-cache showsrc jemalloc 2>/dev/null | grep -q '^Package: jemalloc'; }
if ! have_src; then
  list=/etc/apt/sources.list.d/tdist-deb-src.list
  lines=$(deb_src_lines)
  if [ -z "$lines" ]; then
    echo "tdist: no Debian/Ubuntu archive found in the apt sources: add a deb-src entry" \
         "for it, then run this script again (it fetches jemalloc's source)" >&2
    exit 1
  fi
  if [ $root -eq 0 ]; then
    echo "tdist: jemalloc's source package is needed (apt-get source jemalloc) and apt has no" \
         "deb-src entry: as root, put these lines in $list, run apt-get update," \
         "then run this script again (or configure with -DTDIST_WITH_JEMALLOC=OFF):" >&2
    sed 's/^/  /' <<<"$lines" >&2
    exit 1
  fi
  if [ "$(cat "$list" 2>/dev/null)" != "$lines" ]; then
    echo "tdist: adding deb-src entries ($list) for apt-get source jemalloc"
    printf '%s\n' "$lines" >"$list"
  fi
  apt-get update -q >/dev/null
  have_src || { echo "tdist: apt-get update found no jemalloc source package" >&2; exit 1; }
fi

echo "tdist: fetching jemalloc's source (apt-get source jemalloc) into $je_dir/src"
mkdir -p "$je_dir"
tmp=$(mktemp -d "$je_dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# As root apt-get downloads as its sandbox user, which cannot write here.
(cd "$tmp" && apt-get source -q -o APT::Sandbox::User=root jemalloc >fetch.log 2>&1) ||
  { cat "$tmp/fetch.log" >&2; exit 1; }
src=$(find "$tmp" -mindepth 2 -maxdepth 2 -name configure.ac -printf '%h\n' | head -1)
[ -n "$src" ] && [ -f "$src/configure" ] ||
  { cat "$tmp/fetch.log" >&2; echo "tdist: no unpacked jemalloc source with a configure script" >&2; exit 1; }
# The Debian version fetched (jemalloc_5.3.0-1.dsc -> 5.3.0-1), for the build's log.
basename "$(ls "$tmp"/jemalloc_*.dsc)" .dsc | sed 's/^jemalloc_//' >"$je_dir/DEBIAN_VERSION"
rm -rf "$je_dir/src"
mv "$src" "$je_dir/src"
echo "tdist: jemalloc $(cat "$je_dir/DEBIAN_VERSION") unpacked in $je_dir/src"
