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
#    natsN:PORT rewritten to 127.0.0.1:port, each --metrics-addr to a free port on 127.0.0.1),
#    then the prometheus service: Debian's prometheus with the compose command's flags and the
#    mounted deploy/prometheus.yml (`promtool check config`ed), its targets rewritten to those
#    ports; runs its health check. Then runs the kvbench job's script as written: wait for the
#    fleet, replay the workload per policy, `kvbench --mode digest`; then asks Prometheus's query
#    API until every target is up and its sums of kvrouter_requests_total{endpoint="generate"}
#    and of kvworker_requests_total equal those of the routers' and workers' own /metrics.
# 4. Shows which node each router landed on, stops the node serving router1, waits until that
#    router is back on another node, replays a short load and checks the digests again
#    (FAILOVER=0 skips this).
# 5. Stops everything it started: Prometheus, routers (they drain), workers (they finish), NATS
#    nodes.
#
# Environment: the compose file's own variables (SPEEDUP, WORKLOAD, REQUESTS, CONCURRENCY,
# POLICIES); FAILOVER (1); FAILOVER_REQUESTS (200); COMPOSE_FILE (docker-compose.yml); WRAP: a
# command prefix for the services of the kvrouter image, to run them in the built image with the
# host's network, e.g. WRAP="buildah run --isolation chroot --network host CONTAINER --" (it must
# forward SIGTERM); by default they run from build/src; BUILD_DIR (build): the build directory
# (built first, with scripts/build.sh).
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
build_dir=${BUILD_DIR:-build}
bash scripts/build.sh "$build_dir"

# Nothing from the caller's KVR_* environment: the services get what the compose file gives them.
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^KVR_' || true)

run=$(mktemp -d)
declare -A pid_of=()
# filled by the plan below
nats_services=() router_services=() worker_services=() job_services=() prom_services=()
compose_summary="" prom_url="" prom_conf="" prom_targets=0

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
  stop_group "${prom_services[@]}"
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
"$py" - "$compose_file" "$run" >"$run/plan.sh" <<'PY'
import os, re, shlex, socket, sys
import yaml

path, run = sys.argv[1], sys.argv[2]
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
groups = {"nats": [], "router": [], "worker": [], "job": [], "prom": []}
for svc in services:
    a = argv(svc)
    if str(services[svc].get("image", "")).split(":")[0].split("/")[-1] == "prometheus":
        groups["prom"].append(svc)  # prom/prometheus: its command is the server's flags
        continue
    groups[kinds.get(a[0] if a else "", "job")].append(svc)

nats, routers, workers, jobs = groups["nats"], groups["router"], groups["worker"], groups["job"]
proms = groups["prom"]

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

def mounts(svc):  # container path -> host path, for the files a service mounts
    m = {}
    for v in services[svc].get("volumes") or []:
        parts = str(v).split(":")
        if len(parts) >= 2 and parts[0].startswith("."):
            m[parts[1]] = os.path.abspath(parts[0])
    return m

# every router and worker serves its metrics on all interfaces, at a port Prometheus scrapes
metrics_port = {}
for s in routers + workers:
    addr = opt(argv(s), "--metrics-addr") or ""
    m = re.fullmatch(r"0\.0\.0\.0:([0-9]+)", addr)
    check(m is not None, f"{s}: --metrics-addr 0.0.0.0:PORT (found {addr or 'none'})")
    if m:
        metrics_port[s] = m.group(1)
# one Prometheus, a pinned image, its config mounted from the repository, scraping exactly them
check(len(proms) == 1, f"one prometheus service expected, found {proms}")
prom_conf, prom_doc = None, {}
if len(proms) == 1:
    p = proms[0]
    image = str(services[p].get("image", ""))
    check(":" in image and not image.endswith(":latest"), f"{p}: a pinned image tag ({image})")
    conf_in = opt(argv(p), "--config.file")
    prom_conf = mounts(p).get(conf_in or "")
    check(prom_conf is not None, f"{p}: --config.file ({conf_in}) is a file mounted from the repository")
    check(opt(argv(p), "--storage.tsdb.path") is not None, f"{p}: --storage.tsdb.path")
    check(opt(argv(p), "--web.listen-address") is not None, f"{p}: --web.listen-address")
    check("healthcheck" in services[p], f"{p}: a health check")
    if prom_conf:
        prom_doc = yaml.safe_load(open(prom_conf)) or {}
        targets = [str(t) for sc in prom_doc.get("scrape_configs") or []
                   for st in sc.get("static_configs") or [] for t in st.get("targets") or []]
        want = [f"{s}:{metrics_port.get(s)}" for s in routers + workers]
        check(sorted(targets) == sorted(want),
              f"{os.path.relpath(prom_conf)}: targets {targets}, expected every router and worker {want}")
