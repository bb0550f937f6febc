#!/usr/bin/env bash
# docker-compose.yml without Docker: read the compose file, and run its services' own commands
# natively on 127.0.0.1, so the topology and every flag in it are exercised for real.
#
#   bash scripts/compose-check.sh
#
# 1. Validates docker-compose.yml: `docker compose config` or `docker-compose config` when one of
#    them is installed, and always the checks below (YAML, the topology's invariants).
# 2. Starts the nats services (nats-server, the compose command as written, with the container
#    ports 4222/6222/8222 mapped to free ports on 127.0.0.1 and `-a 127.0.0.1` added), runs their
#    health check, and waits until every node has routes to the two others.
# 3. Starts the workers and routers with their compose command and environment (hostnames
#    natsN:PORT rewritten to 127.0.0.1:port), then runs the kvbench job's script as written:
#    wait for the fleet, replay the workload per policy, `kvbench --mode digest`.
# 4. Shows which node each router landed on, stops the node serving router1, waits until that
#    router is back on another node, replays a short load and checks the digests again
#    (FAILOVER=0 skips this).
# 5. Stops everything it started: routers (they drain), workers (they finish), NATS nodes.
#
# Environment: the compose file's own variables (SPEEDUP, WORKLOAD, REQUESTS, CONCURRENCY,
# POLICIES); FAILOVER (1); FAILOVER_REQUESTS (200); COMPOSE_FILE (docker-compose.yml); WRAP: a
# command prefix for the services of the kvrouter image, to run them in the built image with the
# host's network, e.g. WRAP="buildah run --isolation chroot --network host CONTAINER --" (it must
# forward SIGTERM); by default they run from build/src.
# Exit status 0 when the kvbench job and the digest checks passed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
compose_file=${COMPOSE_FILE:-docker-compose.yml}
FAILOVER=${FAILOVER:-1}
FAILOVER_REQUESTS=${FAILOVER_REQUESTS:-200}

bash scripts/deps.sh
py=/usr/bin/python3
if ! "$py" -c 'import yaml' 2>/dev/null; then
  echo "compose-check: installing python3-yaml"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-yaml >/dev/null
fi
bash scripts/build.sh build

# Nothing from the caller's KVR_* environment: the services get what the compose file gives them.
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^KVR_' || true)

run=$(mktemp -d)
declare -A pid_of=()
# filled by the plan below
nats_services=() router_services=() worker_services=() job_services=() compose_summary=""

