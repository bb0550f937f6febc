#!/usr/bin/env bash
# The client contract under faults (docs/protocol.md; figures in docs/benchmarks.md, "Client
# contract under faults"). Starts its own fleet on 127.0.0.1: nats-server (deploy/nats.conf:
# max_payload 8MB; ephemeral ports, kept across its restart), two kvrouter, WORKERS kvworker
# (SPEEDUP times real time, 2,048 KV blocks each, so kvbench can fill them), then runs:
#   a. kvbench --mode resend --trials TRIALS: a request sent twice, at six timings, answered once?
#   b. REQUESTS requests (seed prompts, 8 tokens out, resends after 2 s of silence) while router 1
#      is paused for 10 s (SIGSTOP, SIGCONT)
#   c. REQUESTS requests across a nats-server stop and its restart 3 s later (same ports): the
#      daemons reconnect; are both routers and every worker back, and do the routers agree?
#   d. kvbench --mode cancel --trials TRIALS: how fast a cancel frees the worker
# Prints every figure and one verdict line per part, then stops everything it started (routers
# drain, workers finish, the server stops). Not part of the test command: about 3 minutes.
#
# usage: bash scripts/faults.sh [BUILD_DIR]      (default build; the programs in BUILD_DIR/src)
# Environment: TRIALS (200), REQUESTS (4000), WORKERS (4), SPEEDUP (10), PARTS (abcd: the parts
# to run, in order).
# Exit status 0 when every part's verdict is ok.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
bin=${1:-build}/src
TRIALS=${TRIALS:-200}
REQUESTS=${REQUESTS:-4000}
WORKERS=${WORKERS:-4}
SPEEDUP=${SPEEDUP:-10}
PARTS=${PARTS:-abcd}
for p in kvrouter kvworker kvbench; do
  [ -x "$bin/$p" ] || { echo "faults: $bin/$p is missing (build it: ninja -C ${1:-build})"; exit 2; }
done
command -v nats-server >/dev/null || { echo "faults: nats-server is not installed"; exit 2; }
# Nothing from the caller's KVR_* environment: every program gets its settings here.
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^KVR_' || true)

run=$(mktemp -d)
router_pids=() worker_pids=() nats_pid="" bench_pid="" verdicts=() failed=0

stop_all() {
  # a load still running (an interrupted part) first, then routers (they drain their queues),
  # then workers (they finish what they hold), then NATS
  local p
  if [ -n "$bench_pid" ]; then kill -TERM "$bench_pid" 2>/dev/null; wait "$bench_pid" 2>/dev/null; fi
  for p in "${router_pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null; done
  for p in "${router_pids[@]}"; do wait "$p" 2>/dev/null; done
  for p in "${worker_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${worker_pids[@]}"; do wait "$p" 2>/dev/null; done
  if [ -n "$nats_pid" ]; then kill -TERM "$nats_pid" 2>/dev/null; wait "$nats_pid" 2>/dev/null; fi
  if [ "$failed" -ne 0 ]; then
    echo "faults: the last lines of the daemons' logs (warnings and errors):"
    for f in "$run"/router*.log "$run"/worker*.log; do
      [ -s "$f" ] && { echo "--- $(basename "$f")"; tail -n 5 "$f"; }
    done
  fi
  rm -rf "$run"
}
trap stop_all EXIT

verdict() { # verdict PART OK|FAIL TEXT
  echo "verdict $1: $2 - $3"
  verdicts+=("$1: $2 - $3")
  [ "$2" = ok ] || failed=1
}

