#!/usr/bin/env bash
# The client-protocol conformance suite (docs/protocol.md), a NATS client in JavaScript: installs
# its packages with `npm ci` (from package-lock.json) when node_modules is missing or older than
# the lock file, then runs every tests/js/*.test.js with Node's test runner. Each test file starts
# its own fleet (nats-server on 127.0.0.1, routers and workers from KVR_BUILD, default the
# repository's build/) and stops it at its end. The last lines are the counts: "pass N", "fail M".
#   KVR_BUILD=DIR       the build directory holding src/kvrouter and src/kvworker
#   KVR_JS_TRIALS=N     trials of each resend timing (default 20)
#   KVR_JS_KEEP=1       keep each fleet's logs (their directory is printed)
#   bash tests/js/run.sh errors.test.js ...   only those files
set -euo pipefail
orig=$PWD
cd "$(dirname "$0")"

command -v node >/dev/null || { echo "node not found: bash scripts/deps.sh installs nodejs and npm"; exit 1; }
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 18 ]; then
  echo "node $(node --version) is too old: the suite needs Node.js 18 or later"
  exit 1
fi

# npm writes node_modules/.package-lock.json at every install: older than the lock file (or
# package.json) means stale.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ] ||
  [ package.json -nt node_modules/.package-lock.json ]; then
  echo "js: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi

# default: this repository's build/, wherever it is checked out
KVR_BUILD=${KVR_BUILD:-$(cd ../.. && pwd)/build}
export KVR_BUILD
files=()
for f in "$@"; do
  # a path from where the script was called, or a name here
  case $f in /*) ;; *) [ -f "$orig/$f" ] && f=$orig/$f ;; esac
  files+=("$f")
done
[ ${#files[@]} -gt 0 ] || files=(*.test.js)

# One file at a time where the runner can be told (Node >= 20.10): each starts its own fleet.
# The spec report goes to the terminal, a TAP copy to a file for the counts.
tap=$(mktemp)
trap 'rm -f "$tap"' EXIT
args=(--test --test-reporter=spec --test-reporter-destination=stdout
  --test-reporter=tap --test-reporter-destination="$tap")
if node --test-concurrency=1 -e '' >/dev/null 2>&1; then args+=(--test-concurrency=1); fi

# A bound on the whole run (a hang past every test's own timeout): 10 min, more with more trials.
# timeout runs node in a process group of its own; a signal to this script is passed on to it,
# and the test files stop their fleets on it.
limit=$((600 + ${KVR_JS_TRIALS:-20} * 6))
timeout --kill-after=10 "$limit" node "${args[@]}" "${files[@]}" &
pid=$!
trap 'kill -TERM -- "-$pid" 2>/dev/null || true' INT TERM
rc=0
while :; do
  if wait "$pid"; then rc=0; else rc=$?; fi
  kill -0 "$pid" 2>/dev/null || break
done
pass=$(sed -n 's/^# pass \([0-9][0-9]*\)$/\1/p' "$tap" | tail -1)
fail=$(sed -n 's/^# fail \([0-9][0-9]*\)$/\1/p' "$tap" | tail -1)
echo "js conformance suite (${#files[@]} files, KVR_BUILD=$KVR_BUILD):"
echo "pass ${pass:-0}"
echo "fail ${fail:-unknown}"
if [ "$rc" -eq 0 ] && [ "${fail:-1}" != 0 ]; then rc=1; fi
exit "$rc"
