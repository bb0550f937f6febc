#!/usr/bin/env bash
# NATS nkeys, JWTs and .creds files for the integration tests, made fresh into DIR by
# nats-keys.mjs (what it writes is listed there). Its packages (@nats-io/nkeys, @nats-io/jwt) are
# tests/js's: when tests/js/node_modules is missing or older than the lock file (a fresh clone,
# where the plain test stage runs before the js stage), they are installed first with `npm ci`,
# as tests/js/run.sh does. Fails, saying what is missing, when node or npm is absent or the
# install fails.
#   bash tests/pki/make-nats-keys.sh DIR
set -euo pipefail
dir=${1:?usage: make-nats-keys.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
js=$here/../js
command -v node >/dev/null || { echo "make-nats-keys: node not found (bash scripts/deps.sh installs nodejs)" >&2; exit 1; }

stale() {
  [ ! -f "$js/node_modules/.package-lock.json" ] ||
    [ ! -d "$js/node_modules/@nats-io/jwt" ] || [ ! -d "$js/node_modules/@nats-io/nkeys" ] ||
    [ "$js/package-lock.json" -nt "$js/node_modules/.package-lock.json" ] ||
    [ "$js/package.json" -nt "$js/node_modules/.package-lock.json" ]
}
if stale; then
  command -v npm >/dev/null || { echo "make-nats-keys: npm not found (bash scripts/deps.sh installs npm)" >&2; exit 1; }
  # one install at a time (two test programs may get here together)
  exec 9>"${TMPDIR:-/tmp}/kvr-tests-js-npm.lock"
  flock 9
  if stale; then
    echo "make-nats-keys: npm ci in tests/js" >&2
    (cd "$js" && npm ci --no-audit --no-fund --loglevel=error) >&2 ||
      { echo "make-nats-keys: npm ci failed in $js" >&2; exit 1; }
  fi
  flock -u 9
fi
mkdir -p "$dir"
node "$here/nats-keys.mjs" "$dir"