start_nats() { # start_nats [PORT MONITOR_PORT]: ephemeral ports the first time, then the same
  local ports="" args=(-p -1 -m -1)
  [ $# -eq 2 ] && args=(-p "$1" -m "$2")
  rm -f "$run"/nats-server_*.ports
  nats-server -c deploy/nats.conf -a 127.0.0.1 "${args[@]}" --ports_file_dir "$run" \
    >>"$run/nats.log" 2>&1 &
  nats_pid=$!
  for _ in $(seq 200); do
    ports=$(ls "$run"/nats-server_*.ports 2>/dev/null || true)
    [ -n "$ports" ] && break
    sleep 0.05
  done
  [ -n "$ports" ] || { echo "faults: nats-server did not start:"; tail "$run/nats.log"; exit 1; }
  url=$(sed -E 's/.*"nats":\["([^"]+)".*/\1/' "$ports")
  monitor=$(sed -E 's/.*"monitoring":\["([^"]+)".*/\1/' "$ports")
}

routers_answering() { # how many routers answer $SRV (through kvbench --mode digest)
  "$bin/kvbench" --nats "$url" --mode digest --digest-wait-ms 300 --log-level error 2>&1 \
    >/dev/null | sed -nE 's/^kvbench: ([0-9]+) routers answered.*/\1/p'
}

connections() { # the kvrouter-* and kvworker-* connections NATS monitoring lists
  curl -s "$monitor/connz?limit=1024" | tr ',' '\n' | grep -oE '"name": *"kv(router|worker)-[^"]*"' |
    sed -E 's/.*"(kv[^"]*)"/\1/' | sort -u
}

contract_ok() { # contract_ok FILE: the load run's row has failed=0, its contract line all zeros
  grep -qE ' finished=[0-9]+ failed=0$' "$1" && grep -q ' contract: ' "$1" || return 1
  ! grep ' contract: ' "$1" | sed 's/ (allowed:.*//' | grep -oE '[a-z_]+=[0-9]+' | grep -qvE '=0$'
}

load() { # load NAME: REQUESTS requests of seed, 8 tokens out, resends after 2 s, in the background
  "$bin/kvbench" --nats "$url" --workload seed --requests "$REQUESTS" --max-tokens 8 \
    --policies kv --concurrency 20 --resend-ms 2000 --timeout-ms 180000 --out "$run/$1" \
    --log-level warn >"$run/$1.out" 2>"$run/$1.err" &
  bench_pid=$!
}

show_load() { # show_load NAME SECONDS: kvbench's lines and its resends
  grep -v '^wrote ' "$run/$1.out"
  grep -hoE "msg=resent.*" "$run/$1.err" | sed "s/^/   kvbench: /" || true
  echo "   ($2 s of wall time)"
}

part_a() {
  echo "== a. resend timings: $TRIALS trials each"
  t0=$SECONDS
  "$bin/kvbench" --nats "$url" --mode resend --trials "$TRIALS" --log-level warn
  rc=$?
  echo "   ($((SECONDS - t0)) s of wall time)"
  if [ $rc -eq 0 ]; then verdict a ok "every resent request answered once, in full"
  else verdict a FAIL "kvbench --mode resend exited $rc (table above)"; fi
}

part_b() {
  echo "== b. $REQUESTS requests while router 1 is paused for 10 s"
  t0=$SECONDS
  load pause
  sleep 1
  kill -STOP "${router_pids[0]}"
  echo "   router 1 stopped at $((SECONDS - t0)) s"
  sleep 10
  kill -CONT "${router_pids[0]}"
  echo "   router 1 continued at $((SECONDS - t0)) s"
  wait "$bench_pid"
  rc=$?
  bench_pid=""
  show_load pause $((SECONDS - t0))
  if [ $rc -ne 0 ]; then verdict b FAIL "kvbench exited $rc"
  elif ! contract_ok "$run/pause.out"; then verdict b FAIL "a request failed or broke the contract (above)"
  else verdict b ok "every request answered once, in full, across the pause"; fi
}

part_c() {
  echo "== c. $REQUESTS requests across a nats-server stop and its restart 3 s later"
  t0=$SECONDS
  load restart
  sleep 1
  kill -TERM "$nats_pid"
  wait "$nats_pid" 2>/dev/null
  echo "   nats-server stopped at $((SECONDS - t0)) s"
  sleep 3
  start_nats "$port" "$mport"
  echo "   nats-server restarted at $((SECONDS - t0)) s on the same ports"
  wait "$bench_pid"
  rc=$?
  bench_pid=""
  show_load restart $((SECONDS - t0))
  want=$(( WORKERS + 2 ))
  for _ in $(seq 40); do
    back=$(connections | grep -cE '^kvrouter-faults-r[12]$|^kvworker-[0-9]+$')
    [ "$back" -ge "$want" ] && break
    sleep 0.25
  done
  echo "   back on the server: $(connections | grep -E '^kvrouter-faults-r[12]$|^kvworker-[0-9]+$' | tr '\n' ' ')"
  agree=0 # the routers converge by gossip and repairs: their digests are asked for up to 5 s
  for k in $(seq 10); do
    if "$bin/kvbench" --nats "$url" --mode digest --digest-wait-ms 500 --log-level error \
      >/dev/null 2>"$run/digest.err"; then agree=1; break; fi
  done
  echo "   $(cat "$run/digest.err") (at the digest poll $k)"
  why=""
  [ $rc -eq 0 ] || why="$why; kvbench exited $rc"
  contract_ok "$run/restart.out" || why="$why; a request failed or broke the contract (above)"
  [ "$back" -ge "$want" ] || why="$why; $back of $want daemons back"
  [ $agree -eq 1 ] || why="$why; the routers' digests differ"
  if [ -z "$why" ]; then
    verdict c ok "every request answered once, in full; both routers and $WORKERS workers back, digests agree"
  else verdict c FAIL "${why#; }"; fi
}

part_d() {
  echo "== d. cancel: $TRIALS requests cancelled after 10 tokens"
  "$bin/kvbench" --nats "$url" --mode cancel --trials "$TRIALS" --log-level warn
  rc=$?
  if [ $rc -eq 0 ]; then verdict d ok "every request ended cancelled"
  else verdict d FAIL "kvbench --mode cancel exited $rc (figures above)"; fi
}

echo "== faults: nats-server on 127.0.0.1, 2 routers, $WORKERS workers (${SPEEDUP}x real time)"
start_nats
port=${url##*:}
mport=${monitor##*:}
echo "   nats $url, monitoring $monitor, logs in $run"
for i in $(seq "$WORKERS"); do
  "$bin/kvworker" --nats "$url" --id "$i" --speedup "$SPEEDUP" --num-blocks 2048 \
    --log-level warn >"$run/worker$i.log" 2>&1 &
  worker_pids+=($!)
done
for i in 1 2; do
  "$bin/kvrouter" --nats "$url" --id "faults-r$i" --engine-speedup "$SPEEDUP" --log-level warn >"$run/router$i.log" 2>&1 &
  router_pids+=($!)
done
for _ in $(seq 40); do [ "$(routers_answering)" = 2 ] && break; sleep 0.25; done
sleep 1 # past the routers' warm-up: every router knows every worker

for part in $(echo "$PARTS" | grep -o .); do "part_$part"; done

echo "== faults: $(date -u +%Y-%m-%d), $(nproc) cores"
for v in "${verdicts[@]}"; do echo "   $v"; done
exit $failed
