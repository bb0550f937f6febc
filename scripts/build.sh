#!/usr/bin/env bash
# Configure (once) and build kvrouter in a build directory.
# usage: scripts/build.sh [BUILD_DIR] [extra meson setup options...]
# Warnings are errors when CI is set.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
opts=()
[ -n "${CI:-}" ] && opts+=(-Dwerror=true)
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" "${opts[@]}" "$@" >/dev/null
fi
# ninja's output (the failing command and the compiler's errors are on stdout) is kept in a log
# and shown when the build fails
if ! ninja -C "$dir" >"$dir/ninja.log" 2>&1; then
  tail -60 "$dir/ninja.log"
  echo "build of $dir failed (log: $dir/ninja.log)"
  exit 1
fi
