#!/usr/bin/env bash
# kvsim run as users run it: a small trace fixture through every policy writes a report with the
# documented keys, plots, the same JSON for the same seed, and clear errors for bad input.
set -u
kvsim=$1
fixture=$2
fail() { echo "FAIL: $*"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$kvsim" run --workload conversation --trace "$fixture" --workers 4 --policies all \
  --num-blocks 4096 --sweep 1,2 --seed 7 --out "$out/a" --quiet >"$out/log" 2>&1 \
  || { cat "$out/log"; fail "kvsim run failed"; }
for f in report.json report.md plots.gp ttft_cdf_1.png ttft_cdf_2.png ttft_p90_vs_load.png hit_vs_load.png; do
  [ -s "$out/a/$f" ] || fail "missing $f"
done
json="$out/a/report.json"
for key in '"workload": "conversation"' '"workers": 4' '"seed": 7' '"results": \[' \
           '"policy": "kv"' '"policy": "chwbl"' '"load": 2' '"ttft_ms": {"mean"' '"p90"' '"p99"' \
           '"itl_ms": {"mean"' '"e2e_ms": {"mean"' '"hit_rate"' '"hit_ceiling"' \
           '"throughput_tok_s"' '"finished": 200' '"rejected": 0' '"imbalance"'; do
  grep -q "$key" "$json" || fail "report.json lacks $key"
done
[ "$(grep -c '"policy"' "$json")" -eq 18 ] || fail "expected 9 policies x 2 loads"
# the Mooncake traces' documented hit ceiling is theirs, not a --trace file's
grep -q '"hit_ceiling_trace_doc"' "$json" && fail "a --trace file reported the documented trace's ceiling"
grep -q "Ratio to the best baseline" "$out/a/report.md" || fail "report.md has no ratio table"

"$kvsim" run --workload conversation --trace "$fixture" --workers 4 --policies kv,random \
  --num-blocks 4096 --seed 7 --out "$out/b" --quiet >/dev/null 2>&1 || fail "second run failed"
"$kvsim" run --workload conversation --trace "$fixture" --workers 4 --policies kv,random \
  --num-blocks 4096 --seed 7 --out "$out/c" --quiet >/dev/null 2>&1 || fail "third run failed"
cmp -s "$out/b/report.json" "$out/c/report.json" || fail "the same seed gave different JSON"

"$kvsim" run --workload seed --requests 100 --concurrency 10 --out "$out/d" --quiet >/dev/null 2>&1 \
  || fail "seed workload failed"
grep -q '"load_kind": "concurrency"' "$out/d/report.json" || fail "seed is closed-loop"

# --max-tokens sets every output length, as kvbench's does: 2 tokens end far sooner than seed's 100
"$kvsim" run --workload seed --requests 100 --concurrency 10 --policies kv --max-tokens 2 \
  --out "$out/m" --quiet >/dev/null 2>&1 || fail "--max-tokens run failed"
e2e() { sed -nE 's/.*"e2e_ms": \{"mean": ([0-9.]+).*/\1/p' "$1/report.json" | head -1; }
awk -v a="$(e2e "$out/m")" -v b="$(e2e "$out/d")" 'BEGIN { exit !(a > 0 && b > 0 && a < b / 5) }' \
  || fail "--max-tokens 2: e2e mean $(e2e "$out/m") ms against $(e2e "$out/d") ms without it"

# --client-max-tokens: every client sends that max_tokens, and longer outputs are cut to it
"$kvsim" run --workload seed --requests 100 --concurrency 10 --policies kv --client-max-tokens 30 \
  --per-request --out "$out/k" --quiet >/dev/null 2>&1 || fail "--client-max-tokens run failed"
awk -F, 'NR > 1 && $8 != 30 { bad++ } END { exit (bad > 0 || NR != 101) }' "$out/k/requests.csv" \
  || fail "--client-max-tokens 30: outputs $(cut -d, -f8 "$out/k/requests.csv" | sort -u | tr '\n' ' ')"
grep -q '"client_max_tokens": 30,' "$out/k/report.json" || fail "report.json lacks client_max_tokens"
grep -q '"decode_weight": 0.500, "learn_output": true' "$out/d/report.json" \
  || fail "report.json lacks the own decode's settings: $(grep '"router"' "$out/d/report.json")"
# the router is sent that max_tokens: taken as sent (--learn-output=false), 2,048 instead of seed's
# 100 prices every request's decode 20 times higher, and kv places them otherwise
for cap in 0 2048; do
  "$kvsim" run --workload seed --requests 200 --concurrency 20 --policies kv --learn-output=false \
    --client-max-tokens $cap --out "$out/c$cap" --quiet >/dev/null 2>&1 || fail "--client-max-tokens $cap run failed"
done
[ "$(grep '"policy": "kv"' "$out/c0/report.json")" != "$(grep '"policy": "kv"' "$out/c2048/report.json")" ] \
  || fail "--client-max-tokens 2048 did not reach the router's price"

# --per-request: requests.csv, a line per finished request of every run, agreeing with the report
"$kvsim" run --workload conversation --trace "$fixture" --workers 4 --policies kv,random \
  --num-blocks 4096 --sweep 1,2 --seed 7 --per-request --out "$out/p" --quiet >/dev/null 2>&1 \
  || fail "--per-request run failed"
csv="$out/p/requests.csv"
head -1 "$csv" | grep -q '^run,load,request,group,worker,arrival_ms,isl,osl,cached_tokens,preemptions,queue_ms,ttft_ms,e2e_ms,itl_mean_ms,itl_max_ms$' \
  || fail "requests.csv header: $(head -1 "$csv")"
[ "$(tail -n +2 "$csv" | wc -l)" -eq 800 ] || fail "expected 2 policies x 2 loads x 200 lines"
awk -F, 'NR > 1 && (NF != 15 || $4 == "" || $5 >= 4 || $12 > $13) { bad++ } END { exit bad > 0 }' "$csv" \
  || fail "requests.csv has a malformed line"
for run in kv random; do
  for load in 1 2; do
    got=$(awk -F, -v r="$run" -v l="$load" '$1 == r && $2 == l { s += $12; n++ } END { printf "%.3f", s / n }' "$csv")
    want=$(grep "\"policy\": \"$run\", \"load\": $load," "$out/p/report.json" \
      | sed -nE 's/.*"ttft_ms": \{"mean": ([0-9.]+).*/\1/p')
    awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(b > 0 && d < 0.005 && d > -0.005) }' || fail "$run at $load: TTFT mean $got ms in requests.csv, $want in report.json"
  done
