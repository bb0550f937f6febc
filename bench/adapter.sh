#!/usr/bin/env bash
# What the adapter costs (issue 12), on 127.0.0.1: one nats-server, one engine stand-in
# (kvengine), one adapter (kvworker --engine openai) and one router, then
#   1. kvbench --mode direct: a request's time to first token through the fleet against the same
#      request sent straight to the engine's HTTP API (one request at a time, alternating);
#   2. kvbench --mode load: a closed loop through the fleet, with the adapter's CPU time (from
#      /proc) per token it streamed (the engine's vllm:generation_tokens_total).
# Prints figures, asserts nothing. usage: bench/adapter.sh [BUILD_DIR] (default build)
# Environment: SPEEDUP (engine speed-up, 1), ROUNDS (direct rounds, 200), REQUESTS (load, 400).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bin=$build/src
SPEEDUP=${SPEEDUP:-1}
ROUNDS=${ROUNDS:-200}
REQUESTS=${REQUESTS:-400}
. bench/lib.sh
# The value of series $2 at http://127.0.0.1:$1/metrics.
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n { print $2 }'; }

start_nats

"$bin/standin/kvengine" --listen 127.0.0.1:0 --speedup "$SPEEDUP" --kv-events 'tcp://127.0.0.1:*' \
  --kv-replay 'tcp://127.0.0.1:*' >"$run/engine.log" 2>&1 &
pids+=($!)
eport=$(log_value "$run/engine.log" http_listening port)
pub=$(log_value "$run/engine.log" kv_events_listening endpoint)
rep=$(log_value "$run/engine.log" kv_events_listening replay)
echo "kvengine on 127.0.0.1:$eport (speedup $SPEEDUP)"
"$bin/kvworker" --nats "$url" --id 1 --engine openai --engine-url "http://127.0.0.1:$eport" \
  --kv-events "$pub" --kv-replay "$rep" \
  --metrics-addr 127.0.0.1:0 --log-level info >"$run/adapter.log" 2>&1 &
adapter=$!
pids+=($adapter)
"$bin/kvrouter" --nats "$url" --id r1 --engine-speedup "$SPEEDUP" >"$run/router.log" 2>&1 &
pids+=($!)
log_value "$run/adapter.log" worker_started id >/dev/null
log_value "$run/router.log" router_started id >/dev/null # in the request queue group

echo "== 1. time to first token: through the fleet against straight to the engine"
"$bin/kvbench" --nats "$url" --mode direct --engine-url "http://127.0.0.1:$eport" \
  --requests "$ROUNDS" | grep -vE '^ts='

echo "== 2. the adapter's CPU per streamed token"
tok0=$(metric "$eport" 'vllm:generation_tokens_total{model_name="kvengine",engine="0"}')
cpu0=$(cpu_s "$adapter")
"$bin/kvbench" --nats "$url" --requests "$REQUESTS" --policies kv --concurrency 20 | grep -E '^kv '
cpu1=$(cpu_s "$adapter")
tok1=$(metric "$eport" 'vllm:generation_tokens_total{model_name="kvengine",engine="0"}')
awk -v c0="$cpu0" -v c1="$cpu1" -v t0="${tok0:-0}" -v t1="${tok1:-0}" 'BEGIN {
  t = t1 - t0; c = c1 - c0
  if (t <= 0) { print "no tokens counted"; exit 1 }
  printf "adapter: %.2f s of CPU for %d streamed tokens: %.1f us per token\n", c, t, c / t * 1e6 }'
