#!/usr/bin/env bash
# kvsim run --replicas as users run it: the small trace fixture shared among 1, 2 and 4 routers,
# with and without gossip, writes the replica table (one router once, then each N with gossip on
# and off), the replica fields in report.json and the plots against N; the same seed gives the same
# JSON; runs without --replicas keep their report; bad values are refused.
set -u
kvsim=$1
fixture=$2
fail() { echo "FAIL: $*"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() { "$kvsim" run --workload conversation --trace "$fixture" --workers 8 --policies kv \
          --arrival-spread-ms 3000 --seed 3 --quiet "$@"; }

run --replicas 1,2,4 --gossip both --out "$out/a" >"$out/log" 2>&1 || { cat "$out/log"; fail "kvsim run failed"; }
for f in report.json report.md plots.gp ttft_cdf_1.png ttft_p90_vs_replicas.png hit_vs_replicas.png; do
  [ -s "$out/a/$f" ] || fail "missing $f"
done
md="$out/a/report.md"
grep -q "^Router replicas:" "$md" || fail "report.md has no replica table"
rows=$(grep -cE '^\| kv \| [0-9]+ \| (on|off|-) \|' "$md")
[ "$rows" -eq 5 ] || fail "expected 5 replica rows (1; 2, 4 x on, off), got $rows"
for row in '| kv | 1 | - | ' '| kv | 2 | on | ' '| kv | 2 | off | ' '| kv | 4 | on | ' '| kv | 4 | off | '; do
  grep -qF "$row" "$md" || fail "report.md lacks the row '$row'"
done
grep -F '| kv | 1 | - | ' "$md" | grep -qF '| 1.000 |' || fail "one router's ratios to itself are not 1"
grep -F '| kv | 4 | on | ' "$md" | grep -qF '| 1.00 |' || fail "gossip sends one message per decision"
grep -qF "| hit / N=1 |" "$md" || fail "no ratio columns"
json="$out/a/report.json"
for key in '"gossip_delay_ms": 1.000' '"arrival_spread_ms": 3000.000' '"replicas": 4' \
           '"gossip": true' '"gossip": false' '"gossip_msgs"' '"gossip_bytes_per_decision"' \
           '"early_events"' '"late_decisions"' '"prediction_error_worst_replica"' '"finished": 200'; do
  grep -q "$key" "$json" || fail "report.json lacks $key"
done
[ "$(grep -c '"policy"' "$json")" -eq 5 ] || fail "expected 5 results"

run --replicas 1,2,4 --gossip both --out "$out/b" >/dev/null 2>&1 || fail "second run failed"
cmp -s "$json" "$out/b/report.json" || fail "the same seed gave different JSON"

run --replicas 2 --gossip off --gossip-delay-ms 5 --out "$out/c" >/dev/null 2>&1 || fail "gossip off failed"
[ "$(grep -c '"policy"' "$out/c/report.json")" -eq 1 ] || fail "--replicas 2 --gossip off is one run"
grep -q '"gossip": false' "$out/c/report.json" || fail "--gossip off ran with gossip"

run --out "$out/d" >/dev/null 2>&1 || fail "a run without replicas failed"
grep -q '"replicas"' "$out/d/report.json" && fail "a run without --replicas reports replicas"
grep -q "^Router replicas:" "$out/d/report.md" && fail "a run without --replicas has their table"

for bad in "--replicas 0" "--replicas 1.5" "--replicas 65" "--replicas 1,x" "--gossip maybe" \
           "--gossip-delay-ms -1" "--arrival-spread-ms x" "--replicas"; do
  # shellcheck disable=SC2086
  run $bad --out "$out/e" >/dev/null 2>&1
  rc=$?
  [ $rc -eq 2 ] || fail "'kvsim run $bad' exited $rc"
done
echo "1 passed, 0 failed"