done
mkdir -p "$out/q/requests.csv"
"$kvsim" run --workload seed --requests 20 --per-request --out "$out/q" --quiet >/dev/null 2>"$out/qlog"
[ $? -eq 1 ] && grep -q "cannot write $out/q/requests.csv" "$out/qlog" || fail "an unwritable requests.csv: $(cat "$out/qlog")"

grep -q '"itl_per_request_ms": {"mean"' "$json" || fail "report.json lacks the per-request ITL"
grep -q "ITL/request mean ms" "$out/a/report.md" || fail "report.md lacks the per-request ITL"

# a closed loop's --sweep values are numbers of clients: below 1 (0 clients hung) or not whole
# (silently truncated) is refused, as --concurrency refuses them
for v in 0.5 2.5 1,0.999; do
  timeout 60 "$kvsim" run --workload seed --requests 20 --sweep $v --out "$out/w" --quiet >/dev/null 2>"$out/wlog"
  rc=$?
  [ $rc -eq 2 ] && grep -q "closed-loop: each value is a number of clients" "$out/wlog" \
    || fail "--sweep $v on seed exited $rc: $(cat "$out/wlog")"
done
timeout 60 "$kvsim" run --workload burst --requests 32 --policies kv --sweep 0.5 --out "$out/w" --quiet \
  >/dev/null 2>&1 || fail "--sweep 0.5 on burst (open loop: a rate scale) was refused"