for s in services:
    for pub in services[s].get("ports") or []:
        check(str(pub).startswith("127.0.0.1:"), f"{s}: port {pub} published on 127.0.0.1 only")
if fail:
    sys.exit("compose-check: docker-compose.yml: " + "; ".join(fail))

# free ports on 127.0.0.1 for each node's client, cluster and monitoring ports, each router's
# and worker's --metrics-addr and Prometheus's web address
socks = []
for _ in range(3 * len(nats) + len(routers) + len(workers) + len(proms)):
    so = socket.socket()
    so.bind(("127.0.0.1", 0))
    socks.append(so)
ports = [so.getsockname()[1] for so in socks]
for so in socks:
    so.close()
pmap = {n: {"4222": ports[3 * i], "6222": ports[3 * i + 1], "8222": ports[3 * i + 2]}
        for i, n in enumerate(nats)}
hport = {s: ports[3 * len(nats) + i] for i, s in enumerate(routers + workers + proms)}

def rewrite(s, me=None):
    for n, m in pmap.items():
        s = re.sub(rf"\b{re.escape(n)}:(4222|6222|8222)\b", lambda x: f"127.0.0.1:{m[x.group(1)]}", s)
    if me:
        s = re.sub(r"\b(0\.0\.0\.0|127\.0\.0\.1|localhost):(4222|6222|8222)\b",
                   lambda x: f"127.0.0.1:{pmap[me][x.group(2)]}", s)
    return s

def emit(name, values):
    print(f"{name}=(" + " ".join(shlex.quote(v) for v in values) + ")")

for g, members in (("nats", nats), ("router", routers), ("worker", workers), ("job", jobs),
                   ("prom", proms)):
    emit(f"{g}_services", members)
print(f"compose_summary={shlex.quote(f'{len(nats)} nats nodes, {len(routers)} routers, {len(workers)} workers, job {jobs[0]}')}")
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
def set_opt(args, name, value):  # args with the value of --name (either form) replaced
    out, i = [], 0
    while i < len(args):
        if args[i] == name and i + 1 < len(args):
            out += [name, value]
            i += 2
            continue
        out.append(f"{name}={value}" if args[i].startswith(name + "=") else args[i])
        i += 1
    return out

for s in routers + workers + jobs:
    a = [rewrite(x) for x in argv(s)]
    if s in hport:
        a = set_opt(a, "--metrics-addr", f"127.0.0.1:{hport[s]}")
        print(f"metrics_{s}=http://127.0.0.1:{hport[s]}")
    emit(f"cmd_{s}", a)
    emit(f"env_{s}", [f"{k}={rewrite(v)}" for k, v in env(s).items()])
for p in proms:  # Debian's prometheus, the compose flags, the mounted config with native targets
    for sc in prom_doc.get("scrape_configs") or []:
        for st in sc.get("static_configs") or []:
            st["targets"] = [f"127.0.0.1:{hport[t.rsplit(':', 1)[0]]}" for t in st.get("targets") or []]
    conf = os.path.join(run, "prometheus.yml")
    with open(conf, "w") as f:
        f.write(f"# {os.path.relpath(prom_conf)} with the compose targets rewritten to 127.0.0.1\n")
        yaml.safe_dump(prom_doc, f, sort_keys=False)
    a = set_opt(argv(p), "--config.file", conf)
    a = set_opt(a, "--storage.tsdb.path", os.path.join(run, f"{p}-data"))
    a = set_opt(a, "--web.listen-address", f"127.0.0.1:{hport[p]}")
    emit(f"cmd_{p}", ["prometheus"] + a)
    emit(f"env_{p}", [f"{k}={v}" for k, v in env(p).items()])
    t = services[p]["healthcheck"]["test"]
    t = ["sh", "-c", t[1]] if t[0] == "CMD-SHELL" else t[1:] if t[0] == "CMD" else ["sh", "-c", t]
    emit(f"health_{p}", [re.sub(r"127\.0\.0\.1:[0-9]+", f"127.0.0.1:{hport[p]}", x) for x in t])
    print(f"prom_url=http://127.0.0.1:{hport[p]}")
    print(f"prom_conf={shlex.quote(os.path.relpath(prom_conf))}")
    print(f"prom_targets={len(routers) + len(workers)}")
