#!/usr/bin/env bash
# meson test wrapper for the valgrind setup. Criterion runs every test in a child process and
# ignores how that child exits, so valgrind's own exit code would be lost: each process writes
# its own log instead, and this script fails when any log reports an error or a leak.
set -u
logs=$(mktemp -d)
# Criterion's children are traced; the other programs a test runs (promtool, python3 and the
# shell that starts them) are not ours and run natively.
valgrind --trace-children=yes --trace-children-skip='*/promtool,*/python3*,*/sh,*/bash' \
  --leak-check=full --show-leak-kinds=definite,indirect \
  --errors-for-leak-kinds=definite,indirect --log-file="$logs/vg.%p" "$@"
rc=$?
if grep -lqE "ERROR SUMMARY: [1-9]|definitely lost: [1-9]|indirectly lost: [1-9]" "$logs"/vg.* 2>/dev/null; then
  grep -hE -B2 -A25 "ERROR SUMMARY: [1-9]|definitely lost|Invalid|uninitialised" "$logs"/vg.* | head -200
  echo "valgrind: errors or leaks found (logs in $logs)"
  exit 1
fi
rm -rf "$logs"
exit $rc
