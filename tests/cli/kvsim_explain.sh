#!/usr/bin/env bash
# kvsim explain, the main job before the daemons exist: every policy runs to completion, the first
# decisions are explained, and kv reuses more cached prefix than round_robin on the seed set-up.
set -u
kvsim=$1
fail() { echo "FAIL: $*"; exit 1; }

out=$("$kvsim" explain --requests 120 --verbose 3) || fail "exit status $?"
[ "$(echo "$out" | grep -c '^request ')" -eq 6 ] || fail "expected 3 explained decisions per policy"
[ "$(echo "$out" | grep -c '    why: ')" -eq 6 ] || fail "every explained decision says why"
hit() { echo "$out" | grep "^summary policy=$1 " | sed -E 's/.*prefix_hit=([0-9.]+).*/\1/'; }
kv=$(hit kv); rr=$(hit round_robin)
[ -n "$kv" ] && [ -n "$rr" ] || fail "missing summaries: $out"
awk -v a="$kv" -v b="$rr" 'BEGIN { exit !(a > b) }' || fail "kv hit $kv not above round_robin $rr"
echo "$out" | grep -q "inflight_left=0" || fail "requests left in flight"

all=$("$kvsim" explain --requests 60 --verbose 0 \
  --policies kv,random,round_robin,least_loaded,power_of_two,prefix_only,sglang_cache_aware,llmd_weighted,chwbl) \
  || fail "a policy failed"
[ "$(echo "$all" | grep -c '^summary .*finished=60 ')" -eq 9 ] || fail "not every policy finished: $all"

"$kvsim" explain --policies nope >/dev/null 2>&1; [ $? -eq 2 ] || fail "an unknown policy must exit 2"
"$kvsim" explain --workers 0 >/dev/null 2>&1; [ $? -eq 2 ] || fail "zero workers must exit 2"
"$kvsim" explain --bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "an unknown option must exit 2"
echo "1 passed, 0 failed"
