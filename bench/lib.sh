# Shared by the bench/*.sh scripts (sourced after `cd` to the repository): a run directory, the
# processes started (stopped at exit), log helpers, and a nats-server on 127.0.0.1.
run=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "${KEEP_LOGS:-}" ]; then echo "logs kept in $run" >&2; else rm -rf "$run"; fi
}
trap cleanup EXIT

# The value of key $3 on the first line of log file $1 with msg=$2 (waits up to 10 s).
log_value() {
  for _ in $(seq 200); do
    v=$(grep -m1 "msg=$2 " "$1" 2>/dev/null | sed -nE "s/.* $3=([^ ]+).*/\1/p" || true)
    [ -n "$v" ] && { echo "$v"; return 0; }
    sleep 0.05
  done
  echo "no msg=$2 in $1" >&2; cat "$1" >&2; return 1
}
# Wait (up to 10 s) for a line with msg=$2 in log file $1.
wait_log() {
  for _ in $(seq 200); do
    grep -q "msg=$2 " "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "no msg=$2 in $1" >&2; cat "$1" >&2; return 1
}
# CPU seconds (user + system) of process $1 so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }

# Start nats-server on a free 127.0.0.1 port, with extra options "$@" (e.g. -c FILE, -m -1 for a
# monitoring port); sets url, nats_pid, and monitor when it has a monitoring port. In a session of
# its own: a Ctrl-C reaches the daemons and not the server, which cleanup stops last (stopped by the
# terminal's SIGINT with them, it left the workers draining for their 60 s with nothing to send to).
start_nats() {
  setsid nats-server "$@" -a 127.0.0.1 -p -1 --ports_file_dir "$run" >"$run/nats.log" 2>&1 &
  nats_pid=$!
  pids+=($nats_pid)
  local ports=
  for _ in $(seq 100); do ports=$(ls "$run"/nats-server_*.ports 2>/dev/null || true); [ -n "$ports" ] && break; sleep 0.05; done
  [ -n "$ports" ] || { echo "nats-server did not start:" >&2; cat "$run/nats.log" >&2; return 1; }
  url=$(sed -E 's/.*"nats":\["([^"]+)".*/\1/' "$ports")
  monitor=$(sed -nE 's/.*"monitoring":\["([^"]+)".*/\1/p' "$ports")
}
