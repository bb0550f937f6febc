#!/usr/bin/env bash
# The main job: install what is missing, build, then run a local fleet on an embedded NATS server
# (127.0.0.1, ephemeral ports, started and stopped here): 8 simulated workers (kvworker, 10x
# real time), 2 routers (kvrouter) sharing the request subject, and kvbench replaying the first
# 3,000 requests of the Mooncake conversation trace through them (arrivals 6 times the trace's
# rate in the workers' time, outputs cut to 64 tokens so the run fits a minute on two cores),
# once per policy: kv, round_robin and sglang_cache_aware. Prints the rows, the hit rates against
# the ceiling, the ratios and a short verdict, writes out/fleet/report.{json,md} and plots, and
# stops everything cleanly.
#
# Environment: WORKERS (8), ROUTERS (2), WORKLOAD (conversation; or seed, seed-isl, seed-osl,
# burst, synthetic), REQUESTS (3000 for the traces, else 1000), RATE (open loop, the traces and
# burst: arrivals this many times the trace's rate in the workers' time; 6), CONCURRENCY (closed
# loop, the seed workloads: clients; 20), MAX_TOKENS (every output length; 64 for the traces, 0:
# the workload's), SPEEDUP (10), POLICIES (kv,round_robin,sglang_cache_aware), OUT (out/fleet),
# EVENT_BATCH_MS (0: each lifecycle event alone; 1: each worker sends them in EventBatches of up
# to 1 ms, fewer messages for the routers),
# KEEP_LOGS (1: keep every process's log, and print where), ROUTER_ARGS (more kvrouter flags, split
# on spaces, e.g. "--decode-weight 0"),
# and ENGINE: sim (the default: each kvworker simulates its engine in-process) or standin (each
# worker is the adapter, `kvworker --engine openai`, in front of its own engine stand-in
# `kvengine`, reached over the engines' real interfaces: the OpenAI-compatible HTTP API and
# ZeroMQ KV events; see docs/engines.md for the same with vLLM or SGLang).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build

WORKERS=${WORKERS:-8}
ROUTERS=${ROUTERS:-2}
WORKLOAD=${WORKLOAD:-conversation}
case "$WORKLOAD" in conversation | synthetic) trace=1 ;; *) trace=0 ;; esac
REQUESTS=${REQUESTS:-$([ "$trace" = 1 ] && echo 3000 || echo 1000)}
MAX_TOKENS=${MAX_TOKENS:-$([ "$trace" = 1 ] && echo 64 || echo 0)}
RATE=${RATE:-6}
CONCURRENCY=${CONCURRENCY:-20}
SPEEDUP=${SPEEDUP:-10}
POLICIES=${POLICIES:-kv,round_robin,sglang_cache_aware}
OUT=${OUT:-out/fleet}
ENGINE=${ENGINE:-sim}
EVENT_BATCH_MS=${EVENT_BATCH_MS:-0}
case "$ENGINE" in sim | standin) ;; *) echo "ENGINE must be sim or standin, not $ENGINE" >&2; exit 2 ;; esac
bin=build/src
source bench/lib.sh # run (the logs), pids, log_value, start_nats

bench_pid=""
stop_all() {
  # kvbench first, if the script was stopped while it ran
  if [ -n "$bench_pid" ]; then
    kill -TERM "$bench_pid" 2>/dev/null || true
    wait "$bench_pid" 2>/dev/null || true
  fi
  # routers first (they drain their queues), then workers (they finish what they hold), then NATS
  for sig_group in kvrouter kvworker kvengine; do
    for p in "${pids[@]}"; do
      if [ -e "/proc/$p" ] && grep -q "$sig_group" "/proc/$p/cmdline" 2>/dev/null; then kill -TERM "$p" 2>/dev/null || true; fi
    done
    for p in "${pids[@]}"; do
      if grep -q "$sig_group" "/proc/$p/cmdline" 2>/dev/null; then wait "$p" 2>/dev/null || true; fi
    done
  done
  cleanup # the server last
}
trap stop_all EXIT
trap 'exit 130' INT # at once, also while waiting for kvbench (below)
trap 'exit 143' TERM

