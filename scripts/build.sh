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
  # meson prints its errors on stdout: shown when it fails
  out=$(meson setup "$dir" "${opts[@]}" "$@" 2>&1) || { printf '%s\n' "$out"; exit 1; }
fi
# ninja's output (the failing command and the compiler's errors are on stdout) is kept in a log
# and shown from the first failure on when the build fails
if ! ninja -C "$dir" >"$dir/ninja.log" 2>&1; then
  sed -n '/^FAILED:/,$p' "$dir/ninja.log" | head -150
  echo "build of $dir failed (log: $dir/ninja.log)"
  exit 1
fi
