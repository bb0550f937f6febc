#!/usr/bin/env bash
# Every test kvrouter has: installs what is missing, builds, then runs
#   1. the whole suite on a plain build (warnings are errors under CI),
#   2. the whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer,
#   3. the unit tests under valgrind (leaks and memory errors fail the run),
#   4. a formatting check of every C file against .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh

start=$(date +%s)
echo "== plain build"
bash scripts/build.sh build
meson test -C build --print-errorlogs --num-processes 2

echo "== address + undefined sanitizers"
# Criterion ignores how a test's child process exits, so the sanitizers write their reports to
# files and any report fails the run.
bash scripts/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false
san_logs=$(mktemp -d)
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$san_logs/asan" \
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$san_logs/ubsan" \
  meson test -C build-asan --print-errorlogs --num-processes 2
if compgen -G "$san_logs/*" >/dev/null; then
  head -100 "$san_logs"/*
  echo "sanitizers reported errors (logs in $san_logs)"
  exit 1
fi
rm -rf "$san_logs"

echo "== valgrind (unit tests)"
meson test -C build --setup=valgrind --suite unit --print-errorlogs --num-processes 2

echo "== clang-format"
bad=$(git ls-files '*.c' '*.h' 2>/dev/null || find src include tests bench -name '*.[ch]')
unformatted=()
for f in $bad; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || unformatted+=("$f")
done
if [ ${#unformatted[@]} -gt 0 ]; then
  echo "not formatted with clang-format: ${unformatted[*]}"
  exit 1
fi
echo "all tests passed in $(( $(date +%s) - start )) s"
