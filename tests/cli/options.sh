#!/usr/bin/env bash
# The option tables of kvsim's subcommands and kvbench as users meet them: --help and
# --print-config show the defaults, a config file < the environment < a flag, --print-config
# output read back as a config file gives the same settings, and bad values (out of range, not
# a choice, not a number, an unknown key) are refused with exit status 2. No NATS is needed:
# kvbench exits before it connects.
# usage: options.sh KVSIM [KVBENCH]   (KVBENCH defaults to the kvbench beside KVSIM; kvworker,
# checked for --engine-dp-rank, is the one beside KVBENCH)
set -u
kvsim=$1
kvbench=${2:-$(dirname "$kvsim")/kvbench}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset KVR_CONFIG KVR_NATS KVR_NAMESPACE KVR_PREFIX KVR_LOG_LEVEL

# --help: every option with its default, read from the config structs
help=$("$kvsim" run --help) || fail "kvsim run --help exited $?"
for want in '--workers N .*(default 8)' '--block-size N .*(default 64)' '--num-blocks N .*(default 16384)' \
            '--kv-cost blocks|time .*(default time)' '--gossip on|off|both .*(default on)' \
            '--event-delay-ms MS .*(default 1)' '--heartbeat-ms MS .*(default 100)' \
            '--busy-threshold X .*(default 0.95)' '--cache-weight X .*(default 4)' \
            '--policies TEXT .*(default kv,random,round_robin)' '--out TEXT .*(default kvsim-out)'; do
  echo "$help" | grep -qE -- "$want" || fail "kvsim run --help lacks '$want'"
done
"$kvsim" explain --help | grep -qE -- '--prefix-tokens N .*(default 3500)' || fail "kvsim explain --help"
"$kvsim" hash --help | grep -qE -- '--block-size N' || fail "kvsim hash --help"
bhelp=$("$kvbench" --help) || fail "kvbench --help exited $?"
for want in '--mode load|hop|digest .*(default load)' '--resend-ms MS .*(default 2000)' \
            '--log-level debug|info|warn|error .*(default warn; env KVR_LOG_LEVEL)' \
            '--namespace TEXT .*(default default; env KVR_NAMESPACE)' '--concurrency N .*(default 20)' \
            'direct \(time to first token' '--engine-url TEXT' '--prompt-tokens N .*(default 1024)'; do
  echo "$bhelp" | grep -qE -- "$want" || fail "kvbench --help lacks '$want'"
done
"$kvbench" --mode direct >/dev/null 2>&1
[ $? -eq 2 ] || fail "kvbench --mode direct without --engine-url: not exit 2"
# hop holds a record per request it could send (100,000 a second): an hour asked ~72 GB and
# exited 1 saying nothing
"$kvbench" --mode hop --hop-seconds 3600 >/dev/null 2>&1
[ $? -eq 2 ] || fail "kvbench --hop-seconds 3600: not exit 2"

# --print-config: the settings in force, without running anything (no --workload needed)
cfg=$("$kvsim" run --print-config) || fail "kvsim run --print-config exited $?"
for want in 'workers = 8' 'heartbeat-ms = 100' 'gossip-delay-ms = 1' 'kv-cost = time' 'gossip = on' \
            'approximate = false' 'watermark = 0.01'; do
  echo "$cfg" | grep -qxF "$want" || fail "kvsim run --print-config lacks '$want'"
done
"$kvsim" run --print-config --kv-cost blocks --gossip both --approximate --event-delay-ms 2.5 \
  >"$tmp/run.conf" || fail "kvsim run --print-config with flags"
for want in 'kv-cost = blocks' 'gossip = both' 'approximate = true' 'event-delay-ms = 2.5'; do
  grep -qxF "$want" "$tmp/run.conf" || fail "--print-config does not show '$want'"
done
# ... and read back as a config file it gives the same settings
"$kvsim" run --config "$tmp/run.conf" --print-config | diff - "$tmp/run.conf" >/dev/null \
  || fail "kvsim run's --print-config output read back differs"

for prog in "$kvsim explain" "$kvsim hash" "$kvbench"; do
  # shellcheck disable=SC2086
  $prog --print-config >"$tmp/p.conf" || fail "$prog --print-config exited $?"
  # shellcheck disable=SC2086
  $prog --config "$tmp/p.conf" --print-config | diff - "$tmp/p.conf" >/dev/null \
    || fail "$prog: --print-config output read back differs"