echo "== starting nats-server on 127.0.0.1 (logs in $run)"
start_nats -c deploy/nats.conf -m -1
echo "   nats $url, monitoring $monitor"

if [ "$ENGINE" = standin ]; then
  echo "== starting $WORKERS engine stand-ins (kvengine) and their adapters, $ROUTERS routers"
  for i in $(seq "$WORKERS"); do
    # like vLLM: long prompts, and a connection for every stream the adapter may open (1,024)
    "$bin/standin/kvengine" --listen 127.0.0.1:0 --speedup "$SPEEDUP" --max-model-len 131072 \
      --max-connections 1100 --kv-events 'tcp://127.0.0.1:*' --kv-replay 'tcp://127.0.0.1:*' >"$run/engine$i.log" 2>&1 &
    pids+=($!)
  done
  for i in $(seq "$WORKERS"); do
    port=$(log_value "$run/engine$i.log" http_listening port)
    events=$(log_value "$run/engine$i.log" kv_events_listening endpoint)
    replay=$(log_value "$run/engine$i.log" kv_events_listening replay)
    "$bin/kvworker" --nats "$url" --id "$i" --engine openai --engine-url "http://127.0.0.1:$port" \
      --kv-events "$events" --kv-replay "$replay" --event-batch-ms "$EVENT_BATCH_MS" \
      --log-level warn >"$run/worker$i.log" 2>&1 &
    pids+=($!)
  done
else
  echo "== starting $WORKERS workers and $ROUTERS routers"
  for i in $(seq "$WORKERS"); do
    "$bin/kvworker" --nats "$url" --id "$i" --speedup "$SPEEDUP" --event-batch-ms "$EVENT_BATCH_MS" \
      --log-level warn >"$run/worker$i.log" 2>&1 &
    pids+=($!)
  done
fi
for i in $(seq "$ROUTERS"); do
  # shellcheck disable=SC2086 # ROUTER_ARGS is split into flags on purpose
  "$bin/kvrouter" --nats "$url" --id "router$i" --engine-speedup "$SPEEDUP" --log-level warn \
    ${ROUTER_ARGS:-} >"$run/router$i.log" 2>&1 &
  pids+=($!)
done
sleep 1.5 # one heartbeat: every router knows every worker

echo "== the routers, as NATS monitoring sees them"
curl -s "$monitor/connz?limit=1024" | tr ',' '\n' | grep -o '"name": *"kvrouter-[^"]*"' | sort -u || true

# The workers run SPEEDUP times faster than real time, so the trace's arrivals are too.
rate_scale=$(awk -v r="$RATE" -v s="$SPEEDUP" 'BEGIN { print r * s }')
case "$WORKLOAD" in
  seed*) load="$CONCURRENCY clients" ;;
  *) load="arrivals ${RATE}x the trace's rate" ;;
esac
outs=$([ "$MAX_TOKENS" = 0 ] && echo "the workload's outputs" || echo "$MAX_TOKENS output tokens each")
echo "== kvbench: $WORKLOAD, $REQUESTS requests, $load, $outs; policies $POLICIES"
# In the background, waited for: a SIGTERM or SIGINT to this script (timeout, a supervisor, Ctrl-C)
# runs stop_all at once, which stops kvbench too; in the foreground, kvbench ran on after a SIGTERM
# against the stopped fleet.
"$bin/kvbench" --nats "$url" --workload "$WORKLOAD" --requests "$REQUESTS" \
  --concurrency "$CONCURRENCY" --rate-scale "$rate_scale" --max-tokens "$MAX_TOKENS" \
  --policies "$POLICIES" --out "$OUT" &
bench_pid=$!
wait "$bench_pid" # set -e: its exit status is the script's
bench_pid=""