stop_group() { # stop_group NAME...: SIGTERM, then wait, in parallel
  local s
  for s in "$@"; do
    [ -n "$s" ] || continue
    if [ -n "${pid_of[$s]:-}" ]; then kill -TERM "${pid_of[$s]}" 2>/dev/null || true; fi
  done
  for s in "$@"; do
    [ -n "$s" ] || continue
    if [ -n "${pid_of[$s]:-}" ]; then wait "${pid_of[$s]}" 2>/dev/null || true; fi
    unset "pid_of[$s]"
  done
}
stop_all() {
  local rc=$?
  set +e
  stop_group "${router_services[@]}"
  stop_group "${worker_services[@]}"
  stop_group "${nats_services[@]}"
  if [ $rc -ne 0 ]; then
    echo "compose-check: failed (rc=$rc); last lines of the service logs:"
    for f in "$run"/*.log; do
      [ -e "$f" ] || continue
      echo "--- $(basename "$f")"
      tail -n 5 "$f"
    done
  fi
  rm -rf "$run"
  exit $rc
}
trap stop_all EXIT

echo "== validating $compose_file"
if docker compose version >/dev/null 2>&1; then
  docker compose -f "$compose_file" config -q && echo "   docker compose config: ok"
elif command -v docker-compose >/dev/null 2>&1; then
  docker-compose -f "$compose_file" config -q && echo "   docker-compose config ($(docker-compose version --short 2>/dev/null)): ok"
else
  echo "   no compose CLI here: YAML and topology checks only"
fi

# The plan: compose interpolation, the topology checks, free ports, and per service its argv,
# environment and health check with container addresses rewritten to 127.0.0.1, as bash arrays.
"$py" - "$compose_file" >"$run/plan.sh" <<'PY'
import os, re, shlex, socket, sys
import yaml

path = sys.argv[1]
doc = yaml.safe_load(open(path))
services = doc["services"]

VAR = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")

def interpolate(s):
    """Compose's variable interpolation: $$, ${V}, ${V:-d}, ${V-d}, ${V:?e}, ${V?e}, $V."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        val = os.environ.get(name)
        if op in (":-", ":?") and not val or op in ("-", "?") and val is None:
            if op.endswith("?"):
                sys.exit(f"compose-check: {name}: {arg or 'required'}")
            return arg
        return val or ""
    return VAR.sub(sub, s)

def walk(x):
    if isinstance(x, str):
        return interpolate(x)
    if isinstance(x, list):
        return [walk(v) for v in x]
    if isinstance(x, dict):
        return {k: walk(v) for k, v in x.items()}
    return x

services = walk(services)
fail = []
def check(cond, what):
    if not cond:
        fail.append(what)

def argv(svc):
    c = services[svc].get("command")
    check(isinstance(c, list) and c, f"{svc}: command must be a non-empty list")
    return [str(a) for a in c] if isinstance(c, list) else []

def env(svc):
    e = services[svc].get("environment") or {}
    if isinstance(e, list):
        e = dict(x.split("=", 1) if "=" in x else (x, os.environ.get(x, "")) for x in e)
    return {k: "" if v is None else str(v) for k, v in e.items()}

def opt(args, *names):
    for i, a in enumerate(args):
        if a in names and i + 1 < len(args):
            return args[i + 1]
        for n in names:
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None

kinds = {"nats-server": "nats", "kvrouter": "router", "kvworker": "worker"}
groups = {"nats": [], "router": [], "worker": [], "job": []}
for svc in services:
    a = argv(svc)
    groups[kinds.get(a[0] if a else "", "job")].append(svc)

nats, routers, workers, jobs = groups["nats"], groups["router"], groups["worker"], groups["job"]

# the topology the compose file promises
check(len(nats) == 3, f"3 nats services expected, found {nats}")
check(len(routers) == 3, f"3 routers expected, found {routers}")
check(len(workers) == 4, f"4 workers expected, found {workers}")
check(jobs == ["kvbench"], f"one job, kvbench, expected, found {jobs}")
for n in nats:
    a, s = argv(n), services[n]
    check(opt(a, "--cluster") == "nats://0.0.0.0:6222", f"{n}: --cluster nats://0.0.0.0:6222")
    routes = (opt(a, "--routes") or "").split(",")
    check(sorted(routes) == sorted(f"nats://{m}:6222" for m in nats), f"{n}: --routes to every node")
    check(opt(a, "--cluster_name") == "kvr", f"{n}: --cluster_name kvr")
    check(opt(a, "-m", "--http_port") == "8222", f"{n}: -m 8222")
    check(opt(a, "--name", "-n") == n, f"{n}: --name {n}")
    check("healthcheck" in s, f"{n}: a health check")
    check(any(str(p).endswith(":8222") for p in s.get("ports", [])), f"{n}: monitoring port published")
published = sorted(str(p).rsplit(":", 2)[-2] for n in nats for p in services[n].get("ports", []))
check(published == ["4222", "8222", "8223", "8224"], f"host ports 4222, 8222-8224: {published}")
for group, flag in ((routers, "--id"), (workers, "--id")):
    ids = [opt(argv(s), flag) for s in group]
    check(None not in ids and len(set(ids)) == len(ids), f"distinct {flag}: {ids}")
for s in routers + workers + jobs:
    urls = env(s).get("KVR_NATS", "").split(",")
    check(sorted(urls) == sorted(f"nats://{m}:4222" for m in nats), f"{s}: KVR_NATS lists every node")
    check(services[s].get("image") == "kvrouter:local", f"{s}: image kvrouter:local")
for s in routers + workers:
    check(services[s].get("restart") in ("unless-stopped", "always", "on-failure"), f"{s}: restart policy")
firsts = [env(s)["KVR_NATS"].split(",")[0] for s in routers]
check(len(set(firsts)) == 3, f"routers list different nodes first: {firsts}")
check("kvbench --mode digest" in " ".join(argv("kvbench")), "kvbench job runs kvbench --mode digest")
if fail:
    sys.exit("compose-check: docker-compose.yml: " + "; ".join(fail))

# free ports on 127.0.0.1 for each node's client, cluster and monitoring ports
socks = []
for _ in range(3 * len(nats)):
    so = socket.socket()
    so.bind(("127.0.0.1", 0))
    socks.append(so)
ports = [so.getsockname()[1] for so in socks]
for so in socks:
    so.close()
pmap = {n: {"4222": ports[3 * i], "6222": ports[3 * i + 1], "8222": ports[3 * i + 2]}
        for i, n in enumerate(nats)}

def rewrite(s, me=None):
    for n, m in pmap.items():
        s = re.sub(rf"\b{re.escape(n)}:(4222|6222|8222)\b", lambda x: f"127.0.0.1:{m[x.group(1)]}", s)
    if me:
        s = re.sub(r"\b(0\.0\.0\.0|127\.0\.0\.1|localhost):(4222|6222|8222)\b",
                   lambda x: f"127.0.0.1:{pmap[me][x.group(2)]}", s)
    return s

def emit(name, values):
    print(f"{name}=(" + " ".join(shlex.quote(v) for v in values) + ")")

for g, members in (("nats", nats), ("router", routers), ("worker", workers), ("job", jobs)):
    emit(f"{g}_services", members)
print(f"compose_summary={shlex.quote(f'{len(nats)} nats nodes, {len(routers)} routers, {len(workers)} workers, job {jobs[0]}')}")
def mounts(svc):  # container path -> host path, for the files a service mounts
    m = {}
    for v in services[svc].get("volumes") or []:
        parts = str(v).split(":")
        if len(parts) >= 2 and parts[0].startswith("."):
            m[parts[1]] = os.path.abspath(parts[0])
    return m

for n in nats:
    a = [mounts(n).get(x, x) for x in argv(n)]
    out = []
    i = 0
    while i < len(a):
        if a[i] in ("-p", "--port", "-m", "--http_port") and i + 1 < len(a):
            out += [a[i], str(pmap[n]["4222" if a[i] in ("-p", "--port") else "8222"])]
            i += 2
            continue
        out.append(rewrite(a[i], n))
        i += 1
    out[1:1] = ["-a", "127.0.0.1"]
    emit(f"cmd_{n}", out)
    emit(f"env_{n}", [f"{k}={rewrite(v, n)}" for k, v in env(n).items()])
    t = services[n]["healthcheck"]["test"]
    t = ["sh", "-c", t[1]] if t[0] == "CMD-SHELL" else t[1:] if t[0] == "CMD" else ["sh", "-c", t]
    emit(f"health_{n}", [rewrite(x, n) for x in t])
    print(f"mon_{n}=http://127.0.0.1:{pmap[n]['8222']}")
    print(f"client_{n}=nats://127.0.0.1:{pmap[n]['4222']}")
for s in routers + workers + jobs:
    emit(f"cmd_{s}", [rewrite(x) for x in argv(s)])
    emit(f"env_{s}", [f"{k}={rewrite(v)}" for k, v in env(s).items()])
PY
# shellcheck source=/dev/null
source "$run/plan.sh"
echo "   topology checks: ok ($compose_summary)"
export PATH="$root/build/src:$PATH" TMPDIR="$run"
read -ra wrap <<<"${WRAP:-}"

start() { # start SERVICE: its command with its environment, output in $run/SERVICE.log
  local s=$1 c e
  c="cmd_${s}[@]"
  e="env_${s}[@]"
  case " ${nats_services[*]} " in
    *" $s "*) env "${!e}" "${!c}" >"$run/$s.log" 2>&1 & ;;
    *) "${wrap[@]}" env "${!e}" "${!c}" >"$run/$s.log" 2>&1 & ;;
  esac
  pid_of[$s]=$!
}
var() { local n="$1_$2"; echo "${!n}"; }
num_routes() { curl -s "$1/routez" | grep -o '"num_routes": *[0-9]*' | grep -o '[0-9]*$' || echo 0; }
conns() { curl -s "$1/connz?limit=1024" | grep -o '"name": *"[^"]*"' | sed -E 's/"name": *"([^"]*)"/\1/' | sort | tr '\n' ' '; }
wait_for() { # wait_for SECONDS COMMAND...: until the command succeeds
  local t=$1
  shift
  for _ in $(seq $((t * 10))); do
    "$@" && return 0
    sleep 0.1
  done
  return 1
}

echo "== starting ${nats_services[*]}: nats-server with the compose flags, on 127.0.0.1"
for n in "${nats_services[@]}"; do
  start "$n"
done
for n in "${nats_services[@]}"; do
  mon=$(var mon "$n")
  h="health_${n}[@]"
  hc=("${!h}")
  if ! command -v "${hc[0]}" >/dev/null; then hc=(curl -fsS -o /dev/null "${hc[-1]}"); fi
  wait_for 10 "${hc[@]}" || { echo "$n: health check failed: ${hc[*]}"; exit 1; }
  kill -0 "${pid_of[$n]}" || { echo "$n: exited"; exit 1; }
  name=$(curl -s "$mon/varz" | grep -o '"server_name": *"[^"]*"' | sed -E 's/.*"([^"]*)"$/\1/')
  [ "$name" = "$n" ] || { echo "$n: $mon answers as '$name'"; exit 1; }
done
routes_ok() {
  local n
  for n in "${nats_services[@]}"; do
    [ "$(num_routes "$(var mon "$n")")" -eq $((${#nats_services[@]} - 1)) ] || return 1
  done
}
wait_for 20 routes_ok || { echo "the cluster did not form"; exit 1; }
for n in "${nats_services[@]}"; do
  echo "   $n: client $(var client "$n"), monitoring $(var mon "$n"), healthz ok, num_routes $(num_routes "$(var mon "$n")")"
  c="cmd_${n}[@]"
  echo "      ${!c}"
done

echo "== starting ${worker_services[*]} and ${router_services[*]}"
for s in "${worker_services[@]}" "${router_services[@]}"; do
  start "$s"
  c="cmd_${s}[@]"
  e="env_${s}[@]"
  echo "   $s: ${!e} ${!c}"
done

echo "== the kvbench job, as in the compose file"
job=${job_services[0]}
c="cmd_${job}[@]"
e="env_${job}[@]"
"${wrap[@]}" env "${!e}" "${!c}" 2>&1 || { echo "the kvbench job failed"; exit 1; }

echo "== where the routers and workers landed, as each node's /connz shows"
home=""
for n in "${nats_services[@]}"; do
  cs=$(conns "$(var mon "$n")")
  echo "   $n: $cs"
  case " $cs " in *" kvrouter-router1 "*) home=$n ;; esac
done

if [ "$FAILOVER" = 1 ] && [ -n "$home" ]; then
  echo "== failover: stopping $home, which serves router1"
  stop_group "$home"
  others=()
  for n in "${nats_services[@]}"; do [ "$n" = "$home" ] || others+=("$n"); done
  back() {
    local n
    for n in "${others[@]}"; do
      case " $(conns "$(var mon "$n")") " in *" kvrouter-router1 "*) echo "   router1 is back, on $n"; return 0 ;; esac
    done
    return 1
  }
  t0=$(date +%s%N)
  wait_for 15 back || { echo "router1 did not reconnect"; exit 1; }
  echo "   reconnected in $((($(date +%s%N) - t0) / 1000000)) ms"
  for n in "${others[@]}"; do echo "   $n: $(conns "$(var mon "$n")")"; done
  sleep 2 # workers on the stopped node reconnect too; let a heartbeat pass
  echo "== kvbench after the failover: $FAILOVER_REQUESTS requests, policy kv, then the digests"
  "${wrap[@]}" env "${!e}" kvbench --workload seed --requests "$FAILOVER_REQUESTS" --policies kv --workers 4 2>&1
  ok=0
  for _ in $(seq 10); do
    if "${wrap[@]}" env "${!e}" kvbench --mode digest --digest-wait-ms 500 >"$run/digest" 2>"$run/digest.err"; then ok=1; break; fi
    sleep 1
  done
  sed -E 's/.*"router_id":"([^"]*)".*"digest":"([0-9a-f]*)".*"workers":([0-9]+),"requests":([0-9]+).*/   router=\1 digest=\2 workers=\3 requests=\4/' "$run/digest"
  cat "$run/digest.err"
  [ $ok = 1 ] || { echo "the routers disagree after the failover"; exit 1; }
fi

echo "== stopping: routers, workers, NATS nodes"
stop_group "${router_services[@]}"
stop_group "${worker_services[@]}"
stop_group "${nats_services[@]}"
echo "compose-check: ok"