PY
# shellcheck source=/dev/null
source "$run/plan.sh"
echo "   topology checks: ok ($compose_summary)"
export PATH="$root/$build_dir/src:$PATH" TMPDIR="$run"
read -ra wrap <<<"${WRAP:-}"

start() { # start SERVICE: its command with its environment, output in $run/SERVICE.log
  local s=$1 c e
  c="cmd_${s}[@]"
  e="env_${s}[@]"
  case " ${nats_services[*]} ${prom_services[*]} " in
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

# prom_query PROMQL: the query API's result as "value" lines, one per series (label=value ...)
prom_query() {
  curl -fsS -G "$prom_url/api/v1/query" --data-urlencode "query=$1" 2>/dev/null | "$py" -c '
import json, sys
d = json.load(sys.stdin)
assert d["status"] == "success"
for r in d["data"]["result"]:
    print(r["value"][1], " ".join(f"{k}={v}" for k, v in sorted(r["metric"].items())))'
}
for p in "${prom_services[@]}"; do
  echo "== starting $p: Debian's prometheus with the compose flags, on 127.0.0.1"
  promtool check config "$prom_conf" | sed 's/^/   /'
  promtool check config "$run/prometheus.yml" >/dev/null || { echo "$run/prometheus.yml: invalid"; exit 1; }
  start "$p"
  h="health_${p}[@]"
  hc=("${!h}")
  if ! command -v "${hc[0]}" >/dev/null; then hc=(curl -fsS -o /dev/null "${hc[-1]}"); fi
  wait_for 30 "${hc[@]}" || { echo "$p: health check failed: ${hc[*]}"; exit 1; }
  c="cmd_${p}[@]"
  echo "   $p: $prom_url, health check ok: ${!c}"
  sed -n '/^scrape_configs/,$p' "$run/prometheus.yml" | sed 's/^/      /'
done

echo "== the kvbench job, as in the compose file"
job=${job_services[0]}
c="cmd_${job}[@]"
e="env_${job}[@]"
"${wrap[@]}" env "${!e}" "${!c}" 2>&1 || { echo "the kvbench job failed"; exit 1; }

if [ ${#prom_services[@]} -gt 0 ]; then
  echo "== Prometheus: every target up, and the request counts read back"
  routed='kvrouter_requests_total{endpoint="generate"}' taken='kvworker_requests_total'
  direct_sum() { # direct_sum SERIES SERVICE...: the sum of SERIES over the services' own /metrics
    local series=$1 s v total=0
    shift
    for s in "$@"; do
      v=$(curl -fsS "$(var metrics "$s")/metrics" | awk -v k="$series" '$1 == k { print $2 }')
      total=$((total + ${v:-0}))
    done
    echo "$total"
  }
  # now that the job is over the figures hold still
  routers_say=$(direct_sum "$routed" "${router_services[@]}")
  workers_say=$(direct_sum "$taken" "${worker_services[@]}")
  read_back() {
    [ "$(prom_query 'count(up == 1)' | awk '{ print $1 }')" = "$prom_targets" ] &&
      [ "$(prom_query "sum($routed)" | awk '{ print $1 }')" = "$routers_say" ] &&
      [ "$(prom_query "sum($taken)" | awk '{ print $1 }')" = "$workers_say" ]
  }
  if ! wait_for 30 read_back; then
    echo "   Prometheus did not read the fleet back within 30 s; what it has:"
    prom_query 'up' | sed 's/^/      /'
    echo "      sum($routed) = $(prom_query "sum($routed)" | awk '{ print $1 }') (the routers: $routers_say)"
    echo "      sum($taken) = $(prom_query "sum($taken)" | awk '{ print $1 }') (the workers: $workers_say)"
    exit 1
  fi
  prom_query 'up' | sed 's/^/   up /'
  echo "   sum($routed) = $(prom_query "sum($routed)" | awk '{ print $1 }'), as the routers say"
  echo "   sum($taken) = $(prom_query "sum($taken)" | awk '{ print $1 }'), as the workers say"
fi

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

echo "== stopping: Prometheus, routers, workers, NATS nodes"
stop_group "${prom_services[@]}"
stop_group "${router_services[@]}"
stop_group "${worker_services[@]}"
stop_group "${nats_services[@]}"
echo "compose-check: ok"
