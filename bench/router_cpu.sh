#!/usr/bin/env bash
# The router's CPU per routed request, on 127.0.0.1: one nats-server, one kvworker --null, one
# kvrouter (gossip off), then kvbench --mode hop (routed and direct round trips of a 1,024-token
# prompt, then the highest routed rate). kvbench prints router_cpu_us_per_request from the
# routers' own $SRV.STATS (process CPU before and after the max-rate phase); this script checks
# it against /proc/<pid>/stat and counts the router's context switches over the same run.
# Prints figures, asserts nothing. usage: bench/router_cpu.sh [BUILD_DIR] (default build)
# Environment: RUNS (1), HOP_SECONDS (5), WINDOW (256), REQUESTS (latency rounds, 2000),
#   ROUTERS (router binaries to alternate, one run of each per round; default BUILD_DIR's),
#   PERF (a perf record -g of the router's max-rate phase into this file; off by default;
#   PERF_CALLGRAPH=dwarf for stacks through libraries built without frame pointers),
#   WORKER_ARGS (more kvworker options, e.g. "--event-batch-ms 1": its events in EventBatches).
# A binary named relay_floor in ROUTERS (BUILD_DIR/bench/relay_floor) takes the router's place:
# the same messages in and out with no routing in between, the floor under the router's figure
# (kvbench then prints router_cpu_us_per_request=na: the proc line is the one to read).
# A name of the form relay_floor:loop runs it with --loop (both connections read on one thread).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bin=$build/src
RUNS=${RUNS:-1}
HOP_SECONDS=${HOP_SECONDS:-5}
WINDOW=${WINDOW:-256}
REQUESTS=${REQUESTS:-2000}
ROUTERS=${ROUTERS:-$bin/kvrouter}
. bench/lib.sh
# Context switches (voluntary + involuntary) of every thread of process $1 so far.
ctxt() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { n += $2 } END { print n + 0 }'; }

start_nats

# shellcheck disable=SC2086 # WORKER_ARGS is a list of options
"$bin/kvworker" --nats "$url" --id 1 --null --log-level info ${WORKER_ARGS:-} >"$run/worker.log" 2>&1 &
pids+=($!)
wait_log "$run/worker.log" worker_started

for round in $(seq "$RUNS"); do
  for router in $ROUTERS; do
    if [ "$(basename "${router%:loop}")" = relay_floor ]; then
      loop=()
      [ "${router%:loop}" != "$router" ] && loop=(--loop)
      "${router%:loop}" --nats "$url" "${loop[@]}" >"$run/router.log" 2>&1 &
      rpid=$!
      pids+=("$rpid")
      wait_log "$run/router.log" relay_started
    else
      "$router" --nats "$url" --id r1 --gossip=false >"$run/router.log" 2>&1 &
      rpid=$!
      pids+=("$rpid")
      wait_log "$run/router.log" router_started
    fi
    perf=
    if [ -n "${PERF:-}" ]; then # the max-rate phase starts after the latency rounds (~2 s)
      (sleep 3 && perf record --call-graph "${PERF_CALLGRAPH:-fp}" -o "$PERF" -p "$rpid" -- \
        sleep "$((HOP_SECONDS - 1))" \
        >/dev/null 2>&1) &
      perf=$!
    fi
    c0=$(cpu_s "$rpid"); x0=$(ctxt "$rpid")
    out=$("$bin/kvbench" --nats "$url" --mode hop --requests "$REQUESTS" \
      --hop-seconds "$HOP_SECONDS" --hop-window "$WINDOW" | grep -vE '^ts=')
    c1=$(cpu_s "$rpid"); x1=$(ctxt "$rpid")
    [ -n "$perf" ] && wait "$perf"
    kill -TERM "$rpid"; wait "$rpid" 2>/dev/null || true
    line=$(echo "$out" | grep -m1 '^routed_p50_us=')
    reqs=$(echo "$out" | sed -nE 's/.*then ([0-9]+) routed requests.*/\1/p')
    echo "round=$round router=$router"
    echo "  $line"
    awk -v c0="$c0" -v c1="$c1" -v x0="$x0" -v x1="$x1" -v n="$REQUESTS" -v r="${reqs:-0}" 'BEGIN {
      t = n + 50 + r # routed over the whole run (the direct ones cost it their done events)
      printf "  proc: router_cpu_s=%.2f over the whole run, %.1f us and %.2f context switches per routed request\n",
        c1 - c0, (c1 - c0) / t * 1e6, (x1 - x0) / t }'
  done
done
