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
ninja -C "$dir" >/dev/null