done

# precedence, kvsim run: the file < a flag (also through KVR_CONFIG)
printf 'workers = 3\nseed = 11\n' >"$tmp/a.conf"
"$kvsim" run --config "$tmp/a.conf" --print-config | grep -qxF 'workers = 3' || fail "file ignored"
"$kvsim" run --config "$tmp/a.conf" --workers 5 --print-config | grep -qxF 'workers = 5' \
  || fail "a flag must beat the file"
KVR_CONFIG="$tmp/a.conf" "$kvsim" run --print-config | grep -qxF 'seed = 11' || fail "KVR_CONFIG ignored"

# precedence, kvbench: the file < the environment < a flag
printf 'namespace = from-file\nresend-ms = 700\n' >"$tmp/b.conf"
ns() { "$@" --print-config | sed -n 's/^namespace = //p'; }
[ "$(ns "$kvbench" --config "$tmp/b.conf")" = from-file ] || fail "kvbench: file ignored"
[ "$(KVR_NAMESPACE=from-env ns "$kvbench" --config "$tmp/b.conf")" = from-env ] \
  || fail "kvbench: the environment must beat the file"
[ "$(KVR_NAMESPACE=from-env ns "$kvbench" --config "$tmp/b.conf" --namespace from-flag)" = from-flag ] \
  || fail "kvbench: a flag must beat the environment"
[ "$(ns "$kvbench")" = default ] || fail "kvbench: the default namespace"
"$kvbench" --config "$tmp/b.conf" --print-config | grep -qxF 'resend-ms = 700' || fail "kvbench: file ms"
KVR_LOG_LEVEL=debug "$kvbench" --print-config | grep -qxF 'log-level = debug' || fail "KVR_LOG_LEVEL"

# bad values: exit 2, never a run
expect2() {
  "$@" >/dev/null 2>&1
  local rc=$?
  [ $rc -eq 2 ] || fail "'$*' exited $rc, expected 2"
}
for bad in "--workers 0" "--workers 4097" "--workers x" "--kv-cost nope" "--gossip maybe" \
           "--watermark 1" "--heartbeat-ms 0" "--num-blocks 8" "--event-delay-ms -1" \
           "--rate-scale 0" "--approximate=maybe" "--sweep 1,,2" "--replicas 2,x" "--out it's"; do
  # shellcheck disable=SC2086
  expect2 "$kvsim" run --workload seed --out "$tmp/never" --quiet $bad
done
[ -e "$tmp/never" ] && fail "a refused kvsim run wrote a report"
expect2 "$kvsim" run --config "$tmp/nonexistent.conf" --workload seed
printf 'bogus = 1\n' >"$tmp/bad.conf"
expect2 "$kvsim" run --config "$tmp/bad.conf" --workload seed
printf 'workers = many\n' >"$tmp/bad2.conf"
expect2 "$kvsim" run --config "$tmp/bad2.conf" --workload seed
for bad in "--workers 5000" "--output-tokens 0" "--block-size 4097" "--seed -1" "--policy nope"; do
  # shellcheck disable=SC2086
  expect2 "$kvsim" explain $bad
done
expect2 "$kvsim" hash --block-size 0 --tokens 1
expect2 "$kvsim" hash --block-size 2000000 --tokens 1
for bad in "--mode nope" "--log-level loud" "--concurrency 0" "--block-size 0" "--workload nope" \
           "--policies kv,nope" "--rate-scale -1" "--resend-ms x" "--bogus"; do
  # shellcheck disable=SC2086
  expect2 "$kvbench" $bad
done
KVR_LOG_LEVEL=loud expect2 "$kvbench" --print-config
# kvworker checks its options before it connects: a bad data-parallel rank is exit 2 too
kvworker=$(dirname "$kvbench")/kvworker
for bad in "--engine openai --engine-dp-rank 65536" "--engine openai --engine-dp-rank -1" \
           "--engine openai --engine-dp-rank 1x" "--engine openai --engine-dp-rank 000001" \
           "--engine-dp-rank 0"; do
  # shellcheck disable=SC2086
  expect2 "$kvworker" --nats nats://127.0.0.1:1 $bad
done
echo "1 passed, 0 failed"
