#!/usr/bin/env bash
# run.sh BUILD_DIR SRC_DIR - see CMakeLists.txt.
set -euo pipefail
B=$1 S=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cmake --install "$B" --prefix "$T/prefix" >"$T/install.log"
mkdir "$T/src"
cp "$S/consumer.c" "$T/src/"
cp "$S/consumer.cmake" "$T/src/CMakeLists.txt"
cmake -S "$T/src" -B "$T/build" -DCMAKE_PREFIX_PATH="$T/prefix" >"$T/configure.log"
cmake --build "$T/build" >"$T/build.log"
PKG_CONFIG_PATH="$T/prefix/lib/pkgconfig" \
  cc "$T/src/consumer.c" $(PKG_CONFIG_PATH="$T/prefix/lib/pkgconfig" pkg-config --cflags --libs tdist) \
  -Wl,-rpath,"$T/prefix/lib" -o "$T/app_pc"
for app in "$T/build/app" "$T/build/app_static" "$T/app_pc"; do
  "$T/prefix/bin/tdistrun" -n 2 "$app" | grep -c "consumer: OK" | grep -qx 2
  echo "install_consumer: $(basename "$app") ok"
done