# requests that need more KV blocks than one engine holds (seed's 7,000-token prompts and 100
# output tokens: 111 blocks of 64, the pool 64) fail, counted, and the run ends
timeout 60 "$kvsim" run --workload seed --requests 5 --policies kv --num-blocks 64 --out "$out/f" \
  --quiet >/dev/null 2>"$out/flog"
rc=$?
[ $rc -eq 0 ] || fail "--num-blocks 64 exited $rc: $(cat "$out/flog")"
grep -q '"finished": 0, "rejected": 0, .*"failed": 5, "failed_reason": "prompt and output need more KV blocks than one engine holds' \
  "$out/f/report.json" || fail "report.json does not count the failed requests"
grep -q "5 requests failed: prompt and output need more KV blocks than one engine holds (up to 111 blocks, of a pool of 64" \
  "$out/flog" || fail "no failure on stderr: $(cat "$out/flog")"
grep -q "^kv: 5 requests failed" "$out/f/report.md" || fail "report.md does not say why they failed"

# a request the engine would never admit (the second shares the first's 98 cached blocks of a
# pool of 100 and needs two more, but admission keeps the watermark free) is refused, as the
# worker does, and the run ends (it once heartbeated for ever)
trace() { # timestamp, input_length, output_length
  echo "{\"timestamp\": $1, \"input_length\": $2, \"output_length\": $3, \"hash_ids\": [1, 2, 3, 4]}"
}
{ trace 0 1583 1; trace 10000 1585 1; } >"$out/stuck.jsonl"
timeout 60 "$kvsim" run --workload conversation --trace "$out/stuck.jsonl" --workers 1 --policies kv \
  --block-size 16 --num-blocks 100 --max-batched-tokens 512 --out "$out/s" --quiet >/dev/null 2>"$out/slog"
rc=$?
[ $rc -eq 0 ] && grep -q '"finished": 1, "rejected": 0, .*"failed": 1,' "$out/s/report.json" ||
  fail "a run with a request its engine cannot admit exited $rc: $(cat "$out/slog")"

# Unix-time trace timestamps: the run starts with the first request, not 55 years before it
for i in 0 1 2; do
  echo "{\"timestamp\": $((1733570000000 + i * 1000)), \"input_length\": 600, \"output_length\": 10, \"hash_ids\": [$i, 9]}"
done >"$out/epoch.jsonl"
timeout 60 "$kvsim" run --workload conversation --trace "$out/epoch.jsonl" --policies kv --out "$out/t" \
  --quiet >/dev/null 2>&1 || fail "a Unix-time trace did not finish"
grep -qE '"finished": 3, .*"makespan_s": 2\.[0-9]+,' "$out/t/report.json" \
  || fail "a Unix-time trace: $(grep -o '"makespan_s": [0-9.]*' "$out/t/report.json")"
# an output_length past --max-tokens' bound is refused, naming its line
{ trace 0 1584 16; trace 5 1600 4294967295; } >"$out/osl.jsonl"
timeout 60 "$kvsim" run --workload conversation --trace "$out/osl.jsonl" --out "$out/o" --quiet >/dev/null 2>"$out/olog"
rc=$?
[ $rc -eq 1 ] && grep -q "osl.jsonl: line 2: output_length over 1000000" "$out/olog" \
  || fail "output_length 2^32-1 exited $rc: $(cat "$out/olog")"

for bad in "--workload nope" "--workload seed --workers 0" "--workload seed --policies kv,nope" \
           "--workload seed --sweep 1,x" "--workload seed --bogus" "--workload conversation --trace /nonexistent" \
           "--workload seed --max-tokens x" "--workload seed --client-max-tokens -1" \
           "--workload seed --learn-output=maybe"; do
  # shellcheck disable=SC2086
  "$kvsim" run $bad --out "$out/e" --quiet >/dev/null 2>&1
  rc=$?
  [ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "'kvsim run $bad' exited $rc"
done

echo "1 passed, 0 failed"
